package policy

import (
	"reflect"
	"testing"
	"time"
)

func TestDefaults(t *testing.T) {
	want := Tenant{
		TTL: 30 * time.Minute, Eviction: LRU, MinimumMatchedTokens: 64, RoutingFloorScore: 0.1,
		AffinityRouting: true, EnableChainMatching: true, RequireChain: false, EnableTenantHot: true,
	}
	if Defaults != want {
		t.Fatalf("Defaults = %+v, want %+v", Defaults, want)
	}
	for name, snap := range map[string]*Snapshot{
		"Empty":      Empty(),
		"NewStore":   NewStore().Load(),
		"empty body": Build(&Body{Version: 7}),
		"other ns":   Build(mustDecode(t, `{"version": 7, "policies": [{"namespace": "x", "minimumPrefixTokens": 9}]}`)),
	} {
		for _, id := range []string{"", "team-a", ReservedTenantID} {
			if got := *snap.Tenant(id); got != want {
				t.Errorf("%s: Tenant(%q) = %+v, want Defaults", name, id, got)
			}
		}
		if snap.AnyLFU() {
			t.Errorf("%s: AnyLFU", name)
		}
	}
}

func TestQuotas(t *testing.T) {
	b := mustDecode(t, `{"version": 7,
	  "policies": [{"namespace": "pol", "minimumPrefixTokens": 8}],
	  "tenants": [
	    {"tenantID": "zero", "maxIndexEntries": 0},
	    {"tenantID": "neg", "maxIndexEntries": -5},
	    {"tenantID": "big", "maxIndexEntries": 100000, "isolationMode": "Fairness"},
	    {"tenantID": "", "maxIndexEntries": 7},
	    {"tenantID": "inferencecache.io/probe", "maxIndexEntries": 1},
	    {"tenantID": "big", "maxIndexEntries": 1},
	    {"tenantID": "pol", "maxIndexEntries": 3},
	    {"tenantID": "nofield"}
	  ]}`)
	snap := Build(b)
	cases := []struct {
		id    string
		quota bool
		max   int64
	}{
		{"zero", true, 0},     // 0 is a real cap: admit nothing
		{"neg", true, 0},      // negative clamps to 0
		{"big", true, 100000}, // duplicates: first wins
		{"pol", true, 3},      // quota composes with a policy
		{"nofield", true, 0},  // maxIndexEntries is not omitempty: absent = 0
		{"absent", false, 0},  // no entry = unbounded
		{"", false, 0},        // empty ids are skipped
		{ReservedTenantID, false, 0},
	}
	for _, c := range cases {
		tn := snap.Tenant(c.id)
		if tn.HasQuota != c.quota || tn.MaxIndexEntries != c.max {
			t.Errorf("Tenant(%q) quota = (%v, %d), want (%v, %d)", c.id, tn.HasQuota, tn.MaxIndexEntries, c.quota, c.max)
		}
	}
	if got, want := snap.QuotaTenants(), []string{"zero", "neg", "big", "pol", "nofield"}; !reflect.DeepEqual(got, want) {
		t.Errorf("QuotaTenants = %q, want %q", got, want)
	}
	// A quota-only tenant keeps every policy knob at the defaults.
	want := Defaults
	want.HasQuota, want.MaxIndexEntries = true, 100000
	if got := *snap.Tenant("big"); got != want {
		t.Errorf("quota-only tenant = %+v, want %+v", got, want)
	}
	pol := snap.Tenant("pol")
	if !pol.HasPolicy || pol.MinimumPrefixTokens != 8 || !pol.HasQuota {
		t.Errorf("policy+quota tenant = %+v", *pol)
	}
}

func TestPolicyEntriesSkippedAndDeduplicated(t *testing.T) {
	snap := Build(mustDecode(t, `{"version": 7, "policies": [
	    {"namespace": "", "eviction": "lfu"},
	    {"namespace": "a", "minimumPrefixTokens": 1},
	    {"namespace": "a", "minimumPrefixTokens": 2, "eviction": "lfu"},
	    null
	  ]}`))
	if got := snap.Tenant("a").MinimumPrefixTokens; got != 1 {
		t.Errorf("duplicate namespace: MinimumPrefixTokens = %d, want the first entry's 1", got)
	}
	if snap.AnyLFU() {
		t.Error("AnyLFU set by a skipped or losing entry")
	}
	if got := *snap.Tenant(""); got != Defaults {
		t.Errorf("empty namespace got a policy: %+v", got)
	}
	if n := len(snap.tenants); n != 1 {
		t.Errorf("resolved %d tenants, want 1", n)
	}
}

func TestReplaceOnWrite(t *testing.T) {
	s := NewStore()
	if g := s.Load().Generation(); g != 0 {
		t.Fatalf("initial generation = %d", g)
	}
	first := s.Apply(mustDecode(t, `{"version": 7,
	  "policies": [{"namespace": "a", "eviction": "lfu", "minimumPrefixTokens": 4}, {"namespace": "b", "lookupTimeoutMs": 9}],
	  "tenants": [{"tenantID": "a", "maxIndexEntries": 10}, {"tenantID": "q", "maxIndexEntries": 5}]}`))
	if first.Generation() != 1 || s.Load() != first {
		t.Fatalf("first apply: generation %d, loaded %p want %p", first.Generation(), s.Load(), first)
	}
	if !s.Load().Tenant("b").HasPolicy || !s.Load().Tenant("q").HasQuota || !s.Load().AnyLFU() {
		t.Fatal("first snapshot not applied")
	}

	second := s.Apply(mustDecode(t, `{"version": 7, "policies": [{"namespace": "a", "minimumPrefixTokens": 4}]}`))
	if second.Generation() != 2 || s.Load() != second {
		t.Fatalf("second apply: generation %d", second.Generation())
	}
	cur := s.Load()
	if got := *cur.Tenant("b"); got != Defaults {
		t.Errorf("namespace b absent from the next snapshot = %+v, want Defaults", got)
	}
	if got := *cur.Tenant("q"); got != Defaults {
		t.Errorf("tenant q absent from the next snapshot = %+v, want Defaults (unbounded)", got)
	}
	a := cur.Tenant("a")
	if a.HasQuota || a.Eviction != LRU || a.MinimumPrefixTokens != 4 {
		t.Errorf("a = %+v: quota and lfu must be gone, prefix gate kept", *a)
	}
	if cur.AnyLFU() || len(cur.QuotaTenants()) != 0 {
		t.Error("AnyLFU / quotas survived the replace")
	}
	// The old snapshot a reader may still hold is untouched.
	if first.Tenant("b").LookupTimeout != 9*time.Millisecond || first.Generation() != 1 {
		t.Error("the previous snapshot was mutated")
	}

	// An empty push reverts everything.
	s.Apply(mustDecode(t, `{"version": 3}`))
	if got := *s.Load().Tenant("a"); got != Defaults {
		t.Errorf("after an empty push a = %+v", got)
	}
	if s.Load().Generation() != 3 {
		t.Errorf("generation = %d, want 3", s.Load().Generation())
	}
}

func TestReplacePublishOnce(t *testing.T) {
	s := NewStore()
	snap := Build(&Body{Version: 7})
	if got := s.Replace(snap); got != snap || got.Generation() != 1 {
		t.Fatalf("Replace = %p gen %d", got, got.Generation())
	}
	for name, again := range map[string]*Snapshot{
		"same snapshot":    snap,
		"initial snapshot": NewStore().Load(),
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil {
					t.Error("republishing did not panic")
				}
			}()
			NewStore().Replace(again)
		})
	}
	if snap.Generation() != 1 {
		t.Errorf("generation rewritten to %d", snap.Generation())
	}
}

func TestParseAlgorithm(t *testing.T) {
	for in, want := range map[string]Algorithm{
		"lfu": LFU, "LFU": LFU, "Lfu": LFU, "\tlfu\n": LFU,
		"lru": LRU, "LRU": LRU, "": LRU, "lfu2": LRU, "l f u": LRU, "random": LRU,
	} {
		if got := ParseAlgorithm(in); got != want {
			t.Errorf("ParseAlgorithm(%q) = %v, want %v", in, got, want)
		}
	}
	if LFU.String() != "lfu" || LRU.String() != "lru" {
		t.Error("Algorithm.String")
	}
}
