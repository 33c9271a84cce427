package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IsolationMode is how a tenant shares the index with others.
// +kubebuilder:validation:Enum=Fairness
type IsolationMode string

// IsolationFairness evicts a tenant's own oldest prefixes when it exceeds its
// entry budget. It is the only mode implemented.
const IsolationFairness IsolationMode = "Fairness"

// CacheTenantSpec is a tenant's identity and index quota.
type CacheTenantSpec struct {
	// TenantID is the tenant identifier gateway and engine traffic carry
	// (tenant_id). inferencecache.io/probe is reserved for the server's
	// self-test and is refused at admission.
	// +required
	// +kubebuilder:validation:MinLength=1
	TenantID string `json:"tenantID"`

	// Quota bounds the tenant's share of the index. Without it the tenant is
	// unbounded.
	// +optional
	Quota *CacheTenantQuota `json:"quota,omitempty"`

	// IsolationMode is how the quota is enforced.
	// +optional
	// +kubebuilder:default=Fairness
	IsolationMode IsolationMode `json:"isolationMode,omitempty"`

	// Crypto is reserved for future cryptographic isolation settings and must
	// be an empty object.
	// +optional
	Crypto *CacheTenantCrypto `json:"crypto,omitempty"`
}

// CacheTenantQuota is a tenant's index budget.
type CacheTenantQuota struct {
	// MaxIndexEntries is the maximum number of distinct prefixes attributed
	// to the tenant; ingest beyond it evicts the tenant's oldest prefixes. 0
	// admits nothing; omit the field for no budget.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxIndexEntries *int64 `json:"maxIndexEntries,omitempty"`
}

// CacheTenantCrypto is reserved; it accepts only the empty object.
// +kubebuilder:validation:Type=object
// +kubebuilder:pruning:PreserveUnknownFields
// +kubebuilder:validation:MaxProperties=0
type CacheTenantCrypto struct{}

// Condition types and reasons of CacheTenant.status.conditions.
const (
	// ConditionReady is True when this CR is the effective owner of its
	// tenant id and the server's snapshot was observed.
	ConditionReady = "Ready"
	// ConditionQuotaExceeded is True when the tenant holds more index
	// entries than its budget.
	ConditionQuotaExceeded = "QuotaExceeded"

	ReasonObserved          = "Observed"
	ReasonDuplicateTenantID = "DuplicateTenantID"
	ReasonOverEntryBudget   = "OverEntryBudget"
	ReasonWithinBudget      = "WithinBudget"
	ReasonNoQuota           = "NoQuota"
	ReasonNotEffective      = "NotEffective"
)

// CacheTenantStatus is the observed state of the tenant.
type CacheTenantStatus struct {
	// ObservedGeneration is the metadata.generation the status is about.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// IndexEntries is the number of distinct prefixes the tenant holds in the
	// index, from the server's snapshot. Absent until a snapshot was
	// observed; a present 0 is a genuinely empty tenant.
	// +optional
	IndexEntries *int64 `json:"indexEntries,omitempty"`

	// Conditions holds Ready and QuotaExceeded, and, on the CacheTenant
	// whose quota is pushed to the routing servers (the owner of its tenant
	// id, with spec.quota.maxIndexEntries), Propagated: whether the servers
	// acknowledged the push, with the reasons of CachePolicy's condition.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=ct,categories=inferencecache
// +kubebuilder:printcolumn:name="TenantID",type=string,JSONPath=`.spec.tenantID`
// +kubebuilder:printcolumn:name="Quota",type=integer,JSONPath=`.spec.quota.maxIndexEntries`
// +kubebuilder:printcolumn:name="Entries",type=integer,JSONPath=`.status.indexEntries`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="OverQuota",type=string,JSONPath=`.status.conditions[?(@.type=="QuotaExceeded")].status`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// CacheTenant declares a tenant identifier and its index quota. Quotas are
// pushed to the routing server keyed by spec.tenantID.
type CacheTenant struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   CacheTenantSpec   `json:"spec"`
	Status CacheTenantStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// CacheTenantList is a list of CacheTenant.
type CacheTenantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CacheTenant `json:"items"`
}

func init() {
	register(&CacheTenant{}, &CacheTenantList{})
}
