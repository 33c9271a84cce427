package loadgen_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/inferencecache/inferencecache/rpc"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

// testServer is a real cache server in process on 127.0.0.1.
type testServer struct {
	srv *server.Server
}

// startServer starts a server on ephemeral 127.0.0.1 ports and stops it
// (bounded) when the test ends. wrap, when non-nil, wraps its index.
func startServer(t *testing.T, wrap func(rpc.Index) rpc.Index) *testServer {
	t.Helper()
	return &testServer{srv: servertest.Start(t, func(c *server.Config) { c.WrapIndex = wrap })}
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
