package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
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
// first 16 hex digits of SHA-256 over the spec's JSON (body, then slots in
// order, each slot's fields in declaration order). Two specs share a
// revision exactly when their body and slots are equal.
func TemplateRevision(spec *v1alpha1.PromptTemplateSpec) string {
	raw, err := json.Marshal(spec)
	if err != nil {
		panic("BUG: a PromptTemplateSpec does not encode: " + err.Error())
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:8])
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
