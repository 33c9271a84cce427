package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SlotType says whether a slot's content takes part in prefix stability.
// +kubebuilder:validation:Enum=Stable;Mutable
type SlotType string

const (
	// SlotStable content is expected to repeat across requests, so it may sit
	// inside a cacheable prefix.
	SlotStable SlotType = "Stable"
	// SlotMutable content changes per request and ends the cacheable prefix.
	SlotMutable SlotType = "Mutable"
)

// PromptTemplateSlot declares one slot of a template body.
type PromptTemplateSlot struct {
	// Name is the slot identifier the body refers to.
	// +required
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Type is Stable or Mutable.
	// +required
	Type SlotType `json:"type"`
	// Required says whether callers must fill the slot.
	// +optional
	Required bool `json:"required,omitempty"`
	// Description is free-form notes for people.
	// +optional
	Description string `json:"description,omitempty"`
}

// PromptTemplateSpec is a template body plus its cache-relevant slots.
type PromptTemplateSpec struct {
	// Body is the template text.
	// +required
	// +kubebuilder:validation:MinLength=1
	Body string `json:"body"`
	// Slots declares the slots the body uses, keyed by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	Slots []PromptTemplateSlot `json:"slots,omitempty"`
}

// PromptTemplateStatus is the observed state of a template.
type PromptTemplateStatus struct {
	// TemplateRevision is a stable revision identifier for cache
	// invalidation.
	// +optional
	TemplateRevision string `json:"templateRevision,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=pt,categories=inferencecache
// +kubebuilder:printcolumn:name="Revision",type=string,JSONPath=`.status.templateRevision`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// PromptTemplate gives the rendering layer a template body and declares which
// of its slots are stable enough to share a cached prefix.
type PromptTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   PromptTemplateSpec   `json:"spec"`
	Status PromptTemplateStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// PromptTemplateList is a list of PromptTemplate.
type PromptTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PromptTemplate `json:"items"`
}

func init() {
	register(&PromptTemplate{}, &PromptTemplateList{})
}
