package controller

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// +kubebuilder:rbac:groups=inferencecache.io,resources=cachepolicies/status;cachetenants/status,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// PolicyPropagator pushes the cluster's CachePolicies and CacheTenants to
// every ready routing server pod's /policy endpoint and reports a verdict and
// the push's outcome on every CachePolicy.
//
// Reconcile contract. There is exactly one work item (PropagationKey): every
// CachePolicy or CacheTenant event, every change of the server Service's
// EndpointSlices (a new ready server pod), the start of the controller, and a
// timer of Interval all enqueue that same key, so reconciles are serialized
// and bursts coalesce. One pass:
//
//  1. lists every CachePolicy and CacheTenant (a kind whose CRD is not
//     installed counts as empty; when neither is installed nothing is
//     pushed and nothing is logged);
//  2. resolves them (ResolvePolicies, ResolveTenants) into the full
//     version-7 body;
//  3. finds the servers (ServerDiscovery): every ready endpoint of the
//     server Service's EndpointSlices, or, when those cannot be read, the
//     configured address; and POSTs the body to each, at most
//     maxConcurrentPushes at a time; each server replaces its whole state
//     with it;
//  4. writes each CachePolicy's status only when it changed: observedGeneration,
//     the Accepted condition (the spec's verdict, whatever the push did), and,
//     on an Accepted policy, the Propagated condition and
//     status.propagation (per server: the generation it acknowledged, or its
//     error); with a Warning Event when a policy becomes Conflicted or
//     Invalid or when Propagated becomes False, and a Normal one when it is
//     True again;
//  5. returns RequeueAfter: Interval on success, so a restarted server with
//     an empty store is back in sync within one interval; when a push to any
//     server or a status write failed it returns the error and the work
//     queue retries with exponential backoff capped at Interval; a status
//     write that lost a resourceVersion race re-runs the pass shortly
//     (passOutcome).
//
// The pass is level-based: it reads the whole state each time; what each
// server acknowledged before is read back from the status it wrote, so a
// missed event costs at most one interval.
type PolicyPropagator struct {
	// Policies and Tenants list the CRs: the manager's cached client when the
	// kind was served at start-up, otherwise a live reader (so a CRD installed
	// later is picked up by the next tick without a watch).
	Policies client.Reader
	Tenants  client.Reader
	// Status writes CachePolicy status.
	Status client.StatusClient
	// Server is the routing server client; its BaseURL is the fallback
	// address.
	Server *ServerClient
	// Servers finds the server pods; its zero value pushes to Server.BaseURL
	// only.
	Servers ServerDiscovery
	// Recorder emits the Conflicted / Invalid / Propagated Events.
	Recorder events.EventRecorder
	// Interval is the periodic re-push (default 30 s).
	Interval time.Duration
	// Now is the clock of status times; nil means time.Now.
	Now func() time.Time

	// lastWhy is why the last pass pushed to the configured address rather
	// than the pods ("" after a pass that used the EndpointSlices), so the
	// change is logged once. Only Reconcile touches it, and the controller
	// runs one Reconcile at a time (MaxConcurrentReconciles 1).
	lastWhy *string
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
	raw, err := encodePolicy(body)
	if err != nil {
		return reconcile.Result{}, err
	}
	set := r.Servers.discover(ctx, r.Server.BaseURL)
	r.noteTarget(ctx, set)
	rep := &pushReport{Target: set.target, Service: r.Servers.Service, Results: pushAll(ctx, r.Server, set.servers, raw)}
	var out passOutcome
	acked := 0
	for _, res := range rep.Results {
		if res.err != nil {
			out.fail(res.err)
		} else {
			acked++
		}
	}
	log.V(1).Info("pushed policy snapshot", "policies", len(body.Policies), "tenants", len(body.Tenants),
		"target", set.target, "servers", len(rep.Results), "acknowledged", acked)
	// The verdicts do not depend on the push, so status is written either way.
	r.writeStatuses(ctx, pols.Items, verdicts, rep, &out)
	r.writeTenantStatuses(ctx, tens.Items, tenants, rep, &out)
	return out.result(r.Interval)
}

// noteTarget logs when the pass starts or stops pushing to the configured
// address instead of the pods, and why.
func (r *PolicyPropagator) noteTarget(ctx context.Context, set serverSet) {
	if r.lastWhy != nil && *r.lastWhy == set.why {
		return
	}
	log := logf.FromContext(ctx)
	if set.why != "" {
		log.Info("pushing the policy to the configured server address only", "address", r.Server.BaseURL, "reason", set.why)
	} else {
		log.Info("pushing the policy to every ready server pod", "service", nsName(r.Servers.Service), "servers", len(set.servers))
	}
	r.lastWhy = &set.why
}

// writeStatuses writes the statuses that changed and announces the new
// Conflicted and Invalid verdicts.
func (r *PolicyPropagator) writeStatuses(ctx context.Context, items []v1alpha1.CachePolicy, verdicts map[types.NamespacedName]PolicyVerdict, rep *pushReport, out *passOutcome) {
	now := metav1.NewTime(time.Now())
	if r.Now != nil {
		now = metav1.NewTime(r.Now())
	}
	for i := range items {
		cp := &items[i]
		v := verdicts[client.ObjectKeyFromObject(cp)]
		want := PropagationStatus(cp, PolicyStatus(cp, cp.Status, v), v, rep, now)
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
		r.announcePropagation(cp, cp.Status.Conditions, before.Status.Conditions)
	}
}

// writeTenantStatuses writes the Propagated condition of the CacheTenants
// whose quota was pushed (and removes it from the others) where it changed.
// The SnapshotPoller writes the other conditions of the same status; both
// update with the read resourceVersion, so neither erases the other's.
func (r *PolicyPropagator) writeTenantStatuses(ctx context.Context, items []v1alpha1.CacheTenant, res TenantResolution, rep *pushReport, out *passOutcome) {
	for i := range items {
		t := &items[i]
		want := TenantPropagationStatus(t, t.Status, res, rep)
		if equality.Semantic.DeepEqual(want, t.Status) {
			continue
		}
		before := t.Status.Conditions
		t.Status = want
		if err := r.Status.Status().Update(ctx, t); err != nil {
			out.wrote(err)
			continue
		}
		r.announcePropagation(t, t.Status.Conditions, before)
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

// announcePropagation emits an Event on obj (a CachePolicy or CacheTenant)
// when its Propagated condition changes status or reason, from the
// conditions before to cur: a Warning when it becomes False, a Normal one
// when it becomes True after having been False. A new message with the same
// reason (another error from a server that still fails) emits nothing, nor
// does a first True.
func (r *PolicyPropagator) announcePropagation(obj runtime.Object, cur, before []metav1.Condition) {
	if r.Recorder == nil {
		return
	}
	now := meta.FindStatusCondition(cur, v1alpha1.ConditionPropagated)
	old := meta.FindStatusCondition(before, v1alpha1.ConditionPropagated)
	if now == nil || old != nil && old.Status == now.Status && old.Reason == now.Reason {
		return
	}
	switch {
	case now.Status == metav1.ConditionFalse:
		r.Recorder.Eventf(obj, nil, corev1.EventTypeWarning, now.Reason, "Push", "%s", now.Message)
	case old != nil && old.Status == metav1.ConditionFalse:
		r.Recorder.Eventf(obj, nil, corev1.EventTypeNormal, now.Reason, "Push", "%s", now.Message)
	}
}
