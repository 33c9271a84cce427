package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/bus/bustest"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/picker"
	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/picker/request"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// byteTokens stands in for the whole-conversation tokenizer: one token per
// byte of each message as sent (later turns extend earlier ones).
type byteTokens struct{}

func (byteTokens) RequestTokens(_ context.Context, _ string, r *request.Request) ([]uint32, error) {
	var toks []uint32
	for _, m := range r.Messages {
		for _, c := range []byte(m.Raw) {
			toks = append(toks, uint32(c))
		}
	}
	return toks, nil
}

func pickerPool(t *testing.T) *endpoints.Pool {
	t.Helper()
	p, err := endpoints.NewPool("t", "vllm", nil, []endpoints.Endpoint{
		{ReplicaID: "pod-a", Address: "10.1.0.1:8000"},
		{ReplicaID: "pod-b", Address: "10.1.0.2:8000"},
		{ReplicaID: "pod-c", Address: "10.1.0.3:8000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func withPicker(src endpoints.Source, mutate func(*server.PickerConfig)) func(*server.Config) {
	return func(c *server.Config) {
		c.Picker.Source = src
		c.Picker.Tokenizer = byteTokens{}
		if mutate != nil {
			mutate(&c.Picker)
		}
	}
}

func chat(turns ...string) []byte {
	var msgs []map[string]string
	for i, c := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": c})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return b
}

// chainUpdate is replica's report of the whole chain of body's tokens.
func chainUpdate(t *testing.T, replica string, body []byte) *pb.CacheStateUpdate {
	t.Helper()
	r, err := request.Parse(request.ChatPath, body)
	if err != nil {
		t.Fatal(err)
	}
	toks, _ := byteTokens{}.RequestTokens(context.Background(), "m", r)
	var hs [][]byte
	var cs []int32
	for _, h := range fingerprint.AppendChain(nil, toks, 16, 0, false) {
		hs = append(hs, fingerprint.AppendWire(nil, h))
		cs = append(cs, 16)
	}
	return &pb.CacheStateUpdate{TenantId: "t", ModelId: "m", HashScheme: "vllm", ReplicaId: replica, TimestampUs: time.Now().UnixMicro(),
		Prefixes: []*pb.PrefixEntry{{BlockHashes: hs, BlockTokenCounts: cs}}}
}

// pick sends one chat request through the picker as Envoy does
// (FULL_DUPLEX_STREAMED) and returns the destination; when finish is
// set it also plays the response (JSON, usage with cached tokens).
func pick(t *testing.T, conn *grpc.ClientConn, body []byte, finish bool) string {
	t.Helper()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *extprocv3.ProcessingRequest) {
		t.Helper()
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() *extprocv3.ProcessingResponse {
		t.Helper()
		m, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte(request.ChatPath)}, {Key: ":method", RawValue: []byte("POST")},
		}}}},
	})
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
	m := recv()
	dest := string(m.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()[0].GetHeader().GetRawValue())
	if sr := recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); string(sr.GetBody()) != string(body) {
		t.Fatal("body not re-emitted")
	}
	if finish {
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}})
		recv()
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: []byte(`{"choices":[],"usage":{"prompt_tokens":90,"prompt_tokens_details":{"cached_tokens":64}}}`), EndOfStream: true}}})
		recv()
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	return dest
}

func health(t *testing.T, conn *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	r, err := healthpb.NewHealthClient(conn).Check(tctx(t), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("health %q: %v", service, err)
	}
	return r.GetStatus()
}

// Without an endpoint source the picker stays off: nothing listens.
func TestPickerOffWithoutSource(t *testing.T) {
	r := servertest.Run(t, nil)
	if r.PickerAddr() != nil || r.Picker() != nil {
		t.Fatalf("the picker is on without an endpoint source: %v", r.PickerAddr())
	}
}

// A source that fails for good, or an ext_proc listener that cannot bind,
// fails where it should: the first is not ready, the second fails New.
func TestPickerBindFailure(t *testing.T) {
	r := servertest.Run(t, withPicker(endpoints.NewFixed(pickerPool(t)), nil))
	cfg := servertest.Config()
	withPicker(endpoints.NewFixed(pickerPool(t)), func(p *server.PickerConfig) { p.Addr = r.PickerAddr().String() })(&cfg)
	if _, err := server.New(cfg); err == nil || !strings.Contains(err.Error(), "ext_proc") {
		t.Fatalf("New on a taken ext_proc port: %v", err)
	}
}

// The health service on the picker's listener: liveness at once;
// readiness and the ext_proc service only once endpoints are known; all
// NOT_SERVING when the drain begins. TLS (self-signed) by default.
func TestPickerHealthAndReadiness(t *testing.T) {
	src := endpoints.NewFixed(nil)
	r := servertest.Run(t, withPicker(src, nil))
	if !r.PickerTLS() {
		t.Fatal("the ext_proc listener serves plaintext by default")
	}
	conn := servertest.PickerConn(t, r.Server)
	if got := health(t, conn, server.PickerLiveness); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness %v", got)
	}
	for _, svc := range []string{server.PickerReadiness, picker.ServiceName} {
		if got := health(t, conn, svc); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("%s %v before any endpoint is known", svc, got)
		}
	}
	src.Set(pickerPool(t))
	waitFor(t, "readiness", func() bool { return health(t, conn, server.PickerReadiness) == healthpb.HealthCheckResponse_SERVING })
	if got := health(t, conn, picker.ServiceName); got != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("ext_proc service %v once ready", got)
	}
	w, err := healthpb.NewHealthClient(conn).Watch(tctx(t), &healthpb.HealthCheckRequest{Service: server.PickerReadiness})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := w.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", m, err)
	}
	r.Stop()
	m, err := w.Recv()
	if err == nil && m.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("readiness during the drain: %v", m.GetStatus())
	}
	<-r.Done()
}

// --ext-proc-plaintext serves plaintext; supplied certificate files serve
// TLS with them.
func TestPickerTLSModes(t *testing.T) {
	t.Run("plaintext", func(t *testing.T) {
		r := servertest.Run(t, withPicker(endpoints.NewFixed(pickerPool(t)), func(p *server.PickerConfig) { p.Plaintext = true }))
		if r.PickerTLS() {
			t.Fatal("TLS with --ext-proc-plaintext")
		}
		conn, err := grpc.NewClient(r.PickerAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if got := health(t, conn, server.PickerLiveness); got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("liveness %v", got)
		}
	})
	t.Run("files", func(t *testing.T) {
		cert, key := writeKeyPair(t)
		r := servertest.Run(t, withPicker(endpoints.NewFixed(pickerPool(t)), func(p *server.PickerConfig) { p.CertFile, p.KeyFile = cert, key }))
		if !r.PickerTLS() {
			t.Fatal("plaintext with certificate files")
		}
		waitFor(t, "a pick over TLS", func() bool { return pick(t, servertest.PickerConn(t, r.Server), chat("hi"), false) != "" })
	})
	t.Run("invalid", func(t *testing.T) {
		cfg := servertest.Config()
		withPicker(endpoints.NewFixed(nil), func(p *server.PickerConfig) { p.Plaintext, p.CertFile = true, "x" })(&cfg)
		if _, err := server.New(cfg); err == nil {
			t.Fatal("plaintext with a certificate file was accepted")
		}
	})
}

func writeKeyPair(t *testing.T) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "picker"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, keyFile
}

// The picker asks the server's own index: a replica that reported the
// conversation's chain gets it; the metrics (parsed from /metrics) count
// the pick, its latency, the usage and the in-flight gauge per endpoint.
func TestPickerThroughServer(t *testing.T) {
	r := start(t, func() server.Config {
		c := testConfig()
		withPicker(endpoints.NewFixed(pickerPool(t)), nil)(&c)
		return c
	}())
	body := chat(strings.Repeat("a long system prompt ", 8), "first question")
	st, err := r.cli.ReportCacheState(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(chainUpdate(t, "pod-c", body)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	conn := servertest.PickerConn(t, r.Server)
	if dest := pick(t, conn, body, true); !strings.HasPrefix(dest, "10.1.0.3:8000,") {
		t.Fatalf("destination %q, want pod-c's first", dest)
	}
	waitFor(t, "the request to end", func() bool { return r.Picker().InflightTotal() == 0 })
	fams := servertest.Scrape(t, r.Server)
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{servermetrics.NamePickerPicks, "outcome=prefix,reason=none", 1},
		{servermetrics.NamePickerPicks, "outcome=fallback,reason=no_tokenizer", 0},
		{servermetrics.NamePickerPicks, "outcome=503,reason=empty_subset", 0},
		{servermetrics.NamePickerDecisionLatency, "", 1},
		{servermetrics.NamePickerTokenizeLatency, "", 1},
		{servermetrics.NamePickerUsage, "result=read", 1},
		{servermetrics.NamePickerDelivered, "model=m", 64},
		{servermetrics.NamePickerPromptTokens, "model=m", 90},
		{servermetrics.NamePickerInflight, "endpoint=10.1.0.3:8000,replica_id=pod-c", 0},
	} {
		got, ok := servertest.Value(fams, c.name, c.labels)
		if !ok || got != c.want {
			t.Errorf("%s{%s} = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if got, _ := servertest.Value(fams, servermetrics.NamePickerPredicted, "model=m"); got <= 0 {
		t.Errorf("predicted cached tokens %v, want the matched prefix", got)
	}
}

// A stream in flight when the drain begins finishes within the drain
// timeout; the server then stops.
func TestPickerDrain(t *testing.T) {
	r := servertest.Run(t, withPicker(endpoints.NewFixed(pickerPool(t)), nil))
	conn := servertest.PickerConn(t, r.Server)
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	time.Sleep(50 * time.Millisecond) // the drain has begun; the stream still works
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.GetResponseHeaders() == nil {
		t.Fatalf("the stream in flight was cut by the drain: %v %v", m, err)
	}
	select {
	case <-r.Done():
		t.Fatal("the server stopped before the stream in flight ended")
	default:
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Done():
	case <-time.After(servertest.StopTimeout):
		t.Fatal("the server did not stop after the last stream ended")
	}
	if r.Picker().InflightTotal() != 0 {
		t.Fatal("in-flight count leaked")
	}
}

// Active-active: every server is a picker, and fed through NATS they hold
// the same index, so the same requests get the same picks from either,
// with no leader election.
func TestPickerActiveActive(t *testing.T) {
	ns := bustest.Start(t)
	var srvs []*running
	for range 2 {
		c := natsConfig(ns.URL())
		withPicker(endpoints.NewFixed(pickerPool(t)), nil)(&c)
		srvs = append(srvs, start(t, c))
	}
	convs := [][]byte{
		chat(strings.Repeat("system prompt one ", 8), "q1"),
		chat(strings.Repeat("system prompt two ", 8), "q2"),
		chat(strings.Repeat("system prompt three ", 8), "q3"),
	}
	p := publisher(t, ns.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subj := bus.Subject("S", "t", "m")
	for i, replica := range []string{"pod-b", "pod-c", "pod-a"} {
		if err := p.Publish(ctx, subj, bus.KindUpdate, chainUpdate(t, replica, convs[i])); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range srvs {
		waitFor(t, "both servers to hold the three chains", func() bool { e, _ := s.Engine().Counts(); return e >= 3 })
	}
	conns := []*grpc.ClientConn{servertest.PickerConn(t, srvs[0].Server), servertest.PickerConn(t, srvs[1].Server)}
	want := []string{"10.1.0.2:8000", "10.1.0.3:8000", "10.1.0.1:8000"}
	// Later turns too (not in the index: affinity or least-loaded, both
	// deterministic), and a conversation nobody holds.
	convs = append(convs, chat(strings.Repeat("system prompt one ", 8), "q1", "a1", "q2"), chat("nobody holds this"))
	for i, body := range convs {
		a, b := pick(t, conns[0], body, true), pick(t, conns[1], body, true)
		if a != b {
			t.Fatalf("conversation %d: server 0 picked %q, server 1 %q", i, a, b)
		}
		if i < len(want) && !strings.HasPrefix(a, want[i]+",") {
			t.Fatalf("conversation %d went to %q, want %s first", i, a, want[i])
		}
		for _, s := range srvs {
			waitFor(t, "the request to end", func() bool { return s.Picker().InflightTotal() == 0 })
		}
	}
}
