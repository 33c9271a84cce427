package kvevents

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/kvevents/wire"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// fakeClock is a forwarder clock the test advances by hand.
type fakeClock struct {
	us atomic.Int64 // the time in µs: the test advances it, the forwarder reads it
}

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.us.Store(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).UnixMicro())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.UnixMicro(c.us.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.us.Add(d.Microseconds()) }

type refreshFixture struct {
	sink *recSink
	fwd  *Forwarder
	proc *Processor
	idx  *Index
	clk  *fakeClock
	m    *Metrics
}

// newRefreshFixture builds a forwarder with a one-minute refresh on a fake
// clock, chunks of 3 and a 2 ms window; it is not started.
func newRefreshFixture(t *testing.T, mut func(*ForwarderConfig)) *refreshFixture {
	t.Helper()
	x := &refreshFixture{sink: &recSink{}, clk: newFakeClock(), m: NewMetrics(nil)}
	x.idx = NewIndex(16, 0, map[int64]string{1: "sql"})
	cfg := baseConfig()
	cfg.Window = 2 * time.Millisecond
	cfg.RefreshInterval = time.Minute
	cfg.MaxPending = 3
	cfg.Now = x.clk.Now
	cfg.Metrics = x.m
	if mut != nil {
		mut(&cfg)
	}
	x.fwd = NewForwarder(cfg, x.sink, x.idx)
	x.proc = NewProcessor(x.idx, x.fwd, false, nil, x.m)
	return x
}

// populate stores 8 held blocks across tiers and adapters (and one that is
// removed again):
//
//	1, 2        default adapter, T1 (3 was chained on 2 and evicted)
//	10, 11      lora_id 1 → "sql", T1
//	20, 21      lora_name "chat", stored on CPU only → T2
//	30          on GPU and CPU → T1
//	31          on GPU and CPU, then removed from the GPU → T2
func (x *refreshFixture) populate() {
	cpu := []byte("CPU")
	a := stored([]uint64{1, 2, 3}, nil, toks(48, 0), 16)
	b := stored([]uint64{10, 11}, nil, toks(32, 1000), 16)
	b.LoRAID, b.HasLoRAID = 1, true
	c := stored([]uint64{20, 21}, nil, toks(32, 2000), 16)
	c.LoRAName, c.Medium = []byte("chat"), cpu
	d := stored([]uint64{30, 31}, nil, toks(32, 3000), 16)
	dCPU := stored([]uint64{30, 31}, nil, toks(32, 3000), 16)
	dCPU.Medium = cpu
	x.proc.Apply(&wire.Batch{TS: 100, Events: []wire.Event{*a, *b, *c, *d, *dCPU,
		{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{3}},
		{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{31}, Medium: []byte("GPU")},
	}})
}

// held renders the index as the refresh must re-report it.
func heldSet(x *Index) []string {
	var out []string
	for _, p := range x.AppendSnapshot(nil) {
		out = append(out, fmt.Sprintf("%x/%d/%s/%s", p.Key, p.Tokens,
			strings.TrimPrefix(icv1.CacheTier(p.Tier).String(), "CACHE_TIER_"), p.Adapter))
	}
	slices.Sort(out)
	return out
}

// reported renders the entries of the updates recorded from index from on,
// checking that each is stamped tsUS and holds at most maxEntries.
func reported(t *testing.T, s *recSink, from int, tsUS int64, maxEntries int) []string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, u := range s.updates[from:] {
		if u.TimestampUs != tsUS || len(u.Prefixes) == 0 || len(u.Prefixes) > maxEntries || u.Stats != nil {
			t.Fatalf("refresh update ts=%d entries=%d (want ts=%d, 1..%d entries)", u.TimestampUs, len(u.Prefixes), tsUS, maxEntries)
		}
		for _, p := range u.Prefixes {
			out = append(out, fmt.Sprintf("%x/%d/%s/%s", binary.BigEndian.Uint64(p.PrefixHash), p.TokenCount,
				strings.TrimPrefix(p.Tier.String(), "CACHE_TIER_"), p.AdapterId))
		}
	}
	slices.Sort(out)
	return out
}

func (s *recSink) nUpdates() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.updates)
}

// waitCounter polls c until it reaches want (bounded).
func waitCounter(t *testing.T, what string, c func() float64, want float64) {
	t.Helper()
	ctx := testCtx(t, 5*time.Second)
	for c() < want {
		if !sleepCtx(ctx, time.Millisecond) {
			t.Fatalf("%s = %v, want %v", what, c(), want)
		}
	}
	if got := c(); got != want {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// quiet gives the forwarder a few windows in which nothing must happen.
// It can only pass vacuously on a stalled machine, never fail spuriously.
func quiet() { time.Sleep(30 * time.Millisecond) }

func TestRefreshReportsHeldSetAtTiersAndAdapters(t *testing.T) {
	x := newRefreshFixture(t, nil)
	x.populate()
	want := heldSet(x.idx)
	if len(want) != 8 {
		t.Fatalf("fixture holds %d blocks: %q", len(want), want)
	}
	refreshes := func() float64 { return counter(t, x.m.refreshes) }
	startForwarder(t, x.fwd)
	if err := x.fwd.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}

	for round := 1; round <= 2; round++ {
		// Half an interval after the start (or the last walk): nothing.
		x.clk.Advance(30 * time.Second)
		quiet()
		if refreshes() != float64(round-1) {
			t.Fatal("refreshed before the interval")
		}
		n0 := x.sink.nUpdates()
		x.clk.Advance(30 * time.Second)
		waitCounter(t, "refreshes_total", refreshes, float64(round))
		got := reported(t, x.sink, n0, x.clk.Now().UnixMicro(), 3)
		if !slices.Equal(got, want) {
			t.Fatalf("round %d re-reported\n%q\nwant the held set\n%q", round, got, want)
		}
		if n := x.sink.nUpdates() - n0; n != 3 {
			t.Fatalf("round %d: %d updates, want 3 chunks of at most 3", round, n)
		}
		if c := counter(t, x.m.refreshEntries); c != float64(8*round) {
			t.Fatalf("refreshed_entries_total = %v", c)
		}
	}
	// The tiers and adapters made it to the wire as the index holds them.
	for _, sub := range []string{"/T1/", "/T1/sql", "/T2/chat"} {
		if !slices.ContainsFunc(want, func(s string) bool { return strings.Contains(s, sub) }) {
			t.Fatalf("held set %q lacks %q", want, sub)
		}
	}
	if n := len(slices.DeleteFunc(slices.Clone(want), func(s string) bool { return !strings.HasSuffix(s, "/T2/") })); n != 1 {
		t.Fatalf("want exactly one default-adapter T2 block (demoted 31), have %d in %q", n, want)
	}

	// After AllBlocksCleared the refresh re-reports nothing.
	x.proc.Apply(&wire.Batch{TS: 200, Events: []wire.Event{{Kind: wire.KindAllBlocksCleared}}})
	if err := x.fwd.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	calls := x.sink.snapshot()
	if last := calls[len(calls)-1]; last != "ALL_CLEARED ts=200000000" {
		t.Fatalf("last call %q", last)
	}
	x.clk.Advance(time.Minute)
	waitCounter(t, "refreshes_total", refreshes, 3)
	if after := x.sink.snapshot()[len(calls):]; len(after) != 0 {
		t.Fatalf("refresh after a clear sent %q", after)
	}
	if c := counter(t, x.m.refreshEntries); c != 16 {
		t.Fatalf("refreshed_entries_total = %v", c)
	}
}

func TestRefreshNothingWhileUnknownAndResyncReschedules(t *testing.T) {
	x := newRefreshFixture(t, func(c *ForwarderConfig) { c.ResyncOnStart = true })
	x.sink.down = true
	x.populate() // dropped by the forwarder (resync state); the index keeps it
	startForwarder(t, x.fwd)

	attempts := func() float64 {
		x.sink.mu.Lock()
		defer x.sink.mu.Unlock()
		return float64(x.sink.attempts)
	}
	for i := range 3 {
		x.clk.Advance(time.Minute)
		// Each round, let the forwarder retry its ALL_CLEARED a few times.
		a := attempts()
		ctx := testCtx(t, 5*time.Second)
		for attempts() < a+3 {
			if !sleepCtx(ctx, time.Millisecond) {
				t.Fatalf("round %d: no retries", i)
			}
		}
	}
	x.sink.mu.Lock()
	reports := x.sink.reportAttempts
	x.sink.mu.Unlock()
	if reports != 0 || counter(t, x.m.refreshes) != 0 || counter(t, x.m.refreshEntries) != 0 {
		t.Fatalf("while the server state is unknown: %d ReportCacheState attempts, %v refreshes",
			reports, counter(t, x.m.refreshes))
	}

	// The server comes back: ALL_CLEARED, then the resync re-reports the
	// index (that is not a refresh) and the next refresh is due one
	// interval after it.
	x.sink.setDown(false)
	if err := x.fwd.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if calls := x.sink.snapshot(); !strings.HasPrefix(calls[0], "ALL_CLEARED ") || len(calls) != 4 {
		t.Fatalf("resync calls %q", calls)
	}
	if got := reported(t, x.sink, 0, x.clk.Now().UnixMicro(), 3); !slices.Equal(got, heldSet(x.idx)) {
		t.Fatalf("resync re-reported %q", got)
	}
	x.clk.Advance(59 * time.Second)
	quiet()
	if counter(t, x.m.refreshes) != 0 || x.sink.nUpdates() != 3 {
		t.Fatal("refreshed less than an interval after the resync")
	}
	x.clk.Advance(time.Second)
	waitCounter(t, "refreshes_total", func() float64 { return counter(t, x.m.refreshes) }, 1)
	if got := reported(t, x.sink, 3, x.clk.Now().UnixMicro(), 3); !slices.Equal(got, heldSet(x.idx)) {
		t.Fatalf("refresh re-reported %q", got)
	}
}

func TestRefreshDisabled(t *testing.T) {
	x := newRefreshFixture(t, func(c *ForwarderConfig) { c.RefreshInterval = -1 })
	x.populate()
	startForwarder(t, x.fwd)
	if err := x.fwd.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	n := x.sink.nUpdates()
	x.clk.Advance(time.Hour)
	quiet()
	if x.sink.nUpdates() != n || counter(t, x.m.refreshes) != 0 {
		t.Fatal("refreshed while disabled")
	}
}

// TestRefreshYieldsToLiveWork checks that work queued during a refresh is
// delivered before the refresh's next chunk, and that a block removed
// mid-refresh is not re-reported after its eviction.
func TestRefreshYieldsToLiveWork(t *testing.T) {
	x := newRefreshFixture(t, nil)
	var evs []wire.Event
	for i := range 30 {
		evs = append(evs, *stored([]uint64{uint64(100 + i)}, nil, toks(16, uint32(16*i)), 16))
	}
	x.proc.Apply(&wire.Batch{TS: 100, Events: evs})
	startForwarder(t, x.fwd)
	if err := x.fwd.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	n0 := len(x.sink.snapshot())

	// On the refresh's second chunk, the engine evicts the last stored
	// block (slab position 29, not read yet).
	refreshTS := fmt.Sprintf("report ts=%d ", x.clk.Now().Add(time.Minute).UnixMicro())
	var chunks atomic.Int32
	x.sink.mu.Lock()
	x.sink.hook = func(call string) {
		if strings.HasPrefix(call, refreshTS) && chunks.Add(1) == 2 {
			x.proc.Apply(&wire.Batch{TS: 101, Events: []wire.Event{{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{129}}}})
		}
	}
	x.sink.mu.Unlock()
	x.clk.Advance(time.Minute)
	waitCounter(t, "refreshes_total", func() float64 { return counter(t, x.m.refreshes) }, 1)

	calls := x.sink.snapshot()[n0:]
	if len(calls) != 11 { // 10 chunks (29 blocks by 3) and the eviction
		t.Fatalf("calls %q", calls)
	}
	if !strings.HasPrefix(calls[1], refreshTS) || !strings.HasPrefix(calls[2], "PREFIX_EVICTED ts=101000000 ") {
		t.Fatalf("the eviction did not go right after the chunk in flight: %q", calls[:4])
	}
	if server, index := serverModel(x.sink), indexModel(x.idx); !maps.Equal(server, index) || len(index) != 29 {
		t.Fatalf("server %d keys, index %d", len(server), len(index))
	}
}

// TestIndexAppendHeldWalk walks a randomly mutated index in small chunks
// and compares with the snapshot; blocks held throughout a walk that
// interleaves mutations are returned exactly once.
func TestIndexAppendHeldWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := NewIndex(16, 0, nil)
	next := uint64(1)
	held := map[uint64]bool{}
	store := func() {
		h := next
		next++
		if _, r := x.Store(stored([]uint64{h}, nil, toks(16, uint32(rng.IntN(1<<20))), 16), nil); r != "" {
			t.Fatal(r)
		}
		held[h] = true
	}
	remove := func() {
		for h := range held {
			x.Remove(&wire.Event{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{h}}, false, nil, nil)
			delete(held, h)
			return
		}
	}
	for range 500 {
		store()
	}
	for range 300 {
		remove() // leave holes in the slab
	}
	walk := func(n int, between func()) []Prefix {
		var out []Prefix
		pos, done := 0, false
		for !done {
			out, pos, done = x.AppendHeld(out, pos, n)
			if between != nil {
				between()
			}
		}
		return out
	}
	sorted := func(ps []Prefix) []uint64 {
		ks := make([]uint64, len(ps))
		for i, p := range ps {
			ks[i] = p.Key
		}
		slices.Sort(ks)
		return ks
	}
	for _, n := range []int{1, 3, 64, 4096} {
		if got, want := sorted(walk(n, nil)), sorted(x.AppendSnapshot(nil)); !slices.Equal(got, want) {
			t.Fatalf("chunk %d: walk %d blocks, snapshot %d", n, len(got), len(want))
		}
	}
	// Mutations between chunks: whatever was held at the start and still is
	// at the end is returned exactly once; nothing is returned twice.
	before := map[uint64]bool{}
	for _, p := range x.AppendSnapshot(nil) {
		before[p.Key] = true
	}
	got := walk(5, func() {
		for range 3 {
			if rng.IntN(2) == 0 {
				store()
			} else {
				remove()
			}
		}
	})
	seen := map[uint64]int{}
	for _, p := range got {
		seen[p.Key]++
	}
	for _, p := range x.AppendSnapshot(nil) {
		if before[p.Key] && seen[p.Key] != 1 {
			t.Fatalf("block held throughout returned %d times", seen[p.Key])
		}
	}
	for k, c := range seen {
		if c != 1 {
			t.Fatalf("block %x returned %d times", k, c)
		}
	}
}
