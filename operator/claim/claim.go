// Package claim decides which CacheBackend claims an engine pod. The pod
// webhook (which backend injects a new pod), the CacheBackend reconciler
// (matchedEnginePods, the restart cascade's engine Deployments) and the
// snapshot projection (replica attribution) all decide through it, so they
// cannot disagree. A pod that opted out of injection (OptedOut) is claimed
// by no backend: the controller never wires it, so it is not counted,
// attributed or restarted for one either.
//
// A backend claims pods of its own namespace. With allowCrossNamespace it
// may also claim pods of a namespace that has no claimant of its own, but
// only when that namespace consents: its Namespace object carries
// AllowClaimsFromAnnotation naming the backend's namespace. Without the
// consent, allowCrossNamespace in one namespace cannot take over another
// namespace's engines (rewrite their args, inject a sidecar, roll their
// Deployments).
package claim

import (
	"strings"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// InjectKey set to "false", as a pod label or annotation, opts the pod out
// of injection (the pod webhook's objectSelector skips the label).
const InjectKey = "inferencecache.io/inject"

// AllowClaimsFromAnnotation, on a Namespace, lists the namespaces
// (comma-separated, e.g. "cache-a,cache-b") whose CacheBackends with
// allowCrossNamespace may claim the namespace's pods. There is no wildcard:
// each source namespace is named.
const AllowClaimsFromAnnotation = "inferencecache.io/allow-claims-from"

// OptedOut reports whether a pod with labels and annotations opted out of
// injection.
func OptedOut(labels, annotations map[string]string) bool {
	return labels[InjectKey] == "false" || annotations[InjectKey] == "false"
}

// Consents reports whether a Namespace whose annotations are nsAnnotations
// lets the CacheBackends of namespace from claim its pods: from is listed in
// AllowClaimsFromAnnotation (blanks around names are ignored).
func Consents(nsAnnotations map[string]string, from string) bool {
	if from == "" {
		return false
	}
	for name := range strings.SplitSeq(nsAnnotations[AllowClaimsFromAnnotation], ",") {
		if strings.TrimSpace(name) == from {
			return true
		}
	}
	return false
}

// Selects reports whether sel claims a pod with labels: every matchLabels
// pair is among them. A nil selector or an empty map claims nothing
// (contract §5.4).
func Selects(sel *v1alpha1.EngineSelector, labels map[string]string) bool {
	if sel == nil || len(sel.MatchLabels) == 0 {
		return false
	}
	for k, v := range sel.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Pod is what the claim rule reads of an engine pod (or of a pod template).
type Pod struct {
	// Namespace is the pod's namespace.
	Namespace string
	// NamespaceAnnotations are the annotations of that Namespace object: its
	// consent to cross-namespace claims (AllowClaimsFromAnnotation).
	NamespaceAnnotations map[string]string
	Labels               map[string]string
	Annotations          map[string]string
}

// Claimant returns the backend of ns that claims a pod of ns with labels and
// annotations: the first by name whose engineSelector Selects the labels;
// nil when none does or the pod OptedOut.
// backends may be in any order and hold other namespaces' backends (they are
// skipped); the slice is not modified.
func Claimant(backends []v1alpha1.CacheBackend, ns string, labels, annotations map[string]string) *v1alpha1.CacheBackend {
	if OptedOut(labels, annotations) {
		return nil
	}
	var first *v1alpha1.CacheBackend
	for i := range backends {
		b := &backends[i]
		if b.Namespace != ns || (first != nil && b.Name >= first.Name) {
			continue
		}
		if Selects(b.Spec.EngineSelector, labels) {
			first = b
		}
	}
	return first
}

// Owner returns the backend that claims pod among backends (any namespaces,
// any order; not modified): its Claimant in the pod's namespace, else the
// first by (namespace, name) of another namespace that sets
// allowCrossNamespace, that the pod's namespace Consents to, and whose
// engineSelector Selects the labels; nil when none does or the pod
// OptedOut. This is the pod webhook's rule.
func Owner(backends []v1alpha1.CacheBackend, pod Pod) *v1alpha1.CacheBackend {
	if OptedOut(pod.Labels, pod.Annotations) {
		return nil
	}
	if c := Claimant(backends, pod.Namespace, pod.Labels, pod.Annotations); c != nil {
		return c
	}
	var first *v1alpha1.CacheBackend
	for i := range backends {
		b := &backends[i]
		if first != nil && !before(b, first) || !Reaches(b, pod) {
			continue
		}
		if Selects(b.Spec.EngineSelector, pod.Labels) {
			first = b
		}
	}
	return first
}

// Reaches reports whether b may claim pods of pod's namespace from another
// namespace: b sets allowCrossNamespace and the namespace Consents to b's.
// It says nothing of b's own namespace (false there) or of its selector.
func Reaches(b *v1alpha1.CacheBackend, pod Pod) bool {
	return b.Namespace != pod.Namespace && b.Spec.AllowCrossNamespace && Consents(pod.NamespaceAnnotations, b.Namespace)
}

func before(a, b *v1alpha1.CacheBackend) bool {
	return a.Namespace < b.Namespace || a.Namespace == b.Namespace && a.Name < b.Name
}

// Claims reports whether b is the Owner of pod among backends (which should
// include b and, for a pod outside b's namespace, that namespace's
// backends).
func Claims(b *v1alpha1.CacheBackend, backends []v1alpha1.CacheBackend, pod Pod) bool {
	o := Owner(backends, pod)
	return o != nil && o.Namespace == b.Namespace && o.Name == b.Name
}
