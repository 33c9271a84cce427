package controller

import (
	"context"
	"fmt"
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
	"github.com/inferencecache/inferencecache/policy"
)

// RBAC: only the verbs the code calls (TestConfigRBACLeastPrivilege pins
// them): informers list and watch, status is written with Update, Events
// are created and patched (series).
// +kubebuilder:rbac:groups=inferencecache.io,resources=cachepolicies;cachetenants,verbs=list;watch
// +kubebuilder:rbac:groups=inferencecache.io,resources=cachepolicies/status;cachetenants/status,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// PolicyPropagator pushes the cluster's CachePolicies, CacheTenants,
// PDTopologies and PromptTemplates to every ready routing server pod's
// /policy endpoint, as one replace-on-write body (two pushers would race),
// and reports a verdict and the push's outcome on every CachePolicy, the
// Propagated condition on the CacheTenants it pushed and the status of
// every PDTopology.
//
// Reconcile contract. There is exactly one work item (PropagationKey): every
// CachePolicy or CacheTenant event, every change of the server Service's
// EndpointSlices (a new ready server pod), the start of the controller, and a
// timer of Interval all enqueue that same key, so reconciles are serialized
// and bursts coalesce. One pass:
//
//  1. lists every CachePolicy, CacheTenant, PDTopology and PromptTemplate
//     (a kind whose CRD is not installed counts as empty; when none is
//     installed nothing is pushed and nothing is logged);
//  2. resolves them (ResolvePolicies, ResolveTenants, ResolvePD) into the
//     full body, at policy.VersionFor's version: 7 without topologies and
//     templates, exactly what a v7 controller sent, else 8;
//  3. finds the servers (ServerDiscovery): every ready endpoint of the
//     server Service's EndpointSlices, or, when those cannot be read, the
//     configured address; and POSTs the body to each, at most
//     maxConcurrentPushes at a time; each server replaces its whole state
//     with it. A server that refuses a version-8 body with HTTP 400 (one
//     that predates version 8) is sent policy.WithoutVersion8(body) once,
//     so CachePolicy and CacheTenant state still reaches it; its
//     PDTopologies read NotPropagated;
//  4. writes each CachePolicy's status only when it changed: observedGeneration,
//     the Accepted condition (the spec's verdict, whatever the push did), and,
//     on an Accepted policy, the Propagated condition and
//     status.propagation (per server: the generation it acknowledged, or its
//     error); with a Warning Event when a policy becomes Conflicted or
//     Invalid or when Propagated becomes False, and a Normal one when it is
//     True again; and each PDTopology's status (PDTopologyStatus: pool
//     members from the pods' labels, the Ready condition), with an Event
//     when Ready changes;
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
	// Policies, Tenants, Topologies and Templates list the CRs: the
	// manager's cached client when the kind was served at start-up,
	// otherwise a live reader (so a CRD installed later is picked up by the
	// next tick without a watch). A nil Topologies or Templates counts as
	// a kind that is not installed.
	Policies   client.Reader
	Tenants    client.Reader
	Topologies client.Reader
	Templates  client.Reader
	// Pods lists pod metadata (metav1.PartialObjectMetadataList) to count
	// the members of each PDTopology pool; nil counts none.
	Pods client.Reader
	// Status writes CachePolicy, CacheTenant and PDTopology status.
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
	// fellBack is the servers that took the version-7 fallback in the last
	// pass, and notPushed the objects left out of the last push with why,
	// so each change is logged (and announced) once. Only Reconcile touches
	// them, like lastWhy.
	fellBack  map[string]bool
	notPushed map[types.NamespacedName]string
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
	var tops v1alpha1.PDTopologyList
	topErr := listOptional(ctx, r.Topologies, &tops)
	if topErr != nil && !kindMissing(topErr) {
		return reconcile.Result{}, topErr
	}
	var tmpls v1alpha1.PromptTemplateList
	tmplErr := listOptional(ctx, r.Templates, &tmpls)
	if tmplErr != nil && !kindMissing(tmplErr) {
		return reconcile.Result{}, tmplErr
	}
	if polErr != nil && tenErr != nil && topErr != nil && tmplErr != nil {
		log.V(1).Info("CachePolicy, CacheTenant, PDTopology and PromptTemplate CRDs are not installed; nothing to push")
		return reconcile.Result{RequeueAfter: r.Interval}, nil
	}

	wire, verdicts := ResolvePolicies(pols.Items)
	tenants := ResolveTenants(tens.Items)
	pd := ResolvePD(tops.Items, tmpls.Items)
	body := BuildBody(wire, tenants.Wire)
	AddPD(body, pd)
	raw, err := encodePolicy(body)
	if err != nil {
		return reconcile.Result{}, err
	}
	var fallback []byte // for a server that refuses version 8
	if body.Version > 7 {
		if fallback, err = encodePolicy(policy.WithoutVersion8(body)); err != nil {
			return reconcile.Result{}, err
		}
	}
	set := r.Servers.discover(ctx, r.Server.BaseURL)
	r.noteTarget(ctx, set)
	rep := &pushReport{Target: set.target, Service: r.Servers.Service, Results: pushAll(ctx, r.Server, set.servers, raw, fallback)}
	var out passOutcome
	acked := 0
	for _, res := range rep.Results {
		if res.err != nil {
			out.fail(res.err)
		} else {
			acked++
		}
	}
	r.noteFallback(ctx, rep)
	r.noteNotPushed(ctx, tmpls.Items, pd)
	log.V(1).Info("pushed policy snapshot", "version", body.Version, "policies", len(body.Policies), "tenants", len(body.Tenants),
		"pdTopologies", len(body.PDTopologies), "promptTemplates", len(body.PromptTemplates),
		"target", set.target, "servers", len(rep.Results), "acknowledged", acked)
	// The verdicts do not depend on the push, so status is written either way.
	r.writeStatuses(ctx, pols.Items, verdicts, rep, &out)
	r.writeTenantStatuses(ctx, tens.Items, tenants, rep, &out)
	r.writeTopologyStatuses(ctx, tops.Items, pd, rep, &out)
	return out.result(r.Interval)
}

// listOptional lists into list with reader; a nil reader reads as a kind
// that is not installed.
func listOptional(ctx context.Context, reader client.Reader, list client.ObjectList) error {
	if reader == nil {
		return &meta.NoKindMatchError{GroupKind: v1alpha1.GroupVersion.WithKind("").GroupKind()}
	}
	return reader.List(ctx, list)
}

// noteFallback logs each server that starts or stops taking the version-7
// fallback (it refused the version-8 body), once per change.
func (r *PolicyPropagator) noteFallback(ctx context.Context, rep *pushReport) {
	now := map[string]bool{}
	for _, res := range rep.Results {
		if res.refused != nil {
			now[res.server.Name] = true
			if !r.fellBack[res.server.Name] {
				logf.FromContext(ctx).Info("a routing server refused the version-8 policy body; it was sent version 7 without PDTopologies and PromptTemplates",
					"server", res.server.Name, "address", res.server.Address, "error", res.refused.Error())
			}
		}
	}
	for name := range r.fellBack {
		if !now[name] {
			logf.FromContext(ctx).Info("a routing server that had refused the version-8 policy body takes it again, or is gone", "server", name)
		}
	}
	r.fellBack = now
}

// noteNotPushed logs, and announces with a Warning Event on the
// PromptTemplate, each object newly left out of the push (ResolvePD); a
// PDTopology's Ready condition also says it.
func (r *PolicyPropagator) noteNotPushed(ctx context.Context, tmpls []v1alpha1.PromptTemplate, pd PDResolution) {
	for key, why := range pd.Invalid {
		if r.notPushed[key] == why {
			continue
		}
		logf.FromContext(ctx).Info("left out of the policy push: the routing server would refuse it", "object", nsName(key), "error", why)
		if r.Recorder == nil {
			continue
		}
		for i := range tmpls {
			if client.ObjectKeyFromObject(&tmpls[i]) == key {
				r.Recorder.Eventf(&tmpls[i], nil, corev1.EventTypeWarning, ReasonNotPushed, "Push", "%s", truncate(why, maxErrorLen))
			}
		}
	}
	r.notPushed = pd.Invalid
}

// ReasonNotPushed is the reason of the Warning Event on a PromptTemplate
// the routing server would refuse (so it is left out of the push).
const ReasonNotPushed = "NotPushed"

// writeTopologyStatuses writes each PDTopology's status (PDTopologyStatus)
// where it changed, with an Event when Ready changes (announceCondition).
// The pods of a namespace are listed once; a namespace whose pods cannot be
// listed keeps its topologies' status as it is.
func (r *PolicyPropagator) writeTopologyStatuses(ctx context.Context, items []v1alpha1.PDTopology, pd PDResolution, rep *pushReport, out *passOutcome) {
	pods := map[string][]metav1.PartialObjectMetadata{}
	failed := map[string]bool{}
	for i := range items {
		t := &items[i]
		ns := t.Namespace
		if _, ok := pods[ns]; !ok && r.Pods != nil && !failed[ns] {
			var pl metav1.PartialObjectMetadataList
			pl.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
			if err := r.Pods.List(ctx, &pl, client.InNamespace(ns)); err != nil {
				failed[ns] = true
				out.fail(fmt.Errorf("cannot list pods in %s to count PDTopology pool members: %w", ns, err))
			} else {
				pods[ns] = pl.Items
			}
		}
		if failed[ns] {
			continue
		}
		want := PDTopologyStatus(t, t.Status, PoolMembers(t, pods[ns]), pd.Invalid[client.ObjectKeyFromObject(t)], rep)
		if equality.Semantic.DeepEqual(want, t.Status) {
			continue
		}
		before := t.Status.Conditions
		t.Status = want
		if err := r.Status.Status().Update(ctx, t); err != nil {
			out.wrote(err)
			continue
		}
		r.announceCondition(t, v1alpha1.ConditionReady, t.Status.Conditions, before)
	}
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
// conditions before to cur (announceCondition).
func (r *PolicyPropagator) announcePropagation(obj runtime.Object, cur, before []metav1.Condition) {
	r.announceCondition(obj, v1alpha1.ConditionPropagated, cur, before)
}

// announceCondition emits an Event on obj when its condition typ changes
// status or reason, from the conditions before to cur: a Warning when it
// becomes False, a Normal one when it becomes True after having been False.
// A new message with the same reason (another error from a server that
// still fails) emits nothing, nor does a first True.
func (r *PolicyPropagator) announceCondition(obj runtime.Object, typ string, cur, before []metav1.Condition) {
	if r.Recorder == nil {
		return
	}
	now := meta.FindStatusCondition(cur, typ)
	old := meta.FindStatusCondition(before, typ)
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
