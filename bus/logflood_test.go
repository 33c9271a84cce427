package bus_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/bus/bustest"
	"github.com/inferencecache/inferencecache/internal/ratelog/ratelogtest"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// TestUnknownKindFloodLogsBounded: a flood of stream messages without a
// known kind header (over a real NATS server) is skipped and counted, and
// costs a bounded number of WARN lines, not one each.
func TestUnknownKindFloodLogsBounded(t *testing.T) {
	const flood = 2000
	ns := bustest.Start(t)
	nc := connect(t, ns.URL())
	p := newPublisher(t, nc)
	subj := bus.Subject("T", "ns", "m")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A good update first (it creates the stream), then the flood, then
	// another good one.
	if err := p.Publish(ctx, subj, bus.KindUpdate, &pb.CacheStateUpdate{ReplicaId: "r"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range flood {
		msg := &nats.Msg{Subject: subj, Header: nats.Header{bus.HeaderKind: []string{"bogus"}}, Data: []byte{byte(i)}}
		if _, err := js.PublishMsgAsync(msg); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishing the flood timed out")
	}
	if n := js.PublishAsyncPending(); n != 0 {
		t.Fatalf("%d flood messages not acknowledged", n)
	}
	if err := p.Publish(ctx, subj, bus.KindUpdate, &pb.CacheStateUpdate{ReplicaId: "r"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	log, rec := ratelogtest.NewLogger(slog.LevelDebug)
	var applied recorder
	c, err := bus.NewConsumer(connect(t, ns.URL()), bus.ConsumerConfig{Stream: bus.StreamConfig{Name: "T"}, Apply: applied.apply, ReadyLag: -1, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(runCtx); close(done) }()
	defer func() { stop(); <-done }()
	waitFor(t, 20*time.Second, "the flood and the updates read", func() bool {
		pr := c.Progress()
		return pr.Unknown == flood && applied.len() == 2
	})
	lines := rec.Count("without a known kind header")
	if lines == 0 || lines > 10 {
		t.Fatalf("%d log lines for %d messages without a kind header, want between 1 and 10", lines, flood)
	}
	t.Logf("%d messages without a kind header: %d log lines", flood, lines)
}
