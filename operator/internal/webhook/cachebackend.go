package webhook

import (
	"context"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
)

// +kubebuilder:webhook:path=/validate-inferencecache-io-v1alpha1-cachebackend,mutating=false,failurePolicy=fail,sideEffects=None,groups=inferencecache.io,resources=cachebackends,verbs=create;update,versions=v1alpha1,name=vcachebackend.inferencecache.io,admissionReviewVersions=v1

// CacheBackendValidator admits CacheBackends: spec.endpoint is required for
// type External and refused for any other type, and must be host:port or
// lm://host:port; engineOverrides.env may not read Secrets or ConfigMaps;
// spec.backendConfig.image and spec.template.serviceAccountName must be
// allowed by Policy. UPDATE refuses only what it newly breaks.
type CacheBackendValidator struct {
	// Policy is the controller's --allowed-backend-images and
	// --allowed-service-accounts; the zero value allows any.
	Policy validation.BackendPolicy
}

var _ admission.Validator[*v1alpha1.CacheBackend] = (*CacheBackendValidator)(nil)

func (v *CacheBackendValidator) errors(b *v1alpha1.CacheBackend) field.ErrorList {
	p := field.NewPath("spec")
	return slices.Concat(
		validation.CacheBackendEndpoint(&b.Spec, p),
		validation.CacheBackendRemoteStorage(&b.Spec, p),
		validation.CacheBackendEngineOverrides(&b.Spec, p),
		v.Policy.CacheBackend(b.Namespace, &b.Spec, p),
	)
}

// ValidateCreate implements admission.Validator.
func (v *CacheBackendValidator) ValidateCreate(_ context.Context, obj *v1alpha1.CacheBackend) (admission.Warnings, error) {
	return nil, invalid("CacheBackend", obj.Name, v.errors(obj))
}

// ValidateUpdate implements admission.Validator.
func (v *CacheBackendValidator) ValidateUpdate(_ context.Context, oldObj, newObj *v1alpha1.CacheBackend) (admission.Warnings, error) {
	return nil, invalid("CacheBackend", newObj.Name, validation.Introduced(v.errors(newObj), v.errors(oldObj)))
}

// ValidateDelete implements admission.Validator; deletes are always allowed.
func (*CacheBackendValidator) ValidateDelete(context.Context, *v1alpha1.CacheBackend) (admission.Warnings, error) {
	return nil, nil
}
