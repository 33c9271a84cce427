package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

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
	if logs := stderr.String(); !strings.Contains(logs, "AUTH IS DISABLED") || !strings.Contains(logs, "drained") {
		t.Fatalf("logs lack the insecure warning or the drain:\n%s", logs)
	}
}
