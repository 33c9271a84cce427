package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/inferencecache/inferencecache/server"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var loopback = []string{"--grpc-bind-address", "127.0.0.1:0", "--http-bind-address", "127.0.0.1:0", "--snapshot-bind-address", "127.0.0.1:0"}

func TestRunRejectsBadFlags(t *testing.T) {
	for name, c := range map[string]struct {
		args []string
		want string
	}{
		"unknown flag":     {[]string{"--nope"}, "flag provided but not defined"},
		"stray argument":   {[]string{"--insecure-disable-auth", "x"}, "unexpected arguments"},
		"bad log format":   {[]string{"--insecure-disable-auth", "--log-format", "xml"}, "--log-format"},
		"bad log level":    {[]string{"--insecure-disable-auth", "--log-level", "loud"}, "--log-level"},
		"cert without key": {[]string{"--insecure-disable-auth", "--tls-cert-file", "/tmp/x.crt"}, "--tls-cert-file and --tls-key-file must be set together"},
		"no identity":      {nil, "--allowed-controller-sa is required"},
		"padded audience":  {[]string{"--insecure-disable-auth", "--policy-audience", "inferencecache.io/policy "}, "surrounding whitespace"},
		"empty audience":   {[]string{"--insecure-disable-auth", "--controller-audience", ""}, "must not be empty"},
		"bad block size":   {[]string{"--insecure-disable-auth", "--engine-block-size", "0"}, "--engine-block-size"},
		"shared model":     {[]string{"--insecure-disable-auth", "--metrics-models", "llama,__other__"}, "--metrics-models"},
		"negative grace":   {[]string{"--insecure-disable-auth", "--metrics-model-grace", "-1s"}, "--metrics-model-grace"},
		"negative models":  {[]string{"--insecure-disable-auth", "--metrics-max-models", "-1"}, "--metrics-max-models"},
		"negative scrapes": {[]string{"--insecure-disable-auth", "--metrics-max-scrapes", "-1"}, "--metrics-max-scrapes"},
		"negative timeout": {[]string{"--insecure-disable-auth", "--metrics-scrape-timeout", "-1s"}, "--metrics-scrape-timeout"},
		"bad NATS stream":  {[]string{"--insecure-disable-auth", "--nats-url", "nats://127.0.0.1:1", "--nats-stream", "a.b"}, "stream name"},
		"negative lag":     {[]string{"--insecure-disable-auth", "--nats-url", "nats://127.0.0.1:1", "--nats-ready-lag", "-1"}, "--nats-ready-lag"},
		"both sources":     {[]string{"--insecure-disable-auth", "--inference-pool", "ns/p", "--endpoints-file", "/tmp/e.yaml"}, "exclude each other"},
		"bad pool name":    {[]string{"--insecure-disable-auth", "--inference-pool", "just-a-name"}, "NAMESPACE/NAME"},
		// A source that cannot start fails startup clearly instead of
		// running a picker with nothing to pick from.
		"pool without API":         {[]string{"--insecure-disable-auth", "--inference-pool", "ns/pool", "--kubeconfig", "/nonexistent/kubeconfig"}, "cannot load --kubeconfig"},
		"missing file":             {[]string{"--insecure-disable-auth", "--endpoints-file", "/nonexistent/endpoints.yaml"}, "endpoints file"},
		"ext-proc TLS":             {[]string{"--insecure-disable-auth", "--ext-proc-bind-address", "127.0.0.1:0", "--ext-proc-plaintext", "--ext-proc-tls-cert-file", "x"}, "exclude each other"},
		"expected credit above 1":  {[]string{"--insecure-disable-auth", "--load-expected-credit", "1.5"}, "expected-entry credit"},
		"eviction share of 1":      {[]string{"--insecure-disable-auth", "--load-eviction-share", "1"}, "eviction share"},
		"negative expected TTL":    {[]string{"--insecure-disable-auth", "--load-expected-ttl", "-1s"}, "expected-entry TTL"},
		"negative NATS byte bound": {[]string{"--insecure-disable-auth", "--nats-url", "nats://127.0.0.1:1", "--nats-stream-max-bytes", "-1"}, "max bytes"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var stderr syncBuffer
			err := run(ctx, append(append([]string{}, loopback...), c.args...), &stderr, nil)
			if err == nil || !strings.Contains(err.Error()+stderr.String(), c.want) {
				t.Fatalf("err = %v (stderr %q), want it to mention %q", err, stderr.String(), c.want)
			}
		})
	}
}

// TestRunServesEndpointsFile starts the binary's run with a static
// endpoints file: the picker serves on its own listener, ready with the
// file's endpoints, and its source metrics are exported.
func TestRunServesEndpointsFile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	file := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(file, []byte("tenant: team-a\nendpoints:\n- replicaId: pod-a\n  address: 10.0.0.7:8000\n- replicaId: pod-b\n  address: 10.0.0.8:8000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var stderr syncBuffer
	started := make(chan *server.Server, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, append([]string{"--insecure-disable-auth", "--log-format", "text", "--endpoints-file", file,
			"--ext-proc-bind-address", "127.0.0.1:0", "--ext-proc-plaintext"}, loopback...), &stderr, func(s *server.Server) { started <- s })
	}()
	var s *server.Server
	select {
	case s = <-started:
	case err := <-done:
		t.Fatalf("run returned early: %v\n%s", err, stderr.String())
	case <-ctx.Done():
		t.Fatal("server did not start")
	}
	if s.PickerAddr() == nil || s.PickerTLS() {
		t.Fatalf("picker addr %v tls %v, want a plaintext listener", s.PickerAddr(), s.PickerTLS())
	}
	conn, err := grpc.NewClient(s.PickerAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: server.PickerReadiness})
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("picker never ready: %v %v\n%s", r, err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.HTTPAddr().String()+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"inferencecache_picker_endpoints 2", `inferencecache_picker_endpoint_source_failures_total{reason="decode"} 0`} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("run did not return after cancel")
	}
}

// TestRunServesAndStops starts the binary's run on loopback, checks
// /readyz, and stops it through its context (what SIGTERM does).
func TestRunServesAndStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	var stderr syncBuffer
	started := make(chan *server.Server, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, append([]string{"--insecure-disable-auth", "--log-format", "text", "--metrics-models", "llama, qwen,"}, loopback...), &stderr, func(s *server.Server) { started <- s })
	}()
	var s *server.Server
	select {
	case s = <-started:
	case err := <-done:
		t.Fatalf("run returned early: %v\n%s", err, stderr.String())
	case <-ctx.Done():
		t.Fatal("server did not start")
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.HTTPAddr().String()+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %v %v", resp, err)
	}
	resp.Body.Close()
	// --metrics-models: the configured models have their latency series
	// before any lookup.
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.HTTPAddr().String()+"/metrics", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`inferencecache_lookup_route_latency_seconds_count{model="llama"} 0`, `inferencecache_lookup_route_latency_seconds_count{model="qwen"} 0`} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("run did not return after cancel")
	}
	if logs := stderr.String(); !strings.Contains(logs, "AUTH IS DISABLED") || !strings.Contains(logs, "drained") || !strings.Contains(logs, "endpoint picker off") {
		t.Fatalf("logs lack the insecure warning or the drain:\n%s", logs)
	}
}
