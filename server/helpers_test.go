package server_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"

	dto "github.com/prometheus/client_model/go"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

// testConfig is the servertest configuration: an insecure server on
// loopback ports chosen by the kernel.
func testConfig() server.Config { return servertest.Config() }

// running is a started server with a plaintext client (none with TLS).
type running struct {
	*servertest.Running
	conn *grpc.ClientConn
	cli  pb.InferenceCacheClient
}

// start runs a server built from cfg through servertest.Run, which waits
// until it is ready and stops it (bounded) when the test ends.
func start(t *testing.T, cfg server.Config) *running {
	t.Helper()
	r := &running{Running: servertest.Run(t, func(c *server.Config) { *c = cfg })}
	if !r.TLS() {
		r.conn = servertest.Conn(t, r.Server)
		r.cli = pb.NewInferenceCacheClient(r.conn)
	}
	return r
}

func tctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// httpDo sends one request and returns the status and body.
func httpDo(t *testing.T, method, url, body string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(tctx(t), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// scrape fetches /metrics and parses it with the Prometheus text parser.
func scrape(t *testing.T, s *server.Server) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := httpDo(t, http.MethodGet, "http://"+s.HTTPAddr().String()+"/metrics", "", nil)
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatalf("cannot parse /metrics: %v", err)
	}
	return fams
}

// sample returns the value of the series of family name whose labels are
// exactly lbls ("k=v,..." sorted by name); ok is false when absent.
func sample(fams map[string]*dto.MetricFamily, name, lbls string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		var parts []string
		for _, l := range m.GetLabel() {
			parts = append(parts, l.GetName()+"="+l.GetValue())
		}
		if strings.Join(parts, ",") != lbls {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// waitFor polls cond every 5 ms for at most 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
