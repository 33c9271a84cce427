package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EvictionAlgorithm selects how the index picks victims when it is over its
// entry cap. The controller sends it lower-cased on the /policy wire.
// +kubebuilder:validation:Enum=LRU;LFU
type EvictionAlgorithm string

const (
	// EvictionLRU evicts the entry with the oldest lastSeen first.
	EvictionLRU EvictionAlgorithm = "LRU"
	// EvictionLFU evicts the entry with the lowest access count first,
	// breaking ties on the oldest lastSeen.
	EvictionLFU EvictionAlgorithm = "LFU"
)

// AffinityRouting toggles the consistent-hash fallback on the LookupRoute
// no-hint branch.
// +kubebuilder:validation:Enum=Enabled;Disabled
type AffinityRouting string

const (
	// AffinityRoutingEnabled pins an otherwise unhinted prompt to one stable
	// replica (reason code AFFINITY_HINT).
	AffinityRoutingEnabled AffinityRouting = "Enabled"
	// AffinityRoutingDisabled leaves such prompts on NO_HINT.
	AffinityRoutingDisabled AffinityRouting = "Disabled"
)

// RoutingFloorScorePattern is the admission pattern of
// spec.routingFloorScore: an integer part that is 0 or 1 to 8 digits without
// a leading zero, optionally followed by a dot and 1 to 6 digits.
const RoutingFloorScorePattern = `^(0|[1-9][0-9]{0,7})(\.[0-9]{1,6})?$`

// CachePolicySpec is the cache lookup and eviction policy of the namespace the
// CachePolicy lives in. A namespace has at most one CachePolicy; it applies to
// lookups whose tenant_id equals the namespace name.
type CachePolicySpec struct {
	// Eviction is the index eviction algorithm applied when the index exceeds
	// its entry cap: LRU evicts the oldest entry first, LFU the least used
	// (ties on the oldest). The evictionTTL sweep is independent of it.
	// +optional
	// +kubebuilder:default=LRU
	Eviction EvictionAlgorithm `json:"eviction,omitempty"`

	// EvictionTTL is the maximum usable lifetime of a cache entry, a Go
	// duration such as 15m or 1h30m (a unit is required). It must be
	// positive when set; when omitted the server default (30m) applies.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	EvictionTTL *metav1.Duration `json:"evictionTTL,omitempty"`

	// MinimumPrefixTokens is the request-side gate: a request whose prefix is
	// shorter never surfaces a positive cache hint (PREFIX_MATCH or
	// TENANT_HOT). 0 disables the gate.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MinimumPrefixTokens *int32 `json:"minimumPrefixTokens,omitempty"`

	// MinimumMatchedTokens is the result-side floor on each replica's matched
	// prefix tokens; replicas below it are filtered from a PREFIX_MATCH. 0
	// disables the floor for this namespace.
	// +optional
	// +kubebuilder:default=64
	// +kubebuilder:validation:Minimum=0
	MinimumMatchedTokens *int32 `json:"minimumMatchedTokens,omitempty"`

	// RoutingFloorScore is the result-side floor on the top replica's ranked
	// score, written as a decimal string such as "0.1", "5" or "0". A
	// PREFIX_MATCH whose top score is below it is downgraded. "0" disables
	// the floor for this namespace.
	// +optional
	// +kubebuilder:default="0.1"
	// +kubebuilder:validation:Pattern=`^(0|[1-9][0-9]{0,7})(\.[0-9]{1,6})?$`
	RoutingFloorScore *string `json:"routingFloorScore,omitempty"`

	// LookupTimeoutMs is the lookup latency budget in milliseconds; a breach
	// answers TIMEOUT (fail-open). 0 means no deadline.
	// +optional
	// +kubebuilder:validation:Minimum=0
	LookupTimeoutMs *int32 `json:"lookupTimeoutMs,omitempty"`

	// Strategy gates which lookup strategies may surface.
	// +optional
	// +kubebuilder:default={}
	Strategy *CachePolicyStrategy `json:"strategy,omitempty"`

	// AffinityRouting toggles the consistent-hash fallback: with Enabled an
	// otherwise unhinted prompt is pinned to one stable replica
	// (AFFINITY_HINT); with Disabled it stays on NO_HINT.
	// +optional
	// +kubebuilder:default=Enabled
	AffinityRouting AffinityRouting `json:"affinityRouting,omitempty"`
}

// CachePolicyStrategy holds the LookupRoute strategy gates.
// +kubebuilder:validation:XValidation:rule="!(has(self.requireChain) && self.requireChain && has(self.enableChainMatching) && !self.enableChainMatching)",message="requireChain: true needs enableChainMatching: true (a required chain could never be matched)",fieldPath=".requireChain"
type CachePolicyStrategy struct {
	// EnableChainMatching enables the block-hash chain matcher for requests
	// that carry block hashes. When false the chain is stripped and the exact
	// prefix_hash path is used.
	// +optional
	// +kubebuilder:default=true
	EnableChainMatching *bool `json:"enableChainMatching,omitempty"`

	// RequireChain answers POLICY_REQUIRES_CHAIN (fail-open) to a request
	// without a valid block-hash chain, before the index is touched.
	// +optional
	// +kubebuilder:default=false
	RequireChain *bool `json:"requireChain,omitempty"`

	// EnableTenantHot allows the TENANT_HOT soft-locality fallback; when false
	// such a result is downgraded to NO_HINT.
	// +optional
	// +kubebuilder:default=true
	EnableTenantHot *bool `json:"enableTenantHot,omitempty"`
}

// Condition types and reasons of CachePolicy.status.conditions.
const (
	// ConditionAccepted is True when the policy governs its namespace.
	ConditionAccepted = "Accepted"

	// ReasonAccepted: the policy is valid and is the one in effect.
	ReasonAccepted = "Accepted"
	// ReasonConflicted: another CachePolicy in the namespace governs it.
	ReasonConflicted = "Conflicted"
	// ReasonInvalid: a field cannot be honored, so the policy governs nothing.
	ReasonInvalid = "Invalid"
)

// CachePolicyStatus is the controller's verdict on the policy.
type CachePolicyStatus struct {
	// ObservedGeneration is the metadata.generation the verdict is about.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions holds the Accepted condition.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=cpol,categories=inferencecache
// +kubebuilder:printcolumn:name="Eviction",type=string,JSONPath=`.spec.eviction`
// +kubebuilder:printcolumn:name="TTL",type=string,JSONPath=`.spec.evictionTTL`
// +kubebuilder:printcolumn:name="Floor",type=string,JSONPath=`.spec.routingFloorScore`,priority=1
// +kubebuilder:printcolumn:name="Affinity",type=string,JSONPath=`.spec.affinityRouting`,priority=1
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// CachePolicy is the cache lookup and eviction policy of one namespace. The
// controller pushes it to the routing server; status.conditions[Accepted]
// says whether it is the one in effect.
type CachePolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   CachePolicySpec   `json:"spec"`
	Status CachePolicyStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// CachePolicyList is a list of CachePolicy.
type CachePolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CachePolicy `json:"items"`
}

func init() {
	register(&CachePolicy{}, &CachePolicyList{})
}
