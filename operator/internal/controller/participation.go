package controller

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/claim"
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
// replicaId in the namespace named by its tenant (for a rank of a
// data-parallel engine, replicaId <pod>-dp<r>, the pod <pod>). The owner is the backend
// the pod's inferencecache.io/injected-by annotation names, when it exists;
// otherwise its claim.Owner (the first backend by name in the pod's namespace
// whose non-empty engineSelector.matchLabels the pod's labels include, else
// the first by namespace and name with allowCrossNamespace whose namespace
// the pod's consents to, nsAnnotations holding the Namespace annotations by
// name; as the pod webhook and the reconciler decide; a pod that opted out
// of injection has none). Replicas whose pod is unknown, or that no backend
// claims, are left out.
func AttributeReplicas(snap *controlapi.CacheSnapshot, backends []v1alpha1.CacheBackend, pods map[types.NamespacedName]PodMeta, nsAnnotations map[string]map[string]string) map[string][]*controlapi.ReplicaSnapshot {
	byKey := make(map[string]*v1alpha1.CacheBackend, len(backends))
	byNS := map[string][]v1alpha1.CacheBackend{} // claim.Claimant scans one namespace
	var cross []v1alpha1.CacheBackend            // those with allowCrossNamespace
	for i := range backends {
		b := &backends[i]
		byKey[b.Namespace+"/"+b.Name] = b
		byNS[b.Namespace] = append(byNS[b.Namespace], *b)
		if b.Spec.AllowCrossNamespace {
			cross = append(cross, *b)
		}
	}
	out := map[string][]*controlapi.ReplicaSnapshot{}
	for i := range snap.Replicas {
		r := &snap.Replicas[i]
		pod, ok := pods[types.NamespacedName{Namespace: r.Tenant, Name: r.ReplicaID}]
		if name, isRank := rankOf(r.ReplicaID); !ok && isRank {
			// A rank of a data-parallel engine reports <pod>-dp<r>.
			pod, ok = pods[types.NamespacedName{Namespace: r.Tenant, Name: name}]
		}
		if !ok {
			continue
		}
		if key := strings.TrimSpace(pod.Annotations[InjectedByAnnotation]); key != "" {
			if _, ok := byKey[key]; ok {
				out[key] = append(out[key], r)
				continue
			}
		}
		b := claim.Claimant(byNS[r.Tenant], r.Tenant, pod.Labels, pod.Annotations)
		if b == nil {
			b = claim.Owner(cross, claim.Pod{Namespace: r.Tenant, NamespaceAnnotations: nsAnnotations[r.Tenant], Labels: pod.Labels, Annotations: pod.Annotations})
		}
		if b != nil {
			key := b.Namespace + "/" + b.Name
			out[key] = append(out[key], r)
		}
	}
	return out
}

// rankOf returns the pod name of a data-parallel rank's replica id,
// <pod>-dp<r> with r a decimal number; ok is false for any other id.
func rankOf(replicaID string) (pod string, ok bool) {
	i := strings.LastIndex(replicaID, "-dp")
	if i <= 0 || i+3 == len(replicaID) {
		return "", false
	}
	for _, c := range replicaID[i+3:] {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return replicaID[:i], true
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
