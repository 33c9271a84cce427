package kvevents

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/kvevents/wire"
	"github.com/inferencecache/inferencecache/rpc"
)

// watchSink is a recSink that also implements ServerWatcher.
type watchSink struct {
	*recSink
	mu     sync.Mutex // guards epoch
	epoch  uint64
	reason string
}

func (w *watchSink) ServerEpoch() (uint64, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.epoch, w.reason
}

func (w *watchSink) bump(reason string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.epoch++
	w.reason = reason
}

// TestForwarderRereportsWhenServerChanges: once the sink's epoch moves (a
// new server instance, a reconnect), the whole index is re-reported, stamped
// now, without ALL_CLEARED, ahead of the queued work; a resync in progress
// absorbs it.
func TestForwarderRereportsWhenServerChanges(t *testing.T) {
	rec := &recSink{}
	s := &watchSink{recSink: rec}
	idx := NewIndex(16, 0, nil)
	cfg := baseConfig()
	cfg.Now = func() time.Time { return time.UnixMicro(5_000_000) }
	m := NewMetrics(nil)
	cfg.Metrics = m
	f := NewForwarder(cfg, s, idx)
	p := NewProcessor(idx, f, false, nil, nil)
	p.Apply(&wire.Batch{TS: 1, Events: []wire.Event{*stored([]uint64{1, 2}, nil, toks(32, 0), 16)}})
	startForwarder(t, f)
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	snap := idx.AppendSnapshot(nil)
	k1, k2 := snap[1].Key, snap[0].Key

	// The server restarted: the next call reveals it (here the flush of a
	// new add); the re-report follows it.
	s.bump(RereportServerRestart)
	p.Apply(&wire.Batch{TS: 2, Events: []wire.Event{*stored([]uint64{3}, ptr(uint64(2)), toks(16, 32), 16)}})
	k3 := idx.AppendSnapshot(nil)[0].Key
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 5*time.Second)
	for len(rec.snapshot()) < 3 {
		if !sleepCtx(ctx, time.Millisecond) {
			t.Fatalf("no re-report: %q", rec.snapshot())
		}
	}
	want := []string{
		fmt.Sprintf("report ts=1000000 %x/16/T1/ %x/32/T1/", k1, k2),
		fmt.Sprintf("report ts=2000000 %x/48/T1/", k3),
		fmt.Sprintf("report ts=5000000 %x/48/T1/ %x/32/T1/ %x/16/T1/", k3, k2, k1),
	}
	if got := rec.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	if n := counter(t, m.rereports.WithLabelValues(RereportServerRestart)); n != 1 {
		t.Fatalf("rereports{server_restart} = %v", n)
	}
}

// TestForwarderHeartbeat: an idle forwarder sends REPLICA_UPDATED every
// Heartbeat; while calls fail it retries four times as often; a busy one
// sends none. The heartbeat's answer is what reveals a restarted server.
func TestForwarderHeartbeat(t *testing.T) {
	rec := &recSink{}
	s := &watchSink{recSink: rec}
	idx := NewIndex(16, 0, nil)
	cfg := baseConfig()
	cfg.Window = 5 * time.Millisecond
	cfg.Heartbeat = 80 * time.Millisecond
	f := NewForwarder(cfg, s, idx)
	NewProcessor(idx, f, false, nil, nil).Apply(&wire.Batch{TS: 1, Events: []wire.Event{*stored([]uint64{1}, nil, toks(16, 0), 16)}})
	startForwarder(t, f)

	beats := func() int {
		n := 0
		for _, c := range rec.snapshot() {
			if strings.HasPrefix(c, "REPLICA_UPDATED") {
				n++
			}
		}
		return n
	}
	ctx := testCtx(t, 5*time.Second)
	for beats() < 3 {
		if !sleepCtx(ctx, time.Millisecond) {
			t.Fatalf("heartbeats: %q", rec.snapshot())
		}
	}
	if calls := rec.snapshot(); !strings.HasPrefix(calls[0], "report") {
		t.Fatalf("queued work did not go first: %q", calls)
	}
	rec.mu.Lock()
	e := rec.events[len(rec.events)-1]
	rec.mu.Unlock()
	if e.ReplicaId != "r1" || e.ModelId != "m" || e.TenantId != "t" || e.TimestampUs == 0 {
		t.Fatalf("heartbeat event %v", e)
	}

	// The server goes away: attempts every Heartbeat/4.
	rec.setDown(true)
	rec.mu.Lock()
	before := rec.attempts
	rec.mu.Unlock()
	time.Sleep(600 * time.Millisecond)
	rec.mu.Lock()
	during := rec.attempts - before
	rec.mu.Unlock()
	// About 30 (every 20 ms); at the idle pace of 80 ms it would be at
	// most 8.
	if during < 12 {
		t.Fatalf("%d heartbeat attempts in 600 ms while failing, want about 30 (every 20 ms)", during)
	}
	// It comes back as a new instance: the next heartbeat reveals it and
	// the index is re-reported.
	s.bump(RereportServerRestart)
	rec.setDown(false)
	for {
		calls := rec.snapshot()
		if slices.ContainsFunc(calls[1:], func(c string) bool { return strings.HasPrefix(c, "report") }) {
			break
		}
		if !sleepCtx(ctx, time.Millisecond) {
			t.Fatalf("no re-report after the restart: %q", calls)
		}
	}
}

// TestForwarderQueueSync: a sync's outcome goes behind the pending adds:
// demotions at T2, evictions, then the whole index, stamped as given; with
// cleared, ALL_CLEARED replaces the pending adds. The demotions and
// evictions count against MaxBuffered, the whole index does not. Nothing is
// queued while a resync is pending.
func TestForwarderQueueSync(t *testing.T) {
	for _, cleared := range []bool{false, true} {
		t.Run(fmt.Sprint("cleared=", cleared), func(t *testing.T) {
			s := &recSink{}
			f := NewForwarder(baseConfig(), s, nil)
			f.Add([]Prefix{pfx(1, 16)}, 100)
			f.QueueSync(cleared, []Prefix{pfx(7, 16), {Key: 8, Tokens: 16, Tier: TierT1, Adapter: "a"}},
				[]Prefix{pfx(6, 32)}, []Prefix{pfx(2, 16), pfx(3, 32)}, 900)
			// The pending add (or, cleared, the ALL_CLEARED replacing it),
			// one demotion and two evictions count against MaxBuffered;
			// the index re-report does not.
			if f.Buffered() != 4 {
				t.Fatalf("buffered %d, want 4", f.Buffered())
			}
			startForwarder(t, f)
			if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
			want := []string{"report ts=100 1/16/T1/"}
			if cleared {
				want = []string{"ALL_CLEARED ts=900"}
			}
			want = append(want, "report ts=900 6/32/T2/", "PREFIX_EVICTED ts=900 7/", "PREFIX_EVICTED ts=900 8/a",
				"report ts=900 2/16/T1/ 3/32/T1/")
			if got := s.snapshot(); !slices.Equal(got, want) {
				t.Fatalf("got  %q\nwant %q", got, want)
			}
		})
	}
	s := &recSink{}
	f := NewForwarder(ForwarderConfig{ReplicaID: "r", ResyncOnStart: true}, s, nil)
	f.QueueSync(false, nil, nil, []Prefix{pfx(2, 16)}, 900)
	if f.Buffered() != 0 || len(f.queue) != 0 {
		t.Fatal("a sync was queued while a resync is pending")
	}
}

// TestGRPCSinkServerEpoch: the epoch moves when a new instance id answers,
// or when a call succeeds after one failed with Unavailable; not on the
// first id, not on other errors.
func TestGRPCSinkServerEpoch(t *testing.T) {
	if InstanceIDHeader != rpc.InstanceIDHeader {
		t.Fatalf("InstanceIDHeader %q != rpc.InstanceIDHeader %q", InstanceIDHeader, rpc.InstanceIDHeader)
	}
	s := NewGRPCSink(nil, nil)
	md := func(id string) metadata.MD { return metadata.Pairs(InstanceIDHeader, id) }
	step := func(m metadata.MD, err error, wantEpoch uint64, wantReason string) {
		t.Helper()
		s.observe(m, err)
		if e, r := s.ServerEpoch(); e != wantEpoch || r != wantReason {
			t.Fatalf("epoch %d %q, want %d %q", e, r, wantEpoch, wantReason)
		}
	}
	step(md("a"), nil, 0, "")
	step(nil, nil, 0, "") // a server that predates the header
	step(nil, status.Error(codes.DeadlineExceeded, "slow"), 0, "")
	step(md("a"), nil, 0, "")
	step(nil, status.Error(codes.Unavailable, "gone"), 0, "")
	step(md("a"), nil, 1, RereportServerReconnect)
	step(md("b"), nil, 2, RereportServerRestart)
	step(nil, errors.New("other"), 2, RereportServerRestart)
	if s.ServerInstance() != "b" {
		t.Fatalf("instance %q", s.ServerInstance())
	}
}
