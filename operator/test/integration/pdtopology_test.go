package integration

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
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

// TestPDTopologyReconciler: the controller pushes a PDTopology and a
// PromptTemplate to the routing server (schema v8) and reports the
// topology's pools and Ready: NoPrefillReplicas until a pod matches a
// prefill pool, NoDecodeReplicas until one matches a decode pool, then
// Propagated; against a server that refuses version 8 it falls back to
// version 7 and says NotPropagated, and recovers once the server takes v8.
func TestPDTopologyReconciler(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "pd-reconcile", false)
	t.Cleanup(func() { srv.refuseV8.Store(false) })
	top := &v1alpha1.PDTopology{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pd"}, Spec: v1alpha1.PDTopologySpec{
		PrefillPools: []v1alpha1.PDPool{{Name: "fill", MatchLabels: map[string]string{"side": "prefill"}}},
		DecodePools:  []v1alpha1.PDPool{{Name: "gen", MatchLabels: map[string]string{"side": "decode"}}},
		Transport:    v1alpha1.TransportMooncake,
	}}
	wantOK(t, "topology", k8s.Create(ctx, top))
	tmpl := &v1alpha1.PromptTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "support"}, Spec: v1alpha1.PromptTemplateSpec{
		Body:  "{{ system }}\nUser: {{ question }}",
		Slots: []v1alpha1.PromptTemplateSlot{{Name: "system", Type: v1alpha1.SlotStable}, {Name: "question", Type: v1alpha1.SlotMutable}},
	}}
	wantOK(t, "template", k8s.Create(ctx, tmpl))

	ready := func(reason string, members map[string]int32) {
		t.Helper()
		eventually(t, propagationLimit, func() error {
			var got v1alpha1.PDTopology
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(top), &got); err != nil {
				return err
			}
			c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady)
			if c == nil || c.Reason != reason {
				return fmt.Errorf("Ready %+v, want reason %s", c, reason)
			}
			if want := reason == v1alpha1.ReasonTopologyPropagated; (c.Status == metav1.ConditionTrue) != want {
				return fmt.Errorf("Ready %s with reason %s", c.Status, reason)
			}
			for _, p := range got.Status.Pools {
				if n, ok := members[p.Name]; ok && p.Members != n {
					return fmt.Errorf("pool %s has %d members, want %d", p.Name, p.Members, n)
				}
			}
			if got.Status.ObservedGeneration != got.Generation {
				return fmt.Errorf("observedGeneration %d of %d", got.Status.ObservedGeneration, got.Generation)
			}
			return nil
		})
	}
	ready(v1alpha1.ReasonNoPrefillReplicas, map[string]int32{"fill": 0, "gen": 0})
	// What the server took: the topology and the template, by namespace/name.
	eventually(t, propagationLimit, func() error {
		snap := srv.store.Load().Load()
		tp := snap.Topology("pd", ns)
		if tp == nil || tp.Transport != "Mooncake" || !tp.HasPrefillPool("fill") || !tp.HasDecodePool("gen") {
			return fmt.Errorf("server topology %+v", tp)
		}
		// The revision the PromptTemplate reconciler writes to
		// status.templateRevision (TestPromptTemplateRevision).
		want := controller.TemplateRevision(&tmpl.Spec)
		if st := snap.Template("support", ns); st == nil || st.Revision != want || st.Body != tmpl.Spec.Body {
			return fmt.Errorf("server template %+v, want revision %q", st, want)
		}
		return nil
	})

	enginePod(t, ctx, ns, "prefill-0", map[string]string{"side": "prefill"}, nil)
	ready(v1alpha1.ReasonNoDecodeReplicas, map[string]int32{"fill": 1, "gen": 0})
	enginePod(t, ctx, ns, "decode-0", map[string]string{"side": "decode"}, nil)
	enginePod(t, ctx, ns, "decode-1", map[string]string{"side": "decode"}, nil)
	ready(v1alpha1.ReasonTopologyPropagated, map[string]int32{"fill": 1, "gen": 2})

	// A version-7 server: the fallback body carries no topology, so the
	// topology is not routable and says so.
	srv.refuseV8.Store(true)
	wantOK(t, "edit the topology", update(ctx, top, func(p *v1alpha1.PDTopology) { p.Spec.SkipPrefillBelowTokens = ptr(int32(1024)) }))
	ready(v1alpha1.ReasonNotPropagated, nil)
	srv.refuseV8.Store(false)
	ready(v1alpha1.ReasonTopologyPropagated, nil)
	eventually(t, propagationLimit, func() error {
		if tp := srv.store.Load().Load().Topology("pd", ns); tp == nil || tp.SkipBelow != 1024 {
			return fmt.Errorf("server topology %+v, want skipPrefillBelowTokens 1024", tp)
		}
		return nil
	})
}
