package bus_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/bus/bustest"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// recorder collects what a Consumer applies.
type recorder struct {
	mu   sync.Mutex
	seqs []uint64
	ids  []int64 // the update's timestamp_us / the event's timestamp_us
	subs []string
}

func (r *recorder) apply(batch []bus.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range batch {
		var ts int64
		switch m.Kind {
		case bus.KindUpdate:
			var u pb.CacheStateUpdate
			if err := bus.DecodeUpdate(m.Data, &u); err != nil {
				panic(err)
			}
			ts = u.GetTimestampUs()
		case bus.KindEvent:
			var e pb.CacheEvent
			if err := bus.DecodeEvent(m.Data, &e); err != nil {
				panic(err)
			}
			ts = -e.GetTimestampUs()
		}
		r.seqs = append(r.seqs, m.Seq)
		r.ids = append(r.ids, ts)
		r.subs = append(r.subs, m.Subject)
	}
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := bus.Connect(url, t.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newPublisher(t *testing.T, nc *nats.Conn) *bus.Publisher {
	t.Helper()
	p, err := bus.NewPublisher(nc, bus.PublisherConfig{Stream: bus.StreamConfig{Name: "T"}, Producer: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// publishN publishes n messages alternating updates and events, numbered
// from first, to subject, retrying while NATS is away (bounded).
func publishN(t *testing.T, p *bus.Publisher, subject string, first, n int) {
	t.Helper()
	for i := first; i < first+n; i++ {
		deadline := time.Now().Add(10 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var err error
			if i%2 == 0 {
				err = p.Publish(ctx, subject, bus.KindUpdate, &pb.CacheStateUpdate{ReplicaId: "r", TimestampUs: int64(i)})
			} else {
				err = p.Publish(ctx, subject, bus.KindEvent, &pb.CacheEvent{ReplicaId: "r", TimestampUs: int64(i)})
			}
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("publish %d: %v", i, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func startConsumer(t *testing.T, nc *nats.Conn, rec *recorder, filters ...string) *bus.Consumer {
	t.Helper()
	c, err := bus.NewConsumer(nc, bus.ConsumerConfig{Stream: bus.StreamConfig{Name: "T"}, Filters: filters, Apply: rec.apply, ReadyLag: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func checkOrder(t *testing.T, rec *recorder, n int) {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.ids) != n {
		t.Fatalf("applied %d messages, want %d", len(rec.ids), n)
	}
	for i, v := range rec.ids {
		want := int64(i)
		if i%2 == 1 {
			want = -want
		}
		if v != want {
			t.Fatalf("message %d is %d, want %d (order or duplicate)", i, v, want)
		}
	}
}

// A consumer started after the publishes replays the retained window in
// order and reports caught up; later publishes follow live.
func TestReplayThenLive(t *testing.T) {
	ns := bustest.Start(t)
	p := newPublisher(t, connect(t, ns.URL()))
	subj := bus.Subject("T", "ns", "m/1")
	publishN(t, p, subj, 0, 500)

	var rec recorder
	c := startConsumer(t, connect(t, ns.URL()), &rec)
	select {
	case <-c.CaughtUp():
	case <-time.After(10 * time.Second):
		t.Fatal("not caught up")
	}
	if got := rec.len(); got != 500 {
		t.Fatalf("caught up after %d messages, want all 500 (ready lag 0)", got)
	}
	if pr := c.Progress(); pr.ReplayTarget != 500 || !pr.CaughtUp || pr.Updates != 250 || pr.Events != 250 {
		t.Fatalf("progress %+v", pr)
	}
	publishN(t, p, subj, 500, 100)
	waitFor(t, 10*time.Second, "live messages", func() bool { return rec.len() == 600 })
	checkOrder(t, &rec, 600)
	if p.Lost() != 0 {
		t.Fatalf("lost %d", p.Lost())
	}
}

// NATS stopped and restarted (same store): the publisher fails fast while
// it is away, the consumer resumes after the last message it applied, with
// nothing lost or applied twice.
func TestNATSRestartResumes(t *testing.T) {
	ns := bustest.Start(t)
	pc := connect(t, ns.URL())
	p := newPublisher(t, pc)
	subj := bus.Subject("T", "ns", "m")
	var rec recorder
	c := startConsumer(t, connect(t, ns.URL()), &rec)
	publishN(t, p, subj, 0, 200)
	waitFor(t, 10*time.Second, "first messages", func() bool { return rec.len() == 200 })

	ns.Stop()
	// Each side has its own connection, and each notices the stop on its
	// own time: wait for both (CI once published before the publisher's
	// connection had seen the stop).
	waitFor(t, 5*time.Second, "disconnect", func() bool { return !c.Progress().Connected && !pc.IsConnected() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err := p.Publish(ctx, subj, bus.KindUpdate, &pb.CacheStateUpdate{})
	cancel()
	if !errors.Is(err, bus.ErrNotConnected) {
		t.Fatalf("publish while NATS is down: %v, want ErrNotConnected", err)
	}
	if c.Progress().Stale == 0 {
		t.Fatal("lag not marked while disconnected")
	}
	ns.Restart()
	publishN(t, p, subj, 200, 200)
	waitFor(t, 20*time.Second, "messages after the restart", func() bool { return rec.len() >= 400 })
	time.Sleep(100 * time.Millisecond) // any duplicate would show up now
	checkOrder(t, &rec, 400)
	waitFor(t, 5*time.Second, "lag back to 0", func() bool { pr := c.Progress(); return pr.Connected && pr.Lag == 0 && pr.Stale == 0 })
}

// Filter subjects select a subset of models (sharding).
func TestFilterSubset(t *testing.T) {
	ns := bustest.Start(t)
	p := newPublisher(t, connect(t, ns.URL()))
	a, b := bus.Subject("T", "ns", "a"), bus.Subject("T", "other", "b")
	publishN(t, p, a, 0, 10)
	publishN(t, p, b, 0, 10)
	var rec recorder
	c := startConsumer(t, connect(t, ns.URL()), &rec, bus.TenantFilter("T", "ns"))
	select {
	case <-c.CaughtUp():
	case <-time.After(10 * time.Second):
		t.Fatal("not caught up")
	}
	checkOrder(t, &rec, 10)
	for _, s := range rec.subs {
		if s != a {
			t.Fatalf("consumed %q outside the filter", s)
		}
	}
}

// A message no stream stores (its ack is negative) is counted lost.
func TestPublisherCountsLost(t *testing.T) {
	ns := bustest.Start(t)
	p := newPublisher(t, connect(t, ns.URL()))
	publishN(t, p, bus.Subject("T", "a", "b"), 0, 1) // creates the stream
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := p.Publish(ctx, "T.not.in.stream", bus.KindEvent, &pb.CacheEvent{}); err != nil {
		t.Fatal(err)
	}
	_ = p.Flush(ctx)
	waitFor(t, 5*time.Second, "the loss", func() bool { return p.Lost() == 1 })
	if p.TakeLost() != 1 || p.TakeLost() != 0 {
		t.Fatal("TakeLost does not hand the count over once")
	}
}

// The stream is created with the retention asked for.
func TestStreamRetention(t *testing.T) {
	ns := bustest.Start(t)
	nc := connect(t, ns.URL())
	p, err := bus.NewPublisher(nc, bus.PublisherConfig{Stream: bus.StreamConfig{Name: "R", MaxAge: bus.Retention(time.Hour, 10*time.Minute)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Publish(ctx, bus.Subject("R", "a", "b"), bus.KindEvent, &pb.CacheEvent{}); err != nil {
		t.Fatal(err)
	}
	s, err := p.JetStream().Stream(ctx, "R")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxAge; got != 70*time.Minute {
		t.Fatalf("MaxAge %v", got)
	}
	if got := s.CachedInfo().Config.Subjects; len(got) != 1 || got[0] != "R.*.*" {
		t.Fatalf("subjects %v", got)
	}
	if got := s.CachedInfo().Config.MaxBytes; got != bus.DefaultMaxBytes {
		t.Fatalf("MaxBytes %d, want the default %d", got, bus.DefaultMaxBytes)
	}
	if got := s.CachedInfo().Config.Discard; got != jetstream.DiscardOld {
		t.Fatalf("discard policy %v, want DiscardOld", got)
	}
	// The subscriber owns the retention: its update sets the byte bound.
	if _, err := bus.EnsureStream(ctx, p.JetStream(), bus.StreamConfig{Name: "R", MaxAge: time.Hour, MaxBytes: 1 << 20}, true); err != nil {
		t.Fatal(err)
	}
	if s, err = p.JetStream().Stream(ctx, "R"); err != nil || s.CachedInfo().Config.MaxBytes != 1<<20 {
		t.Fatalf("MaxBytes after an update: %v %v", s.CachedInfo().Config.MaxBytes, err)
	}
	bad := bus.StreamConfig{Name: "R", MaxBytes: -1}
	if err := bad.Validate(); err == nil {
		t.Fatal("a negative byte bound validated")
	}
}

// At the byte bound the stream discards its oldest messages first (as it
// does at the age bound): a consumer started later replays only the newest
// ones, in order, and reports caught up on that shorter window.
func TestStreamByteBoundDiscardsOldest(t *testing.T) {
	ns := bustest.Start(t)
	nc := connect(t, ns.URL())
	const bound = 64 << 10
	p, err := bus.NewPublisher(nc, bus.PublisherConfig{Stream: bus.StreamConfig{Name: "T", MaxBytes: bound}, Producer: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	subj := bus.Subject("T", "a", "b")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n, size = 400, 1000 // ~400 KB published, the stream holds ~64 KB
	for i := range n {
		u := &pb.CacheStateUpdate{ReplicaId: "r", TimestampUs: int64(i), Prefixes: []*pb.PrefixEntry{{PrefixHash: make([]byte, size)}}}
		if err := p.Publish(ctx, subj, bus.KindUpdate, u); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := p.JetStream().Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	st := s.CachedInfo().State
	if st.Bytes > bound || st.LastSeq != n || st.FirstSeq <= 1 || st.Msgs != st.LastSeq-st.FirstSeq+1 {
		t.Fatalf("stream state %+v: want at most %d bytes, the newest messages up to %d", st, bound, n)
	}
	t.Logf("the %d-byte bound keeps messages %d to %d of %d (%d bytes)", bound, st.FirstSeq, st.LastSeq, n, st.Bytes)

	var rec recorder
	c, err := bus.NewConsumer(connect(t, ns.URL()), bus.ConsumerConfig{Stream: bus.StreamConfig{Name: "T"}, Apply: rec.apply})
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	select {
	case <-c.CaughtUp():
	case <-time.After(10 * time.Second):
		t.Fatal("not caught up")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if uint64(len(rec.seqs)) != st.Msgs || rec.seqs[0] != st.FirstSeq || rec.ids[0] != int64(st.FirstSeq-1) {
		t.Fatalf("replayed %d messages from seq %v, want the %d retained from %d", len(rec.seqs), rec.seqs[:1], st.Msgs, st.FirstSeq)
	}
}

// The ready lag bounds live lag only: a window smaller than it is still
// replayed completely before the consumer counts as caught up.
func TestCaughtUpOnlyAfterReplay(t *testing.T) {
	ns := bustest.Start(t)
	p := newPublisher(t, connect(t, ns.URL()))
	publishN(t, p, bus.Subject("T", "a", "b"), 0, 20)
	var rec recorder
	slow := func(b []bus.Message) {
		time.Sleep(5 * time.Millisecond)
		rec.apply(b)
	}
	c, err := bus.NewConsumer(connect(t, ns.URL()), bus.ConsumerConfig{Stream: bus.StreamConfig{Name: "T"}, Apply: slow, MaxBatch: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	select {
	case <-c.CaughtUp():
	case <-time.After(10 * time.Second):
		t.Fatal("not caught up")
	}
	if n := rec.len(); n != 20 {
		t.Fatalf("caught up after %d of the 20 retained messages (ready lag %d)", n, bus.DefaultReadyLag)
	}
}
