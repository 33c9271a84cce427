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

// TestPromptTemplateSlots: the apiserver refuses a PromptTemplate whose body
// reads a slot it does not declare, declares one it never reads, or does
// not compile, naming the field and the slot; an UPDATE is refused only for
// what it newly breaks.
func TestPromptTemplateSlots(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "pt-slots", false)
	pt := func(name, body string, slots ...v1alpha1.PromptTemplateSlot) *v1alpha1.PromptTemplate {
		return &v1alpha1.PromptTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.PromptTemplateSpec{Body: body, Slots: slots}}
	}
	stable := func(n string) v1alpha1.PromptTemplateSlot {
		return v1alpha1.PromptTemplateSlot{Name: n, Type: v1alpha1.SlotStable}
	}
	mutable := func(n string) v1alpha1.PromptTemplateSlot {
		return v1alpha1.PromptTemplateSlot{Name: n, Type: v1alpha1.SlotMutable, Required: true}
	}
	ok := pt("ok", "{{ system }}\n{% for d in docs %}{{ d }}{% endfor %}\nUser: {{ question }}", stable("system"), stable("docs"), mutable("question"))
	wantOK(t, "valid template", k8s.Create(ctx, ok))
	wantOK(t, "no slots", k8s.Create(ctx, pt("plain", "You are a helpful assistant.")))

	wantDenied(t, "undeclared slot", k8s.Create(ctx, pt("undeclared", "{{ system }} {{ user }}", stable("system"))),
		"spec.body", `"user"`, "not a declared slot")
	wantDenied(t, "unused slot", k8s.Create(ctx, pt("unused", "{{ system }}", stable("system"), mutable("question"))),
		"spec.slots[1].name", `"question"`, "never uses")
	wantDenied(t, "body does not compile", k8s.Create(ctx, pt("broken", "{% if system %}{{ system }}", stable("system"))),
		"spec.body")

	// UPDATE: dropping a slot the body reads is refused; a description
	// edit is admitted.
	wantDenied(t, "drop a used slot", update(ctx, ok, func(p *v1alpha1.PromptTemplate) {
		p.Spec.Slots = p.Spec.Slots[:2]
	}), "spec.body", `"question"`)
	wantOK(t, "description edit", update(ctx, ok, func(p *v1alpha1.PromptTemplate) { p.Spec.Slots[0].Description = "the fixed system prompt" }))
}
