package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/kvevents/wire"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// recSink records every call in order. While down it fails calls; failNext
// fails that many calls first.
type recSink struct {
	mu       sync.Mutex // guards the fields below
	calls    []string   // compact rendering, see render*
	updates  []*icv1.CacheStateUpdate
	events   []*icv1.CacheEvent
	down     bool
	failNext int
	attempts int
	// reportAttempts counts ReportCacheState calls, failed ones included.
	reportAttempts int
	// hook, when set, runs after a delivered call (outside mu), on the
	// forwarder's Run goroutine, with the call's rendering.
	hook func(call string)
}

var errDown = errors.New("sink down")

func (s *recSink) fail() bool {
	s.attempts++
	if s.down {
		return true
	}
	if s.failNext > 0 {
		s.failNext--
		return true
	}
	return false
}

func (s *recSink) ReportCacheState(_ context.Context, u *icv1.CacheStateUpdate) error {
	s.mu.Lock()
	s.reportAttempts++
	if s.fail() {
		s.mu.Unlock()
		return errDown
	}
	call := renderUpdate(u)
	s.updates = append(s.updates, u)
	s.calls = append(s.calls, call)
	hook := s.hook
	s.mu.Unlock()
	if hook != nil {
		hook(call)
	}
	return nil
}

func (s *recSink) PublishEvent(_ context.Context, e *icv1.CacheEvent) error {
	s.mu.Lock()
	if s.fail() {
		s.mu.Unlock()
		return errDown
	}
	call := renderEvent(e)
	s.events = append(s.events, e)
	s.calls = append(s.calls, call)
	hook := s.hook
	s.mu.Unlock()
	if hook != nil {
		hook(call)
	}
	return nil
}

func (s *recSink) setDown(v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = v
}

func (s *recSink) snapshot() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// renderUpdate: "report ts=T [key/tokens/tier/adapter ...]" or "stats ...".
func renderUpdate(u *icv1.CacheStateUpdate) string {
	if u.Stats != nil && len(u.Prefixes) == 0 {
		return fmt.Sprintf("stats hit=%.2f pressure=%.2f mem=%d", u.Stats.HitRate, u.Stats.Pressure, u.Stats.CacheMemoryBytes)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "report ts=%d", u.TimestampUs)
	for _, p := range u.Prefixes {
		fmt.Fprintf(&b, " %x/%d/%s/%s", binary.BigEndian.Uint64(p.PrefixHash), p.TokenCount,
			strings.TrimPrefix(p.Tier.String(), "CACHE_TIER_"), p.AdapterId)
	}
	return b.String()
}

func renderEvent(e *icv1.CacheEvent) string {
	if len(e.PrefixHash) == 8 {
		return fmt.Sprintf("%s ts=%d %x/%s", e.Type, e.TimestampUs, binary.BigEndian.Uint64(e.PrefixHash), e.AdapterId)
	}
	return fmt.Sprintf("%s ts=%d", e.Type, e.TimestampUs)
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// startForwarder runs f until the test ends.
func startForwarder(t *testing.T, f *Forwarder) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func baseConfig() ForwarderConfig {
	return ForwarderConfig{
		ReplicaID: "r1", ModelID: "m", TenantID: "t", HashScheme: "vllm",
		Window: time.Hour, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
	}
}

func waitCalls(t *testing.T, s *recSink, n int) []string {
	t.Helper()
	ctx := testCtx(t, 5*time.Second)
	for {
		if c := s.snapshot(); len(c) >= n {
			return c
		}
		if !sleepCtx(ctx, time.Millisecond) {
			t.Fatalf("timed out waiting for %d calls; have %q", n, s.snapshot())
		}
	}
}

func pfx(key uint64, tokens int32) Prefix { return Prefix{Key: key, Tokens: tokens, Tier: TierT1} }

func TestForwarderBatchesWithinWindow(t *testing.T) {
	s := &recSink{}
	cfg := baseConfig()
	cfg.Window = 30 * time.Millisecond
	f := NewForwarder(cfg, s, nil)
	f.Add([]Prefix{pfx(1, 16), pfx(2, 32)}, 1000)
	f.Add([]Prefix{{Key: 3, Tokens: 16, Tier: TierT1, Adapter: "a"}}, 3000)
	f.Add([]Prefix{pfx(4, 16)}, 2000)
	startForwarder(t, f)
	calls := waitCalls(t, s, 1)
	want := "report ts=3000 1/16/T1/ 2/32/T1/ 3/16/T1/a 4/16/T1/"
	if calls[0] != want {
		t.Fatalf("got %q\nwant %q", calls[0], want)
	}
	u := s.updates[0]
	if u.ReplicaId != "r1" || u.ModelId != "m" || u.TenantId != "t" || u.HashScheme != "vllm" || u.Stats != nil ||
		len(u.Prefixes[0].PrefixHash) != 8 || len(u.Prefixes[0].BlockHashes) != 0 {
		t.Fatalf("update %v", u)
	}
}

func TestForwarderFlushesAtMaxPending(t *testing.T) {
	s := &recSink{}
	cfg := baseConfig() // window of an hour: only size flushes
	cfg.MaxPending = 4
	f := NewForwarder(cfg, s, nil)
	startForwarder(t, f)
	var ps []Prefix
	for i := range 10 {
		ps = append(ps, pfx(uint64(i), 16))
	}
	f.Add(ps, 7)
	calls := waitCalls(t, s, 2)
	if len(calls) != 2 || calls[0] != "report ts=7 0/16/T1/ 1/16/T1/ 2/16/T1/ 3/16/T1/" {
		t.Fatalf("calls %q", calls)
	}
	if f.Buffered() != 2 {
		t.Fatalf("buffered %d", f.Buffered())
	}
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if calls := s.snapshot(); len(calls) != 3 || calls[2] != "report ts=7 8/16/T1/ 9/16/T1/" {
		t.Fatalf("calls %q", calls)
	}
}

// processorFixture stores a 3-block chain and returns its keys.
func processorFixture(t *testing.T, l2 bool) (*recSink, *Forwarder, *Processor, []uint64) {
	s := &recSink{}
	idx := NewIndex(16, 0, nil)
	f := NewForwarder(baseConfig(), s, idx)
	p := NewProcessor(idx, f, l2, nil, nil)
	b := &wire.Batch{TS: 1.5, Events: []wire.Event{*stored([]uint64{1, 2, 3}, nil, toks(48, 0), 16)}}
	p.Apply(b)
	snap := idx.AppendSnapshot(nil)
	keys := []uint64{snap[2].Key, snap[1].Key, snap[0].Key} // MRU first → chain order
	return s, f, p, keys
}

func TestForwarderRemovalWithoutL2(t *testing.T) {
	s, f, p, keys := processorFixture(t, false)
	p.Apply(&wire.Batch{TS: 2, Events: []wire.Event{{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{3, 2}}}})
	startForwarder(t, f)
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("report ts=1500000 %x/16/T1/ %x/32/T1/ %x/48/T1/", keys[0], keys[1], keys[2]),
		fmt.Sprintf("PREFIX_EVICTED ts=2000000 %x/", keys[2]),
		fmt.Sprintf("PREFIX_EVICTED ts=2000000 %x/", keys[1]),
	}
	if got := s.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestForwarderRemovalWithL2(t *testing.T) {
	s, f, p, keys := processorFixture(t, true)
	p.Apply(&wire.Batch{TS: 2, Events: []wire.Event{{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{3}}}})
	startForwarder(t, f)
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("report ts=1500000 %x/16/T1/ %x/32/T1/ %x/48/T1/", keys[0], keys[1], keys[2]),
		fmt.Sprintf("report ts=2000000 %x/48/T2/", keys[2]),
	}
	if got := s.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestForwarderAllBlocksClearedDiscardsPending(t *testing.T) {
	s, f, p, _ := processorFixture(t, false)
	p.Apply(&wire.Batch{TS: 3, Events: []wire.Event{{Kind: wire.KindAllBlocksCleared}}})
	startForwarder(t, f)
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := s.snapshot(); !slices.Equal(got, []string{"ALL_CLEARED ts=3000000"}) {
		t.Fatalf("got %q", got)
	}
	if p.idx.Len() != 0 {
		t.Fatal("index not cleared")
	}
}

func TestForwarderRetriesInOrder(t *testing.T) {
	s := &recSink{failNext: 3}
	f := NewForwarder(baseConfig(), s, nil)
	f.Add([]Prefix{pfx(1, 16)}, 1)
	f.Removed([]Prefix{pfx(1, 16), pfx(2, 32)}, nil, 2)
	f.AllCleared(3)
	startForwarder(t, f)
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	want := []string{"report ts=1 1/16/T1/", "PREFIX_EVICTED ts=2 1/", "PREFIX_EVICTED ts=2 2/", "ALL_CLEARED ts=3"}
	if got := s.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("got %q", got)
	}

	// A failure in the middle of the evictions resumes after the delivered ones.
	s2 := &recSink{}
	f2 := NewForwarder(baseConfig(), s2, nil)
	f2.Removed([]Prefix{pfx(1, 16), pfx(2, 32), pfx(3, 48)}, nil, 2)
	f2.sink = &flakySink{recSink: s2, failAt: 2}
	startForwarder(t, f2)
	if err := f2.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	want = []string{"PREFIX_EVICTED ts=2 1/", "PREFIX_EVICTED ts=2 2/", "PREFIX_EVICTED ts=2 3/"}
	if got := s2.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("got %q", got)
	}
}

// flakySink fails its failAt-th PublishEvent call (only the Run goroutine
// calls it, so n needs no lock).
type flakySink struct {
	*recSink
	failAt int
	n      int
}

func (s *flakySink) PublishEvent(ctx context.Context, e *icv1.CacheEvent) error {
	s.n++
	if s.n == s.failAt {
		return errDown
	}
	return s.recSink.PublishEvent(ctx, e)
}

func TestForwarderOverflowClearsAndResyncs(t *testing.T) {
	s := &recSink{down: true}
	idx := NewIndex(16, 0, nil)
	cfg := baseConfig()
	cfg.MaxPending = 4
	cfg.MaxBuffered = 8
	f := NewForwarder(cfg, s, idx)
	p := NewProcessor(idx, f, false, nil, nil)
	startForwarder(t, f)

	// Five 2-block chains = 10 adds > 8 while the server is down.
	for i := range 5 {
		p.Apply(&wire.Batch{TS: float64(i + 1), Events: []wire.Event{*stored([]uint64{uint64(10 * i), uint64(10*i + 1)}, nil, toks(32, uint32(100*i)), 16)}})
	}
	if !f.Resyncing() || f.Buffered() != 0 {
		t.Fatalf("resyncing %v buffered %d", f.Resyncing(), f.Buffered())
	}
	// Work after the overflow is dropped too; the index keeps it.
	p.Apply(&wire.Batch{TS: 9, Events: []wire.Event{{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{0, 1}}}})
	if f.Buffered() != 0 || idx.Len() != 8 {
		t.Fatalf("buffered %d index %d", f.Buffered(), idx.Len())
	}

	s.setDown(false)
	ctx := testCtx(t, 5*time.Second)
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	calls := s.snapshot()
	// The Run goroutine may have taken the first flushed update for a
	// delivery attempt just before the overflow and make that attempt once
	// the sink is up: at most that one report precedes the ALL_CLEARED
	// (harmless: the clear and the re-report follow it on the same
	// goroutine). Then the clear and two re-report updates.
	stale := 0
	if len(calls) > 0 && strings.HasPrefix(calls[0], "report ts=") {
		stale = 1
	}
	if len(calls) != stale+3 || !strings.HasPrefix(calls[stale], "ALL_CLEARED ") {
		t.Fatalf("calls %q", calls)
	}
	// The re-report covers exactly the index, in MaxPending-sized updates.
	var got []string
	for _, u := range s.updates[stale:] {
		for _, pe := range u.Prefixes {
			got = append(got, fmt.Sprintf("%x/%d", binary.BigEndian.Uint64(pe.PrefixHash), pe.TokenCount))
		}
	}
	var want []string
	for _, pe := range idx.AppendSnapshot(nil) {
		want = append(want, fmt.Sprintf("%x/%d", pe.Key, pe.Tokens))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("re-reported %q\nindex       %q", got, want)
	}

	// After the resync, work flows normally again.
	p.Apply(&wire.Batch{TS: 10, Events: []wire.Event{{Kind: wire.KindAllBlocksCleared}}})
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if calls := s.snapshot(); calls[len(calls)-1] != "ALL_CLEARED ts=10000000" {
		t.Fatalf("calls %q", calls)
	}
}

func TestForwarderResyncOnStart(t *testing.T) {
	s := &recSink{failNext: 2}
	idx := NewIndex(16, 0, nil)
	cfg := baseConfig()
	cfg.ResyncOnStart = true
	f := NewForwarder(cfg, s, idx)
	startForwarder(t, f)
	f.kick()
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if calls := s.snapshot(); len(calls) != 1 || !strings.HasPrefix(calls[0], "ALL_CLEARED ") {
		t.Fatalf("calls %q", calls)
	}
	if s.events[0].TimestampUs == 0 {
		t.Fatal("resync clear without timestamp")
	}
}

func TestForwarderStats(t *testing.T) {
	s := &recSink{}
	f := NewForwarder(baseConfig(), s, nil)
	startForwarder(t, f)
	f.Stats(&icv1.ReplicaStats{HitRate: 0.5, Pressure: 0.25, CacheMemoryBytes: 42}, 5)
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if calls := s.snapshot(); !slices.Equal(calls, []string{"stats hit=0.50 pressure=0.25 mem=42"}) {
		t.Fatalf("calls %q", calls)
	}
	if u := s.updates[0]; u.TimestampUs != 5 || len(u.Prefixes) != 0 || u.ReplicaId != "r1" {
		t.Fatalf("update %v", u)
	}
}
