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

// +kubebuilder:webhook:path=/validate-inferencecache-io-v1alpha1-cachetenant,mutating=false,failurePolicy=fail,sideEffects=None,groups=inferencecache.io,resources=cachetenants,verbs=create;update,versions=v1alpha1,name=vcachetenant.inferencecache.io,admissionReviewVersions=v1

// CacheTenantValidator admits CacheTenants.
//
// The reserved tenant id (inferencecache.io/probe) is refused on CREATE and
// on an UPDATE that newly introduces it. A tenantID already used by another
// CacheTenant of the same namespace is refused on CREATE and on an UPDATE
// that changes tenantID onto it. The same tenantID in different namespaces
// is allowed (the controller picks one owner deterministically).
type CacheTenantValidator struct {
	// Reader lists the CacheTenants of a namespace. Required.
	Reader client.Reader
}

var _ admission.Validator[*v1alpha1.CacheTenant] = (*CacheTenantValidator)(nil)

var tenantIDPath = field.NewPath("spec", "tenantID")

// ValidateCreate implements admission.Validator.
func (v *CacheTenantValidator) ValidateCreate(ctx context.Context, obj *v1alpha1.CacheTenant) (admission.Warnings, error) {
	return nil, v.validate(ctx, obj)
}

// ValidateUpdate implements admission.Validator. Both rules look only at
// spec.tenantID, so an update that keeps it is admitted without a list.
func (v *CacheTenantValidator) ValidateUpdate(ctx context.Context, oldObj, newObj *v1alpha1.CacheTenant) (admission.Warnings, error) {
	if newObj.Spec.TenantID == oldObj.Spec.TenantID {
		return nil, nil
	}
	return nil, v.validate(ctx, newObj)
}

// validate applies both rules to obj's tenantID.
func (v *CacheTenantValidator) validate(ctx context.Context, obj *v1alpha1.CacheTenant) error {
	var errs field.ErrorList
	if e := validation.TenantID(obj.Spec.TenantID, tenantIDPath); e != nil {
		errs = append(errs, e)
	}
	dup, err := v.duplicate(ctx, obj)
	if err != nil {
		return err
	}
	if dup != nil {
		errs = append(errs, dup)
	}
	return invalid("CacheTenant", obj.Name, errs)
}

// ValidateDelete implements admission.Validator; deletes are always allowed.
func (v *CacheTenantValidator) ValidateDelete(context.Context, *v1alpha1.CacheTenant) (admission.Warnings, error) {
	return nil, nil
}

// duplicate returns a Duplicate error naming the other CacheTenants of obj's
// namespace that already claim obj's tenantID, or nil.
func (v *CacheTenantValidator) duplicate(ctx context.Context, obj *v1alpha1.CacheTenant) (*field.Error, error) {
	if v.Reader == nil {
		return nil, ErrNoReader
	}
	var list v1alpha1.CacheTenantList
	if err := v.Reader.List(ctx, &list, client.InNamespace(obj.Namespace)); err != nil {
		return nil, fmt.Errorf("cannot list CacheTenants in namespace %q to check tenantID uniqueness; refusing admission (fail closed): %w", obj.Namespace, err)
	}
	var owners []string
	for i := range list.Items {
		t := &list.Items[i]
		if t.Name != obj.Name && t.Spec.TenantID == obj.Spec.TenantID {
			owners = append(owners, t.Name)
		}
	}
	if len(owners) == 0 {
		return nil, nil
	}
	slices.Sort(owners)
	e := field.Duplicate(tenantIDPath, obj.Spec.TenantID)
	e.Detail = fmt.Sprintf("CacheTenant %q in namespace %q already uses this tenantID; give %q another tenantID or edit %q instead",
		owners[0], obj.Namespace, obj.Name, owners[0])
	return e, nil
}
