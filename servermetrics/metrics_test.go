package servermetrics_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/inferencecache/inferencecache/controlserver/auth"
	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/servermetrics"
)

var (
	_ engine.Metrics = (*servermetrics.Metrics)(nil)
	_ auth.Recorder  = servermetrics.AuthRecorder{}
)

func gather(t *testing.T, m *servermetrics.Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

func labels(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(parts, ",")
}

// value returns the counter or gauge value of the series with the given
// labels ("k=v,k=v" in label-name order), and whether it exists.
func value(fams map[string]*dto.MetricFamily, name, lbls string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		if labels(m) == lbls {
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue(), true
			case m.Gauge != nil:
				return m.GetGauge().GetValue(), true
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func TestMetrics(t *testing.T) {
	m := servermetrics.New()
	fams := gather(t, m)
	for _, name := range []string{servermetrics.NameServerUp, servermetrics.NameGRPCTLSEnabled, "go_goroutines", "process_cpu_seconds_total"} {
		if fams[name] == nil {
			t.Fatalf("%s missing from a fresh registry", name)
		}
	}
	// Lazily created series are absent until first written.
	for _, name := range []string{servermetrics.NameLookupCalls, servermetrics.NameTenantEvictions, servermetrics.NameIndexEvictions, servermetrics.NameIndexEntries} {
		if fams[name] != nil {
			t.Fatalf("%s has series before any write", name)
		}
	}

	m.SetUp(true)
	m.SetTLSEnabled(true)
	// The index holds both models, so their lookups get their own series.
	m.SetIndexEntries("llama", 10)
	m.SetIndexEntries("qwen", 1)
	m.ObserveLookup("llama", "PREFIX_MATCH", true, 300*time.Microsecond)
	m.ObserveLookup("llama", "PREFIX_MATCH", true, 50*time.Microsecond)
	m.ObserveLookup("llama", "NO_HINT", false, 0)
	m.ObserveLookup("qwen", "TIMEOUT", false, 200*time.Millisecond)
	m.AddIndexEvictions("lru", "cap", 3)
	m.AddIndexEvictions("lfu", "ttl", 2)
	m.AddIndexEvictions("lfu", "ttl", 0)
	m.AddTenantEvictions("team-a", 4)
	m.SetIndexEntries("llama", 0)
	m.SnapshotAuth().Record(auth.ResultOK)
	m.PolicyAuth().Record(auth.ResultUnauth)
	m.PolicyAuth().Record(auth.ResultUnauth)
	m.ProbeAuth().Record(auth.ResultForbidden)
	m.TimestampClamped("ReportCacheState")
	m.TimestampClamped("ReportCacheState")

	fams = gather(t, m)
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{servermetrics.NameServerUp, "", 1},
		{servermetrics.NameGRPCTLSEnabled, "", 1},
		{servermetrics.NameLookupCalls, "hint_used=true,model=llama,reason_code=PREFIX_MATCH", 2},
		{servermetrics.NameLookupCalls, "hint_used=false,model=llama,reason_code=NO_HINT", 1},
		{servermetrics.NameLookupCalls, "hint_used=false,model=qwen,reason_code=TIMEOUT", 1},
		{servermetrics.NameLookupLatency, "model=llama", 3},
		{servermetrics.NameLookupLatency, "model=qwen", 1},
		{servermetrics.NameIndexEvictions, "algorithm=lru,reason=cap", 3},
		{servermetrics.NameIndexEvictions, "algorithm=lfu,reason=ttl", 2},
		{servermetrics.NameTenantEvictions, "reason=over_entries,tenant_id=team-a", 4},
		{servermetrics.NameIndexEntries, "model=llama", 0},
		{servermetrics.NameIndexEntries, "model=qwen", 1},
		{servermetrics.NameSnapshotAuth, "result=ok", 1},
		{servermetrics.NamePolicyAuth, "result=unauth", 2},
		{servermetrics.NameProbeAuth, "result=forbidden", 1},
		{servermetrics.NameTimestampsClamped, "rpc=ReportCacheState", 2},
		{servermetrics.NameTimestampsClamped, "rpc=PublishEvent", 0},
	} {
		if got, ok := value(fams, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s{%s} = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if n := len(fams[servermetrics.NameLookupCalls].GetMetric()); n != 3 {
		t.Errorf("%d call series, want 3", n)
	}
	// Buckets exactly as the spec lists them, and the observations in them.
	var h *dto.Histogram
	for _, s := range fams[servermetrics.NameLookupLatency].GetMetric() {
		if labels(s) == "model=llama" {
			h = s.GetHistogram()
		}
	}
	var bounds []float64
	for _, b := range h.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	if !slices.Equal(bounds, []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1}) {
		t.Errorf("buckets = %v", bounds)
	}
	// llama: 0 and 50µs land in <=100µs, 300µs in <=500µs.
	if c := h.GetBucket()[0].GetCumulativeCount(); c != 2 {
		t.Errorf("<=100µs count = %d, want 2", c)
	}
	if c := h.GetBucket()[2].GetCumulativeCount(); c != 3 {
		t.Errorf("<=500µs count = %d, want 3", c)
	}
	m.SetUp(false)
	if got, _ := value(gather(t, m), servermetrics.NameServerUp, ""); got != 0 {
		t.Errorf("server_up = %v after SetUp(false)", got)
	}
}

// TestObserveLookupAllocs: once a series exists, recording allocates
// nothing (the LookupRoute hot path budget), for a known model and for one
// under the shared label.
func TestObserveLookupAllocs(t *testing.T) {
	m := servermetrics.New()
	m.ObserveLookup("llama", "PREFIX_MATCH", true, time.Millisecond)
	m.SetIndexEntries("llama", 1)
	m.ObserveLookup("ghost", "UNKNOWN_MODEL", false, time.Millisecond)
	if n := testing.AllocsPerRun(1000, func() {
		m.ObserveLookup("llama", "PREFIX_MATCH", true, time.Millisecond)
		m.ObserveLookup("ghost", "UNKNOWN_MODEL", false, time.Millisecond)
		m.SetIndexEntries("llama", 2)
	}); n != 0 {
		t.Fatalf("allocs/op = %v, want 0", n)
	}
}

// TestObserveLookupConcurrent races first-time series creation.
func TestObserveLookupConcurrent(t *testing.T) {
	m := servermetrics.New()
	m.SetIndexEntries("a", 1)
	m.SetIndexEntries("b", 1)
	var wg sync.WaitGroup
	reasons := []string{"PREFIX_MATCH", "NO_HINT", "TENANT_HOT", "AFFINITY_HINT"}
	for g := 0; g < 8; g++ {
		wg.Go(func() {
			for i := 0; i < 200; i++ {
				m.ObserveLookup([]string{"a", "b"}[i%2], reasons[(i+g)%4], (i+g)%4 != 1, time.Microsecond)
			}
		})
	}
	wg.Wait()
	fams := gather(t, m)
	var total float64
	for _, s := range fams[servermetrics.NameLookupCalls].GetMetric() {
		total += s.GetCounter().GetValue()
	}
	if total != 8*200 || len(fams[servermetrics.NameLookupCalls].GetMetric()) != 8 {
		t.Fatalf("total %v over %d series, want 1600 over 8", total, len(fams[servermetrics.NameLookupCalls].GetMetric()))
	}
}

// BenchmarkObserveLookup: the LookupRoute metric write for a model with its
// own series and for one under the shared label (a model the index does
// not hold).
func BenchmarkObserveLookup(b *testing.B) {
	m := servermetrics.New()
	m.SetIndexEntries("llama", 1)
	for _, model := range []string{"llama", "ghost-model-not-in-the-index"} {
		b.Run(model, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					m.ObserveLookup(model, "PREFIX_MATCH", true, 300*time.Microsecond)
				}
			})
		})
	}
}
