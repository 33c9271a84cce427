package server_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/bus/bustest"
	"github.com/inferencecache/inferencecache/internal/ratelog/ratelogtest"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server/servertest"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// maxFloodLines bounds the lines one log call site may write for a flood
// that takes well under a minute: its burst plus a few refills.
const maxFloodLines = 10

// TestPanicFloodLogsBounded: a flood of requests that make a handler panic
// is answered Internal each time and counted each time, but costs a
// bounded number of ERROR lines (each with its stack), the last of which
// counts the ones held back.
func TestPanicFloodLogsBounded(t *testing.T) {
	const flood = 300
	log, rec := ratelogtest.NewLogger(slog.LevelDebug)
	cfg := testConfig()
	cfg.Logger = log
	cfg.WrapIndex = func(ix rpc.Index) rpc.Index { return panicIndex{ix} }
	s := start(t, cfg)
	for range flood {
		_, err := s.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: panicModel, HashScheme: "vllm", PrefixHash: []byte("12345678")})
		if err == nil {
			t.Fatal("a panicking lookup answered without an error")
		}
	}
	if got := metric(t, s.Server, servermetrics.NameRecoveredPanics, "listener=grpc"); got != flood {
		t.Fatalf("recovered_panics_total{grpc} = %v, want %d", got, flood)
	}
	lines := rec.Count("recovered a panic")
	if lines == 0 || lines > maxFloodLines {
		t.Fatalf("%d panic log lines for %d panics, want 1 to %d", lines, flood, maxFloodLines)
	}
}

// TestNATSBadMessageFloodLogsBounded: a flood of stream messages the server
// cannot apply (updates and events that do not decode, events its handler
// refuses)
// is counted per message and costs a bounded number of log lines, at any
// level.
func TestNATSBadMessageFloodLogsBounded(t *testing.T) {
	const flood = 300
	ns := bustest.Start(t)
	p := publisher(t, ns.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subj := bus.Subject("S", "t", "m")
	if err := p.Publish(ctx, subj, bus.KindUpdate, update("r1", 1)); err != nil { // creates the stream
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := bus.Connect(ns.URL(), "raw", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("x", 2048)
	for i := range flood {
		bad := &nats.Msg{Subject: subj, Header: nats.Header{bus.HeaderKind: []string{"event"}}, Data: []byte{0x12, 0x10, byte(i)}}
		if _, err := js.PublishMsgAsync(bad); err != nil {
			t.Fatal(err)
		}
		badUpdate := &nats.Msg{Subject: subj, Header: nats.Header{bus.HeaderKind: []string{"update"}}, Data: []byte{0x12, 0x10, byte(i)}}
		if _, err := js.PublishMsgAsync(badUpdate); err != nil {
			t.Fatal(err)
		}
		// On its own subject (a hashed token), so the subject check passes
		// and the producer handler refuses the id.
		if err := p.Publish(ctx, bus.Subject("S", huge, "m"), bus.KindEvent, &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, TenantId: huge, ModelId: "m", ReplicaId: "r1"}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishing timed out")
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	log, rec := ratelogtest.NewLogger(slog.LevelDebug)
	cfg := natsConfig(ns.URL())
	cfg.Logger = log
	s := start(t, cfg)
	waitFor(t, "the flood applied", func() bool {
		fams := scrapeValues(t, s)
		return fams["malformed"] == 2*flood && fams["refused"] == flood
	})
	for _, msg := range []string{"malformed NATS event", "malformed NATS update", "NATS event was refused", "producer reports dropped"} {
		if lines := rec.Count(msg); lines == 0 || lines > maxFloodLines {
			t.Errorf("%d log lines %q for %d messages, want 1 to %d", lines, msg, flood, maxFloodLines)
		}
	}
}

// scrapeValues reads bus_messages_dropped_total by reason.
func scrapeValues(t *testing.T, s *running) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, reason := range []string{"malformed", "refused"} {
		v, _ := servertest.Value(servertest.Scrape(t, s.Server), "inferencecache_bus_messages_dropped_total", "reason="+reason)
		out[reason] = v
	}
	return out
}
