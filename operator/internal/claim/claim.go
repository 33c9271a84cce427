// Package claim decides which CacheBackend claims an engine pod. The pod
// webhook (which backend injects a new pod), the CacheBackend reconciler
// (matchedEnginePods, the restart cascade's engine Deployments) and the
// snapshot projection (replica attribution) all decide through it, so they
// cannot disagree.
package claim

import "github.com/inferencecache/inferencecache/operator/api/v1alpha1"

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

// Claimant returns the backend of ns that claims a pod of ns with labels:
// the first by name whose engineSelector Selects them; nil when none does.
// backends may be in any order and hold other namespaces' backends (they are
// skipped); the slice is not modified.
func Claimant(backends []v1alpha1.CacheBackend, ns string, labels map[string]string) *v1alpha1.CacheBackend {
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

// Claims reports whether b is the Claimant of a pod of b's namespace with
// labels among backends (which should include b).
func Claims(b *v1alpha1.CacheBackend, backends []v1alpha1.CacheBackend, labels map[string]string) bool {
	c := Claimant(backends, b.Namespace, labels)
	return c != nil && c.Name == b.Name
}
