package webhook

import (
	"context"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
)

// +kubebuilder:webhook:path=/validate-inferencecache-io-v1alpha1-prompttemplate,mutating=false,failurePolicy=fail,sideEffects=None,groups=inferencecache.io,resources=prompttemplates,verbs=create;update,versions=v1alpha1,name=vprompttemplate.inferencecache.io,admissionReviewVersions=v1

// PromptTemplateValidator admits PromptTemplates whose body compiles, names
// only slots it declares and uses every slot it declares (a slot the body
// never reads would make RenderTemplate's stable prefix silently ignore a
// variable the caller fills). UPDATE refuses only what it newly breaks.
type PromptTemplateValidator struct{}

var _ admission.Validator[*v1alpha1.PromptTemplate] = (*PromptTemplateValidator)(nil)

// ValidateCreate implements admission.Validator.
func (PromptTemplateValidator) ValidateCreate(_ context.Context, obj *v1alpha1.PromptTemplate) (admission.Warnings, error) {
	return nil, invalid("PromptTemplate", obj.Name, validation.PromptTemplateSpec(&obj.Spec, field.NewPath("spec")))
}

// ValidateUpdate implements admission.Validator.
func (PromptTemplateValidator) ValidateUpdate(_ context.Context, oldObj, newObj *v1alpha1.PromptTemplate) (admission.Warnings, error) {
	p := field.NewPath("spec")
	errs := validation.Introduced(validation.PromptTemplateSpec(&newObj.Spec, p), validation.PromptTemplateSpec(&oldObj.Spec, p))
	return nil, invalid("PromptTemplate", newObj.Name, errs)
}

// ValidateDelete implements admission.Validator; deletes are always allowed.
func (PromptTemplateValidator) ValidateDelete(context.Context, *v1alpha1.PromptTemplate) (admission.Warnings, error) {
	return nil, nil
}
