package webhook

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
)

// +kubebuilder:webhook:path=/validate-inferencecache-io-v1alpha1-cachepolicy,mutating=false,failurePolicy=fail,sideEffects=None,groups=inferencecache.io,resources=cachepolicies,verbs=create;update,versions=v1alpha1,name=vcachepolicy.inferencecache.io,admissionReviewVersions=v1

// CachePolicyValidator admits CachePolicies.
//
// CREATE: the spec rules plus one CachePolicy per namespace (Forbidden on
// metadata.name, naming the existing policy with the smallest name).
// UPDATE: only spec violations the update introduces; the one-per-namespace
// rule is not re-checked, so every CachePolicy stays editable.
type CachePolicyValidator struct {
	// Reader lists the CachePolicies of a namespace. Required.
	Reader client.Reader
}

var _ admission.Validator[*v1alpha1.CachePolicy] = (*CachePolicyValidator)(nil)

// ValidateCreate implements admission.Validator.
func (v *CachePolicyValidator) ValidateCreate(ctx context.Context, obj *v1alpha1.CachePolicy) (admission.Warnings, error) {
	errs := validation.CachePolicySpec(&obj.Spec, field.NewPath("spec"))
	sibling, err := v.existingPolicy(ctx, obj)
	if err != nil {
		return nil, err
	}
	if sibling != "" {
		errs = append(errs, field.Forbidden(field.NewPath("metadata", "name"), fmt.Sprintf(
			"namespace %q already has CachePolicy %q and allows only one; edit %q instead, or delete it before creating %q",
			obj.Namespace, sibling, sibling, obj.Name)))
	}
	return nil, invalid("CachePolicy", obj.Name, errs)
}

// ValidateUpdate implements admission.Validator.
func (v *CachePolicyValidator) ValidateUpdate(_ context.Context, oldObj, newObj *v1alpha1.CachePolicy) (admission.Warnings, error) {
	p := field.NewPath("spec")
	errs := validation.Introduced(validation.CachePolicySpec(&newObj.Spec, p), validation.CachePolicySpec(&oldObj.Spec, p))
	return nil, invalid("CachePolicy", newObj.Name, errs)
}

// ValidateDelete implements admission.Validator; deletes are always allowed.
func (v *CachePolicyValidator) ValidateDelete(context.Context, *v1alpha1.CachePolicy) (admission.Warnings, error) {
	return nil, nil
}

// existingPolicy returns the smallest name among the other CachePolicies of
// obj's namespace, or "" when there are none.
func (v *CachePolicyValidator) existingPolicy(ctx context.Context, obj *v1alpha1.CachePolicy) (string, error) {
	if v.Reader == nil {
		return "", ErrNoReader
	}
	var list v1alpha1.CachePolicyList
	if err := v.Reader.List(ctx, &list, client.InNamespace(obj.Namespace)); err != nil {
		return "", fmt.Errorf("cannot list CachePolicies in namespace %q to enforce one policy per namespace; refusing admission (fail closed): %w", obj.Namespace, err)
	}
	var names []string
	for i := range list.Items {
		if n := list.Items[i].Name; n != obj.Name {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "", nil
	}
	return slices.Min(names), nil
}
