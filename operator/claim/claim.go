// Package claim decides which CacheBackend claims an engine pod. The pod
// webhook (which backend injects a new pod), the CacheBackend reconciler
// (matchedEnginePods, the restart cascade's engine Deployments) and the
// snapshot projection (replica attribution) all decide through it, so they
// cannot disagree. A pod that opted out of injection (OptedOut) is claimed
// by no backend: the controller never wires it, so it is not counted,
// attributed or restarted for one either.
package claim

import "github.com/inferencecache/inferencecache/operator/api/v1alpha1"

// InjectKey set to "false", as a pod label or annotation, opts the pod out
// of injection (the pod webhook's objectSelector skips the label).
const InjectKey = "inferencecache.io/inject"

// OptedOut reports whether a pod with labels and annotations opted out of
// injection.
func OptedOut(labels, annotations map[string]string) bool {
	return labels[InjectKey] == "false" || annotations[InjectKey] == "false"
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

// Owner returns the backend that claims a pod of namespace ns with labels
// and annotations among backends (any namespaces, any order; not modified): its Claimant in
// ns, else the first by (namespace, name) of another namespace that sets
// allowCrossNamespace and whose engineSelector Selects the labels; nil when
// none does or the pod OptedOut. This is the pod webhook's rule.
func Owner(backends []v1alpha1.CacheBackend, ns string, labels, annotations map[string]string) *v1alpha1.CacheBackend {
	if OptedOut(labels, annotations) {
		return nil
	}
	if c := Claimant(backends, ns, labels, annotations); c != nil {
		return c
	}
	var first *v1alpha1.CacheBackend
	for i := range backends {
		b := &backends[i]
		if b.Namespace == ns || !b.Spec.AllowCrossNamespace || (first != nil && !before(b, first)) {
			continue
		}
		if Selects(b.Spec.EngineSelector, labels) {
			first = b
		}
	}
	return first
}

func before(a, b *v1alpha1.CacheBackend) bool {
	return a.Namespace < b.Namespace || a.Namespace == b.Namespace && a.Name < b.Name
}

// Claims reports whether b is the Owner of a pod of namespace ns with labels
// and annotations among backends (which should include b and, for a pod outside b's
// namespace, that namespace's backends).
func Claims(b *v1alpha1.CacheBackend, backends []v1alpha1.CacheBackend, ns string, labels, annotations map[string]string) bool {
	o := Owner(backends, ns, labels, annotations)
	return o != nil && o.Namespace == b.Namespace && o.Name == b.Name
}
