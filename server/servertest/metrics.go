package servertest

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/inferencecache/inferencecache/server"
)

// ScrapeTimeout bounds one Scrape.
const ScrapeTimeout = 10 * time.Second

// Scrape fetches srv's /metrics from its public listener and parses it with
// the Prometheus text parser, keyed by family name. It fails the test on any
// error or a status other than 200.
func Scrape(t testing.TB, srv *server.Server) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(ScrapeText(t, srv)))
	if err != nil {
		t.Fatalf("servertest: cannot parse /metrics: %v", err)
	}
	return fams
}

// Value returns the value of the series of family name whose labels are
// exactly labels, written "k=v,k=v" in label-name order ("" for none): a
// counter's or gauge's value, a histogram's sample count. ok is false when
// there is no such series.
func Value(fams map[string]*dto.MetricFamily, name, labels string) (v float64, ok bool) {
	for _, m := range fams[name].GetMetric() {
		var parts []string
		for _, l := range m.GetLabel() {
			parts = append(parts, l.GetName()+"="+l.GetValue())
		}
		if strings.Join(parts, ",") != labels {
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

// ScrapeText fetches srv's /metrics from its public listener and returns the
// raw exposition text. It fails the test on any error or a status other
// than 200.
func ScrapeText(t testing.TB, srv *server.Server) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ScrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+srv.HTTPAddr().String()+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("servertest: cannot scrape /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("servertest: cannot read /metrics: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("servertest: /metrics answered %d", resp.StatusCode)
	}
	return string(body)
}
