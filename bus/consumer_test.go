package bus_test

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/bus/bustest"
)

// runConsumer starts c.Run and returns a stop that cancels it and reports
// how long Run took to return (the test fails if it takes over 15 s).
func runConsumer(t *testing.T, c *bus.Consumer) (stop func() time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	var took time.Duration
	var stopped atomic.Bool
	stop = func() time.Duration {
		if stopped.Swap(true) {
			return took
		}
		start := time.Now()
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Errorf("Run did not return within 15 s of its context ending")
		}
		took = time.Since(start)
		return took
	}
	t.Cleanup(func() { stop() })
	return stop
}

func jetStream(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A long-lived session must not cost a goroutine per batch applied (it
// did: every pass of the apply loop asked the ordered consumer for a new
// Closed channel, each one a goroutine waiting for the session's end).
func TestConsumerGoroutinesDoNotGrowPerBatch(t *testing.T) {
	ns := bustest.Start(t)
	p := newPublisher(t, connect(t, ns.URL()))
	subj := bus.Subject("T", "ns", "m")
	var rec recorder
	c, err := bus.NewConsumer(connect(t, ns.URL()), bus.ConsumerConfig{Stream: bus.StreamConfig{Name: "T"}, Apply: rec.apply, MaxBatch: 1, ReadyLag: -1})
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	publishN(t, p, subj, 0, 50)
	waitFor(t, 10*time.Second, "the first messages", func() bool { return rec.len() == 50 })
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()

	const n = 2000 // one batch each (MaxBatch 1)
	publishN(t, p, subj, 50, n)
	waitFor(t, 20*time.Second, "the later messages", func() bool { return rec.len() == 50+n })
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base+50 {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after %d more batches, %d before: a goroutine per batch", runtime.NumGoroutine(), n, base)
		}
		time.Sleep(20 * time.Millisecond)
	}
	checkOrder(t, &rec, 50+n)
}

// The replay target comes from the first session that read the stream,
// not from the first session begun: a first session that failed before it
// could (JetStream not answering yet) left the target at 0, and the
// consumer reported caught up while most of the window was still to come.
func TestReplayTargetFromFirstSessionThatReadTheStream(t *testing.T) {
	ns := bustest.Start(t)
	p := newPublisher(t, connect(t, ns.URL()))
	const n = 200
	publishN(t, p, bus.Subject("T", "a", "b"), 0, n)
	ns.Stop()
	ns.RestartWith(func(o *bustest.Options) { o.JetStream = false }) // NATS up, JetStream not yet

	var rec recorder
	slow := func(b []bus.Message) {
		time.Sleep(time.Millisecond)
		rec.apply(b)
	}
	c, err := bus.NewConsumer(connect(t, ns.URL()), bus.ConsumerConfig{Stream: bus.StreamConfig{Name: "T"}, Apply: slow, MaxBatch: 1})
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	waitFor(t, 10*time.Second, "a failed first session", func() bool { return c.Progress().Sessions >= 1 })
	time.Sleep(100 * time.Millisecond)
	ns.Stop()
	ns.RestartWith(func(o *bustest.Options) { o.JetStream = true })
	select {
	case <-c.CaughtUp():
	case <-time.After(20 * time.Second):
		t.Fatal("not caught up")
	}
	if got := rec.len(); got != n {
		t.Fatalf("caught up after %d of the %d retained messages (ready lag %d): ready on a partial index", got, n, bus.DefaultReadyLag)
	}
	if pr := c.Progress(); pr.ReplayTarget != n {
		t.Fatalf("replay target %d, want %d", pr.ReplayTarget, n)
	}
}

// A stream deleted and created again starts its sequence at 1: the
// consumer must read the new stream from its start instead of waiting for
// it to pass the last sequence applied from the old one (it skipped every
// message until then).
func TestStreamRecreatedIsReadFromItsStart(t *testing.T) {
	ns := bustest.Start(t)
	nc := connect(t, ns.URL())
	p := newPublisher(t, nc)
	subj := bus.Subject("T", "ns", "m")
	var rec recorder
	c := startConsumer(t, connect(t, ns.URL()), &rec)
	publishN(t, p, subj, 0, 50)
	waitFor(t, 10*time.Second, "the first messages", func() bool { return rec.len() == 50 })

	ctx := ctxT(t)
	js := jetStream(t, nc)
	if err := js.DeleteStream(ctx, "T"); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.EnsureStream(ctx, js, bus.StreamConfig{Name: "T"}, true); err != nil {
		t.Fatal(err)
	}
	p2 := newPublisher(t, connect(t, ns.URL()))
	publishN(t, p2, subj, 50, 10)
	waitFor(t, 20*time.Second, "the new stream's messages", func() bool { return rec.len() == 60 })
	checkOrder(t, &rec, 60)
	rec.mu.Lock()
	seqs := slices.Clone(rec.seqs[50:])
	rec.mu.Unlock()
	if !slices.Equal(seqs, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
		t.Fatalf("new stream's sequences %v, want 1..10", seqs)
	}
	if pr := c.Progress(); pr.LastSeq != 10 || pr.StreamResets != 1 {
		t.Fatalf("progress %+v: want last sequence 10 of the new stream, 1 stream reset", pr)
	}
}

// NATS restarted without its store (a lost volume): the stream comes back
// empty, from sequence 1, created by whoever publishes or consumes first.
// The consumer reads it from its start, and shutting down meanwhile does
// not wait for the ordered consumer's own recovery, which ignores contexts
// (its Info and Stop waited on a lock held while it retried, forever while
// the stream was missing).
func TestNATSLostStoreIsReadFromTheStart(t *testing.T) {
	ns := bustest.Start(t)
	p := newPublisher(t, connect(t, ns.URL()))
	subj := bus.Subject("T", "ns", "m")
	var rec recorder
	c, err := bus.NewConsumer(connect(t, ns.URL()), bus.ConsumerConfig{Stream: bus.StreamConfig{Name: "T"}, Apply: rec.apply, ReadyLag: -1})
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, c)
	publishN(t, p, subj, 0, 50)
	waitFor(t, 10*time.Second, "the first messages", func() bool { return rec.len() == 50 })

	ns.Stop()
	fresh := t.TempDir()
	ns.RestartWith(func(o *bustest.Options) { o.StoreDir = fresh })
	// A new producer (its own first publish ensures the stream).
	p2 := newPublisher(t, connect(t, ns.URL()))
	publishN(t, p2, subj, 50, 10)
	waitFor(t, 30*time.Second, "the messages after the store was lost", func() bool { return rec.len() == 60 })
	checkOrder(t, &rec, 60)
	if took := stop(); took > 2*time.Second {
		t.Fatalf("Run took %v to return after its context ended", took)
	}
}

// Shutdown while the stream is missing after NATS lost its store, before
// anyone re-created it: Run returns at once.
func TestShutdownWhileStreamMissing(t *testing.T) {
	ns := bustest.Start(t)
	p := newPublisher(t, connect(t, ns.URL()))
	var rec recorder
	c, err := bus.NewConsumer(connect(t, ns.URL()), bus.ConsumerConfig{Stream: bus.StreamConfig{Name: "T"}, Apply: rec.apply, ReadyLag: -1})
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, c)
	publishN(t, p, bus.Subject("T", "ns", "m"), 0, 20)
	waitFor(t, 10*time.Second, "the first messages", func() bool { return rec.len() == 20 })
	ns.Stop()
	fresh := t.TempDir()
	ns.RestartWith(func(o *bustest.Options) { o.StoreDir = fresh })
	waitFor(t, 10*time.Second, "the reconnect", func() bool { return c.Progress().Connected })
	time.Sleep(3500 * time.Millisecond) // the ordered consumer's own retries back off meanwhile
	if took := stop(); took > 2*time.Second {
		t.Fatalf("Run took %v to return after its context ended", took)
	}
}

// consumerGoroutines returns the stacks of goroutines running code of
// package bus other than Run's own goroutine (a frame, not the "created
// by" line).
func consumerGoroutines() []string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		inBus, isRun := false, false
		for line := range strings.SplitSeq(g, "\n") {
			if strings.HasPrefix(line, "created by ") || strings.HasPrefix(line, "\t") {
				continue
			}
			if strings.HasPrefix(line, "github.com/inferencecache/inferencecache/bus.") {
				inBus = true
				if strings.HasPrefix(line, "github.com/inferencecache/inferencecache/bus.(*Consumer).Run(") {
					isRun = true
				}
			}
		}
		if inBus && !isRun {
			out = append(out, g)
		}
	}
	return out
}

// The delivery callback of an ended session returns: it waited on a full
// hand-over channel nobody read any more until the whole consumer stopped,
// holding the connection's delivery goroutine.
func TestDeliveryCallbackEndsWithItsSession(t *testing.T) {
	ns := bustest.Start(t)
	nc := connect(t, ns.URL())
	p := newPublisher(t, nc)
	publishN(t, p, bus.Subject("T", "a", "b"), 0, 2000)

	gate := make(chan struct{})
	var first atomic.Bool
	var rec recorder
	apply := func(b []bus.Message) {
		if first.CompareAndSwap(false, true) {
			<-gate
		}
		rec.apply(b)
	}
	c, err := bus.NewConsumer(connect(t, ns.URL()), bus.ConsumerConfig{Stream: bus.StreamConfig{Name: "T"}, Apply: apply, MaxBatch: 1, ReadyLag: -1})
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	waitFor(t, 10*time.Second, "the first session", func() bool { return c.Progress().Sessions == 1 })
	time.Sleep(300 * time.Millisecond) // the hand-over channel fills behind the stuck Apply
	if err := jetStream(t, nc).DeleteStream(ctxT(t), "T"); err != nil {
		t.Fatal(err)
	}
	close(gate)
	waitFor(t, 20*time.Second, "a second session", func() bool { return c.Progress().Sessions >= 2 })
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := consumerGoroutines()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines still in the consumer's code after its session ended:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The last sequence applied never moves back within a stream: an unknown
// kind after the last known message of a batch counts (it moved back to the
// known one, so a new session read the unknown message again).
func TestLastSeqNeverMovesBack(t *testing.T) {
	ns := bustest.Start(t)
	nc := connect(t, ns.URL())
	p := newPublisher(t, nc)
	subj := bus.Subject("T", "a", "b")
	publishN(t, p, subj, 0, 2) // seq 1, 2
	ctx := ctxT(t)
	js := jetStream(t, nc)
	for range 2 { // seq 3, 4
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: []byte("x"), Header: nats.Header{bus.HeaderKind: []string{"gossip"}}}); err != nil {
			t.Fatal(err)
		}
	}
	var rec recorder
	slow := func(b []bus.Message) {
		time.Sleep(100 * time.Millisecond) // later messages queue up into one batch
		rec.apply(b)
	}
	c, err := bus.NewConsumer(connect(t, ns.URL()), bus.ConsumerConfig{Stream: bus.StreamConfig{Name: "T"}, Apply: slow, ReadyLag: -1})
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, c)
	waitFor(t, 10*time.Second, "every message", func() bool { return c.Progress().Applied >= 4 })
	time.Sleep(200 * time.Millisecond)
	if pr := c.Progress(); pr.LastSeq != 4 || pr.Applied != 4 || pr.Unknown != 2 {
		t.Fatalf("progress %+v: want last sequence 4, 4 applied, 2 unknown", pr)
	}
}
