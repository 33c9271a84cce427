package controller

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/policy"
)

// This file turns PDTopologies and PromptTemplates into the version-8 lists
// of the /policy body (docs/pd.md, "What the controller pushes") and
// computes a PDTopology's status from its pools' pods and the push.

// RBAC: both kinds are listed and watched; PDTopology status is written with
// Update (the PromptTemplate reconciler patches templateRevision).
// +kubebuilder:rbac:groups=inferencecache.io,resources=pdtopologies;prompttemplates,verbs=list;watch
// +kubebuilder:rbac:groups=inferencecache.io,resources=pdtopologies/status,verbs=update

// PDResolution is the version-8 content of one pass.
type PDResolution struct {
	// Topologies and Templates are the entries pushed, sorted by
	// (namespace, name).
	Topologies []policy.PDTopology
	Templates  []policy.PromptTemplate
	// Invalid holds, per object left out, why: the server's decoder would
	// refuse the entry, and one bad entry fails the whole push with HTTP
	// 400 (an object admitted before the webhook or the CRD's rules, or
	// with a body over policy.MaxTemplateBodyBytes).
	Invalid map[types.NamespacedName]string
}

// TopologyEntry flattens a PDTopology into its /policy entry: the metadata
// that names it and its spec as is (lists in the CR's order).
func TopologyEntry(t *v1alpha1.PDTopology) policy.PDTopology {
	pools := func(in []v1alpha1.PDPool) []policy.PDPool {
		var out []policy.PDPool
		for _, p := range in {
			out = append(out, policy.PDPool{Name: p.Name, MatchLabels: p.MatchLabels, Replicas: p.Replicas, AcceleratorType: p.AcceleratorType})
		}
		return out
	}
	e := policy.PDTopology{
		Namespace: t.Namespace, Name: t.Name,
		PrefillPools: pools(t.Spec.PrefillPools), DecodePools: pools(t.Spec.DecodePools),
		Transport: string(t.Spec.Transport), SkipPrefillBelowTokens: t.Spec.SkipPrefillBelowTokens,
		KVLocality: string(t.Spec.KVLocality),
	}
	for _, a := range t.Spec.AcceleratorTypes {
		e.AcceleratorTypes = append(e.AcceleratorTypes, policy.AcceleratorType{Name: a.Name, Vendor: a.Vendor, Model: a.Model, MatchLabels: a.MatchLabels})
	}
	return e
}

// TemplateSlots maps spec.slots to the wire's slots (and
// prompttemplate.Validate's argument).
func TemplateSlots(spec *v1alpha1.PromptTemplateSpec) []policy.TemplateSlot {
	var out []policy.TemplateSlot
	for _, s := range spec.Slots {
		out = append(out, policy.TemplateSlot{Name: s.Name, Type: string(s.Type), Required: s.Required, Description: s.Description})
	}
	return out
}

// TemplateEntry is a PromptTemplate's /policy entry. Its templateRevision is
// computed from the spec being pushed rather than read from status, which
// lags a spec change until the PromptTemplate reconciler catches up; the two
// are the same function (TemplateRevision).
func TemplateEntry(t *v1alpha1.PromptTemplate) policy.PromptTemplate {
	return policy.PromptTemplate{Namespace: t.Namespace, Name: t.Name, Body: t.Spec.Body,
		Slots: TemplateSlots(&t.Spec), TemplateRevision: TemplateRevision(&t.Spec)}
}

// ResolvePD builds the version-8 lists from every PDTopology and
// PromptTemplate, sorted by (namespace, name). An entry the server would
// refuse is left out and recorded in Invalid: the rest still propagates.
func ResolvePD(tops []v1alpha1.PDTopology, tmpls []v1alpha1.PromptTemplate) PDResolution {
	res := PDResolution{Invalid: map[types.NamespacedName]string{}}
	tops = slices.Clone(tops)
	slices.SortFunc(tops, func(a, b v1alpha1.PDTopology) int { return compareNamespacedName(&a, &b) })
	for i := range tops {
		e := TopologyEntry(&tops[i])
		if err := serverAccepts(&policy.Body{PDTopologies: []policy.PDTopology{e}}); err != nil {
			res.Invalid[client.ObjectKeyFromObject(&tops[i])] = err.Error()
			continue
		}
		res.Topologies = append(res.Topologies, e)
	}
	tmpls = slices.Clone(tmpls)
	slices.SortFunc(tmpls, func(a, b v1alpha1.PromptTemplate) int { return compareNamespacedName(&a, &b) })
	for i := range tmpls {
		e := TemplateEntry(&tmpls[i])
		if err := serverAccepts(&policy.Body{PromptTemplates: []policy.PromptTemplate{e}}); err != nil {
			res.Invalid[client.ObjectKeyFromObject(&tmpls[i])] = err.Error()
			continue
		}
		res.Templates = append(res.Templates, e)
	}
	return res
}

// AddPD puts res's lists into b and sets b's version (policy.VersionFor).
func AddPD(b *policy.Body, res PDResolution) {
	b.PDTopologies, b.PromptTemplates = res.Topologies, res.Templates
	b.Version = policy.VersionFor(b)
}

// serverAccepts runs a one-entry body through the server's own decoder, so
// the controller leaves out exactly what the server would refuse.
func serverAccepts(b *policy.Body) error {
	b.Version, b.Policies = policy.PropagationVersion, []policy.ResolvedPolicy{}
	raw, err := json.Marshal(b)
	if err != nil {
		return fmt.Errorf("cannot encode the entry: %w", err)
	}
	if _, err := policy.Decode(bytes.NewReader(raw)); err != nil {
		return fmt.Errorf("the routing server would refuse it: %w", err)
	}
	return nil
}

// PoolMembers counts, per pool of t, the pods of pods (t's namespace's pod
// metadata) that the pool's matchLabels selects, leaving out terminating
// pods. A pool without matchLabels selects nothing: an empty selector
// would claim every pod of the namespace.
func PoolMembers(t *v1alpha1.PDTopology, pods []metav1.PartialObjectMetadata) []v1alpha1.PDPoolStatus {
	count := func(p v1alpha1.PDPool) int32 {
		if len(p.MatchLabels) == 0 {
			return 0
		}
		sel := labels.SelectorFromSet(p.MatchLabels)
		var n int32
		for i := range pods {
			if pods[i].DeletionTimestamp == nil && sel.Matches(labels.Set(pods[i].Labels)) {
				n++
			}
		}
		return n
	}
	var out []v1alpha1.PDPoolStatus
	for _, p := range t.Spec.PrefillPools {
		out = append(out, v1alpha1.PDPoolStatus{Name: p.Name, Side: v1alpha1.SidePrefill, Members: count(p)})
	}
	for _, p := range t.Spec.DecodePools {
		out = append(out, v1alpha1.PDPoolStatus{Name: p.Name, Side: v1alpha1.SideDecode, Members: count(p)})
	}
	return out
}

// PDTopologyStatus is t's status after a pass: observedGeneration, the pool
// members, and the Ready condition, the first that applies of
//
//   - False/Invalid: the server would refuse the entry (invalid, non-empty),
//     so it was not pushed;
//   - False/NotPropagated: no server acknowledged the push (none ready, or
//     every push failed), or a server refused the version-8 body and was
//     sent version 7 without topologies and templates (policy.WithoutVersion8);
//   - False/NoPrefillReplicas, False/NoDecodeReplicas: no pod matches any
//     pool of that side;
//   - True/Propagated.
//
// The propagation state comes first: without the topology on a server,
// LookupPDRoute answers UNKNOWN_TOPOLOGY whatever the pods. The
// condition's lastTransitionTime moves only when its status does
// (meta.SetStatusCondition), so a pass that changes nothing writes nothing.
func PDTopologyStatus(t *v1alpha1.PDTopology, st v1alpha1.PDTopologyStatus, members []v1alpha1.PDPoolStatus, invalid string, rep *pushReport) v1alpha1.PDTopologyStatus {
	st = *st.DeepCopy()
	st.ObservedGeneration = t.Generation
	st.Pools = members
	c := metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: t.Generation}
	var prefill, decode int32
	for _, m := range members {
		if m.Side == v1alpha1.SidePrefill {
			prefill += m.Members
		} else {
			decode += m.Members
		}
	}
	var acked, fellBack []pushResult
	var failed []pushResult
	for _, r := range rep.Results {
		switch {
		case r.err != nil:
			failed = append(failed, r)
		case r.refused != nil:
			fellBack = append(fellBack, r)
		default:
			acked = append(acked, r)
		}
	}
	switch {
	case invalid != "":
		c.Reason = v1alpha1.ReasonInvalidTopology
		c.Message = "not pushed: " + truncate(invalid, maxErrorLen)
	case len(fellBack) > 0:
		c.Reason = v1alpha1.ReasonNotPropagated
		c.Message = fmt.Sprintf("%s refused the version-8 policy body (%s) and was sent version 7 without PDTopologies and PromptTemplates; upgrade the routing server to route with this topology",
			serverList(fellBack), truncate(fellBack[0].refused.Error(), maxErrorLen))
	case len(rep.Results) == 0:
		c.Reason = v1alpha1.ReasonNotPropagated
		c.Message = fmt.Sprintf("the EndpointSlices of Service %s list no ready server endpoint; nothing was pushed", nsName(rep.Service))
	case len(acked) == 0:
		c.Reason = v1alpha1.ReasonNotPropagated
		c.Message = fmt.Sprintf("no server acknowledged the push: %s: %s", serverList(failed), truncate(failed[0].err.Error(), maxErrorLen))
	case prefill == 0:
		c.Reason = v1alpha1.ReasonNoPrefillReplicas
		c.Message = fmt.Sprintf("no pod in namespace %s matches the matchLabels of a prefill pool (%s)", t.Namespace, poolNames(t.Spec.PrefillPools))
	case decode == 0:
		c.Reason = v1alpha1.ReasonNoDecodeReplicas
		c.Message = fmt.Sprintf("no pod in namespace %s matches the matchLabels of a decode pool (%s)", t.Namespace, poolNames(t.Spec.DecodePools))
	default:
		c.Status, c.Reason = metav1.ConditionTrue, v1alpha1.ReasonTopologyPropagated
		c.Message = fmt.Sprintf("%d of %d ready servers took the topology; %d prefill and %d decode pods", len(acked), len(rep.Results), prefill, decode)
		if len(failed) > 0 {
			c.Message += fmt.Sprintf("; not acknowledged by %s", serverList(failed))
		}
	}
	meta.SetStatusCondition(&st.Conditions, c)
	return st
}

// serverList names the servers of rs, the first three and a count.
func serverList(rs []pushResult) string {
	names := make([]string, 0, len(rs))
	for _, r := range rs {
		names = append(names, r.server.Name)
	}
	slices.Sort(names)
	if len(names) > 3 {
		return fmt.Sprintf("servers %s and %d more", strings.Join(names[:3], ", "), len(names)-3)
	}
	if len(names) == 1 {
		return "server " + names[0]
	}
	return "servers " + strings.Join(names, ", ")
}

func poolNames(pools []v1alpha1.PDPool) string {
	if len(pools) == 0 {
		return "none declared"
	}
	names := make([]string, 0, len(pools))
	for _, p := range pools {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}
