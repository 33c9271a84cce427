package server_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// panicModel is the magic model id panicIndex panics on.
const panicModel = "panic-please"

// panicIndex panics in every index call naming panicModel and forwards the
// rest to the real engine.
type panicIndex struct{ rpc.Index }

func (p panicIndex) LookupRoute(req *engine.LookupRequest, now int64, res *engine.LookupResult) {
	if req.ModelID == panicModel {
		panic("test panic in LookupRoute")
	}
	p.Index.LookupRoute(req, now, res)
}

func (p panicIndex) Ingest(u *engine.Update, now int64) engine.IngestResult {
	if u.ModelID == panicModel {
		panic("test panic in Ingest")
	}
	return p.Index.Ingest(u, now)
}

func (p panicIndex) ApplyEvent(ev *engine.Event, now int64) {
	if ev.ModelID == panicModel {
		panic("test panic in ApplyEvent")
	}
	p.Index.ApplyEvent(ev, now)
}

// panicHTTP panics on the path /panic before writing anything, and on
// /panic-late after writing the header and part of a body; other paths go to
// the listener's handler.
func panicHTTP(_ string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/panic":
			panic("test panic in " + r.Host)
		case "/panic-late":
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("partial"))
			// On the wire, so the client cannot retry the request.
			_ = http.NewResponseController(w).Flush()
			panic("test panic after the header")
		}
		h.ServeHTTP(w, r)
	})
}

// logBuf is a goroutine-safe log sink.
type logBuf struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestPanicRecovery: a panic in a unary or streaming gRPC handler, or in a
// handler of the public or control HTTP listener, answers that request
// Internal / 500, moves recovered_panics_total{listener}, logs the stack,
// and the server goes on serving.
func TestPanicRecovery(t *testing.T) {
	var logs logBuf
	cfg := testConfig()
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	cfg.WrapIndex = func(ix rpc.Index) rpc.Index { return panicIndex{ix} }
	server.SetWrapHTTP(&cfg, panicHTTP)
	s := start(t, cfg)

	wantInternal := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.Internal {
			t.Fatalf("%s: %v, want Internal", what, err)
		}
	}
	_, err := s.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: panicModel, HashScheme: "vllm", PrefixHash: []byte("12345678")})
	wantInternal("unary LookupRoute", err)
	_, err = s.cli.PublishEvent(tctx(t), &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, TenantId: "team", ModelId: panicModel, ReplicaId: "r1"})
	wantInternal("unary PublishEvent", err)
	st, err := s.cli.ReportCacheState(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.CacheStateUpdate{TenantId: "team", ModelId: panicModel, HashScheme: "vllm", ReplicaId: "r1",
		Prefixes: []*pb.PrefixEntry{{PrefixHash: []byte("12345678"), TokenCount: 16}}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	_, err = st.CloseAndRecv()
	wantInternal("stream ReportCacheState", err)

	httpBase, intBase := "http://"+s.HTTPAddr().String(), "http://"+s.InternalAddr().String()
	for _, u := range []string{httpBase + "/panic", intBase + "/panic"} {
		if code, body := httpDo(t, http.MethodGet, u, "", nil); code != http.StatusInternalServerError || strings.Contains(body, "test panic") {
			t.Fatalf("GET %s: %d %q, want 500 without the panic value", u, code, body)
		}
	}
	// A panic after the header: the response cannot turn into a 500, so the
	// connection is cut and the client sees a broken response.
	req, _ := http.NewRequestWithContext(tctx(t), http.MethodGet, httpBase+"/panic-late", nil)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Fatal("a response cut by a panic read as complete")
		}
	}

	// Still serving, on every listener.
	a, ac := chain(1, 8)
	report(t, s.cli, &pb.CacheStateUpdate{TenantId: "team", ModelId: "llama", HashScheme: "vllm", ReplicaId: "r1",
		Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}})
	if r, err := s.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: "llama", HashScheme: "vllm", BlockHashes: a, BlockTokenCounts: ac}); err != nil || r.GetReasonCode() != rpc.ReasonPrefixMatch {
		t.Fatalf("lookup after the panics: %v, %v", r, err)
	}
	if code, _ := httpDo(t, http.MethodGet, httpBase+"/healthz", "", nil); code != http.StatusOK {
		t.Fatalf("/healthz after the panics: %d", code)
	}
	if code, _ := httpDo(t, http.MethodGet, intBase+"/snapshot", "", nil); code != http.StatusOK {
		t.Fatalf("/snapshot after the panics: %d", code)
	}

	fams := servertest.Scrape(t, s.Server)
	for listener, want := range map[string]float64{"grpc": 3, "http": 2, "control": 1} {
		if got, ok := servertest.Value(fams, servermetrics.NameRecoveredPanics, "listener="+listener); !ok || got != want {
			t.Errorf("recovered_panics_total{listener=%s} = %v (present %v), want %v", listener, got, ok, want)
		}
	}
	out := logs.String()
	for _, want := range []string{"test panic in LookupRoute", "test panic in Ingest", "test panic in ApplyEvent", "test panic after the header",
		"/inferencecache.v1alpha1.InferenceCache/ReportCacheState", "goroutine ", "recover_test.go"} {
		if !strings.Contains(out, want) {
			t.Errorf("logs lack %q", want)
		}
	}
}
