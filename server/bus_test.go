package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/bus/bustest"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

func natsConfig(url string) server.Config {
	cfg := testConfig()
	cfg.NATS.URL = url
	cfg.NATS.Stream.Name = "S"
	return cfg
}

func publisher(t *testing.T, url string) *bus.Publisher {
	t.Helper()
	nc, err := bus.Connect(url, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	p, err := bus.NewPublisher(nc, bus.PublisherConfig{Stream: bus.StreamConfig{Name: "S"}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func update(replica string, keys ...uint64) *pb.CacheStateUpdate {
	u := &pb.CacheStateUpdate{ReplicaId: replica, TenantId: "t", ModelId: "m", HashScheme: "vllm", TimestampUs: time.Now().UnixMicro()}
	for _, k := range keys {
		u.Prefixes = append(u.Prefixes, &pb.PrefixEntry{PrefixHash: fingerprint.AppendWire(nil, k), TokenCount: 16, Tier: pb.CacheTier_CACHE_TIER_T1})
	}
	return u
}

func readyz(t *testing.T, srv *server.Server) int {
	code, _ := httpDo(t, http.MethodGet, "http://"+srv.HTTPAddr().String()+"/readyz", "", nil)
	return code
}

func metric(t *testing.T, srv *server.Server, name, labels string) float64 {
	t.Helper()
	v, ok := servertest.Value(servertest.Scrape(t, srv), name, labels)
	if !ok {
		t.Fatalf("no series %s{%s}", name, labels)
	}
	return v
}

// With --nats-url the server is not ready while it cannot read the stream,
// turns ready once caught up, applies stream messages as the producer RPCs
// would, and keeps answering (ready, lag marked) while NATS is away, then
// resumes from its position.
func TestServerNATSReadinessAndOutage(t *testing.T) {
	ns := bustest.Start(t)
	p := publisher(t, ns.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subj := bus.Subject("S", "t", "m")
	if err := p.Publish(ctx, subj, bus.KindUpdate, update("r1", 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ns.Stop()

	srv, err := server.New(natsConfig(ns.URL()))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Run(rctx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	waitFor(t, "the HTTP listener", func() bool { return readyz(t, srv) == http.StatusServiceUnavailable })
	time.Sleep(200 * time.Millisecond)
	if readyz(t, srv) != http.StatusServiceUnavailable || metric(t, srv, "inferencecache_bus_connected", "") != 0 {
		t.Fatal("ready (or connected) without NATS")
	}

	ns.Restart()
	select {
	case <-srv.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("not ready 10 s after NATS came back")
	}
	if readyz(t, srv) != http.StatusOK {
		t.Fatal("/readyz not ok once caught up")
	}
	if e, _ := srv.Engine().Counts(); e != 3 {
		t.Fatalf("index holds %d entries after the replay, want 3", e)
	}
	for name, want := range map[string]float64{
		"inferencecache_bus_connected": 1, "inferencecache_bus_caught_up": 1, "inferencecache_bus_replay_target_messages": 1,
		"inferencecache_bus_replay_progress_ratio": 1, "inferencecache_bus_consumer_lag_messages": 0,
	} {
		if got := metric(t, srv, name, ""); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if metric(t, srv, "inferencecache_bus_messages_total", "kind=update") != 1 || metric(t, srv, "inferencecache_bus_replay_duration_seconds", "") <= 0 {
		t.Error("messages_total or replay_duration_seconds wrong")
	}

	// An event through the stream: the same PublishEvent path.
	if err := p.Publish(ctx, subj, bus.KindEvent, &pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, ReplicaId: "r1", TenantId: "t", ModelId: "m",
		PrefixHash: fingerprint.AppendWire(nil, 2), TimestampUs: time.Now().UnixMicro()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the eviction", func() bool { e, _ := srv.Engine().Counts(); return e == 2 })

	// NATS away: still ready, still answering, lag marked.
	ns.Stop()
	waitFor(t, "the disconnect", func() bool { return metric(t, srv, "inferencecache_bus_connected", "") == 0 })
	time.Sleep(50 * time.Millisecond)
	if readyz(t, srv) != http.StatusOK || metric(t, srv, "inferencecache_bus_consumer_stale_seconds", "") <= 0 {
		t.Fatal("not ready, or the lag not marked, while NATS is away")
	}
	if e, _ := srv.Engine().Counts(); e != 2 {
		t.Fatalf("index lost entries while NATS was away: %d", e)
	}
	ns.Restart()
	waitFor(t, "reconnect", func() bool { return metric(t, srv, "inferencecache_bus_connected", "") == 1 })
	pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer pcancel()
	for p.Publish(pctx, subj, bus.KindUpdate, update("r2", 9)) != nil {
		if pctx.Err() != nil {
			t.Fatal("cannot publish after NATS came back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitFor(t, "the update after NATS came back", func() bool { e, _ := srv.Engine().Counts(); return e == 3 })
	if got := metric(t, srv, "inferencecache_bus_messages_total", "kind=update"); got != 2 {
		t.Fatalf("applied %v updates, want 2 (none twice)", got)
	}
}

// Malformed payloads and unknown kinds are skipped and counted; the
// messages after them are applied.
func TestServerNATSBadMessages(t *testing.T) {
	ns := bustest.Start(t)
	srv := start(t, natsConfig(ns.URL())).Server
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := tctx(t)
	subj := bus.Subject("S", "t", "m")
	for _, m := range []*nats.Msg{
		{Subject: subj, Data: []byte{0xff, 0xff, 0xff}, Header: nats.Header{bus.HeaderKind: []string{"update"}}},
		{Subject: subj, Data: []byte{0x0a, 0xff}, Header: nats.Header{bus.HeaderKind: []string{"event"}}},
		{Subject: subj, Data: []byte("x"), Header: nats.Header{bus.HeaderKind: []string{"gossip"}}},
	} {
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	p := publisher(t, ns.URL())
	if err := p.Publish(ctx, subj, bus.KindUpdate, update("r1", 5)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the good update", func() bool { e, _ := srv.Engine().Counts(); return e == 1 })
	if got := metric(t, srv, "inferencecache_bus_messages_dropped_total", "reason=malformed"); got != 2 {
		t.Errorf("malformed drops %v, want 2", got)
	}
	if got := metric(t, srv, "inferencecache_bus_messages_total", "kind=unknown"); got != 1 {
		t.Errorf("unknown kinds %v, want 1", got)
	}
}
