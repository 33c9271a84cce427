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
}

// PDTopologyStatus is reserved for the future topology reconciler.
type PDTopologyStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=pdt,categories=inferencecache
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// PDTopology declares prefill and decode pools and accelerator classes for
// phase-disaggregated serving. No controller acts on it yet; the type ships
// so clients can reference the contract.
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
