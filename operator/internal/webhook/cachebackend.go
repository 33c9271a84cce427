package webhook

import (
	"context"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
)

// +kubebuilder:webhook:path=/validate-inferencecache-io-v1alpha1-cachebackend,mutating=false,failurePolicy=fail,sideEffects=None,groups=inferencecache.io,resources=cachebackends,verbs=create;update,versions=v1alpha1,name=vcachebackend.inferencecache.io,admissionReviewVersions=v1

// CacheBackendValidator admits CacheBackends: spec.endpoint is required for
// type External and refused for any other type, and must be host:port or
// lm://host:port. UPDATE refuses only what it newly breaks.
type CacheBackendValidator struct{}

var _ admission.Validator[*v1alpha1.CacheBackend] = (*CacheBackendValidator)(nil)

// ValidateCreate implements admission.Validator.
func (CacheBackendValidator) ValidateCreate(_ context.Context, obj *v1alpha1.CacheBackend) (admission.Warnings, error) {
	return nil, invalid("CacheBackend", obj.Name, validation.CacheBackendEndpoint(&obj.Spec, field.NewPath("spec")))
}

// ValidateUpdate implements admission.Validator.
func (CacheBackendValidator) ValidateUpdate(_ context.Context, oldObj, newObj *v1alpha1.CacheBackend) (admission.Warnings, error) {
	p := field.NewPath("spec")
	errs := validation.Introduced(validation.CacheBackendEndpoint(&newObj.Spec, p), validation.CacheBackendEndpoint(&oldObj.Spec, p))
	return nil, invalid("CacheBackend", newObj.Name, errs)
}

// ValidateDelete implements admission.Validator; deletes are always allowed.
func (CacheBackendValidator) ValidateDelete(context.Context, *v1alpha1.CacheBackend) (admission.Warnings, error) {
	return nil, nil
}
