package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

func getIndex(ctx context.Context) (*v1alpha1.CacheIndex, error) {
	var ci v1alpha1.CacheIndex
	err := k8s.Get(ctx, client.ObjectKey{Name: v1alpha1.CacheIndexName}, &ci)
	return &ci, err
}

func TestCacheIndexProjection(t *testing.T) {
	ctx := needEnv(t)
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	snap := controlapi.CacheSnapshot{
		Replicas: []controlapi.ReplicaSnapshot{
			{ReplicaID: "vllm-0", Tenant: "team-a", CacheMemoryBytes: 1 << 30, HitRate: 0.5, Pressure: 0.25, LastUpdate: t0, PrefixCount: 4, StatsReported: true},
			{ReplicaID: "vllm-0", Tenant: "team-b", CacheMemoryBytes: 2 << 30, HitRate: 0.75, Pressure: 0.125, LastUpdate: t0, StatsReported: true},
			{ReplicaID: "vllm-1", Tenant: "team-a", PrefixCount: 2}, // prefix only: not listed
		},
		Tenants: []controlapi.TenantSnapshot{
			{TenantID: "team-a", IndexEntries: 6, HitRate: 0.5, HitRateReported: true},
			{TenantID: "team-b", IndexEntries: 0},
		},
		TotalPrefixes: 6,
	}
	srv.snap.Store(&snap)
	var first *v1alpha1.CacheIndex
	eventually(t, propagationLimit, func() error {
		ci, err := getIndex(ctx)
		if err != nil {
			return err
		}
		st := ci.Status
		if len(st.Replicas) != 1 || st.Prefixes.Summary.Total != 6 || len(st.Tenants) != 2 {
			return fmt.Errorf("status %+v", st)
		}
		first = ci
		return nil
	})
	st := first.Status
	r := st.Replicas[0]
	if r.ID != "vllm-0" || r.Tenant != "team-b" || *r.HitRate != "0.75" || r.Pressure != "0.125" || r.CacheMemoryBytes != 2<<30 || !r.LastUpdate.Time.Equal(t0) {
		t.Fatalf("replica row %+v", r)
	}
	if st.Tenants[0].ID != "team-a" || *st.Tenants[0].IndexEntries != 6 || *st.Tenants[0].HitRate != "0.5" ||
		st.Tenants[1].HitRate != nil || *st.Tenants[1].IndexEntries != 0 {
		t.Fatalf("tenant rows %+v", st.Tenants)
	}
	if st.ObservedServer != "http://"+srv.addr || st.LastUpdated == nil || st.Prefixes.Summary.Hot != 0 {
		t.Fatalf("status %+v", st)
	}
	// memoryUsed: 0 is stored, not omitted.
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("CacheIndex"))
	wantOK(t, "get unstructured", k8s.Get(ctx, client.ObjectKey{Name: v1alpha1.CacheIndexName}, u))
	tenants, _, _ := unstructured.NestedSlice(u.Object, "status", "tenants")
	for _, row := range tenants {
		if v, ok := row.(map[string]any)["memoryUsed"]; !ok || fmt.Sprint(v) != "0" {
			t.Fatalf("tenant row without memoryUsed: 0: %v", row)
		}
	}

	// Unchanged snapshots write nothing: lastUpdated and resourceVersion stay.
	time.Sleep(3 * tick)
	again, err := getIndex(ctx)
	wantOK(t, "get", err)
	if again.ResourceVersion != first.ResourceVersion || !again.Status.LastUpdated.Equal(first.Status.LastUpdated) {
		t.Fatalf("rewritten without a change: rv %s -> %s", first.ResourceVersion, again.ResourceVersion)
	}

	// A change moves lastUpdated.
	time.Sleep(time.Second) // lastUpdated has second precision
	snap2 := snap
	snap2.Tenants = append([]controlapi.TenantSnapshot(nil), snap.Tenants...)
	snap2.Tenants[1].IndexEntries = 3
	snap2.TotalPrefixes = 9
	srv.snap.Store(&snap2)
	eventually(t, propagationLimit, func() error {
		ci, err := getIndex(ctx)
		if err != nil {
			return err
		}
		if ci.Status.Prefixes.Summary.Total != 9 || !ci.Status.LastUpdated.After(first.Status.LastUpdated.Time) {
			return fmt.Errorf("status %+v", ci.Status)
		}
		return nil
	})

	// The controller recreates the singleton when it is deleted.
	wantOK(t, "delete CacheIndex", k8s.Delete(ctx, first))
	eventually(t, propagationLimit, func() error {
		ci, err := getIndex(ctx)
		if err != nil {
			return err
		}
		if ci.UID == first.UID || ci.Status.Prefixes.Summary.Total != 9 {
			return errNotYet
		}
		return nil
	})
}

func TestCacheTenantStatus(t *testing.T) {
	ctx := needEnv(t)
	ns1 := namespace(t, ctx, "st-1", false)
	ns2 := namespace(t, ctx, "st-2", false)
	owner := tenantObj(ns1, "owner", "st-shared", ptr(int64(10)))
	shadow := tenantObj(ns2, "shadow", "st-shared", ptr(int64(50)))
	free := tenantObj(ns1, "free", "st-free", nil)
	for _, o := range []*v1alpha1.CacheTenant{owner, shadow, free} {
		wantOK(t, "create "+o.Name, k8s.Create(ctx, o))
	}
	srv.snap.Store(&controlapi.CacheSnapshot{
		Tenants: []controlapi.TenantSnapshot{
			{TenantID: "st-free", IndexEntries: 7},
			{TenantID: "st-shared", IndexEntries: 12},
		},
		TotalPrefixes: 19,
	})
	type want struct {
		entries                  int64
		ready                    metav1.ConditionStatus
		readyReason, quotaReason string
		quota                    metav1.ConditionStatus
		messageFragment          string
	}
	check := func(o *v1alpha1.CacheTenant, w want) {
		t.Helper()
		eventually(t, propagationLimit, func() error {
			var got v1alpha1.CacheTenant
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(o), &got); err != nil {
				return err
			}
			st := got.Status
			r := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
			q := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionQuotaExceeded)
			if st.IndexEntries == nil || *st.IndexEntries != w.entries || r == nil || q == nil ||
				r.Status != w.ready || r.Reason != w.readyReason || q.Status != w.quota || q.Reason != w.quotaReason ||
				!strings.Contains(r.Message, w.messageFragment) || st.ObservedGeneration != got.Generation {
				return fmt.Errorf("%s status %+v", o.Name, st)
			}
			return nil
		})
	}
	check(owner, want{12, metav1.ConditionTrue, v1alpha1.ReasonObserved, v1alpha1.ReasonOverEntryBudget, metav1.ConditionTrue, "12 index entries"})
	check(shadow, want{12, metav1.ConditionFalse, v1alpha1.ReasonDuplicateTenantID, v1alpha1.ReasonNotEffective, metav1.ConditionFalse, "st-1/owner"})
	check(free, want{7, metav1.ConditionTrue, v1alpha1.ReasonObserved, v1alpha1.ReasonNoQuota, metav1.ConditionFalse, "7 index entries"})

	// The owner raises its budget: within budget now.
	wantOK(t, "raise budget", update(ctx, owner, func(t *v1alpha1.CacheTenant) { t.Spec.Quota.MaxIndexEntries = ptr(int64(20)) }))
	check(owner, want{12, metav1.ConditionTrue, v1alpha1.ReasonObserved, v1alpha1.ReasonWithinBudget, metav1.ConditionFalse, "12 index entries"})

	// The owner goes away: the former shadow owns the id.
	wantOK(t, "delete owner", k8s.Delete(ctx, owner))
	check(shadow, want{12, metav1.ConditionTrue, v1alpha1.ReasonObserved, v1alpha1.ReasonWithinBudget, metav1.ConditionFalse, "12 index entries"})
}

// metricValue reads one series of the controller-runtime registry; ok is
// false when the series does not exist.
func metricValue(name, backend string) (float64, bool) {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		return 0, false
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "backend" && l.GetValue() == backend {
					if m.GetCounter() != nil {
						return m.GetCounter().GetValue(), true
					}
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

func TestCacheBackendParticipationAndT2Metrics(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "st-backend", false)
	cb := backendObj(ns, "lmcache", v1alpha1.BackendLMCache, "")
	cb.Spec.EngineSelector = &v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "llama"}}
	wantOK(t, "backend", k8s.Create(ctx, cb))
	for _, name := range []string{"vllm-0", "vllm-1"} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "llama"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "vllm"}}},
		}
		wantOK(t, "pod "+name, k8s.Create(ctx, pod))
	}
	t0 := time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC)
	setSnap := func(q0, h0 int64, withReplicas bool) {
		snap := &controlapi.CacheSnapshot{Replicas: []controlapi.ReplicaSnapshot{}, Tenants: []controlapi.TenantSnapshot{}}
		if withReplicas {
			snap.Replicas = []controlapi.ReplicaSnapshot{
				{ReplicaID: "vllm-0", Tenant: ns, PrefixCount: 3, LastEventAt: t0, T2QueryTokens: q0, T2HitTokens: h0},
				{ReplicaID: "vllm-1", Tenant: ns, PrefixCount: 2, LastEventAt: t0.Add(time.Minute), T2QueryTokens: 100, T2HitTokens: 50},
				{ReplicaID: "stranger", Tenant: ns, PrefixCount: 9},
			}
		}
		srv.snap.Store(snap)
	}
	key := ns + "/lmcache"
	setSnap(100, 0, true)
	eventually(t, propagationLimit, func() error {
		var got v1alpha1.CacheBackend
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(cb), &got); err != nil {
			return err
		}
		ip := got.Status.IndexParticipation
		if ip == nil || ip.PrefixCount != 5 || ip.LastEventAt == nil || !ip.LastEventAt.Time.Equal(t0.Add(time.Minute)) || ip.T2HitRate == nil || *ip.T2HitRate != "0.25" {
			return fmt.Errorf("indexParticipation %+v", ip)
		}
		if v, ok := metricValue("inferencecache_backend_t2_query_tokens_total", key); !ok || v != 200 {
			return fmt.Errorf("query tokens %v %v", v, ok)
		}
		if v, ok := metricValue("inferencecache_backend_t2_hit_rate", key); !ok || v != 0.25 {
			return fmt.Errorf("hit rate %v %v", v, ok)
		}
		return nil
	})
	setSnap(300, 150, true)
	eventually(t, propagationLimit, func() error {
		if v, _ := metricValue("inferencecache_backend_t2_query_tokens_total", key); v != 400 {
			return fmt.Errorf("query tokens %v, want 400", v)
		}
		if v, _ := metricValue("inferencecache_backend_t2_hit_rate", key); v != 0.5 {
			return fmt.Errorf("hit rate %v, want 0.5", v)
		}
		return nil
	})
	// The replicas drain: the series go, the participation reads zero.
	setSnap(0, 0, false)
	eventually(t, propagationLimit, func() error {
		var got v1alpha1.CacheBackend
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(cb), &got); err != nil {
			return err
		}
		ip := got.Status.IndexParticipation
		if ip == nil || ip.PrefixCount != 0 || ip.LastEventAt != nil || ip.T2HitRate != nil {
			return fmt.Errorf("indexParticipation %+v", ip)
		}
		if _, ok := metricValue("inferencecache_backend_t2_hit_rate", key); ok {
			return fmt.Errorf("stale hit-rate series")
		}
		return nil
	})
}
