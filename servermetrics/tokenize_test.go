package servermetrics_test

import (
	"fmt"
	"testing"

	"github.com/inferencecache/inferencecache/servermetrics"
	"github.com/inferencecache/inferencecache/tokenizer/modeldir"
)

var _ modeldir.LoadFailureObserver = (*servermetrics.TokenizeMetrics)(nil)

// TestTokenizerLoadFailuresBounded: failed loads are counted per model and
// reason; models past the bound share the __other__ series.
func TestTokenizerLoadFailuresBounded(t *testing.T) {
	m := servermetrics.New()
	tm := m.RegisterTokenizer(modeldir.Reasons...)
	tm.TokenizerLoadFailed("org/a", modeldir.ReasonNotFound)
	tm.TokenizerLoadFailed("org/a", modeldir.ReasonNotFound)
	tm.TokenizerLoadFailed("org/a", modeldir.ReasonLoadFailed)
	for i := range servermetrics.MaxLoadFailureModels + 10 {
		tm.TokenizerLoadFailed(fmt.Sprintf("m%d", i), modeldir.ReasonNotFound)
	}
	fams := gather(t, m)
	if v, _ := value(fams, servermetrics.NameTokenizerLoadFailures, "model=org/a,reason=not_found"); v != 2 {
		t.Errorf("org/a not_found = %v, want 2", v)
	}
	if v, _ := value(fams, servermetrics.NameTokenizerLoadFailures, "model=org/a,reason=load_failed"); v != 1 {
		t.Errorf("org/a load_failed = %v, want 1", v)
	}
	// org/a and m0..m62 have their own series; m63.. are __other__.
	if v, _ := value(fams, servermetrics.NameTokenizerLoadFailures, "model=__other__,reason=not_found"); v != 11 {
		t.Errorf("__other__ = %v, want 11", v)
	}
	models := map[string]bool{}
	for _, s := range fams[servermetrics.NameTokenizerLoadFailures].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "model" {
				models[l.GetValue()] = true
			}
		}
	}
	if len(models) != servermetrics.MaxLoadFailureModels+1 {
		t.Errorf("%d model label values, want %d and __other__", len(models), servermetrics.MaxLoadFailureModels)
	}
}
