package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PDPool is one prefill or decode pool.
type PDPool struct {
	// Name identifies the pool.
	// +required
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// MatchLabels selects the pool's pods or nodes.
	// +optional
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
	// Replicas is the desired pool size.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Replicas *int32 `json:"replicas,omitempty"`
	// AcceleratorType names one of spec.acceleratorTypes.
	// +optional
	AcceleratorType string `json:"acceleratorType,omitempty"`
}

// AcceleratorType is one accelerator class.
type AcceleratorType struct {
	// Name identifies the class.
	// +required
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Vendor is descriptive, e.g. nvidia.
	// +optional
	Vendor string `json:"vendor,omitempty"`
	// Model is descriptive, e.g. H100.
	// +optional
	Model string `json:"model,omitempty"`
	// MatchLabels identifies matching nodes or pods.
	// +optional
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// PDTopologySpec declares the pools of phase-disaggregated serving.
type PDTopologySpec struct {
	// PrefillPools are keyed by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	PrefillPools []PDPool `json:"prefillPools,omitempty"`
	// DecodePools are keyed by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	DecodePools []PDPool `json:"decodePools,omitempty"`
	// AcceleratorTypes are keyed by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	AcceleratorTypes []AcceleratorType `json:"acceleratorTypes,omitempty"`
	// Transport is the KV-cache transfer between the pools, returned to
	// gateways as LookupPDRoute's transport_hint.
	// +optional
	// +kubebuilder:default=NIXL
	Transport PDTransport `json:"transport,omitempty"`
	// SkipPrefillBelowTokens: a request of which the decode replica would
	// compute fewer tokens than this (the prompt minus what it caches) is
	// served by the decode replica alone; 0 never skips the prefill hop by
	// size. Chosen with the P/D simulator (docs/pd.md).
	// +optional
	// +kubebuilder:default=512
	// +kubebuilder:validation:Minimum=0
	SkipPrefillBelowTokens *int32 `json:"skipPrefillBelowTokens,omitempty"`
	// KVLocality is where the decode replica should run relative to the
	// prefill replica it pulls the KV cache from: Node prefers the same
	// node, then the same zone; Zone the same zone; None anywhere.
	// +optional
	// +kubebuilder:default=None
	KVLocality KVLocality `json:"kvLocality,omitempty"`
}

// PDTransport is the KV-cache transfer a PDTopology's pools use.
// +kubebuilder:validation:Enum=Mooncake;NIXL;Direct
type PDTransport string

// The transports of a PDTopology.
const (
	TransportMooncake PDTransport = "Mooncake"
	TransportNIXL     PDTransport = "NIXL"
	TransportDirect   PDTransport = "Direct"
)

// KVLocality is a PDTopology's decode placement preference.
// +kubebuilder:validation:Enum=None;Node;Zone
type KVLocality string

// The KV localities of a PDTopology.
const (
	LocalityNone KVLocality = "None"
	LocalityNode KVLocality = "Node"
	LocalityZone KVLocality = "Zone"
)

// PDTopologyStatus is what the controller observed of a PDTopology.
type PDTopologyStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Pools counts the pods each pool's matchLabels selects in the
	// topology's namespace (not terminating), prefill pools first, each
	// side in the spec's order.
	// +optional
	// +listType=atomic
	Pools []PDPoolStatus `json:"pools,omitempty"`
	// Conditions: Ready (reasons Propagated, NoPrefillReplicas,
	// NoDecodeReplicas, NotPropagated, Invalid).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PDPoolStatus is the observed membership of one pool.
type PDPoolStatus struct {
	// Name is the pool's name.
	Name string `json:"name"`
	// Side is Prefill or Decode.
	Side PDSide `json:"side"`
	// Members is the number of pods the pool's matchLabels selects.
	Members int32 `json:"members"`
}

// PDSide is the side of a pool in a PDTopology.
type PDSide string

// The sides of a PDTopology.
const (
	SidePrefill PDSide = "Prefill"
	SideDecode  PDSide = "Decode"
)

// The reasons of a PDTopology's Ready condition (ConditionReady): True when
// both sides have a member pod and the routing servers took the topology.
const (
	// ReasonTopologyPropagated (True): both sides have members and every
	// server that acknowledged the push took the topology.
	ReasonTopologyPropagated = "Propagated"
	// ReasonNoPrefillReplicas (False): no pod matches a prefill pool.
	ReasonNoPrefillReplicas = "NoPrefillReplicas"
	// ReasonNoDecodeReplicas (False): no pod matches a decode pool.
	ReasonNoDecodeReplicas = "NoDecodeReplicas"
	// ReasonNotPropagated (False): a server refused the version-8 body and
	// was sent the policy without topologies and templates, or no server
	// acknowledged the push.
	ReasonNotPropagated = "NotPropagated"
	// ReasonInvalidTopology (False): the routing server would refuse the
	// topology (its message says why), so it is left out of the push.
	ReasonInvalidTopology = "Invalid"
)

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=pdt,categories=inferencecache
// +kubebuilder:printcolumn:name="Transport",type=string,JSONPath=`.spec.transport`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// PDTopology declares prefill and decode pools and accelerator classes for
// phase-disaggregated serving. The controller pushes it to the routing
// servers (LookupPDRoute) and labels the pools' engine sidecars with their
// role (docs/pd.md).
type PDTopology struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec   PDTopologySpec   `json:"spec,omitempty"`
	Status PDTopologyStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// PDTopologyList is a list of PDTopology.
type PDTopologyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PDTopology `json:"items"`
}

func init() {
	register(&PDTopology{}, &PDTopologyList{})
}
