package servermetrics_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/servermetrics"
)

// fakeClock is a settable clock for the drain grace period.
type fakeClock struct {
	mu  sync.Mutex // guards t
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newMetrics(t *testing.T, o servermetrics.Options) (*servermetrics.Metrics, *fakeClock) {
	t.Helper()
	clk := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	if o.Now == nil {
		o.Now = clk.Now
	}
	m, err := servermetrics.NewWithOptions(o)
	if err != nil {
		t.Fatal(err)
	}
	return m, clk
}

// seriesModels returns the model label values of a family's series.
func seriesModels(t *testing.T, m *servermetrics.Metrics, name string) []string {
	t.Helper()
	var out []string
	for _, s := range gather(t, m)[name].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "model" {
				out = append(out, l.GetValue())
			}
		}
	}
	return out
}

// TestLookupSeriesOnlyForKnownModels: a lookup naming a model the index
// does not hold (and that is not configured) is recorded under the shared
// model label; the index's models and the configured ones get their own.
func TestLookupSeriesOnlyForKnownModels(t *testing.T) {
	m, _ := newMetrics(t, servermetrics.Options{Models: []string{"qwen"}})
	for i := range 1000 {
		m.ObserveLookup(fmt.Sprintf("ghost-%d", i), "UNKNOWN_MODEL", false, time.Microsecond)
	}
	m.ObserveLookup(strings.Repeat("x", 7<<20), "NO_HINT", false, time.Microsecond)
	m.ObserveLookup("bad\xffutf8", "NO_HINT", false, time.Microsecond)
	m.SetIndexEntries("llama", 3)
	m.ObserveLookup("llama", "PREFIX_MATCH", true, time.Microsecond)
	m.ObserveLookup("qwen", "NO_HINT", false, time.Microsecond)

	fams := gather(t, m)
	other := servermetrics.OtherModel
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{servermetrics.NameLookupCalls, "hint_used=false,model=" + other + ",reason_code=UNKNOWN_MODEL", 1000},
		{servermetrics.NameLookupCalls, "hint_used=false,model=" + other + ",reason_code=NO_HINT", 2},
		{servermetrics.NameLookupLatency, "model=" + other, 1002},
		{servermetrics.NameLookupCalls, "hint_used=true,model=llama,reason_code=PREFIX_MATCH", 1},
		{servermetrics.NameLookupLatency, "model=llama", 1},
		{servermetrics.NameLookupCalls, "hint_used=false,model=qwen,reason_code=NO_HINT", 1},
		{servermetrics.NameLookupLatency, "model=qwen", 1},
		{servermetrics.NameIndexEntries, "model=llama", 3},
	} {
		if got, ok := value(fams, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s{%s} = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if got := seriesModels(t, m, servermetrics.NameLookupLatency); len(got) != 3 {
		t.Errorf("latency series for models %v, want llama, qwen and %s", got, other)
	}
	if n := len(fams[servermetrics.NameLookupCalls].GetMetric()); n != 4 {
		t.Errorf("%d call series, want 4", n)
	}
}

// TestDrainedModelRetired: a model that drains to 0 keys keeps its series
// (index_entries reading 0) for the grace period; then its lookups move to
// the shared label and, one retirement pass later, its series disappear.
// Keys coming back revive it. Configured models are never retired.
func TestDrainedModelRetired(t *testing.T) {
	const grace = 10 * time.Minute
	m, clk := newMetrics(t, servermetrics.Options{Models: []string{"pinned"}, ModelGrace: grace})
	for _, model := range []string{"llama", "pinned"} {
		m.SetIndexEntries(model, 5)
		m.ObserveLookup(model, "PREFIX_MATCH", true, time.Microsecond)
		m.SetIndexEntries(model, 0)
	}
	clk.Add(grace - time.Second)
	if n := m.RetireDrainedModels(); n != 0 {
		t.Fatalf("retired %d models inside the grace period", n)
	}
	if got, ok := value(gather(t, m), servermetrics.NameIndexEntries, "model=llama"); !ok || got != 0 {
		t.Fatalf("drained model's index_entries = %v (present %v), want 0 during the grace period", got, ok)
	}
	clk.Add(time.Second)
	if n := m.RetireDrainedModels(); n != 1 {
		t.Fatalf("retired %d models after the grace period, want 1 (llama)", n)
	}
	m.ObserveLookup("llama", "UNKNOWN_MODEL", false, time.Microsecond)
	if got, _ := value(gather(t, m), servermetrics.NameLookupCalls, "hint_used=false,model="+servermetrics.OtherModel+",reason_code=UNKNOWN_MODEL"); got != 1 {
		t.Fatalf("a retired model's lookup is not under the shared label: %v", got)
	}
	m.RetireDrainedModels() // deletes the series retired by the previous pass
	for _, name := range []string{servermetrics.NameIndexEntries, servermetrics.NameLookupCalls, servermetrics.NameLookupLatency} {
		for _, model := range seriesModels(t, m, name) {
			if model == "llama" {
				t.Fatalf("%s{model=llama} still exported after retirement", name)
			}
		}
	}
	if got, ok := value(gather(t, m), servermetrics.NameLookupCalls, "hint_used=true,model=pinned,reason_code=PREFIX_MATCH"); !ok || got != 1 {
		t.Fatalf("configured model lost its series: %v %v", got, ok)
	}

	// Keys come back: own series again, counting from zero.
	m.SetIndexEntries("llama", 2)
	m.ObserveLookup("llama", "PREFIX_MATCH", true, time.Microsecond)
	fams := gather(t, m)
	if got, _ := value(fams, servermetrics.NameIndexEntries, "model=llama"); got != 2 {
		t.Fatalf("revived index_entries = %v", got)
	}
	if got, _ := value(fams, servermetrics.NameLookupCalls, "hint_used=true,model=llama,reason_code=PREFIX_MATCH"); got != 1 {
		t.Fatalf("revived call count = %v, want 1", got)
	}
}

// TestRetiredModelRevivedBeforeDeletion: keys returning between the two
// retirement passes keep the model's series (and their counts).
func TestRetiredModelRevivedBeforeDeletion(t *testing.T) {
	m, clk := newMetrics(t, servermetrics.Options{ModelGrace: time.Minute})
	m.SetIndexEntries("llama", 1)
	m.ObserveLookup("llama", "PREFIX_MATCH", true, time.Microsecond)
	m.SetIndexEntries("llama", 0)
	clk.Add(time.Minute)
	if n := m.RetireDrainedModels(); n != 1 {
		t.Fatalf("retired %d, want 1", n)
	}
	m.SetIndexEntries("llama", 4)
	m.RetireDrainedModels()
	m.ObserveLookup("llama", "PREFIX_MATCH", true, time.Microsecond)
	fams := gather(t, m)
	if got, _ := value(fams, servermetrics.NameLookupCalls, "hint_used=true,model=llama,reason_code=PREFIX_MATCH"); got != 2 {
		t.Fatalf("call count = %v, want 2 (kept across the revival)", got)
	}
	if got, _ := value(fams, servermetrics.NameIndexEntries, "model=llama"); got != 4 {
		t.Fatalf("index_entries = %v, want 4", got)
	}
}

func TestOptionsValidation(t *testing.T) {
	for _, models := range [][]string{
		{""},
		{servermetrics.OtherModel},
		{strings.Repeat("m", servermetrics.MaxModelLabelBytes+1)},
		{"bad\xff"},
	} {
		if _, err := servermetrics.NewWithOptions(servermetrics.Options{Models: models}); err == nil {
			t.Errorf("models %.40q accepted", models)
		}
	}
	for _, o := range []servermetrics.Options{
		{ModelGrace: -time.Second}, {MaxModels: -1}, {MaxScrapesInFlight: -1}, {ScrapeTimeout: -time.Second},
	} {
		if _, err := servermetrics.NewWithOptions(o); err == nil {
			t.Errorf("options %+v accepted", o)
		}
	}
}

// TestRetireRacesLookups races lookups, entry reports and retirement passes
// (for the race detector), then checks no call was lost while no model
// was retired.
func TestRetireRacesLookups(t *testing.T) {
	m, clk := newMetrics(t, servermetrics.Options{ModelGrace: time.Nanosecond})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				model := fmt.Sprintf("m%d", (i+g)%8)
				switch i % 3 {
				case 0:
					m.SetIndexEntries(model, int64(i%2))
				default:
					m.ObserveLookup(model, "NO_HINT", false, time.Microsecond)
				}
			}
		})
	}
	wg.Go(func() {
		for range 200 {
			clk.Add(time.Millisecond)
			m.RetireDrainedModels()
		}
	})
	wg.Wait()
	if _, err := m.Registry().Gather(); err != nil {
		t.Fatal(err)
	}
}

// TestBusiestModelsKeepSeries: with MaxModels 2, the first two models the
// index reports get series at once; each ranking pass then gives them to
// the two models with the most lookups since the previous pass (ties to
// the models that have them), deleting the others' at once; the keys and
// lookups of the models without series count under the shared value, so
// index_entries keeps summing to the index's keys.
func TestBusiestModelsKeepSeries(t *testing.T) {
	m, _ := newMetrics(t, servermetrics.Options{MaxModels: 2, Models: []string{"pinned"}})
	other := servermetrics.OtherModel
	m.SetIndexEntries("a", 1)
	m.SetIndexEntries("b", 2)
	m.SetIndexEntries("c", 4)
	m.SetIndexEntries(other, 8) // a model literally named like the shared value
	m.SetIndexEntries("pinned", 16)
	entries := func() map[string]float64 {
		out := map[string]float64{}
		for _, s := range gather(t, m)[servermetrics.NameIndexEntries].GetMetric() {
			out[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
		}
		return out
	}
	want := func(what string, got, want map[string]float64) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: index_entries %v, want %v", what, got, want)
		}
	}
	want("first come", entries(), map[string]float64{"a": 1, "b": 2, other: 12, "pinned": 16})

	lookups := func(model string, n int) {
		for range n {
			m.ObserveLookup(model, "PREFIX_MATCH", true, time.Microsecond)
		}
	}
	lookups("c", 5)
	lookups("b", 3)
	lookups("a", 3)
	lookups("pinned", 1)
	if got, _ := value(gather(t, m), servermetrics.NameLookupCalls, "hint_used=true,model="+other+",reason_code=PREFIX_MATCH"); got != 5 {
		t.Fatalf("c's lookups before the pass: %v under %s, want 5", got, other)
	}
	m.RetireDrainedModels()
	// c (5) first; a and b tie at 3, both holding series: the most keys (b).
	want("after a pass", entries(), map[string]float64{"b": 2, "c": 4, other: 9, "pinned": 16})
	for _, model := range seriesModels(t, m, servermetrics.NameLookupLatency) {
		if model == "a" {
			t.Fatal("the demoted model's lookup series were not deleted")
		}
	}
	lookups("a", 1)
	m.RetireDrainedModels() // a is the only model looked up since: a, then c (b and c hold series; c has more keys)
	want("after a second pass", entries(), map[string]float64{"a": 1, "c": 4, other: 10, "pinned": 16})
	lookups("a", 2)
	fams := gather(t, m)
	if got, _ := value(fams, servermetrics.NameLookupCalls, "hint_used=true,model=a,reason_code=PREFIX_MATCH"); got != 2 {
		t.Fatalf("a promoted again counts %v, want 2 (new series)", got)
	}
	if got, _ := value(fams, servermetrics.NameLookupCalls, "hint_used=true,model=pinned,reason_code=PREFIX_MATCH"); got != 1 {
		t.Fatalf("the configured model counts %v, want 1 (never demoted)", got)
	}
	if got := len(seriesModels(t, m, servermetrics.NameLookupLatency)); got > 2+1+1 {
		t.Fatalf("%d latency series, want at most MaxModels + configured + shared", got)
	}
}

// TestRetiringKeepsItsSlot: a retired model holds its place among the
// MaxModels until its series are deleted, so a new model the index reports
// meanwhile waits under the shared value, and the bound holds throughout.
func TestRetiringKeepsItsSlot(t *testing.T) {
	m, clk := newMetrics(t, servermetrics.Options{MaxModels: 1, ModelGrace: time.Minute})
	m.SetIndexEntries("old", 3)
	m.SetIndexEntries("old", 0)
	clk.Add(time.Minute)
	if n := m.RetireDrainedModels(); n != 1 {
		t.Fatalf("retired %d, want 1", n)
	}
	m.SetIndexEntries("new", 5)
	if got := seriesModels(t, m, servermetrics.NameIndexEntries); fmt.Sprint(got) != fmt.Sprint([]string{servermetrics.OtherModel, "old"}) {
		t.Fatalf("index_entries models %v, want the retiring one and the shared value", got)
	}
	m.RetireDrainedModels() // deletes old's series, then ranks: new gets the slot
	if got := seriesModels(t, m, servermetrics.NameIndexEntries); fmt.Sprint(got) != fmt.Sprint([]string{servermetrics.OtherModel, "new"}) {
		t.Fatalf("index_entries models %v, want new and the shared value (at 0)", got)
	}
	if got, _ := value(gather(t, m), servermetrics.NameIndexEntries, "model="+servermetrics.OtherModel); got != 0 {
		t.Fatalf("shared index_entries %v, want 0", got)
	}
}
