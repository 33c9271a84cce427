package claim

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

func TestPlacementOf(t *testing.T) {
	pool := func(name string, sel map[string]string) v1alpha1.PDPool {
		return v1alpha1.PDPool{Name: name, MatchLabels: sel}
	}
	top := func(name string, prefill, decode []v1alpha1.PDPool) v1alpha1.PDTopology {
		return v1alpha1.PDTopology{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1alpha1.PDTopologySpec{PrefillPools: prefill, DecodePools: decode}}
	}
	pf := map[string]string{"role": "prefill"}
	dc := map[string]string{"role": "decode"}
	app := map[string]string{"app": "llm"}
	tops := []v1alpha1.PDTopology{
		// Listed out of name order on purpose: "a" decides before "b".
		top("b", []v1alpha1.PDPool{pool("b-prefill", pf)}, []v1alpha1.PDPool{pool("b-decode", dc)}),
		top("a", []v1alpha1.PDPool{pool("prefill", pf), pool("wide", app), pool("all", nil)},
			[]v1alpha1.PDPool{pool("decode", dc), pool("wide", app)}),
	}
	for _, c := range []struct {
		labels map[string]string
		want   PDPlacement
	}{
		{map[string]string{"role": "prefill", "x": "y"}, PDPlacement{Topology: "a", Role: RolePrefill, Pool: "prefill"}},
		{map[string]string{"role": "decode"}, PDPlacement{Topology: "a", Role: RoleDecode, Pool: "decode"}},
		// One pool name on both sides: both roles, that pool.
		{map[string]string{"app": "llm"}, PDPlacement{Topology: "a", Role: RoleBoth, Pool: "wide"}},
		// Two prefill pools select it: any prefill pool.
		{map[string]string{"app": "llm", "role": "prefill"}, PDPlacement{Topology: "a", Role: RoleBoth}},
		// A pool without matchLabels selects nothing.
		{map[string]string{"other": "1"}, PDPlacement{}},
		{nil, PDPlacement{}},
	} {
		if got := PlacementOf(tops, c.labels); got != c.want {
			t.Errorf("%v: %+v, want %+v", c.labels, got, c.want)
		}
	}
	gone := top("a", []v1alpha1.PDPool{pool("prefill", pf)}, nil)
	now := metav1.Now()
	gone.DeletionTimestamp = &now
	if got := PlacementOf([]v1alpha1.PDTopology{gone, tops[0]}, pf); got != (PDPlacement{Topology: "b", Role: RolePrefill, Pool: "b-prefill"}) {
		t.Errorf("a deleting topology decided: %+v", got)
	}
}
