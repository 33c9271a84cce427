package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CacheIndexName is the name of the one CacheIndex the controller maintains.
const CacheIndexName = "cluster-default"

// CacheIndexSpec has no fields: CacheIndex is status only. An omitted spec
// and the empty object are both accepted.
type CacheIndexSpec struct{}

// ReplicaCacheStatus is one stats-reporting engine replica.
type ReplicaCacheStatus struct {
	// ID is the replica identifier (the engine pod name).
	ID string `json:"id"`
	// Tenant is the tenant the replica reports under. It is informational;
	// on an id collision across tenants the lexicographically later tenant's
	// row is the one shown.
	// +optional
	Tenant string `json:"tenant,omitempty"`
	// CacheMemoryBytes is the engine's reported KV memory (the engine total,
	// shared by every tenant on it).
	// +optional
	CacheMemoryBytes int64 `json:"cacheMemoryBytes,omitempty"`
	// HitRate is the replica's hit rate in [0,1] as a decimal string; absent
	// until the replica reported stats.
	// +optional
	HitRate *string `json:"hitRate,omitempty"`
	// Pressure is the replica's memory-pressure heuristic in [0,1] as a
	// decimal string.
	// +optional
	Pressure string `json:"pressure,omitempty"`
	// LastUpdate is when the replica's reported stats last changed.
	// +optional
	LastUpdate *metav1.Time `json:"lastUpdate,omitempty"`
}

// TenantCacheStatus is one tenant's share of the index.
type TenantCacheStatus struct {
	// ID is the tenant id; "" is the bucket of untenanted prefixes.
	ID string `json:"id"`
	// IndexEntries is the number of distinct prefixes the tenant holds; the
	// rows sum to prefixes.summary.total.
	// +optional
	IndexEntries *int64 `json:"indexEntries,omitempty"`
	// HitRate is the mean hit rate of the tenant's stats-reporting replicas,
	// as a decimal string; absent until one reported.
	// +optional
	HitRate *string `json:"hitRate,omitempty"`
	// MemoryUsed is deprecated and always 0: per-tenant memory cannot be
	// attributed on a shared engine. Read replicas[].cacheMemoryBytes. The
	// key is always present.
	MemoryUsed int64 `json:"memoryUsed"`
}

// PrefixSummary counts the prefixes in the index.
type PrefixSummary struct {
	// Total is the number of distinct prefixes in the index.
	Total int64 `json:"total"`
	// Hot is always 0 (per-prefix access counting is not published).
	Hot int64 `json:"hot"`
}

// PrefixStatus wraps the prefix summary.
type PrefixStatus struct {
	// +optional
	Summary PrefixSummary `json:"summary"`
}

// CacheIndexStatus is the controller's projection of the server's /snapshot.
// It never holds KV data or prompt text.
type CacheIndexStatus struct {
	// Replicas lists the replicas that reported stats, keyed by id.
	// +optional
	// +listType=map
	// +listMapKey=id
	Replicas []ReplicaCacheStatus `json:"replicas,omitempty"`
	// Tenants lists every tenant of the index, keyed by id.
	// +optional
	// +listType=map
	// +listMapKey=id
	Tenants []TenantCacheStatus `json:"tenants,omitempty"`
	// Prefixes summarizes the index.
	// +optional
	Prefixes PrefixStatus `json:"prefixes"`
	// ObservedServer is the server address the snapshot was read from.
	// +optional
	ObservedServer string `json:"observedServer,omitempty"`
	// LastUpdated is when the projection last changed (not when it was last
	// polled).
	// +optional
	LastUpdated *metav1.Time `json:"lastUpdated,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=ci,categories=inferencecache
// +kubebuilder:printcolumn:name="Prefixes",type=integer,JSONPath=`.status.prefixes.summary.total`
// +kubebuilder:printcolumn:name="Server",type=string,JSONPath=`.status.observedServer`,priority=1
// +kubebuilder:printcolumn:name="Changed",type=date,JSONPath=`.status.lastUpdated`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// CacheIndex is the cluster-wide, read-only view of the routing server's
// in-memory index. The controller owns the single object named
// cluster-default and writes only its status.
type CacheIndex struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec   CacheIndexSpec   `json:"spec,omitempty"`
	Status CacheIndexStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// CacheIndexList is a list of CacheIndex.
type CacheIndexList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CacheIndex `json:"items"`
}

func init() {
	register(&CacheIndex{}, &CacheIndexList{})
}
