package loadgen_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/inferencecache/inferencecache/rpc"
	"github.com/inferencecache/inferencecache/server"
)

// testServer is a real cache server in process on 127.0.0.1.
type testServer struct {
	srv *server.Server
}

// startServer starts a server on ephemeral 127.0.0.1 ports and stops it
// (bounded) when the test ends. wrap, when non-nil, wraps its index.
func startServer(t *testing.T, wrap func(rpc.Index) rpc.Index) *testServer {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.WrapIndex = wrap
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.InternalAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.InsecureDisableAuth = true
	cfg.DrainTimeout = 5 * time.Second
	cfg.Logger = slog.New(slog.DiscardHandler)
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("server.Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("server did not stop within 15s")
		}
	})
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatalf("server stopped before serving: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatalf("server not ready within 10s")
	}
	return &testServer{srv: srv}
}

func (s *testServer) grpcAddr() string { return s.srv.GRPCAddr().String() }

// lookupCalls scrapes /metrics and returns
// inferencecache_lookup_route_calls_total for model, by reason_code.
func (s *testServer) lookupCalls(t *testing.T, modelID string) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/metrics", s.srv.HTTPAddr()), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("cannot scrape /metrics: %v", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("cannot parse /metrics: %v", err)
	}
	out := map[string]int64{}
	fam := fams["inferencecache_lookup_route_calls_total"]
	if fam == nil {
		return out
	}
	for _, m := range fam.GetMetric() {
		if label(m, "model") != modelID {
			continue
		}
		out[label(m, "reason_code")] += int64(m.GetCounter().GetValue())
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
