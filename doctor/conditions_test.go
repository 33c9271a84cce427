package doctor

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSplitConditions: a condition is judged by its own observedGeneration,
// or by status.observedGeneration when it carries none; older than the
// spec's generation is stale.
func TestSplitConditions(t *testing.T) {
	conds := []metav1.Condition{
		{Type: "Own", Status: metav1.ConditionTrue, ObservedGeneration: 3},
		{Type: "OwnOld", Status: metav1.ConditionTrue, ObservedGeneration: 2},
		{Type: "Inherits", Status: metav1.ConditionFalse},
	}
	for _, c := range []struct {
		gen, statusGen int64
		current, stale []string
	}{
		{3, 3, []string{"Own", "Inherits"}, []string{"OwnOld"}},
		{3, 2, []string{"Own"}, []string{"OwnOld", "Inherits"}},
		{2, 0, []string{"Own", "OwnOld"}, []string{"Inherits"}},
		{4, 4, []string{"Inherits"}, []string{"Own", "OwnOld"}},
	} {
		cur, stale := splitConditions(conds, c.gen, c.statusGen)
		if got := condTypes(cur); !slices.Equal(got, c.current) {
			t.Errorf("gen %d status %d: current %v, want %v", c.gen, c.statusGen, got, c.current)
		}
		if got := condTypes(stale); !slices.Equal(got, c.stale) {
			t.Errorf("gen %d status %d: stale %v, want %v", c.gen, c.statusGen, got, c.stale)
		}
	}
	if got, want := describeStale(conds[1:], 2), "OwnOld=True (generation 2), Inherits=False (generation 2)"; got != want {
		t.Errorf("describeStale = %q, want %q", got, want)
	}
}

func condTypes(cs []metav1.Condition) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Type)
	}
	return out
}

func TestNameList(t *testing.T) {
	if got := nameList([]string{"a", "b", "c"}, 2); got != "a, b and 1 more" {
		t.Errorf("nameList = %q", got)
	}
	if got := nameList([]string{"a", "b"}, 2); got != "a, b" {
		t.Errorf("nameList = %q", got)
	}
}
