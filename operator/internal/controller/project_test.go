package controller

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

func TestProjectIndex(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 500_000_000, time.UTC)
	snap := controlapi.CacheSnapshot{
		Replicas: []controlapi.ReplicaSnapshot{
			{ReplicaID: "pod-1", Tenant: "team-b", HitRate: 0.25, Pressure: 0.5, CacheMemoryBytes: 10, LastUpdate: t0, StatsReported: true},
			{ReplicaID: "pod-1", Tenant: "team-a", HitRate: 0.75, LastUpdate: t0, StatsReported: true},
			{ReplicaID: "pod-1", Tenant: "team-c", HitRate: 0.1, StatsReported: true},
			{ReplicaID: "prefix-only", Tenant: "team-a", PrefixCount: 3},
			{ReplicaID: "old-server", Tenant: "team-a", HitRate: 0, LastUpdate: t0},
		},
		Tenants: []controlapi.TenantSnapshot{
			{TenantID: "team-b", IndexEntries: 5},
			{TenantID: "", IndexEntries: 1},
			{TenantID: "team-a", IndexEntries: 2, HitRate: 0.3, HitRateReported: true, MemoryUsed: 999},
			{TenantID: "team-c", IndexEntries: 0, HitRate: 0, HitRateReported: true},
		},
		TotalPrefixes: 8,
	}
	st := ProjectIndex(&snap, "http://srv:8081")
	if len(st.Replicas) != 2 || st.Replicas[0].ID != "old-server" || st.Replicas[1].ID != "pod-1" {
		t.Fatalf("replicas %+v", st.Replicas)
	}
	r := st.Replicas[1]
	if r.Tenant != "team-c" || *r.HitRate != "0.1" || r.LastUpdate != nil {
		t.Fatalf("collision: %+v (want the lexicographically later tenant team-c)", r)
	}
	if o := st.Replicas[0]; *o.HitRate != "0" || !o.LastUpdate.Time.Equal(t0.Truncate(time.Second)) {
		t.Fatalf("old-server row %+v", o)
	}
	ids := []string{}
	for _, tr := range st.Tenants {
		ids = append(ids, tr.ID)
		if tr.MemoryUsed != 0 || tr.IndexEntries == nil {
			t.Fatalf("tenant row %+v", tr)
		}
	}
	if strings.Join(ids, ",") != ",team-a,team-b,team-c" {
		t.Fatalf("tenant order %q", ids)
	}
	if st.Tenants[1].HitRate == nil || *st.Tenants[1].HitRate != "0.3" || st.Tenants[2].HitRate != nil || *st.Tenants[3].HitRate != "0" {
		t.Fatalf("tenant hit rates %+v", st.Tenants)
	}
	if st.Prefixes.Summary.Total != 8 || st.ObservedServer != "http://srv:8081" {
		t.Fatalf("summary %+v", st)
	}
	raw, _ := json.Marshal(st.Tenants[2])
	if !strings.Contains(string(raw), `"memoryUsed":0`) {
		t.Fatalf("memoryUsed must always serialize: %s", raw)
	}
	if got := formatRate(0.78); got != "0.78" {
		t.Fatalf("formatRate(0.78) = %q", got)
	}
}

func TestTenantStatus(t *testing.T) {
	q := func(v int64) *int64 { return &v }
	items := []v1alpha1.CacheTenant{
		ctenant("a", "owner", "shared", q(10)),
		ctenant("b", "shadow", "shared", q(100)),
		ctenant("c", "free", "free", nil),
	}
	res := ResolveTenants(items)
	f := func(i int, entries int64, ready metav1.ConditionStatus, readyReason, quotaReason string, quota metav1.ConditionStatus) {
		t.Helper()
		tn := &items[i]
		tn.Generation = 3
		st := TenantStatus(tn, tn.Status, res, entries)
		r := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
		qc := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionQuotaExceeded)
		if r == nil || qc == nil || r.Status != ready || r.Reason != readyReason || qc.Status != quota || qc.Reason != quotaReason {
			t.Fatalf("%s: %+v", tn.Name, st.Conditions)
		}
		if st.ObservedGeneration != 3 || st.IndexEntries == nil || *st.IndexEntries != entries {
			t.Fatalf("%s: %+v", tn.Name, st)
		}
		// Recomputing from the result changes nothing (no needless writes).
		again := TenantStatus(tn, st, res, entries)
		if !meta.IsStatusConditionPresentAndEqual(again.Conditions, v1alpha1.ConditionReady, r.Status) ||
			meta.FindStatusCondition(again.Conditions, v1alpha1.ConditionReady).LastTransitionTime != r.LastTransitionTime {
			t.Fatalf("%s: not stable", tn.Name)
		}
	}
	f(0, 4, metav1.ConditionTrue, v1alpha1.ReasonObserved, v1alpha1.ReasonWithinBudget, metav1.ConditionFalse)
	f(0, 10, metav1.ConditionTrue, v1alpha1.ReasonObserved, v1alpha1.ReasonWithinBudget, metav1.ConditionFalse)
	f(0, 11, metav1.ConditionTrue, v1alpha1.ReasonObserved, v1alpha1.ReasonOverEntryBudget, metav1.ConditionTrue)
	f(1, 11, metav1.ConditionFalse, v1alpha1.ReasonDuplicateTenantID, v1alpha1.ReasonNotEffective, metav1.ConditionFalse)
	f(2, 0, metav1.ConditionTrue, v1alpha1.ReasonObserved, v1alpha1.ReasonNoQuota, metav1.ConditionFalse)
	st := TenantStatus(&items[1], items[1].Status, res, 0)
	if m := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady).Message; !strings.Contains(m, "a/owner") {
		t.Fatalf("shadowed message must name the owner: %q", m)
	}
}

func TestPolicyStatus(t *testing.T) {
	cp := cpol("ns", "p")
	cp.Generation = 2
	st := PolicyStatus(&cp, cp.Status, PolicyVerdict{Reason: v1alpha1.ReasonConflicted, Winner: nsKey("ns", "a")})
	c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionAccepted)
	if c.Status != metav1.ConditionFalse || c.Reason != "Conflicted" || !strings.Contains(c.Message, `"a"`) || st.ObservedGeneration != 2 {
		t.Fatalf("conflicted: %+v", st)
	}
	cp.Spec.EvictionTTL = &metav1.Duration{}
	wire, verdicts := ResolvePolicies([]v1alpha1.CachePolicy{cp})
	if len(wire) != 0 {
		t.Fatalf("invalid policy on the wire: %+v", wire)
	}
	st = PolicyStatus(&cp, st, verdicts[nsKey("ns", "p")])
	c = meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionAccepted)
	if c.Reason != "Invalid" || !strings.Contains(c.Message, "spec.evictionTTL") {
		t.Fatalf("invalid: %+v", c)
	}
}
