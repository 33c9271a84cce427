package kvevents

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// TestForwarderKeepsNewestStatsOnly: stats are snapshots. While the server
// is down, each new one replaces the one still queued (one entry in the
// buffer, not one per interval), and after an ALL_CLEARED (which deletes
// the replica's stats on the server) the newest goes behind it. When the
// server is back it gets the clear and the newest stats, nothing stale.
func TestForwarderKeepsNewestStatsOnly(t *testing.T) {
	s := &recSink{down: true}
	f := NewForwarder(baseConfig(), s, nil)
	startForwarder(t, f)
	st := func(mem int64) *icv1.ReplicaStats { return &icv1.ReplicaStats{CacheMemoryBytes: mem} }
	for i := int64(1); i <= 20; i++ {
		f.Stats(st(i), i)
	}
	if b := f.Buffered(); b != 1 {
		t.Fatalf("buffered %d after 20 stats during an outage, want 1", b)
	}
	f.AllCleared(100)
	for i := int64(21); i <= 40; i++ {
		f.Stats(st(i), i)
	}
	if b := f.Buffered(); b != 2 {
		t.Fatalf("buffered %d (stats, clear, stats), want 2: the clear and the newest stats", b)
	}
	s.setDown(false)
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Before the clear at most the stats whose send was already under way
	// when the clear came (a copy in flight); after it, only the newest.
	got := s.snapshot()
	i := slices.Index(got, "ALL_CLEARED ts=100")
	if i < 0 || i > 1 || (i == 1 && !strings.HasPrefix(got[0], "stats ")) {
		t.Fatalf("got %q: want ALL_CLEARED first (after at most one stats in flight)", got)
	}
	if want := []string{"stats hit=0.00 pressure=0.00 mem=40"}; !slices.Equal(got[i+1:], want) {
		t.Fatalf("after the clear got %q, want %q", got[i+1:], want)
	}
	if u := s.updates[len(s.updates)-1]; u.TimestampUs != 40 {
		t.Fatalf("stats stamped %d, want the newest's 40", u.TimestampUs)
	}
}

// TestForwarderStatsReplacedInFlight: stats replaced while the queued ones
// are being sent are sent too, after them.
func TestForwarderStatsReplacedInFlight(t *testing.T) {
	s := &recSink{}
	f := NewForwarder(baseConfig(), s, nil)
	var once bool
	s.hook = func(call string) {
		if !once {
			once = true
			f.Stats(&icv1.ReplicaStats{CacheMemoryBytes: 2}, 2) // while the first is "in flight"
		}
	}
	f.Stats(&icv1.ReplicaStats{CacheMemoryBytes: 1}, 1)
	startForwarder(t, f)
	ctx := testCtx(t, 5*time.Second)
	for len(s.snapshot()) < 2 {
		if !sleepCtx(ctx, time.Millisecond) {
			t.Fatalf("calls %q: the stats replaced in flight were lost", s.snapshot())
		}
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"stats hit=0.00 pressure=0.00 mem=1", "stats hit=0.00 pressure=0.00 mem=2"}
	if got := s.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// queuedEntries counts the prefixes the forwarder holds in its queue.
func queuedEntries(f *Forwarder) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.pending)
	for _, o := range f.queue {
		n += len(o.prefixes)
	}
	return n
}

// TestForwarderSyncSnapshotsBounded: syncs while the server is down (an
// engine that reconnects again and again) do not pile up copies of the
// whole index: each sync's snapshot replaces the unsent one, and the
// evictions and demotions of syncs count against MaxBuffered like live
// ones, so an outage holds at most MaxBuffered entries plus one index.
func TestForwarderSyncSnapshotsBounded(t *testing.T) {
	s := &recSink{down: true}
	cfg := baseConfig()
	cfg.Window = time.Millisecond
	f := NewForwarder(cfg, s, nil)
	startForwarder(t, f)
	held := make([]Prefix, 5000)
	for i := range held {
		held[i] = pfx(uint64(1000+i), 16)
	}
	var last []Prefix
	for round := range 10 {
		last = slices.Clone(held)
		last[0].Tokens = int32(16 * (round + 1)) // each sync states a newer index
		f.QueueSync(false, []Prefix{pfx(uint64(round+1), 16)}, nil, last, int64(round+1))
	}
	if n := queuedEntries(f); n > len(held)+DefaultMaxPending+10 {
		t.Fatalf("%d entries queued after 10 syncs of a %d-block index", n, len(held))
	}
	if b := f.Buffered(); b != 10 {
		t.Fatalf("buffered %d: want the 10 syncs' evictions counted", b)
	}
	s.setDown(false)
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// The server ends with exactly the last sync's index, every eviction
	// delivered.
	want := map[string]icv1.CacheTier{}
	for _, p := range last {
		want[fmt.Sprintf("%x/", p.Key)] = icv1.CacheTier(TierT1)
	}
	if got := serverModel(s); !maps.Equal(got, want) {
		t.Fatalf("server holds %d keys, want the last index's %d", len(got), len(want))
	}
	evicted := 0
	for _, e := range s.events {
		if e.Type == icv1.CacheEvent_PREFIX_EVICTED {
			evicted++
		}
	}
	if evicted != 10 {
		t.Fatalf("%d evictions delivered, want 10", evicted)
	}
	reports := 0
	for _, u := range s.updates {
		reports += len(u.Prefixes)
	}
	// The last index once, plus at most the chunk that was in flight when
	// a newer sync superseded it.
	if reports > len(held)+DefaultMaxPending {
		t.Fatalf("%d entries re-reported for a %d-block index", reports, len(held))
	}
}
