package controller

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/policy"
)

func cpol(ns, name string, mut ...func(*v1alpha1.CachePolicySpec)) v1alpha1.CachePolicy {
	cp := v1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, m := range mut {
		m(&cp.Spec)
	}
	return cp
}

func ctenant(ns, name, id string, quota *int64) v1alpha1.CacheTenant {
	t := v1alpha1.CacheTenant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.CacheTenantSpec{TenantID: id}}
	if quota != nil {
		t.Spec.Quota = &v1alpha1.CacheTenantQuota{MaxIndexEntries: quota}
	}
	return t
}

func TestFlattenPolicy(t *testing.T) {
	f := func(spec v1alpha1.CachePolicySpec, want policy.ResolvedPolicy) {
		t.Helper()
		want.Namespace = "ns"
		got := FlattenPolicy(&v1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"}, Spec: spec})
		if !reflect.DeepEqual(got, want) {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			t.Errorf("FlattenPolicy:\n got %s\nwant %s", g, w)
		}
	}
	defaults := func(mut func(*policy.ResolvedPolicy)) policy.ResolvedPolicy {
		rp := policy.ResolvedPolicy{
			Eviction: "lru", MinimumMatchedTokens: 64, RoutingFloorScore: ptr(float32(0.1)), AffinityRouting: ptr(true),
			Strategy: &policy.LookupStrategy{EnableChainMatching: ptr(true), RequireChain: ptr(false), EnableTenantHot: ptr(true)},
		}
		if mut != nil {
			mut(&rp)
		}
		return rp
	}
	// An empty spec (as a legacy object could be) says the defaults outright.
	f(v1alpha1.CachePolicySpec{}, defaults(nil))
	f(v1alpha1.CachePolicySpec{
		Eviction: "LFU", EvictionTTL: &metav1.Duration{Duration: 15 * time.Minute},
		MinimumPrefixTokens: ptr(int32(32)), MinimumMatchedTokens: ptr(int32(0)), RoutingFloorScore: ptr("5"),
		LookupTimeoutMs: ptr(int32(25)), AffinityRouting: "Disabled",
		Strategy: &v1alpha1.CachePolicyStrategy{EnableChainMatching: ptr(false), EnableTenantHot: ptr(false)},
	}, defaults(func(rp *policy.ResolvedPolicy) {
		rp.Eviction, rp.EvictionTTL = "lfu", 15*time.Minute
		rp.MinimumPrefixTokens, rp.MinimumMatchedTokens, rp.LookupTimeoutMs = 32, 0, 25
		rp.RoutingFloorScore, rp.AffinityRouting = ptr(float32(5)), ptr(false)
		rp.Strategy.EnableChainMatching, rp.Strategy.EnableTenantHot = ptr(false), ptr(false)
	}))
	f(v1alpha1.CachePolicySpec{RoutingFloorScore: ptr("0")}, defaults(func(rp *policy.ResolvedPolicy) { rp.RoutingFloorScore = ptr(float32(0)) }))
	f(v1alpha1.CachePolicySpec{AffinityRouting: "Enabled"}, defaults(nil))
	// Unparseable, NaN, infinite or negative floors fall back to 0.1.
	for _, bad := range []string{"abc", "NaN", "Inf", "-1", "1e40"} {
		f(v1alpha1.CachePolicySpec{RoutingFloorScore: ptr(bad)}, defaults(nil))
	}
	// A non-positive TTL is never sent (the server default applies).
	f(v1alpha1.CachePolicySpec{EvictionTTL: &metav1.Duration{Duration: -time.Second}}, defaults(nil))
}

func TestResolvePolicies(t *testing.T) {
	invalidTTL := func(s *v1alpha1.CachePolicySpec) { s.EvictionTTL = &metav1.Duration{} }
	lfu := func(s *v1alpha1.CachePolicySpec) { s.Eviction = "LFU" }
	items := []v1alpha1.CachePolicy{
		cpol("b", "zeta"),
		cpol("a", "second", lfu),
		cpol("a", "first"),
		cpol("c", "aaa", invalidTTL), // invalid: does not take part in the tie-break
		cpol("c", "bbb", lfu),
		cpol("d", "only", invalidTTL),
		cpol("a", "third"),
	}
	// The outcome must not depend on list order.
	for range 20 {
		rand.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
		wire, verdicts := ResolvePolicies(items)
		var got []string
		for _, p := range wire {
			got = append(got, p.Namespace+":"+p.Eviction)
		}
		if want := []string{"a:lru", "b:lru", "c:lfu"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("wire = %v, want %v", got, want)
		}
		want := map[string]string{
			"a/first": v1alpha1.ReasonAccepted, "a/second": v1alpha1.ReasonConflicted, "a/third": v1alpha1.ReasonConflicted,
			"b/zeta": v1alpha1.ReasonAccepted, "c/aaa": v1alpha1.ReasonInvalid, "c/bbb": v1alpha1.ReasonAccepted,
			"d/only": v1alpha1.ReasonInvalid,
		}
		for k, v := range verdicts {
			if want[nsName(k)] != v.Reason {
				t.Errorf("%s: %s, want %s", k, v.Reason, want[nsName(k)])
			}
			if v.Reason == v1alpha1.ReasonConflicted && v.Winner != (types.NamespacedName{Namespace: "a", Name: "first"}) {
				t.Errorf("%s: winner %s", k, v.Winner)
			}
			if v.Reason == v1alpha1.ReasonInvalid && (len(v.Errors) != 1 || v.Errors[0].Field != "spec.evictionTTL") {
				t.Errorf("%s: errors %v", k, v.Errors)
			}
		}
		if len(verdicts) != len(want) {
			t.Fatalf("%d verdicts, want %d", len(verdicts), len(want))
		}
	}
}

func TestResolveTenants(t *testing.T) {
	q := func(v int64) *int64 { return &v }
	items := []v1alpha1.CacheTenant{
		ctenant("b", "t", "shared", q(10)),
		ctenant("a", "z", "shared", q(20)),
		ctenant("a", "a", "shared", nil), // no quota: never beats a quota-bearing CR
		ctenant("c", "x", "free", nil),
		ctenant("c", "y", "free", nil),
		ctenant("d", "p", policy.ReservedTenantID, q(5)),
		ctenant("e", "zero", "zero", q(0)),
		ctenant("e", "neg", "neg", q(-3)),
	}
	for range 20 {
		rand.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
		res := ResolveTenants(items)
		wantWire := []policy.ResolvedTenant{
			{TenantID: "neg", MaxIndexEntries: 0, IsolationMode: "Fairness"},
			{TenantID: "shared", MaxIndexEntries: 20, IsolationMode: "Fairness"},
			{TenantID: "zero", MaxIndexEntries: 0, IsolationMode: "Fairness"},
		}
		if !reflect.DeepEqual(res.Wire, wantWire) {
			t.Fatalf("wire = %+v, want %+v", res.Wire, wantWire)
		}
		wantOwner := map[string]string{"shared": "a/z", "free": "c/x", policy.ReservedTenantID: "d/p", "zero": "e/zero", "neg": "e/neg"}
		for id, o := range res.Owner {
			if wantOwner[id] != nsName(o) {
				t.Errorf("owner of %q = %s, want %s", id, nsName(o), wantOwner[id])
			}
		}
	}
}

// TestBodyDecodesOnServer sends the controller's body through the server's
// own decoder and store and checks the resolved policy.
func TestBodyDecodesOnServer(t *testing.T) {
	items := []v1alpha1.CachePolicy{cpol("team-a", "p", func(s *v1alpha1.CachePolicySpec) {
		s.Eviction, s.EvictionTTL, s.RoutingFloorScore = "LFU", &metav1.Duration{Duration: time.Hour}, ptr("0")
		s.AffinityRouting = "Disabled"
	})}
	wire, _ := ResolvePolicies(items)
	res := ResolveTenants([]v1alpha1.CacheTenant{ctenant("team-a", "t", "tenant-1", ptr(int64(7)))})
	body := BuildBody(wire, res.Wire)
	if body.Version != 7 {
		t.Fatalf("version %d: a body without PDTopologies or PromptTemplates is schema 7", body.Version)
	}
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := policy.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("server refuses the body: %v\n%s", err, raw)
	}
	st := policy.NewStore()
	st.Apply(dec)
	got := st.Load().Tenant("team-a")
	if !got.HasPolicy || got.TTL != time.Hour || got.Eviction != policy.LFU || got.RoutingFloorScore != 0 || got.AffinityRouting || got.MinimumMatchedTokens != 64 {
		t.Fatalf("resolved %+v", got)
	}
	if q := st.Load().Tenant("tenant-1"); !q.HasQuota || q.MaxIndexEntries != 7 {
		t.Fatalf("tenant quota %+v", q)
	}
	// An empty cluster is a valid body too.
	raw, _ = json.Marshal(BuildBody(nil, nil))
	if _, err := policy.Decode(bytes.NewReader(raw)); err != nil {
		t.Fatalf("empty body refused: %v (%s)", err, raw)
	}
}

// TestInvalidFieldsNameTheField: every field the server cannot honor makes
// the policy Invalid, and the verdict names that field.
func TestInvalidFieldsNameTheField(t *testing.T) {
	f := func(mut func(*v1alpha1.CachePolicySpec), field string) {
		t.Helper()
		wire, verdicts := ResolvePolicies([]v1alpha1.CachePolicy{cpol("ns", "p", mut)})
		v := verdicts[nsKey("ns", "p")]
		if len(wire) != 0 || v.Reason != v1alpha1.ReasonInvalid || len(v.Errors) != 1 || v.Errors[0].Field != field {
			t.Errorf("%s: wire %v, verdict %+v", field, wire, v)
		}
	}
	f(func(s *v1alpha1.CachePolicySpec) { s.RoutingFloorScore = ptr("abc") }, "spec.routingFloorScore")
	f(func(s *v1alpha1.CachePolicySpec) { s.RoutingFloorScore = ptr("-0.5") }, "spec.routingFloorScore")
	f(func(s *v1alpha1.CachePolicySpec) { s.EvictionTTL = &metav1.Duration{Duration: -time.Hour} }, "spec.evictionTTL")
	f(func(s *v1alpha1.CachePolicySpec) {
		s.Strategy = &v1alpha1.CachePolicyStrategy{RequireChain: ptr(true), EnableChainMatching: ptr(false)}
	}, "spec.strategy.requireChain")
	f(func(s *v1alpha1.CachePolicySpec) { s.Eviction = "ARC" }, "spec.eviction")
	f(func(s *v1alpha1.CachePolicySpec) { s.AffinityRouting = "Sometimes" }, "spec.affinityRouting")
	f(func(s *v1alpha1.CachePolicySpec) { s.LookupTimeoutMs = ptr(int32(-1)) }, "spec.lookupTimeoutMs")
}
