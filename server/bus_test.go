package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

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

// rawPublish stores m in the stream as is (no publisher-side subject).
func rawPublish(t *testing.T, url string, subject string, kind bus.Kind, m proto.Message) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(tctx(t), &nats.Msg{Subject: subject, Data: data, Header: nats.Header{bus.HeaderKind: []string{kind.String()}}}); err != nil {
		t.Fatal(err)
	}
}

// Subject permissions are the tenant boundary on the bus: a producer that
// may publish on S.teamA.* must not write team B's index by naming team B
// in the payload. A message whose subject is not its payload's (tenant,
// model) is dropped and counted; the ones that match are applied, long
// (hashed) ids included.
func TestServerNATSSubjectMustMatchPayload(t *testing.T) {
	ns := bustest.Start(t)
	srv := start(t, natsConfig(ns.URL())).Server
	teamA := bus.Subject("S", "teamA", "m")
	intruder := update("r1", 1, 2)
	intruder.TenantId = "teamB"
	rawPublish(t, ns.URL(), teamA, bus.KindUpdate, intruder)
	otherModel := update("r1", 3)
	otherModel.TenantId = "teamA"
	otherModel.ModelId = "m2"
	rawPublish(t, ns.URL(), teamA, bus.KindUpdate, otherModel)
	rawPublish(t, ns.URL(), teamA, bus.KindEvent, &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, ReplicaId: "r9", TenantId: "teamB", ModelId: "m"})

	own := update("r1", 4, 5, 6)
	own.TenantId = "teamA"
	rawPublish(t, ns.URL(), teamA, bus.KindUpdate, own)
	long := strings.Repeat("x/", 200) // hashed into its token
	hashed := update("r1", 7)
	hashed.TenantId, hashed.ModelId = "teamA", long
	rawPublish(t, ns.URL(), bus.Subject("S", "teamA", long), bus.KindUpdate, hashed)

	waitFor(t, "the last update", func() bool { _, keys := srv.Engine().ModelState("teamA", long); return keys == 1 })
	if _, keys := srv.Engine().ModelState("teamA", "m"); keys != 3 {
		t.Fatalf("team A's own update: %d keys, want 3", keys)
	}
	if _, keys := srv.Engine().ModelState("teamB", "m"); keys != 0 {
		t.Fatalf("team B's index holds %d keys written through team A's subject", keys)
	}
	if _, keys := srv.Engine().ModelState("teamA", "m2"); keys != 0 {
		t.Fatalf("model m2 holds %d keys written through model m's subject", keys)
	}
	if got := metric(t, srv, "inferencecache_bus_messages_dropped_total", "reason=subject"); got != 3 {
		t.Fatalf("subject drops %v, want 3", got)
	}
}

// The server creates a missing stream with its byte bound (and its age).
func TestServerNATSCreatesStreamWithByteBound(t *testing.T) {
	ns := bustest.Start(t)
	cfg := natsConfig(ns.URL())
	cfg.NATS.Stream.MaxBytes = 5 << 20
	start(t, cfg)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(tctx(t), "S")
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.MaxBytes != 5<<20 || c.MaxAge != bus.Retention(bus.DefaultMaxTTL, bus.DefaultRefresh) || c.Discard != jetstream.DiscardOld {
		t.Fatalf("stream config MaxBytes %d MaxAge %v Discard %v", c.MaxBytes, c.MaxAge, c.Discard)
	}
}

// What the byte bound means for a new server: once the stream is full the
// oldest reports go first, so the replay window is shorter than the TTL.
// A new server turns ready on what is left (it cannot know what was
// discarded): a block reported only before the cut is missing from its
// index, a block re-reported (the subscriber's refresh) after it is there,
// and no eviction is replayed without the adds that came after it.
func TestServerNATSByteBoundShortensTheReplay(t *testing.T) {
	ns := bustest.Start(t)
	nc, err := bus.Connect(ns.URL(), "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	const bound = 256 << 10
	p, err := bus.NewPublisher(nc, bus.PublisherConfig{Stream: bus.StreamConfig{Name: "S", MaxBytes: bound}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := tctx(t)
	subj := bus.Subject("S", "t", "m")
	pub := func(u *pb.CacheStateUpdate) {
		t.Helper()
		if err := p.Publish(ctx, subj, bus.KindUpdate, u); err != nil {
			t.Fatal(err)
		}
	}
	pub(update("old", 1))     // reported once, before the cut
	pub(update("kept", 2, 3)) // reported before the cut, refreshed after it
	filler := make([]uint64, 500)
	for i := range filler {
		filler[i] = uint64(1000 + i)
	}
	for range 40 { // ~40 × 12 KB: the bound discards the first reports
		pub(update("busy", filler...))
	}
	pub(update("kept", 2, 3)) // the refresh
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := p.JetStream().Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	if st := s.CachedInfo().State; st.FirstSeq <= 2 || st.Bytes > bound {
		t.Fatalf("stream state %+v: the bound discarded nothing", st)
	}

	srv := start(t, natsConfig(ns.URL())).Server // start returns once ready
	has := func(replica string) int64 {
		for _, r := range srv.Engine().Snapshot().Replicas {
			if r.ReplicaID == replica {
				return r.PrefixCount
			}
		}
		return 0
	}
	if has("old") != 0 || has("kept") != 2 || has("busy") != int64(len(filler)) {
		t.Fatalf("ready with old %d (want 0: discarded), kept %d (want 2: refreshed after the cut), busy %d", has("old"), has("kept"), has("busy"))
	}
}
