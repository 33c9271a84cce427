package engine

import (
	"fmt"
	"testing"
)

// flood reports n single-block chains for tenant from replica, each one
// microsecond newer than the last, starting at ts and at hash base.
func flood(e *Engine, tenant, replica string, ts int64, base uint64, n int) {
	for i := range n {
		e.Ingest(&Update{TenantID: tenant, ModelID: "m", HashScheme: "vllm", ReplicaID: replica, TimestampUs: ts + int64(i),
			Prefixes: []PrefixEntry{{BlockHashes: [][]byte{h8(base + uint64(i))}, BlockTokenCounts: []int32{16}}}}, ts+int64(i))
	}
}

// tenantEntries counts the storage entries of each tenant.
func tenantEntries(e *Engine) map[string]int {
	out := map[string]int{}
	for _, d := range e.dump() {
		out[d.key.tenant]++
	}
	return out
}

// TestCapFairShare: with no quotas, one producer flooding the index at its
// entry cap pays for itself: the cap evicts from the tenants over their
// fair share (cap / active tenants) first, so a quiet tenant's entries,
// older than every one of the flood's, survive it; within the flooding
// tenant the victims are still the contract's order (its oldest first).
func TestCapFairShare(t *testing.T) {
	const capEntries = 100
	m := newRecMetrics()
	e := New(Config{MaxEntries: capEntries, Metrics: m})
	flood(e, "quiet", "q", tT-60*min1, 1_000, 20) // 20 entries, an hour old
	flood(e, "noisy", "n", tT-30*min1, 2_000, 80) // fills the cap
	if got := tenantEntries(e); got["quiet"] != 20 || got["noisy"] != 80 {
		t.Fatalf("before the flood: %v", got)
	}
	flood(e, "noisy", "n", tT, 3_000, 1_000) // the flood, all newer
	got := tenantEntries(e)
	if got["quiet"] != 20 || got["noisy"] != 80 {
		t.Fatalf("after the flood: %v, want quiet's 20 kept and noisy at 80", got)
	}
	// noisy kept its newest 80 (the contract's order within it).
	for _, d := range e.dump() {
		if d.key.tenant == "noisy" {
			if h := d.key.hash; h < string(h8(3_000+1_000-80)) {
				t.Fatalf("noisy kept %x, not among its 80 newest", h)
			}
		}
	}
	if n := m.evictions[[2]string{"lru", "cap"}]; n != 1_000 {
		t.Fatalf("cap evictions %d, want 1000", n)
	}
}

// TestCapFairShareOverShareTenantsOnly: a tenant at or under its share is
// left alone while others are over theirs; once the flood stops and a
// third tenant arrives, the share shrinks and each pays for its excess.
func TestCapFairShareOverShareTenantsOnly(t *testing.T) {
	e := New(Config{MaxEntries: 90})
	flood(e, "a", "r", tT-90*min1, 1_000, 30) // exactly its share of 90 / 3 once c arrives
	flood(e, "b", "r", tT-60*min1, 2_000, 60)
	// Two tenants: share 45. a (30) is under it, b (60) over: b pays.
	flood(e, "b", "r", tT-50*min1, 2_500, 10)
	if got := tenantEntries(e); got["a"] != 30 || got["b"] != 60 {
		t.Fatalf("two tenants: %v, want a 30, b 60", got)
	}
	// A third tenant: share 30. a sits at it, b is over: c's entries
	// evict b's, never a's, until b is down to its share too.
	flood(e, "c", "r", tT, 3_000, 30)
	if got := tenantEntries(e); got["a"] != 30 || got["b"] != 30 || got["c"] != 30 {
		t.Fatalf("three tenants: %v, want 30 each", got)
	}
	// Everyone at the share: the next entry is over it for its own tenant
	// only, so c pays for it, its oldest first.
	flood(e, "c", "r", tT+1_000, 4_000, 1)
	if got := tenantEntries(e); got["a"] != 30 || got["b"] != 30 || got["c"] != 30 {
		t.Fatalf("at the share: %v, want 30 each", got)
	}
	for _, d := range e.dump() {
		if d.key.tenant == "c" && d.key.hash == string(h8(3_000)) {
			t.Fatal("c's oldest entry survived its own overflow")
		}
	}
}

// TestByteBudgetFairShare: the byte budget evicts from the tenants holding
// more than the average share first, as the entry cap does from those over
// cap / active.
func TestByteBudgetFairShare(t *testing.T) {
	probe := New(Config{MaxEntries: 200}) // keeps a cap queue (100 entries are over a quarter of its cap), as the budgeted engine will
	flood(probe, "quiet", "q", tT-60*min1, 1_000, 20)
	flood(probe, "noisy", "n", tT-30*min1, 2_000, 80)
	budget := probe.Memory().IndexBytes
	e := New(Config{MaxBytes: budget})
	flood(e, "quiet", "q", tT-60*min1, 1_000, 20)
	flood(e, "noisy", "n", tT-30*min1, 2_000, 80)
	flood(e, "noisy", "n", tT, 3_000, 500)
	got := tenantEntries(e)
	if got["quiet"] != 20 || got["noisy"] < 50 {
		t.Fatalf("after the flood under a byte budget: %v, want quiet's 20 kept", got)
	}
	if mem := e.Memory(); mem.IndexBytes > budget {
		t.Fatalf("index %d bytes over the %d budget", mem.IndexBytes, budget)
	}
}

// TestCapFairShareManyTenants: many quiet tenants under their share and one
// flooding tenant: every quiet entry survives however long the flood.
func TestCapFairShareManyTenants(t *testing.T) {
	const tenants, each = 50, 10
	e := New(Config{MaxEntries: 2_000})
	for i := range tenants {
		flood(e, fmt.Sprintf("quiet-%02d", i), "q", tT-90*min1+int64(i), uint64(10_000*(i+1)), each)
	}
	flood(e, "noisy", "n", tT, 1_000_000, 5_000)
	got := tenantEntries(e)
	for i := range tenants {
		if n := got[fmt.Sprintf("quiet-%02d", i)]; n != each {
			t.Fatalf("quiet-%02d holds %d entries after the flood, want %d", i, n, each)
		}
	}
	if got["noisy"] != 2_000-tenants*each {
		t.Fatalf("noisy holds %d, want the rest of the cap (%d)", got["noisy"], 2_000-tenants*each)
	}
}
