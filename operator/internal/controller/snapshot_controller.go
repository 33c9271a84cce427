package controller

import (
	"context"
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// +kubebuilder:rbac:groups=inferencecache.io,resources=cacheindices,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=inferencecache.io,resources=cacheindices/status;cachetenants/status,verbs=get;update;patch

// SnapshotPoller reads the routing server's /snapshot and projects it into
// CacheIndex cluster-default and into every CacheTenant's status.
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
//     when it changed.
//
// A kind whose CRD is not installed is skipped without logging an error.
type SnapshotPoller struct {
	// Reader reads CacheIndex and CacheTenants (cached or live, see
	// PolicyPropagator.Policies); Writer creates CacheIndex and writes status.
	Index   client.Reader
	Tenants client.Reader
	Writer  client.Client
	// Server is the routing server client.
	Server *ServerClient
	// Interval is the polling period (default 30 s).
	Interval time.Duration
	// Now returns the current time; nil means time.Now. Tests pin it.
	Now func() time.Time
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
	// A failure on the CacheIndex does not hold back the CacheTenants.
	idxErr := r.writeIndex(ctx, ProjectIndex(&snap, r.Server.BaseURL))
	if kindMissing(idxErr) {
		idxErr = nil
	}

	var tens v1alpha1.CacheTenantList
	if err := r.Tenants.List(ctx, &tens); err != nil {
		if kindMissing(err) {
			return reconcile.Result{RequeueAfter: r.Interval}, idxErr
		}
		return reconcile.Result{}, errors.Join(idxErr, err)
	}
	entries := make(map[string]int64, len(snap.Tenants))
	for _, t := range snap.Tenants {
		entries[t.TenantID] = t.IndexEntries
	}
	res := ResolveTenants(tens.Items)
	firstErr, conflicted := idxErr, false
	for i := range tens.Items {
		t := &tens.Items[i]
		want := TenantStatus(t, t.Status, res, entries[t.Spec.TenantID])
		if equality.Semantic.DeepEqual(want, t.Status) {
			continue
		}
		t.Status = want
		// Deleted meanwhile: skip; changed meanwhile: re-run soon.
		switch err := r.Writer.Status().Update(ctx, t); {
		case err == nil, apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			conflicted = true
		case firstErr == nil:
			firstErr = err
		}
	}
	if firstErr != nil {
		return reconcile.Result{}, firstErr
	}
	if conflicted {
		return reconcile.Result{RequeueAfter: min(conflictRetry, r.Interval)}, nil
	}
	return reconcile.Result{RequeueAfter: r.Interval}, nil
}

// writeIndex creates the singleton if needed and stores want as its status
// when it differs from the stored one (ignoring lastUpdated).
func (r *SnapshotPoller) writeIndex(ctx context.Context, want v1alpha1.CacheIndexStatus) error {
	var ci v1alpha1.CacheIndex
	err := r.Index.Get(ctx, types.NamespacedName{Name: v1alpha1.CacheIndexName}, &ci)
	if apierrors.IsNotFound(err) {
		ci = v1alpha1.CacheIndex{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.CacheIndexName}}
		if err = r.Writer.Create(ctx, &ci); err == nil {
			logf.FromContext(ctx).Info("created CacheIndex", "name", v1alpha1.CacheIndexName)
		} else if apierrors.IsAlreadyExists(err) {
			// Created concurrently (or the cache lags): fetch it live.
			err = r.Writer.Get(ctx, types.NamespacedName{Name: v1alpha1.CacheIndexName}, &ci)
		}
	}
	if err != nil {
		return err
	}
	want.LastUpdated = ci.Status.LastUpdated
	if equality.Semantic.DeepEqual(want, ci.Status) {
		return nil
	}
	now := metav1.NewTime(r.now().UTC().Truncate(time.Second))
	want.LastUpdated = &now
	ci.Status = want
	return r.Writer.Status().Update(ctx, &ci)
}

func (r *SnapshotPoller) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
