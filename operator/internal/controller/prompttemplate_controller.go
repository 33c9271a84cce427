package controller

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/policy"
)

// +kubebuilder:rbac:groups=inferencecache.io,resources=prompttemplates,verbs=list;watch
// +kubebuilder:rbac:groups=inferencecache.io,resources=prompttemplates/status,verbs=patch

// PromptTemplateReconciler writes status.templateRevision, a content hash
// of the spec, so clients can tell which version of a template they cached.
//
// Reconcile contract: one work item per PromptTemplate, on every change;
// the pass patches status.templateRevision when it differs from
// TemplateRevision(spec). Nothing else is read or written.
type PromptTemplateReconciler struct {
	Client client.Client
}

var _ reconcile.Reconciler = (*PromptTemplateReconciler)(nil)

// TemplateRevision is the stable content hash of a PromptTemplate spec: the
// first 16 hex digits of SHA-256 over the body and then each slot's name,
// type, required flag and description, in order, every string
// length-prefixed so no two specs share an encoding. Two specs share a
// revision exactly when their body and slots are equal.
func TemplateRevision(spec *v1alpha1.PromptTemplateSpec) string {
	// The server computes the same for a pushed template without one
	// (TestTemplateRevisionMatchesServer).
	return policy.TemplateRevision(spec.Body, TemplateSlots(spec))
}

// Reconcile runs one pass; see the type's doc.
func (r *PromptTemplateReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pt v1alpha1.PromptTemplate
	if err := r.Client.Get(ctx, req.NamespacedName, &pt); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	rev := TemplateRevision(&pt.Spec)
	if pt.Status.TemplateRevision == rev {
		return reconcile.Result{}, nil
	}
	before := pt.DeepCopy()
	pt.Status.TemplateRevision = rev
	if err := r.Client.Status().Patch(ctx, &pt, client.MergeFrom(before)); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("cannot write status of PromptTemplate %s: %w", req, err)
	}
	return reconcile.Result{}, nil
}
