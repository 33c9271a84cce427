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

// ConditionPropagated and its reasons. The condition is present only on a
// policy that is Accepted (one that governs its namespace): it says whether
// the routing servers acknowledged this generation, independently of
// Accepted, which only judges the spec.
const (
	// ConditionPropagated is True when every ready routing server pod (or,
	// when the pods cannot be enumerated, the configured server address)
	// acknowledged the push of this generation.
	ConditionPropagated = "Propagated"

	// ReasonPropagated (True): every ready server pod of the server Service
	// acknowledged this generation.
	ReasonPropagated = "Propagated"
	// ReasonAddressAcknowledged (True): the server pods could not be
	// enumerated (the server Service's EndpointSlices cannot be read), and the
	// configured server address acknowledged this generation; the pods behind
	// that address are not individually known.
	ReasonAddressAcknowledged = "AddressAcknowledged"
	// ReasonPartiallyPropagated (False): some ready server pods acknowledged
	// this generation and some did not; the message names one that did not
	// and its error.
	ReasonPartiallyPropagated = "PartiallyPropagated"
	// ReasonPushFailed (False): no server acknowledged this generation; the
	// message carries the server's error.
	ReasonPushFailed = "PushFailed"
	// ReasonNoReadyServers (False): the server Service's EndpointSlices list
	// no ready server endpoint, so nothing was pushed.
	ReasonNoReadyServers = "NoReadyServers"
)

// How the controller found the routing servers (PolicyPropagation.Target).
const (
	// PropagationTargetEndpointSlices: every ready endpoint of the server
	// Service, from its EndpointSlices.
	PropagationTargetEndpointSlices = "EndpointSlices"
	// PropagationTargetAddress: the configured server address only.
	PropagationTargetAddress = "Address"
)

// MaxPropagationServers bounds status.propagation.servers.
const MaxPropagationServers = 16

// CachePolicyStatus is the controller's verdict on the policy.
type CachePolicyStatus struct {
	// ObservedGeneration is the metadata.generation the verdict is about.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions holds the Accepted condition and, while the policy is
	// Accepted, the Propagated condition.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Propagation reports, per routing server, what the controller's pushes
	// of this policy achieved. Present only while the policy is Accepted.
	// +optional
	Propagation *PolicyPropagation `json:"propagation,omitempty"`
}

// PolicyPropagation is the outcome of the controller's last push of the
// policy to the routing servers.
type PolicyPropagation struct {
	// Target is how the servers were found: EndpointSlices (every ready
	// endpoint of the server Service) or Address (the configured server
	// address, when no EndpointSlice of the Service can be read).
	// +kubebuilder:validation:Enum=EndpointSlices;Address
	Target string `json:"target"`

	// ReadyServers is the number of servers the last push went to.
	ReadyServers int32 `json:"readyServers"`

	// AcknowledgedServers is the number of them that acknowledged this
	// generation on the last push.
	AcknowledgedServers int32 `json:"acknowledgedServers"`

	// Servers has one entry per server of the last push: those that did not
	// acknowledge first, then by name. At most 16 are listed; the counts
	// above cover all.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Servers []ServerPropagation `json:"servers,omitempty"`
}

// ServerPropagation is the push outcome on one routing server.
type ServerPropagation struct {
	// Name is the server pod (the endpoint's targetRef) or, without one, the
	// address.
	Name string `json:"name"`

	// Address is the host:port the policy was pushed to.
	Address string `json:"address"`

	// PushedGeneration is the metadata.generation of this policy the server
	// last acknowledged; absent when it never did.
	// +optional
	PushedGeneration int64 `json:"pushedGeneration,omitempty"`

	// AcknowledgedTime is when the server first acknowledged
	// pushedGeneration. The periodic re-push of an unchanged generation does
	// not move it (so status is not rewritten on every tick).
	// +optional
	AcknowledgedTime *metav1.Time `json:"acknowledgedTime,omitempty"`

	// Error is why the last push to this server was not acknowledged: the
	// server's answer or the transport error. Empty when it was.
	// +optional
	Error string `json:"error,omitempty"`

	// FailingSince is when the pushes to this server started failing; absent
	// while they succeed.
	// +optional
	FailingSince *metav1.Time `json:"failingSince,omitempty"`
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
// +kubebuilder:printcolumn:name="Propagated",type=string,JSONPath=`.status.conditions[?(@.type=="Propagated")].status`
// +kubebuilder:printcolumn:name="Servers",type=string,JSONPath=`.status.propagation.acknowledgedServers`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// CachePolicy is the cache lookup and eviction policy of one namespace. The
// controller pushes it to every ready routing server pod;
// status.conditions[Accepted] says whether it is the one in effect,
// status.conditions[Propagated] whether the servers acknowledged it.
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
