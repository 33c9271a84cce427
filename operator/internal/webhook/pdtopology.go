package webhook

import (
	"context"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
)

// +kubebuilder:webhook:path=/validate-inferencecache-io-v1alpha1-pdtopology,mutating=false,failurePolicy=fail,sideEffects=None,groups=inferencecache.io,resources=pdtopologies,verbs=create;update,versions=v1alpha1,name=vpdtopology.inferencecache.io,admissionReviewVersions=v1

// PDTopologyValidator admits PDTopologies: every prefill and decode pool's
// acceleratorType, when set, names an entry of spec.acceleratorTypes. UPDATE
// refuses only what it newly breaks.
type PDTopologyValidator struct{}

var _ admission.Validator[*v1alpha1.PDTopology] = (*PDTopologyValidator)(nil)

// ValidateCreate implements admission.Validator.
func (PDTopologyValidator) ValidateCreate(_ context.Context, obj *v1alpha1.PDTopology) (admission.Warnings, error) {
	return nil, invalid("PDTopology", obj.Name, validation.PDTopologySpec(&obj.Spec, field.NewPath("spec")))
}

// ValidateUpdate implements admission.Validator.
func (PDTopologyValidator) ValidateUpdate(_ context.Context, oldObj, newObj *v1alpha1.PDTopology) (admission.Warnings, error) {
	p := field.NewPath("spec")
	errs := validation.Introduced(validation.PDTopologySpec(&newObj.Spec, p), validation.PDTopologySpec(&oldObj.Spec, p))
	return nil, invalid("PDTopology", newObj.Name, errs)
}

// ValidateDelete implements admission.Validator; deletes are always allowed.
func (PDTopologyValidator) ValidateDelete(context.Context, *v1alpha1.PDTopology) (admission.Warnings, error) {
	return nil, nil
}
