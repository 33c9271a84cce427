package engine

import (
	"testing"
	"time"
)

// Routing-time entries (expect.go, docs/routing.md "Routing-time entries").

func TestExpectTable(t *testing.T) {
	tb := newExpectTable(64 * expectSlotBytes)
	if len(tb.slots) != 64 || tb.bytes() != 64*expectSlotBytes {
		t.Fatalf("%d slots, %d bytes", len(tb.slots), tb.bytes())
	}
	if n := newExpectTable(100 * expectSlotBytes); len(n.slots) != 64 {
		t.Fatalf("100 slots' worth gave %d slots, want the power of two below (64)", len(n.slots))
	}
	if n := newExpectTable(0); len(n.slots) != 0 || n.bytes() != 0 {
		t.Fatal("a zero-byte table has slots")
	}
	now := tT
	exp := now + 10_000_000
	tb.insert(7, 3, exp, now)
	if rid, ok := tb.find(7, now); !ok || rid != 3 {
		t.Fatalf("find(7) = %d, %v; want 3", rid, ok)
	}
	if _, ok := tb.find(8, now); ok {
		t.Fatal("found a key never inserted")
	}
	if _, ok := tb.find(7, exp); ok {
		t.Fatal("an expired entry was found")
	}
	tb.insert(7, 4, exp, now) // the key's own slot is overwritten
	if rid, _ := tb.find(7, now); rid != 4 {
		t.Fatalf("overwrite: rid %d, want 4", rid)
	}
	tb.confirm(7, 3) // another replica stored it: the entry stays
	if _, ok := tb.find(7, now); !ok {
		t.Fatal("a store on another replica dropped the entry")
	}
	tb.confirm(7, 4)
	if _, ok := tb.find(7, now); ok {
		t.Fatal("the routed replica's store did not drop the entry")
	}
	// A full probe window replaces the entry that expires first.
	for i := range uint64(expectProbe) {
		tb.insert(64*i+1, uint16(i), exp+int64(i)*1_000_000, now)
	}
	tb.insert(64*expectProbe+1, 9, exp, now)
	if _, ok := tb.find(1, now); ok {
		t.Fatal("the earliest expiry survived a full window")
	}
	for i := uint64(1); i < expectProbe; i++ {
		if rid, ok := tb.find(64*i+1, now); !ok || rid != uint16(i) {
			t.Fatalf("key %d lost (rid %d, %v)", 64*i+1, rid, ok)
		}
	}
	// A value written for another key (a torn overwrite) reads as a miss.
	s := &tb.slots[5]
	s.key.Store(5)
	s.val.Store(packExpect(0xabcd000000000005, 1, exp/1e6))
	if _, ok := tb.find(5, now); ok {
		t.Fatal("a value of another key was accepted")
	}
}

// expectFixture: a, b and c hold the shared block 0 and report load; the
// first turn (chain 0..4) went to b, a caller following the answer, and
// the second turn (0..6) arrives before b stored the first.
func expectFixture(t *testing.T, follow bool) (*tix, LookupRequest, int64) {
	t.Helper()
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	for _, r := range []string{"a", "b", "c"} {
		x.chain(r, now, 0, 0)
	}
	now += 1000
	x.load("a", now, 2, 2, 500)
	x.load("b", now, 2, 2, 100)
	x.load("c", now, 2, 2, 500)
	turn1 := LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(0, 1, 2, 3, 4), BlockTokenCounts: sixteens(5)}
	res, d, pin := x.advise(turn1, now)
	if pin != "b" {
		t.Fatalf("turn 1: decision %v to %q, want b (the shortest queue)", d, pin)
	}
	var pick ContractPick
	for i := range res.Scores {
		if res.Scores[i].ReplicaID == "b" {
			pick = PickOfScore(&res.Scores[i])
		}
	}
	x.e.NoteRouted(res, pick, 64, now)
	if follow {
		x.e.NoteFollowed(&turn1, res, pick, now)
	}
	// b's queue grew since; c's is now the shortest.
	now += 1_000_000
	x.load("a", now, 2, 2, 500)
	x.load("b", now, 3, 2, 300)
	x.load("c", now, 2, 2, 100)
	turn2 := LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(0, 1, 2, 3, 4, 5, 6), BlockTokenCounts: sixteens(7)}
	return x, turn2, now
}

func TestExpectedEntriesKeepTheNextTurn(t *testing.T) {
	x, turn2, now := expectFixture(t, false)
	if _, d, pin := x.advise(turn2, now); pin != "c" {
		t.Fatalf("without routing-time entries: decision %v to %q, want c (the index knows only block 0)", d, pin)
	}
	x, turn2, now = expectFixture(t, true)
	// b: 300 + 16 × (112 − (16 + 0.75 × 64)) = 1,068 against c's 1,892.
	_, d, pin := x.advise(turn2, now)
	if pin != "b" || (d != LoadExpected && d != LoadKeep) {
		t.Fatalf("with routing-time entries: decision %v to %q, want b, where turn 1 is queued", d, pin)
	}
	if rid, blocks, ok := x.e.expectedMatch(x.e.lookupDomain("team", "m").findScheme("vllm"), turn2.BlockHashes, 1, now); !ok || blocks != 5 {
		t.Fatalf("expected match: rid %d, %d blocks, %v; want 5 blocks", rid, blocks, ok)
	}
	// b stores turn 1: its KV events confirm the entries, which go.
	x.chain("b", now, 0, 0, 1, 2, 3, 4)
	sch := x.e.lookupDomain("team", "m").findScheme("vllm")
	for i := 1; i <= 4; i++ {
		if _, ok := x.e.expect.find(expectKey(sch.expectSeed, h8(uint64(i))), now); ok {
			t.Fatalf("block %d still expected after b stored it", i)
		}
	}
	// And the entries expire: a fresh fixture, well past the TTL.
	x, turn2, now = expectFixture(t, true)
	late := now + DefaultExpectedTTL.Microseconds() + maxExpectedDrain.Microseconds()
	for _, r := range []string{"a", "b", "c"} {
		x.load(r, late, 2, 2, map[string]int64{"a": 500, "b": 300, "c": 100}[r])
	}
	if _, d, pin := x.advise(turn2, late); pin != "c" {
		t.Fatalf("after the TTL: decision %v to %q, want c", d, pin)
	}
}

// TestExpectedEntriesKeepLightLoadExact: routing-time entries change no
// answer while load-awareness is off (no replica reports MinQueue in
// flight), and a lookup without follows_answer records none.
func TestExpectedEntriesKeepLightLoadExact(t *testing.T) {
	x, turn2, now := expectFixture(t, true)
	for _, r := range []string{"a", "b", "c"} {
		x.load(r, now, 0, 1, 0) // idle: activation off
	}
	contract := &LookupResult{}
	x.e.LookupRoute(&turn2, now, contract)
	res, d, pin := x.advise(turn2, now)
	if d != LoadKeep || pin != contract.Scores[0].ReplicaID {
		t.Fatalf("light load: decision %v to %q, want the contract's %q", d, pin, contract.Scores[0].ReplicaID)
	}
	if len(res.Scores) != len(contract.Scores) {
		t.Fatalf("light load changed the scores: %+v vs %+v", res.Scores, contract.Scores)
	}
	for i := range res.Scores {
		if res.Scores[i] != contract.Scores[i] {
			t.Fatalf("light load changed score %d: %+v vs %+v", i, res.Scores[i], contract.Scores[i])
		}
	}
	y, _, _ := expectFixture(t, false)
	if y.e.expect.used.Load() {
		t.Fatal("lookups that did not follow their answers wrote routing-time entries")
	}
}

func TestExpectedTableMemory(t *testing.T) {
	e := New(Config{Load: DefaultLoadConfig()})
	if m := e.Memory(); m.TableBytes < DefaultExpectedBytes || m.IndexBytes < DefaultExpectedBytes {
		t.Fatalf("the expected table is not counted: %+v", m)
	}
	e = New(Config{Load: DefaultLoadConfig(), MaxBytes: 1 << 20})
	if b := e.expect.bytes(); b == 0 || b > (1<<20)/8 {
		t.Fatalf("with a 1 MiB budget the table takes %d bytes, want 1..%d", b, (1<<20)/8)
	}
	off := DefaultLoadConfig()
	off.ExpectedBytes = -1
	if b := New(Config{Load: off}).expect.bytes(); b != 0 {
		t.Fatalf("ExpectedBytes < 0 kept %d bytes", b)
	}
	if b := New(Config{}).expect.bytes(); b != 0 {
		t.Fatalf("load-aware routing off kept %d bytes", b)
	}
}

func TestExpectedAllocs(t *testing.T) {
	x, turn2, now := expectFixture(t, true)
	res := &LookupResult{}
	x.e.LookupRoute(&turn2, now, res)
	pick := PickOfScore(&res.Scores[0])
	n := testing.AllocsPerRun(200, func() {
		x.e.LookupRoute(&turn2, now, res)
		x.e.AdviseByLoad(&turn2, now, res, pick, 112)
		x.e.NoteFollowed(&turn2, res, pick, now)
	})
	if n != 0 {
		t.Fatalf("lookup + advise + follow: %v allocations, want 0", n)
	}
}

// TestExpectTTL: the least TTL, plus the queue's drain at the prefill
// speed stored blocks show between two busy reports.
func TestExpectTTL(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	x.chain("a", now, 0, 0)
	x.load("a", now, 4, 1, 0)
	res := x.lookup(LookupRequest{BlockHashes: chainOf(0), BlockTokenCounts: sixteens(1)})
	pick := PickOfScore(&res.Scores[0])
	if got := x.e.expectTTL(res, pick, now); got != DefaultExpectedTTL.Microseconds() {
		t.Fatalf("no speed yet: TTL %d µs, want %d", got, DefaultExpectedTTL.Microseconds())
	}
	// 160 tokens stored in the second between two busy reports: 160
	// tokens/s; a queue of 1,600 tokens drains in 10 s.
	x.chain("a", now, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	now += 1_000_000
	x.load("a", now, 4, 1, 1600)
	got := time.Duration(x.e.expectTTL(res, pick, now)) * time.Microsecond
	if got < 19*time.Second || got > 21*time.Second {
		t.Fatalf("TTL %v, want about 10 s + 10 s of drain", got)
	}
}

// TestTierCredit: under load, a block held only in offload memory (T2)
// counts 0.75 of a GPU-resident one, so a slightly shorter T1 match on a
// slightly shorter queue wins; at T1 the longer match stands.
func TestTierCredit(t *testing.T) {
	if tierCredit(TierT1) != 1 || tierCredit(TierT2) != 0.75 || tierCredit(TierT3) != 0.25 || tierCredit(tierUnknown) != 0.25 {
		t.Fatal("tier credits are not 1 / 0.75 / 0.25")
	}
	for _, c := range []struct {
		tier int32
		want string
	}{{1, "a"}, {2, "b"}} {
		x := newLoadTix(t, DefaultLoadConfig())
		now := tT
		x.chain("a", now, c.tier, 0, 1, 2, 3, 4, 5, 6, 7)
		x.chain("b", now, 1, 0, 1, 2, 3, 4, 5, 6)
		now += 1000
		x.load("a", now, 2, 2, 1000)
		x.load("b", now, 2, 2, 900)
		req := LookupRequest{BlockHashes: chainOf(0, 1, 2, 3, 4, 5, 6, 7), BlockTokenCounts: sixteens(8)}
		// a: 1000 + 16 × 128 × (1 − credit); b: 900 + 16 × 16 = 1156.
		if _, d, pin := x.advise(req, now); pin != c.want {
			t.Fatalf("a's blocks at tier %d: decision %v to %q, want %q", c.tier, d, pin, c.want)
		}
	}
}

// TestRoutedCachedAt: a request sent to the replica its chain is expected
// on counts the expected run as cached there (the earlier turn's prefill,
// already counted as routed, stores it first), so the queue estimate does
// not count that prefill twice; elsewhere, and without routing-time
// entries, only what the replica stores counts.
func TestRoutedCachedAt(t *testing.T) {
	for _, c := range []struct {
		follow bool
		want   map[string]int64
	}{
		{false, map[string]int64{"b": 16, "c": 16}},
		{true, map[string]int64{"b": 5 * 16, "c": 16}},
	} {
		x, turn2, now := expectFixture(t, c.follow)
		res := &LookupResult{}
		x.e.LookupRoute(&turn2, now, res)
		for id, want := range c.want {
			var pick ContractPick
			for i := range res.Scores {
				if res.Scores[i].ReplicaID == id {
					pick = PickOfScore(&res.Scores[i])
				}
			}
			if got := x.e.RoutedCachedAt(&turn2, res, pick, now); got != want {
				t.Fatalf("follow %v, pick %s: cached %d, want %d", c.follow, id, got, want)
			}
			if n := testing.AllocsPerRun(100, func() { x.e.RoutedCachedAt(&turn2, res, pick, now) }); n != 0 {
				t.Fatalf("RoutedCachedAt allocates %v times", n)
			}
		}
	}
}
