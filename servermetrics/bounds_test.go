package servermetrics_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// scrape GETs /metrics from h and returns the status and body.
func scrape(t *testing.T, h http.Handler) (int, []byte) {
	t.Helper()
	srv := httptest.NewServer(h) // 127.0.0.1
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// parseExposition parses a text exposition with expfmt and returns its
// families and its line count.
func parseExposition(t *testing.T, body []byte) (map[string]*dto.MetricFamily, int) {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v", err)
	}
	lines := 0
	for sc := bufio.NewScanner(bytes.NewReader(body)); sc.Scan(); {
		if strings.TrimSpace(sc.Text()) != "" {
			lines++
		}
	}
	return fams, lines
}

// modelValues returns the distinct values of the model label across every
// family that has one.
func modelValues(fams map[string]*dto.MetricFamily) map[string]bool {
	out := map[string]bool{}
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "model" {
					out[l.GetValue()] = true
				}
			}
		}
	}
	return out
}

// TestManyModelsBoundedExposition: with 10,000 models in the index, each
// looked up and each with replicas reporting load, /metrics stays bounded:
// the busiest DefaultMaxModels models (by lookups since the previous
// ranking pass) keep their own series and every other model is aggregated
// under __other__, in every family with a model label. The aggregate
// loses nothing: index_entries still sums to the index's keys and the
// lookup counters to the calls.
func TestManyModelsBoundedExposition(t *testing.T) {
	const models = 10_000
	m := servermetrics.New()
	name := func(i int) string { return fmt.Sprintf("org/model-%05d", i) }
	// The index reports the models in reverse order, so the first models
	// it reports are not the busiest ones.
	var keys int64
	for i := models - 1; i >= 0; i-- {
		m.SetIndexEntries(name(i), int64(1+i%7))
		keys += int64(1 + i%7)
	}
	m.RegisterLoads(func(_ int64, fn func(engine.LoadView)) {
		for i := range models {
			for r := range 2 {
				fn(engine.LoadView{Tenant: "team", Model: name(i), Replica: fmt.Sprintf("%s-r%d", name(i), r), Fresh: true, QueueTokens: 10, Waiting: 1})
			}
		}
	})
	// Models 0..99 are the busiest: 10 lookups each; the others get one.
	calls := 0
	for i := range models {
		n := 1
		if i < 100 {
			n = 10 + (100 - i) // 0 busiest, then 1, ...
		}
		for range n {
			m.ObserveLookup(name(i), "PREFIX_MATCH", true, time.Microsecond)
			calls++
		}
	}
	m.RetireDrainedModels() // the sweep's pass ranks the models
	for i := range models {
		m.ObserveLookup(name(i), "NO_HINT", false, time.Microsecond)
		calls++
	}

	code, body := scrape(t, m.Handler())
	if code != http.StatusOK {
		t.Fatalf("scrape: %d", code)
	}
	fams, lines := parseExposition(t, body)
	vals := modelValues(fams)
	t.Logf("%d models: %d exposition lines, %d bytes, %d model label values", models, lines, len(body), len(vals))
	if len(vals) != servermetrics.DefaultMaxModels+1 || !vals[servermetrics.OtherModel] {
		t.Fatalf("%d distinct model label values, want %d (the busiest) and %s", len(vals), servermetrics.DefaultMaxModels, servermetrics.OtherModel)
	}
	for i := range servermetrics.DefaultMaxModels {
		if !vals[name(i)] {
			t.Fatalf("busy model %s has no series of its own", name(i))
		}
	}
	if lines > 4000 {
		t.Fatalf("%d exposition lines for %d models, want a bound independent of the model count", lines, models)
	}

	var sumEntries, sumCalls float64
	for _, s := range fams[servermetrics.NameIndexEntries].GetMetric() {
		sumEntries += s.GetGauge().GetValue()
	}
	for _, s := range fams[servermetrics.NameLookupCalls].GetMetric() {
		sumCalls += s.GetCounter().GetValue()
	}
	if sumEntries != float64(keys) {
		t.Errorf("index_entries sums to %v, want the index's %d keys", sumEntries, keys)
	}
	// Calls counted in a series that a demotion deleted are gone with it
	// (as when a drained model retires); the ones since the pass are all
	// there.
	if sumCalls < models || sumCalls > float64(calls) {
		t.Errorf("lookup_route_calls_total sums to %v, want between %d and %d", sumCalls, models, calls)
	}
}

// blockingCollector holds every Collect until released, and records how
// many ran at once.
type blockingCollector struct {
	desc    *prometheus.Desc
	release chan struct{}
	// inFlight and peak are updated by the scrape goroutines.
	inFlight, peak atomic.Int64
}

func (b *blockingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }

func (b *blockingCollector) Collect(ch chan<- prometheus.Metric) {
	n := b.inFlight.Add(1)
	for {
		p := b.peak.Load()
		if n <= p || b.peak.CompareAndSwap(p, n) {
			break
		}
	}
	<-b.release
	b.inFlight.Add(-1)
	ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, 1)
}

// TestConcurrentScrapesBounded: 200 concurrent scrapes of /metrics gather
// at most DefaultMaxScrapesInFlight at a time; the others are answered
// 503 at once instead of each building its own copy of the exposition.
func TestConcurrentScrapesBounded(t *testing.T) {
	const clients = 200
	m := servermetrics.New()
	bc := &blockingCollector{desc: prometheus.NewDesc("test_blocking", "Holds scrapes in flight.", nil, nil), release: make(chan struct{})}
	m.Registry().MustRegister(bc)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	codes := make(chan int, clients)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	// While the gathers are held: the refused scrapes answer at once, and
	// no more than the limit gather. Stop waiting early if the limit is
	// already broken.
	refused := 0
	deadline := time.After(30 * time.Second)
wait:
	for refused < clients-servermetrics.DefaultMaxScrapesInFlight {
		if bc.peak.Load() > servermetrics.DefaultMaxScrapesInFlight {
			break
		}
		select {
		case c := <-codes:
			if c != http.StatusServiceUnavailable {
				t.Errorf("a scrape answered %d while the gathers were held, want 503", c)
			}
			refused++
		case <-deadline:
			break wait
		case <-time.After(10 * time.Millisecond):
		}
	}
	if p := bc.peak.Load(); p > servermetrics.DefaultMaxScrapesInFlight {
		close(bc.release)
		wg.Wait()
		t.Fatalf("%d scrapes gathered at once, want at most %d", p, servermetrics.DefaultMaxScrapesInFlight)
	}
	if refused != clients-servermetrics.DefaultMaxScrapesInFlight {
		t.Fatalf("%d scrapes refused while %d gathered, want %d", refused, bc.inFlight.Load(), clients-servermetrics.DefaultMaxScrapesInFlight)
	}
	close(bc.release)
	wg.Wait()
	close(codes)
	ok := 0
	for c := range codes {
		if c == http.StatusOK {
			ok++
		}
	}
	if ok != servermetrics.DefaultMaxScrapesInFlight {
		t.Fatalf("%d scrapes answered 200 after the release, want %d", ok, servermetrics.DefaultMaxScrapesInFlight)
	}
	// The slots are free again.
	if code, _ := scrape(t, m.Handler()); code != http.StatusOK {
		t.Fatalf("a scrape after the flood: %d", code)
	}
}

// TestScrapeTimeout: a gather slower than the scrape timeout is answered
// 503 when the timeout passes, not when the gather ends.
func TestScrapeTimeout(t *testing.T) {
	m, err := servermetrics.NewWithOptions(servermetrics.Options{ScrapeTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	bc := &blockingCollector{desc: prometheus.NewDesc("test_blocking", "Holds scrapes in flight.", nil, nil), release: make(chan struct{})}
	m.Registry().MustRegister(bc)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	defer close(bc.release) // before the server closes: the gather still holds its goroutine
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("a scrape past its timeout: %v, want a 503", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a scrape past its timeout: %d, want 503", resp.StatusCode)
	}
}
