package engine

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/policy"
)

// holders lists "replica:hash" for every storage entry, sorted.
func holders(e *Engine) []string {
	var out []string
	for _, d := range e.dump() {
		out = append(out, fmt.Sprintf("%s/%s:%x", d.key.tenant, d.replica, d.key.hash[len(d.key.hash)-1:]))
	}
	slices.Sort(out)
	return out
}

func wantHolders(t *testing.T, e *Engine, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := holders(e); !slices.Equal(got, want) {
		t.Fatalf("holders %v, want %v", got, want)
	}
}

func TestCapEvictionOrder(t *testing.T) {
	t.Run("LRU: oldest lastSeen first, then key, then replica", func(t *testing.T) {
		m := newRecMetrics()
		e := New(Config{MaxEntries: 3, Metrics: m})
		put := func(tenant, replica string, ts int64, hash uint64) {
			e.Ingest(&Update{TenantID: tenant, ModelID: "m", HashScheme: "vllm", ReplicaID: replica, TimestampUs: ts,
				Prefixes: []PrefixEntry{{PrefixHash: h8(hash), TokenCount: 16}}}, tT)
		}
		put("t", "b", tT-2*min1, 1)
		put("t", "a", tT-2*min1, 1)
		put("t", "a", tT-3*min1, 2)
		wantHolders(t, e, "t/b:01", "t/a:01", "t/a:02")
		put("t", "a", tT, 3) // 4 entries: the oldest (a:02 at -3 min) goes
		wantHolders(t, e, "t/b:01", "t/a:01", "t/a:03")
		put("t", "c", tT, 4) // tie at -2 min on key 01: replica "a" < "b" goes
		wantHolders(t, e, "t/b:01", "t/a:03", "t/c:04")
		put("s", "z", tT, 5) // t (3) is over its fair share of 3/2, s (1) is not: t's oldest, b:01, goes
		wantHolders(t, e, "t/a:03", "t/c:04", "s/z:05")
		put("s", "y", tT, 6) // both hold 2, over the share: all at tT, the smallest key wins: tenant "s" first
		wantHolders(t, e, "t/a:03", "t/c:04", "s/y:06")
		put("t", "c", tT, 2) // only t is over its share: its smallest key goes, not s's entry
		wantHolders(t, e, "t/a:03", "t/c:04", "s/y:06")
		if m.evictions[[2]string{"lru", "cap"}] != 5 {
			t.Fatalf("cap evictions %v", m.evictions)
		}
	})
	t.Run("LFU counts first, LRU tenants count as 0, switching back refiles", func(t *testing.T) {
		store := policy.NewStore()
		store.Apply(&policy.Body{Version: 7, Policies: []policy.ResolvedPolicy{{Namespace: "hot", Eviction: "lfu"}}})
		m := newRecMetrics()
		e := New(Config{MaxEntries: 3, Policies: store, Metrics: m})
		x := &tix{t: t, e: e, store: store}
		x.chainIn("hot", "m", "vllm", "", "a", tT-9*min1, 0, 1)
		x.chainIn("hot", "m", "vllm", "", "a", tT-8*min1, 0, 2)
		x.chainIn("cold", "m", "vllm", "", "a", tT, 0, 3)
		// Credit hot:01 twice; hot:02 stays at 0.
		for range 2 {
			res := &LookupResult{}
			e.LookupRoute(&LookupRequest{TenantID: "hot", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(1), BlockTokenCounts: sixteens(1)}, tT, res)
			e.Credit(res)
		}
		x.chainIn("cold", "m", "vllm", "", "a", tT, 0, 4)
		// Candidates: hot:01 (2, -9m), hot:02 (0, -8m), cold:03 (0, now), cold:04 (0, now) -> hot:02 goes.
		wantHolders(t, e, "hot/a:01", "cold/a:03", "cold/a:04")
		x.chainIn("cold", "m", "vllm", "", "a", tT, 0, 5)
		// hot:01 has count 2; cold entries count 0: cold:03 (smallest key at tT) goes.
		wantHolders(t, e, "hot/a:01", "cold/a:04", "cold/a:05")
		// The tenant leaves LFU: its entry now counts 0 and is the oldest
		// (both tenants hold 2 entries, over the fair share of 3/2).
		store.Apply(&policy.Body{Version: 7})
		x.chainIn("hot", "m", "vllm", "", "a", tT, 0, 6)
		wantHolders(t, e, "hot/a:06", "cold/a:04", "cold/a:05")
		if m.evictions[[2]string{"lfu", "cap"}] != 1 || m.evictions[[2]string{"lru", "cap"}] != 2 {
			t.Fatalf("cap evictions %v", m.evictions)
		}
	})
	t.Run("the reserved tenant is outside the cap", func(t *testing.T) {
		e := New(Config{MaxEntries: 1})
		e.Ingest(&Update{TenantID: policy.ReservedTenantID, ModelID: "m", HashScheme: "vllm", ReplicaID: "__probe-x", TimestampUs: tT - min1,
			Prefixes: []PrefixEntry{{PrefixHash: h8(1), TokenCount: 16}}}, tT)
		e.Ingest(&Update{TenantID: "t", ModelID: "m", HashScheme: "vllm", ReplicaID: "a", TimestampUs: tT,
			Prefixes: []PrefixEntry{{PrefixHash: h8(2), TokenCount: 16}}}, tT)
		wantHolders(t, e, policy.ReservedTenantID+"/__probe-x:01", "t/a:02")
		if entries, keys := e.Counts(); entries != 1 || keys != 1 {
			t.Fatalf("counts %d %d", entries, keys)
		}
	})
	t.Run("a byte budget evicts like the cap", func(t *testing.T) {
		// The baseline keeps a cap queue, as the budgeted engine will once
		// it nears its budget (an engine with no cap keeps none), and
		// never evicts.
		e := New(Config{MaxEntries: 150})
		x := &tix{t: t, e: e}
		for i := range 100 {
			x.chain("a", tT+int64(i), 0, uint64(1000+i))
		}
		full := e.Memory().IndexBytes
		b := New(Config{MaxBytes: full * 6 / 10})
		y := &tix{t: t, e: b}
		for i := range 100 {
			y.chain("a", tT+int64(i), 0, uint64(1000+i))
		}
		m := b.Memory()
		if m.IndexBytes > full*6/10 || m.Entries >= 100 || m.Entries < 30 {
			t.Fatalf("budget %d: index %d bytes, %d entries", full*6/10, m.IndexBytes, m.Entries)
		}
		// The survivors are the newest.
		last := b.dump()
		if last[len(last)-1].key.hash != string(h8(1099)) {
			t.Fatalf("newest entry evicted: %v", last[len(last)-1])
		}
	})
}

func TestQuotaEviction(t *testing.T) {
	store := policy.NewStore()
	m := newRecMetrics()
	e := New(Config{Policies: store, Metrics: m})
	x := &tix{t: t, e: e, store: store}
	x.chainIn("t", "m2", "vllm", "", "a", tT-5*min1, 0, 1)
	x.chainIn("t", "m1", "vllm", "", "a", tT-5*min1, 0, 2)
	x.chainIn("t", "m1", "vllm", "", "b", tT-9*min1, 0, 3)
	x.chainIn("t", "m1", "vllm", "", "a", tT-1*min1, 0, 3) // key 03's newest lastSeen is -1 min
	x.chainIn("u", "m1", "vllm", "", "a", tT-60*min1, 0, 9)
	store.Apply(&policy.Body{Version: 7, Tenants: []policy.ResolvedTenant{{TenantID: "t", MaxIndexEntries: 2}}})
	x.chainIn("t", "m1", "vllm", "", "c", tT, 0, 4)
	// Keys of t by newest lastSeen: 01 (m2, -5m), 02 (m1, -5m), 03 (-1m), 04 (now).
	// Two must go: the -5 min pair, tie broken by model (m1 < m2): 02 then 01.
	wantHolders(t, e, "t/a:03", "t/b:03", "t/c:04", "u/a:09")
	if m.tenantEv["t"] != 2 {
		t.Fatalf("tenant evictions %v", m.tenantEv)
	}
	// A quota of 0 admits nothing; other tenants are untouched.
	store.Apply(&policy.Body{Version: 7, Tenants: []policy.ResolvedTenant{{TenantID: "t", MaxIndexEntries: 0}}})
	x.chainIn("t", "m1", "vllm", "", "a", tT, 0, 5)
	wantHolders(t, e, "u/a:09")
	// The reserved tenant never gets a quota.
	store.Apply(&policy.Body{Version: 7, Tenants: []policy.ResolvedTenant{{TenantID: policy.ReservedTenantID, MaxIndexEntries: 0}}})
	x.chainIn(policy.ReservedTenantID, "m1", "vllm", "", "__probe-x", tT, 0, 6)
	wantHolders(t, e, "u/a:09", policy.ReservedTenantID+"/__probe-x:06")
}

func TestSweep(t *testing.T) {
	store := policy.NewStore()
	store.Apply(&policy.Body{Version: 7, Policies: []policy.ResolvedPolicy{{Namespace: "short", EvictionTTL: 5 * time.Minute, Eviction: "lfu"}}})
	m := newRecMetrics()
	e := New(Config{Policies: store, Metrics: m})
	x := &tix{t: t, e: e, store: store}
	x.chainIn("short", "m", "vllm", "", "a", tT-6*min1, 0, 1)
	x.chainIn("short", "m", "vllm", "", "a", tT-4*min1, 0, 2)
	x.chainIn("long", "m", "vllm", "", "a", tT-29*min1, 0, 3)
	x.chainIn("long", "m", "vllm", "", "b", tT-30*min1, 0, 3)
	e.Ingest(&Update{TenantID: "long", ModelID: "m", ReplicaID: "s", TimestampUs: tT - 40*min1, Stats: &ReplicaStats{HitRate: 0.5}}, tT)
	e.Ingest(&Update{TenantID: "long", ModelID: "m", ReplicaID: "s2", TimestampUs: tT - 40*min1, Stats: &ReplicaStats{HitRate: 0.5}}, tT)
	e.ApplyEvent(&Event{Type: EventReplicaUpdated, TenantID: "long", ModelID: "m", ReplicaID: "s2", TimestampUs: tT}, tT)
	if n := e.Sweep(tT); n != 2 {
		t.Fatalf("sweep removed %d, want 2", n)
	}
	wantHolders(t, e, "short/a:02", "long/a:03")
	if m.evictions[[2]string{"lfu", "ttl"}] != 1 || m.evictions[[2]string{"lru", "ttl"}] != 1 {
		t.Fatalf("ttl evictions %v", m.evictions)
	}
	// s's stats expired; s2 was kept alive by REPLICA_UPDATED.
	reps, _ := e.ModelState("long", "m")
	if len(reps) != 1 || reps[0].ReplicaID != "s2" {
		t.Fatalf("stats after sweep: %+v", reps)
	}
}

func TestEvents(t *testing.T) {
	x := newTix(t)
	x.chainIn("t", "m", "vllm", "", "a", tT, 0, 1, 2)
	x.chainIn("t", "m", "sglang", "", "a", tT, 0, 1)
	x.chainIn("t", "m", "vllm", "lora", "a", tT, 0, 1)
	x.chainIn("t", "m", "vllm", "", "b", tT, 0, 1)
	x.chainIn("t", "m2", "vllm", "", "a", tT, 0, 1)
	// PREFIX_EVICTED with an adapter touches that partition only, in every scheme.
	x.e.ApplyEvent(&Event{Type: EventPrefixEvicted, TenantID: "t", ModelID: "m", ReplicaID: "a", PrefixHash: h8(1), AdapterID: "lora"}, tT)
	if got := len(x.e.dump()); got != 5 {
		t.Fatalf("after adapter-scoped eviction %d entries, want 5", got)
	}
	// Without an adapter: every partition and scheme of (t, m), replica a only.
	x.e.ApplyEvent(&Event{Type: EventPrefixEvicted, TenantID: "t", ModelID: "m", ReplicaID: "a", PrefixHash: h8(1)}, tT)
	wantHolders(t, x.e, "t/a:02", "t/b:01", "t/a:01")
	x.e.Ingest(&Update{TenantID: "t", ModelID: "m", ReplicaID: "a", Stats: &ReplicaStats{HitRate: 1}}, tT)
	// ALL_CLEARED: replica a leaves every key of (t, m) and its stats go.
	x.e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: "t", ModelID: "m", ReplicaID: "a"}, tT)
	wantHolders(t, x.e, "t/b:01", "t/a:01")
	if reps, _ := x.e.ModelState("t", "m"); len(reps) != 0 {
		t.Fatalf("stats survived ALL_CLEARED: %+v", reps)
	}
	// PREFIX_ADDED and unknown types do nothing.
	x.e.ApplyEvent(&Event{Type: EventPrefixAdded, TenantID: "t", ModelID: "m", ReplicaID: "b", PrefixHash: h8(1)}, tT)
	x.e.ApplyEvent(&Event{Type: 42, TenantID: "t", ModelID: "m", ReplicaID: "b"}, tT)
	wantHolders(t, x.e, "t/b:01", "t/a:01")
	checkInvariants(t, x.e)
}

func TestIngestRules(t *testing.T) {
	x := newTix(t)
	up := &Update{TenantID: "t", ModelID: "m", HashScheme: "vllm", ReplicaID: "a", TimestampUs: 0, AdapterID: "upd",
		Prefixes: []PrefixEntry{
			{BlockHashes: chainOf(1, 2), BlockTokenCounts: []int32{16, 8}, PrefixHash: h8(3), TokenCount: 24},
			{BlockHashes: chainOf(4), BlockTokenCounts: []int32{16, 16}}, // unbalanced: dropped
			{BlockHashes: [][]byte{h8(5), nil}, BlockTokenCounts: []int32{16, 16}},
			{PrefixHash: nil, TokenCount: 10}, // no hash: dropped
			{PrefixHash: h8(6), AdapterID: "own"},
		}}
	res := x.e.Ingest(up, tT)
	if res.Entries != 4 || res.Dropped != 3 {
		t.Fatalf("ingest result %+v", res)
	}
	got := map[string]dumpEntry{}
	for _, d := range x.e.dump() {
		got[d.key.adapter+fmt.Sprintf("%x", d.key.hash)] = d
	}
	if d := got["upd"+fmt.Sprintf("%x", h8(2))]; d.tokens != 24 || d.ts != tT || d.tier != TierT1 {
		t.Fatalf("block 2: %+v (cumulative tokens, server time, T1)", d)
	}
	if d := got["upd"+fmt.Sprintf("%x", h8(3))]; d.tokens != 24 {
		t.Fatalf("legacy key written with the chain: %+v", d)
	}
	if _, ok := got["own"+fmt.Sprintf("%x", h8(6))]; !ok {
		t.Fatal("entry adapter must win over the update's")
	}
	// No hash scheme: stats kept, prefixes dropped.
	x.e.Ingest(&Update{TenantID: "t", ModelID: "m", ReplicaID: "b", Prefixes: []PrefixEntry{{PrefixHash: h8(7)}}, Stats: &ReplicaStats{HitRate: 0.4}}, tT)
	if reps, _ := x.e.ModelState("t", "m"); len(reps) != 1 || reps[0].ReplicaID != "b" {
		t.Fatalf("stats %+v", reps)
	}
	if len(x.e.dump()) != 4 {
		t.Fatal("a scheme-less update indexed prefixes")
	}
	// Last write wins for the tier.
	x.e.Ingest(&Update{TenantID: "t", ModelID: "m", HashScheme: "vllm", ReplicaID: "a", AdapterID: "upd", TimestampUs: tT,
		Prefixes: []PrefixEntry{{PrefixHash: h8(3), TokenCount: 24, Tier: 2}}}, tT)
	for _, d := range x.e.dump() {
		if d.key.hash == string(h8(3)) && d.tier != TierT2 {
			t.Fatalf("tier not overwritten: %+v", d)
		}
	}
	checkInvariants(t, x.e)
}

// TestCapRecordNeverValidatesALaterLife pins issue 12 item 7 (gen): a cap
// record names its node by offset and the low 16 bits of the node's gen.
// After 65,536 reuses the node comes back with the same 16 bits; were it
// then to hold an entry of the same replica and lastSeen, the stale record
// (and the place it was sorted to in its bucket) would pass for that entry.
func TestCapRecordNeverValidatesALaterLife(t *testing.T) {
	if testing.Short() {
		t.Skip("131,072 writes")
	}
	e := New(Config{})
	put := func(hash uint64, ts int64) {
		e.Ingest(&Update{TenantID: "t", ModelID: "m", HashScheme: "vllm", ReplicaID: "a", TimestampUs: ts,
			Prefixes: []PrefixEntry{{PrefixHash: h8(hash), TokenCount: 16}}}, tT)
	}
	drop := func(hash uint64) {
		e.ApplyEvent(&Event{Type: EventPrefixEvicted, TenantID: "t", ModelID: "m", ReplicaID: "a", PrefixHash: h8(hash)}, tT)
	}
	put(1<<40, tT+1) // keeps replica a (and its id) alive throughout
	put(1, tT)
	e.mu.Lock()
	sc := e.lookupDomain("t", "m").findScheme("vllm").findScope("")
	k, _ := e.makeKey(h8(1))
	off, _ := e.findLocked(sc.table.Load(), sc.id, &k)
	rec := capRec(e.w(off+nGen), off, 0)
	e.mu.Unlock()
	drop(1)
	// 65,535 more lives of the node (the free list hands it straight back).
	for i := range 1<<16 - 1 {
		put(uint64(100+i), tT+1)
		drop(uint64(100 + i))
	}
	put(2, tT) // same replica, same lastSeen as the record's entry
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, _, _, ok := e.capRecState(rec, tT); ok {
		t.Fatalf("a cap record of key 01 validates against key 02 in a later life of node %d", off)
	}
}

// TestCapQueueBuiltNearCap checks that the cap queue costs nothing until
// the index reaches a quarter of its cap, and that a queue built then evicts the
// entries the cap order names: the oldest first, across entries written
// before the queue existed.
func TestCapQueueBuiltNearCap(t *testing.T) {
	e := New(Config{MaxEntries: 40})
	x := &tix{t: t, e: e}
	if q := New(Config{}); q.Memory().QueueBytes != 0 {
		t.Fatalf("an engine with no cap holds %d queue bytes", q.Memory().QueueBytes)
	}
	for i := range 9 {
		x.chain("a", tT+int64(i), 0, uint64(100+i))
	}
	if m := e.Memory(); m.QueueBytes != 0 || m.Entries != 9 {
		t.Fatalf("below a quarter of the cap: %d queue bytes, %d entries", m.QueueBytes, m.Entries)
	}
	for i := 9; i < 45; i++ {
		x.chain("a", tT+int64(i), 0, uint64(100+i))
	}
	m := e.Memory()
	if m.QueueBytes == 0 || m.Entries != 40 {
		t.Fatalf("at the cap: %d queue bytes, %d entries", m.QueueBytes, m.Entries)
	}
	got := e.dump()
	for i, en := range got {
		if want := string(h8(uint64(105 + i))); en.key.hash != want {
			t.Fatalf("entry %d is %x, want %x (the five oldest evicted)", i, en.key.hash, want)
		}
	}
}
