package engine

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// structures counts the engine's Go-side structures: domains, tenant
// states, model counters and live scopes.
func structures(e *Engine) (domains, tenants, models, scopes int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, sc := range e.scopes[1:] {
		if sc != nil {
			scopes++
		}
	}
	return e.domains.Size(), e.tenants.Size(), len(e.modelKeys), scopes
}

// TestSweepReclaimsEmptyStructures pins issue 12 item 5: domains, scopes,
// tenant states and model counters whose keys and stats are all gone are
// reclaimed by the sweep, so a client cycling through tenant or model ids
// cannot grow the index without bound. Survivors are untouched, and a
// reclaimed (tenant, model) comes back as a fresh domain.
func TestSweepReclaimsEmptyStructures(t *testing.T) {
	const tenants = 50_000
	e := New(Config{})
	for i := range tenants {
		u := &Update{TenantID: fmt.Sprint("t", i), ModelID: fmt.Sprint("m", i%7), HashScheme: "vllm", ReplicaID: "r",
			AdapterID: fmt.Sprint("a", i%3), TimestampUs: tT - 31*min1,
			Prefixes: []PrefixEntry{{BlockHashes: chainOf(uint64(i)+1, 1<<40), BlockTokenCounts: sixteens(2)}}}
		if i%5 == 0 {
			u.Stats = &ReplicaStats{HitRate: 0.5}
		}
		e.Ingest(u, tT)
	}
	x := &tix{t: t, e: e}
	x.chainIn("keep", "m", "vllm", "", "r", tT, 0, 1, 2, 3)
	if n := e.Sweep(tT); n != 2*tenants {
		t.Fatalf("sweep removed %d entries, want %d", n, 2*tenants)
	}
	if d, ts, m, sc := structures(e); d != 1 || ts != 1 || m != 1 || sc != 1 {
		t.Fatalf("after every other tenant expired: %d domains, %d tenant states, %d model counters, %d scopes; want 1 each", d, ts, m, sc)
	}
	checkInvariants(t, e)
	res := x.lookup(LookupRequest{TenantID: "keep", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(1, 2, 3), BlockTokenCounts: sixteens(3)})
	if res.Strategy != StrategyPrefixMatch || res.Scores[0].MatchedTokens != 48 {
		t.Fatalf("survivor lookup %v %+v", res.Strategy, res.Scores)
	}
	// A reclaimed (tenant, model) is recreated from scratch.
	x.chainIn("t3", "m3", "vllm", "a0", "r", tT, 0, 4, 5)
	res = x.lookup(LookupRequest{TenantID: "t3", ModelID: "m3", HashScheme: "vllm", AdapterID: "a0", BlockHashes: chainOf(4, 5), BlockTokenCounts: sixteens(2)})
	if res.Strategy != StrategyPrefixMatch || res.Scores[0].MatchedTokens != 32 {
		t.Fatalf("recreated tenant lookup %v %+v", res.Strategy, res.Scores)
	}
	if d, ts, m, sc := structures(e); d != 2 || ts != 2 || m != 2 || sc != 2 {
		t.Fatalf("after recreating one: %d domains, %d tenant states, %d model counters, %d scopes; want 2 each", d, ts, m, sc)
	}
	checkInvariants(t, e)
}

// TestByteBudgetIgnoresUnreclaimableOverhead pins the other half of item 5:
// the byte budget must not evict live entries to pay for bookkeeping that
// evicting entries cannot free, here 40,000 stats-only tenants.
func TestByteBudgetIgnoresUnreclaimableOverhead(t *testing.T) {
	fill := func(e *Engine) {
		x := &tix{t: t, e: e}
		for i := range 500 {
			x.chain("a", tT, 0, uint64(i)*4+1, uint64(i)*4+2, uint64(i)*4+3)
		}
	}
	plain := New(Config{})
	fill(plain)
	budget := plain.Memory().IndexBytes * 3 / 2 // room for every entry
	e := New(Config{MaxBytes: budget})
	for i := range 40_000 {
		statsOnly(e, i, tT)
	}
	fill(e)
	if entries, _ := e.Counts(); entries != 1500 {
		m := e.Memory()
		t.Fatalf("with 40,000 stats-only tenants the byte budget (%d) kept %d of 1500 entries (memory %+v)", budget, entries, m)
	}
}

// TestStaleReaderOfReclaimedScope pins the reclamation hazard: a reader
// that loaded a scope and its table, then stalled while the sweep reclaimed
// the scope, must not validate a node that now belongs to another tenant's
// scope and holds the very hash it looks for, even when that node reuses
// the reclaimed key's memory and the new scope reuses the reclaimed slot.
func TestStaleReaderOfReclaimedScope(t *testing.T) {
	e := New(Config{})
	put := func(tenant string, ts, now int64) {
		e.Ingest(&Update{TenantID: tenant, ModelID: "m", HashScheme: "vllm", ReplicaID: "r", TimestampUs: ts,
			Prefixes: []PrefixEntry{{BlockHashes: chainOf(42), BlockTokenCounts: sixteens(1)}}}, now)
	}
	put("a", tT-31*min1, tT)
	stale := e.lookupDomain("a", "m").findScheme("vllm").findScope("")
	staleID := stale.id
	// The table as the reader saw it (the delete later tombstones the slot
	// in place, after the reader had read it).
	cur := stale.table.Load()
	staleTable := &table{slots: make([]atomic.Uint64, len(cur.slots)), mask: cur.mask, shift: cur.shift}
	for i := range cur.slots {
		staleTable.slots[i].Store(cur.slots[i].Load())
	}
	k, _ := e.makeKey(h8(42))
	node := e.find(staleTable, staleID, &k)
	if node == 0 {
		t.Fatal("setup: key not found")
	}
	e.Sweep(tT)
	if !stale.dead {
		t.Fatal("setup: the scope was not reclaimed")
	}
	for _, now := range []int64{tT, tT + scopeQuarantineUs} {
		put("b", now, now)
		fresh := e.lookupDomain("b", "m").findScheme("vllm").findScope("")
		if now > tT && scopeSlot(fresh.id) != scopeSlot(staleID) {
			t.Fatalf("after the quarantine the slot was not reused (ids %#x, %#x)", staleID, fresh.id)
		}
		if fresh.id == staleID {
			t.Fatalf("scope id %#x reused", staleID)
		}
		if got := e.find(fresh.table.Load(), fresh.id, &k); got != node {
			t.Fatalf("setup: the new key took node %d, not the reclaimed key's %d", got, node)
		}
		// The stale reader: its table still nominates the node.
		if off := e.find(staleTable, staleID, &k); off != 0 {
			t.Fatalf("a stale reader of the reclaimed scope validated node %d of another tenant", off)
		}
		stale.table.Store(staleTable) // as the stalled reader saw it
		var res LookupResult
		res.d = stale.d
		e.walkChain(stale, &LookupRequest{BlockHashes: chainOf(42), BlockTokenCounts: sixteens(1)}, 30*min1, now, &res)
		if len(res.Scores) != 0 {
			t.Fatalf("a stale chain walk matched another tenant's key: %+v", res.Scores)
		}
		e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: "b", ModelID: "m", ReplicaID: "r"}, now)
		e.Sweep(now)
	}
	checkInvariants(t, e)
}
