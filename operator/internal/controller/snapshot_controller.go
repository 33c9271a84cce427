package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// RBAC: CacheIndex is read with Get (a live read when its CRD was installed
// after start-up) and created; CacheIndex and CacheTenant status are written
// with Update, CacheBackend status with a merge Patch; CacheBackends and pod
// metadata are read through informers.
// +kubebuilder:rbac:groups=inferencecache.io,resources=cacheindices,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=inferencecache.io,resources=cacheindices/status;cachetenants/status,verbs=update
// +kubebuilder:rbac:groups=inferencecache.io,resources=cachebackends,verbs=list;watch
// +kubebuilder:rbac:groups=inferencecache.io,resources=cachebackends/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=list;watch

// SnapshotPoller reads the routing server's /snapshot and projects it into
// CacheIndex cluster-default, every CacheTenant's status and every
// CacheBackend's status.indexParticipation.
//
// Reconcile contract. One work item (SnapshotKey), enqueued at start, on
// every CacheTenant create/delete/spec change, and every Interval. One pass:
//
//  1. GETs /snapshot with the controller-audience token; on failure it
//     returns the error (exponential backoff capped at Interval) and changes
//     no status: one failed scrape never clears what was observed;
//  2. creates CacheIndex cluster-default if missing and writes its status
//     when the projection (ProjectIndex) differs from what is stored;
//     lastUpdated moves only then;
//  3. resolves CacheTenant ownership the same way the PolicyPropagator does
//     (ResolveTenants) and writes each CacheTenant's status (TenantStatus)
//     when it changed;
//  4. attributes the snapshot's replicas to CacheBackends through their
//     engine pods (AttributeReplicas), writes each backend's
//     status.indexParticipation when it changed (a merge patch of that one
//     field; the rest of CacheBackend status is not the poller's), and sets
//     the tier-2 metrics (BackendMetrics). A backend whose namespace's pods
//     could not be listed this pass is left untouched, status and series.
//
// Steps 2 to 4 each go on when another fails, and the pass ends as
// passOutcome describes: an error is retried with backoff, a lost
// resourceVersion race re-runs the pass shortly, and otherwise the next pass
// is one Interval away. A kind whose CRD is not installed is skipped without
// logging an error.
type SnapshotPoller struct {
	// Index and Tenants read CacheIndex and CacheTenants (cached or live, see
	// PolicyPropagator.Policies); Writer creates CacheIndex and writes status.
	Index   client.Reader
	Tenants client.Reader
	Writer  client.Client
	// Server is the routing server client.
	Server *ServerClient
	// Backends lists CacheBackends and Pods lists pod and Namespace metadata
	// (labels and annotations, a metadata-only cache; a Namespace's
	// annotations carry its consent to cross-namespace claims) for replica
	// attribution; either nil skips step 4.
	Backends client.Reader
	Pods     client.Reader
	// Metrics receives the tier-2 series; nil drives none.
	Metrics *BackendMetrics
	// Interval is the polling period (default 30 s).
	Interval time.Duration
	// Now returns the current time (for lastUpdated); nil means time.Now.
	Now func() time.Time

	// lastQueries is each backend's cumulative tier-2 query tokens at the
	// previous poll, for the counter's deltas. Only Reconcile reads or writes
	// it and the controller runs a single worker, so it has no lock.
	lastQueries map[string]int64
}

// SnapshotKey is the single work item of the SnapshotPoller.
var SnapshotKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "cache-snapshot"}}

var _ reconcile.Reconciler = (*SnapshotPoller)(nil)

// Reconcile runs one polling pass; see the type's doc.
func (r *SnapshotPoller) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	snap, err := r.Server.Snapshot(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	var out passOutcome
	r.writeIndex(ctx, ProjectIndex(&snap, r.Server.BaseURL), &out)
	r.writeTenants(ctx, &snap, &out)
	r.writeBackends(ctx, &snap, &out)
	return out.result(r.Interval)
}

// writeIndex is step 2 of Reconcile: it creates the singleton if needed and
// stores want as its status when it differs from the stored one (ignoring
// lastUpdated).
func (r *SnapshotPoller) writeIndex(ctx context.Context, want v1alpha1.CacheIndexStatus, out *passOutcome) {
	var ci v1alpha1.CacheIndex
	err := r.Index.Get(ctx, types.NamespacedName{Name: v1alpha1.CacheIndexName}, &ci)
	if apierrors.IsNotFound(err) {
		ci = v1alpha1.CacheIndex{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.CacheIndexName}}
		if err = r.Writer.Create(ctx, &ci); err == nil {
			logf.FromContext(ctx).Info("created CacheIndex", "name", v1alpha1.CacheIndexName)
		} else if apierrors.IsAlreadyExists(err) {
			// Created concurrently, or the cache has not seen it yet: read it
			// back (a pass whose cache still lags fails and is retried).
			err = r.Writer.Get(ctx, types.NamespacedName{Name: v1alpha1.CacheIndexName}, &ci)
		}
	}
	if err != nil {
		if !kindMissing(err) {
			out.fail(err)
		}
		return
	}
	want.LastUpdated = ci.Status.LastUpdated
	if equality.Semantic.DeepEqual(want, ci.Status) {
		return
	}
	now := metav1.NewTime(r.now().UTC().Truncate(time.Second))
	want.LastUpdated = &now
	ci.Status = want
	out.wrote(r.Writer.Status().Update(ctx, &ci))
}

// writeTenants is step 3 of Reconcile.
func (r *SnapshotPoller) writeTenants(ctx context.Context, snap *controlapi.CacheSnapshot, out *passOutcome) {
	var tens v1alpha1.CacheTenantList
	if err := r.Tenants.List(ctx, &tens); err != nil {
		if !kindMissing(err) {
			out.fail(err)
		}
		return
	}
	entries := make(map[string]int64, len(snap.Tenants))
	for _, t := range snap.Tenants {
		entries[t.TenantID] = t.IndexEntries
	}
	res := ResolveTenants(tens.Items)
	for i := range tens.Items {
		t := &tens.Items[i]
		want := TenantStatus(t, t.Status, res, entries[t.Spec.TenantID])
		if equality.Semantic.DeepEqual(want, t.Status) {
			continue
		}
		t.Status = want
		out.wrote(r.Writer.Status().Update(ctx, t))
	}
}

func (r *SnapshotPoller) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// writeBackends is step 4 of Reconcile.
func (r *SnapshotPoller) writeBackends(ctx context.Context, snap *controlapi.CacheSnapshot, out *passOutcome) {
	if r.Backends == nil || r.Pods == nil {
		return
	}
	var backends v1alpha1.CacheBackendList
	if err := r.Backends.List(ctx, &backends); err != nil {
		if !kindMissing(err) {
			out.fail(err)
		}
		return
	}
	pods := map[types.NamespacedName]PodMeta{}
	tainted := map[string]bool{}
	listed := map[string]bool{}
	for i := range snap.Replicas {
		ns := snap.Replicas[i].Tenant
		if ns == "" || listed[ns] {
			continue
		}
		listed[ns] = true
		var pl metav1.PartialObjectMetadataList
		pl.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := r.Pods.List(ctx, &pl, client.InNamespace(ns)); err != nil {
			tainted[ns] = true
			out.fail(fmt.Errorf("cannot list pods in %s to attribute replicas: %w", ns, err))
			continue
		}
		maps.Copy(pods, podMetaOf(pl.Items))
	}
	// Cross-namespace claims need the pod namespace's consent.
	nsAnn := map[string]map[string]string{}
	if slices.ContainsFunc(backends.Items, func(b v1alpha1.CacheBackend) bool { return b.Spec.AllowCrossNamespace }) {
		var nl metav1.PartialObjectMetadataList
		nl.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NamespaceList"))
		if err := r.Pods.List(ctx, &nl); err != nil {
			// Attribution without them could move replicas between
			// backends; keep every backend's participation as it is.
			out.fail(fmt.Errorf("cannot list namespaces to attribute replicas: %w", err))
			return
		}
		for i := range nl.Items {
			if listed[nl.Items[i].Name] {
				nsAnn[nl.Items[i].Name] = nl.Items[i].Annotations
			}
		}
	}
	groups := AttributeReplicas(snap, backends.Items, pods, nsAnn)
	if r.lastQueries == nil {
		r.lastQueries = map[string]int64{}
	}
	live := map[string]bool{}
	for i := range backends.Items {
		b := &backends.Items[i]
		key := b.Namespace + "/" + b.Name
		live[key] = true
		if tainted[b.Namespace] {
			continue
		}
		p, hits, queries := Participation(groups[key])
		if !equality.Semantic.DeepEqual(b.Status.IndexParticipation, &p) {
			out.wrote(r.patchParticipation(ctx, b, &p))
		}
		if r.Metrics == nil {
			continue
		}
		if len(groups[key]) == 0 || queries == 0 {
			r.Metrics.delete(key)
			delete(r.lastQueries, key)
			continue
		}
		r.Metrics.HitRate.WithLabelValues(key).Set(min(max(float64(hits)/float64(queries), 0), 1))
		if d := queries - r.lastQueries[key]; d > 0 {
			r.Metrics.QueryTokens.WithLabelValues(key).Add(float64(d))
		}
		r.lastQueries[key] = queries
	}
	for key := range r.lastQueries {
		if !live[key] { // the backend was deleted
			r.Metrics.delete(key)
			delete(r.lastQueries, key)
		}
	}
}

// patchParticipation replaces status.indexParticipation with p through a
// JSON merge patch that names every field, absent ones as null, so a field
// that went away is removed.
func (r *SnapshotPoller) patchParticipation(ctx context.Context, b *v1alpha1.CacheBackend, p *v1alpha1.IndexParticipation) error {
	field := map[string]any{"prefixCount": p.PrefixCount, "lastEventAt": nil, "hitRate": nil, "t2HitRate": nil}
	if p.LastEventAt != nil {
		field["lastEventAt"] = p.LastEventAt
	}
	if p.HitRate != nil {
		field["hitRate"] = *p.HitRate
	}
	if p.T2HitRate != nil {
		field["t2HitRate"] = *p.T2HitRate
	}
	data, err := json.Marshal(map[string]any{"status": map[string]any{"indexParticipation": field}})
	if err != nil {
		return fmt.Errorf("cannot encode indexParticipation of %s/%s: %w", b.Namespace, b.Name, err)
	}
	return r.Writer.Status().Patch(ctx, b, client.RawPatch(types.MergePatchType, data))
}
