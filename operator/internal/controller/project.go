package controller

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// ProjectIndex maps a /snapshot body to CacheIndex.status, leaving
// LastUpdated to the caller (it moves only when the rest changes).
//
//   - replicas: only replicas that reported stats (the statsReported bit, or
//     for an older server a non-zero lastUpdate or hitRate); on an id
//     collision across tenants the lexicographically later tenant wins;
//     sorted by id;
//   - tenants: every snapshot tenant, with indexEntries always present,
//     hitRate only when reported, memoryUsed hard-zeroed; sorted by id;
//   - rates are float32 formatted with 'f', -1.
func ProjectIndex(snap *controlapi.CacheSnapshot, server string) v1alpha1.CacheIndexStatus {
	st := v1alpha1.CacheIndexStatus{
		Prefixes:       v1alpha1.PrefixStatus{Summary: v1alpha1.PrefixSummary{Total: snap.TotalPrefixes, Hot: 0}},
		ObservedServer: server,
	}
	byID := map[string]int{}
	for i := range snap.Replicas {
		r := &snap.Replicas[i]
		if !r.StatsReported && r.LastUpdate.IsZero() && r.HitRate == 0 {
			continue // prefix-only replica: not published here
		}
		row := v1alpha1.ReplicaCacheStatus{
			ID:               r.ReplicaID,
			Tenant:           r.Tenant,
			CacheMemoryBytes: r.CacheMemoryBytes,
			HitRate:          ptr(formatRate(r.HitRate)),
			Pressure:         formatRate(r.Pressure),
			LastUpdate:       timeOrNil(r.LastUpdate),
		}
		if j, ok := byID[r.ReplicaID]; ok {
			if st.Replicas[j].Tenant < row.Tenant {
				st.Replicas[j] = row
			}
			continue
		}
		byID[r.ReplicaID] = len(st.Replicas)
		st.Replicas = append(st.Replicas, row)
	}
	slices.SortFunc(st.Replicas, func(a, b v1alpha1.ReplicaCacheStatus) int { return cmp.Compare(a.ID, b.ID) })
	for i := range snap.Tenants {
		t := &snap.Tenants[i]
		row := v1alpha1.TenantCacheStatus{ID: t.TenantID, IndexEntries: ptr(t.IndexEntries)}
		if t.HitRateReported || t.HitRate != 0 {
			row.HitRate = ptr(formatRate(t.HitRate))
		}
		st.Tenants = append(st.Tenants, row)
	}
	slices.SortFunc(st.Tenants, func(a, b v1alpha1.TenantCacheStatus) int { return cmp.Compare(a.ID, b.ID) })
	return st
}

// formatRate renders a rate the way the CRD stores it: the shortest decimal
// that round-trips the float32.
func formatRate(v float32) string { return strconv.FormatFloat(float64(v), 'f', -1, 32) }

// timeOrNil converts t to the second-precision API time, nil for the zero
// time. Truncating here keeps a round trip through the apiserver equal.
func timeOrNil(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	mt := metav1.NewTime(t.UTC().Truncate(time.Second))
	return &mt
}

// TenantStatus computes a CacheTenant's status from the tenant resolution and
// the snapshot's entry count for its tenant id (0 when the snapshot has no
// row for it). cur is the current status; conditions keep their transition
// times when unchanged.
func TenantStatus(t *v1alpha1.CacheTenant, cur v1alpha1.CacheTenantStatus, res TenantResolution, entries int64) v1alpha1.CacheTenantStatus {
	st := *cur.DeepCopy()
	st.ObservedGeneration = t.Generation
	st.IndexEntries = ptr(entries)
	id := t.Spec.TenantID
	self := client.ObjectKeyFromObject(t)
	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: t.Generation,
		})
	}
	if owner, ok := res.Owner[id]; ok && owner != self {
		set(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonDuplicateTenantID, fmt.Sprintf(
			"CacheTenant %s owns tenant id %q (CacheTenants with a quota come first, then the first by namespace/name wins); this one is not enforced: give it another tenantID or delete it",
			nsName(owner), id))
		set(v1alpha1.ConditionQuotaExceeded, metav1.ConditionFalse, v1alpha1.ReasonNotEffective, fmt.Sprintf(
			"the quota of %s applies to tenant id %q, not this one", nsName(owner), id))
		return st
	}
	set(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonObserved, fmt.Sprintf(
		"tenant id %q holds %d index entries on the server", id, entries))
	switch q := t.Spec.Quota; {
	case q == nil || q.MaxIndexEntries == nil:
		set(v1alpha1.ConditionQuotaExceeded, metav1.ConditionFalse, v1alpha1.ReasonNoQuota,
			"no spec.quota.maxIndexEntries: the tenant is unbounded")
	case entries > *q.MaxIndexEntries:
		set(v1alpha1.ConditionQuotaExceeded, metav1.ConditionTrue, v1alpha1.ReasonOverEntryBudget, fmt.Sprintf(
			"%d index entries exceed the budget of %d; the server evicts the tenant's oldest prefixes at ingest", entries, *q.MaxIndexEntries))
	default:
		set(v1alpha1.ConditionQuotaExceeded, metav1.ConditionFalse, v1alpha1.ReasonWithinBudget, fmt.Sprintf(
			"%d of %d index entries used", entries, *q.MaxIndexEntries))
	}
	return st
}

// PolicyStatus computes a CachePolicy's status from its verdict. cur is the
// current status; the condition keeps its transition time when unchanged.
func PolicyStatus(cp *v1alpha1.CachePolicy, cur v1alpha1.CachePolicyStatus, v PolicyVerdict) v1alpha1.CachePolicyStatus {
	st := *cur.DeepCopy()
	st.ObservedGeneration = cp.Generation
	c := metav1.Condition{Type: v1alpha1.ConditionAccepted, Reason: v.Reason, ObservedGeneration: cp.Generation}
	switch v.Reason {
	case v1alpha1.ReasonAccepted:
		c.Status = metav1.ConditionTrue
		c.Message = fmt.Sprintf("governs namespace %q: the controller pushes it to the routing server as the policy of tenant %q", cp.Namespace, cp.Namespace)
	case v1alpha1.ReasonConflicted:
		c.Status = metav1.ConditionFalse
		c.Message = fmt.Sprintf("CachePolicy %q governs namespace %q (the first valid policy by name wins); this one is not applied: merge its settings into %q and delete it",
			v.Winner.Name, cp.Namespace, v.Winner.Name)
	default:
		c.Status = metav1.ConditionFalse
		c.Message = "not applied, a field cannot be honored: " + v.Errors.ToAggregate().Error()
	}
	meta.SetStatusCondition(&st.Conditions, c)
	return st
}
