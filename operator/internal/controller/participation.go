package controller

import (
	"cmp"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// InjectedByAnnotation is the engine pod annotation, "<namespace>/<name>",
// naming the CacheBackend that wired the pod.
const InjectedByAnnotation = "inferencecache.io/injected-by"

// PodMeta is what attribution needs of an engine pod.
type PodMeta struct {
	Labels      map[string]string
	Annotations map[string]string
}

// AttributeReplicas groups the snapshot's replicas by the CacheBackend that
// owns them, keyed by "<namespace>/<name>". A replica is the pod named by its
// replicaId in the namespace named by its tenant. The owner is the backend
// the pod's inferencecache.io/injected-by annotation names, when it exists;
// otherwise the first backend by name in the pod's namespace whose non-empty
// engineSelector.matchLabels the pod's labels include. Replicas whose pod is
// unknown, or that no backend claims, are left out.
func AttributeReplicas(snap *controlapi.CacheSnapshot, backends []v1alpha1.CacheBackend, pods map[types.NamespacedName]PodMeta) map[string][]*controlapi.ReplicaSnapshot {
	byKey := make(map[string]*v1alpha1.CacheBackend, len(backends))
	byNS := map[string][]*v1alpha1.CacheBackend{}
	for i := range backends {
		b := &backends[i]
		byKey[b.Namespace+"/"+b.Name] = b
		byNS[b.Namespace] = append(byNS[b.Namespace], b)
	}
	for _, list := range byNS {
		slices.SortFunc(list, func(a, b *v1alpha1.CacheBackend) int { return cmp.Compare(a.Name, b.Name) })
	}
	out := map[string][]*controlapi.ReplicaSnapshot{}
	for i := range snap.Replicas {
		r := &snap.Replicas[i]
		pod, ok := pods[types.NamespacedName{Namespace: r.Tenant, Name: r.ReplicaID}]
		if !ok {
			continue
		}
		if key := strings.TrimSpace(pod.Annotations[InjectedByAnnotation]); key != "" {
			if _, ok := byKey[key]; ok {
				out[key] = append(out[key], r)
				continue
			}
		}
		for _, b := range byNS[r.Tenant] {
			if selects(b, pod.Labels) {
				key := b.Namespace + "/" + b.Name
				out[key] = append(out[key], r)
				break
			}
		}
	}
	return out
}

// selects reports whether b's non-empty selector matches labels.
func selects(b *v1alpha1.CacheBackend, labels map[string]string) bool {
	sel := b.Spec.EngineSelector
	if sel == nil || len(sel.MatchLabels) == 0 {
		return false // an empty selector claims nothing
	}
	for k, v := range sel.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Participation aggregates a backend's replicas: the prefix count, the newest
// KV event, and the tier-2 hit rate (hit tokens over query tokens, clamped to
// [0,1], present only once queried). It also returns the cumulative tier-2
// hit and query tokens. hitRate is never set (no per-backend source yet).
func Participation(replicas []*controlapi.ReplicaSnapshot) (p v1alpha1.IndexParticipation, hits, queries int64) {
	for _, r := range replicas {
		p.PrefixCount += r.PrefixCount
		if !r.LastEventAt.IsZero() && (p.LastEventAt == nil || r.LastEventAt.After(p.LastEventAt.Time)) {
			p.LastEventAt = timeOrNil(r.LastEventAt)
		}
		hits += max(r.T2HitTokens, 0)
		queries += max(r.T2QueryTokens, 0)
	}
	if queries > 0 {
		rate := min(max(float64(hits)/float64(queries), 0), 1)
		p.T2HitRate = ptr(formatRate(float32(rate)))
	}
	return p, hits, queries
}

// podMetaOf converts listed pod metadata.
func podMetaOf(items []metav1.PartialObjectMetadata) map[types.NamespacedName]PodMeta {
	out := make(map[types.NamespacedName]PodMeta, len(items))
	for i := range items {
		m := &items[i]
		out[types.NamespacedName{Namespace: m.Namespace, Name: m.Name}] = PodMeta{Labels: m.Labels, Annotations: m.Annotations}
	}
	return out
}
