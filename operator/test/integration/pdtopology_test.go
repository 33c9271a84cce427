package integration

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// TestPDTopologyAcceleratorTypes: the apiserver refuses a pool whose
// acceleratorType names no entry of spec.acceleratorTypes, with the field
// and the known names in the message; on UPDATE only a newly broken pool.
func TestPDTopologyAcceleratorTypes(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "pdt", false)
	pdt := func(name, prefill, decode string) *v1alpha1.PDTopology {
		return &v1alpha1.PDTopology{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.PDTopologySpec{
			AcceleratorTypes: []v1alpha1.AcceleratorType{{Name: "h100", Vendor: "nvidia"}, {Name: "mi300", Vendor: "amd"}},
			PrefillPools:     []v1alpha1.PDPool{{Name: "prefill", AcceleratorType: prefill}},
			DecodePools:      []v1alpha1.PDPool{{Name: "decode", AcceleratorType: decode}},
		}}
	}
	ok := pdt("ok", "h100", "mi300")
	wantOK(t, "valid PDTopology", k8s.Create(ctx, ok))
	wantOK(t, "pools without an accelerator type", k8s.Create(ctx, pdt("untyped", "", "")))

	wantDenied(t, "unknown prefill type", k8s.Create(ctx, pdt("bad-prefill", "b200", "h100")),
		"spec.prefillPools[0].acceleratorType", `"b200"`, "h100, mi300")
	wantDenied(t, "unknown decode type", k8s.Create(ctx, pdt("bad-decode", "h100", "a10")),
		"spec.decodePools[0].acceleratorType", `"a10"`)
	none := pdt("no-types", "h100", "")
	none.Spec.AcceleratorTypes = nil
	wantDenied(t, "no accelerator types", k8s.Create(ctx, none), "spec.prefillPools[0].acceleratorType", "spec.acceleratorTypes is empty")

	// UPDATE: removing the type a pool names breaks it and is refused;
	// an unrelated edit is admitted.
	wantDenied(t, "drop a used type", update(ctx, ok, func(p *v1alpha1.PDTopology) {
		p.Spec.AcceleratorTypes = p.Spec.AcceleratorTypes[:1]
	}), "spec.decodePools[0].acceleratorType", `"mi300"`)
	wantOK(t, "unrelated update", update(ctx, ok, func(p *v1alpha1.PDTopology) { p.Spec.PrefillPools[0].Replicas = ptr(int32(2)) }))
}
