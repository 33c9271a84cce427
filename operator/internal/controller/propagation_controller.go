package controller

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// RBAC: only the verbs the code calls (TestConfigRBACLeastPrivilege pins
// them): informers list and watch, status is written with Update, Events
// are created and patched (series).
// +kubebuilder:rbac:groups=inferencecache.io,resources=cachepolicies;cachetenants,verbs=list;watch
// +kubebuilder:rbac:groups=inferencecache.io,resources=cachepolicies/status,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// PolicyPropagator pushes the cluster's CachePolicies and CacheTenants to the
// routing server's /policy endpoint and reports a verdict on every
// CachePolicy.
//
// Reconcile contract. There is exactly one work item (PropagationKey): every
// CachePolicy or CacheTenant event, the start of the controller, and a timer
// of Interval all enqueue that same key, so reconciles are serialized and
// bursts coalesce. One pass:
//
//  1. lists every CachePolicy and CacheTenant (a kind whose CRD is not
//     installed counts as empty; when neither is installed nothing is
//     pushed and nothing is logged);
//  2. resolves them (ResolvePolicies, ResolveTenants) and POSTs the full
//     version-7 body; the server replaces its whole state with it;
//  3. writes each CachePolicy's status (observedGeneration and the Accepted
//     condition) only when it changed, with a Warning Event when a policy
//     becomes Conflicted or Invalid;
//  4. returns RequeueAfter: Interval on success, so a restarted server with
//     an empty store is back in sync within one interval; on a failed push
//     or status write it returns the error and the work queue retries with
//     exponential backoff capped at Interval; a status write that lost a
//     resourceVersion race re-runs the pass shortly (passOutcome).
//
// The pass is level-based: it reads the whole state each time and keeps
// nothing between passes, so a missed event costs at most one interval.
type PolicyPropagator struct {
	// Policies and Tenants list the CRs: the manager's cached client when the
	// kind was served at start-up, otherwise a live reader (so a CRD installed
	// later is picked up by the next tick without a watch).
	Policies client.Reader
	Tenants  client.Reader
	// Status writes CachePolicy status.
	Status client.StatusClient
	// Server is the routing server client.
	Server *ServerClient
	// Recorder emits the Conflicted / Invalid Warning Events.
	Recorder events.EventRecorder
	// Interval is the periodic re-push (default 30 s).
	Interval time.Duration
}

// PropagationKey is the single work item of the PolicyPropagator.
var PropagationKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "policy-propagation"}}

var _ reconcile.Reconciler = (*PolicyPropagator)(nil)

// Reconcile runs one propagation pass; see the type's doc.
func (r *PolicyPropagator) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	log := logf.FromContext(ctx)
	var pols v1alpha1.CachePolicyList
	polErr := r.Policies.List(ctx, &pols)
	if polErr != nil && !kindMissing(polErr) {
		return reconcile.Result{}, polErr
	}
	var tens v1alpha1.CacheTenantList
	tenErr := r.Tenants.List(ctx, &tens)
	if tenErr != nil && !kindMissing(tenErr) {
		return reconcile.Result{}, tenErr
	}
	if polErr != nil && tenErr != nil {
		log.V(1).Info("CachePolicy and CacheTenant CRDs are not installed; nothing to push")
		return reconcile.Result{RequeueAfter: r.Interval}, nil
	}

	wire, verdicts := ResolvePolicies(pols.Items)
	tenants := ResolveTenants(tens.Items)
	body := BuildBody(wire, tenants.Wire)
	var out passOutcome
	if err := r.Server.PushPolicy(ctx, body); err != nil {
		out.fail(err)
	} else {
		log.V(1).Info("pushed policy snapshot", "policies", len(body.Policies), "tenants", len(body.Tenants))
	}
	// The verdicts do not depend on the push, so status is written either way.
	r.writeStatuses(ctx, pols.Items, verdicts, &out)
	return out.result(r.Interval)
}

// writeStatuses writes the statuses that changed and announces the new
// Conflicted and Invalid verdicts.
func (r *PolicyPropagator) writeStatuses(ctx context.Context, items []v1alpha1.CachePolicy, verdicts map[types.NamespacedName]PolicyVerdict, out *passOutcome) {
	for i := range items {
		cp := &items[i]
		v := verdicts[client.ObjectKeyFromObject(cp)]
		want := PolicyStatus(cp, cp.Status, v)
		if equality.Semantic.DeepEqual(want, cp.Status) {
			continue
		}
		before := cp.DeepCopy()
		cp.Status = want
		// A full update with the read resourceVersion: a conflict (the object
		// changed meanwhile) re-runs the pass, which reads it again.
		if err := r.Status.Status().Update(ctx, cp); err != nil {
			out.wrote(err)
			continue
		}
		r.announce(cp, before, v)
	}
}

// announce emits a Warning Event when a policy newly becomes (or changes
// why it is) Conflicted or Invalid.
func (r *PolicyPropagator) announce(cp, before *v1alpha1.CachePolicy, v PolicyVerdict) {
	if r.Recorder == nil || v.Reason == v1alpha1.ReasonAccepted {
		return
	}
	now := meta.FindStatusCondition(cp.Status.Conditions, v1alpha1.ConditionAccepted)
	old := meta.FindStatusCondition(before.Status.Conditions, v1alpha1.ConditionAccepted)
	if now == nil || old != nil && old.Reason == now.Reason && old.Message == now.Message {
		return
	}
	var related runtime.Object // the governing policy, for Conflicted
	if v.Reason == v1alpha1.ReasonConflicted {
		w := &v1alpha1.CachePolicy{}
		w.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("CachePolicy"))
		w.Namespace, w.Name = v.Winner.Namespace, v.Winner.Name
		related = w
	}
	r.Recorder.Eventf(cp, related, corev1.EventTypeWarning, v.Reason, "Resolve", "%s", now.Message)
}
