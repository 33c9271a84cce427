package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/bus/bustest"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	"github.com/inferencecache/inferencecache/kvevents/wire"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
)

// The NATS targets of issue 13 (docs/scaleout.md): subscriber → NATS
// JetStream → servers, with a real nats-server in process on 127.0.0.1.
// Sizes are scaled down under -race; the full-size figures come from a run
// without it (go test -run NATS -v ./kvevents) and
// BenchmarkE2EEventsThroughNATS.

// natsPipe is one subscriber's processing without the ZMQ hop: engine
// batch bytes → decoder → positional index → forwarder → sink.
type natsPipe struct {
	idx     *Index
	fwd     *Forwarder
	proc    *Processor
	dec     *wire.Decoder
	batch   wire.Batch
	enc     fakeengine.Encoding
	metrics *Metrics
	model   *chainModel
}

func newPipe(t testing.TB, replica string, sink Sink, mut func(*ForwarderConfig)) *natsPipe {
	t.Helper()
	p := &natsPipe{idx: NewIndex(16, 0, nil), dec: wire.NewDecoder(), enc: fakeengine.Encoding{Layout: fakeengine.LayoutMap},
		metrics: NewMetrics(nil), model: newChainModel(nil)}
	cfg := ForwarderConfig{ReplicaID: replica, ModelID: "m", TenantID: "t", HashScheme: "vllm", Metrics: p.metrics,
		RPCTimeout: time.Second, MaxBackoff: 50 * time.Millisecond}
	if mut != nil {
		mut(&cfg)
	}
	p.fwd = NewForwarder(cfg, sink, p.idx)
	p.proc = NewProcessor(p.idx, p.fwd, false, nil, p.metrics)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.fwd.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return p
}

func (p *natsPipe) apply(t testing.TB, b fakeengine.Batch) {
	t.Helper()
	p.model.add(b)
	raw, err := p.enc.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.dec.Decode(raw, &p.batch); err != nil {
		t.Fatal(err)
	}
	p.proc.Apply(&p.batch)
}

// natsSink connects a NATSSink to url (stream INFERENCECACHE).
func natsSink(t testing.TB, url string) *NATSSink {
	t.Helper()
	nc, err := bus.Connect(url, t.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pub, err := bus.NewPublisher(nc, bus.PublisherConfig{Stream: bus.StreamConfig{Name: bus.DefaultStream}, Producer: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return NewNATSSink(pub, bus.DefaultStream)
}

// startNATSServer starts a real server consuming the stream at url.
func startNATSServer(t testing.TB, url string) *realServer {
	t.Helper()
	return startRealServer(t, func(c *server.Config) {
		c.MaxIndexEntries = 0
		c.NATS.URL = url
		c.NATS.Stream.Name = bus.DefaultStream
	})
}

// flushPipes waits until every pipe's forwarder and sink delivered
// everything.
func flushPipes(t testing.TB, sink *NATSSink, pipes ...*natsPipe) {
	t.Helper()
	ctx := testCtx(t, 60*time.Second)
	for _, p := range pipes {
		if err := p.fwd.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if sink != nil {
		if err := sink.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// waitConverged waits until every server applied the stream's last
// message.
func waitConverged(t testing.TB, sink *NATSSink, limit time.Duration, srvs ...*server.Server) {
	t.Helper()
	ctx := testCtx(t, limit)
	st, err := sink.pub.JetStream().Stream(ctx, bus.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	last := st.CachedInfo().State.LastSeq
	for _, s := range srvs {
		for s.Bus().Progress().LastSeq < last {
			if !sleepCtx(ctx, 5*time.Millisecond) {
				t.Fatalf("server applied up to %d of %d", s.Bus().Progress().LastSeq, last)
			}
		}
	}
}

// chainRequest is the gateway's chain lookup for tokens.
func chainRequest(tokens []uint32) *icv1.LookupRouteRequest {
	req := &icv1.LookupRouteRequest{ModelId: "m", TenantId: "t", HashScheme: "vllm"}
	for _, k := range fingerprint.AppendChain(nil, tokens, 16, 0, false) {
		req.BlockHashes = append(req.BlockHashes, fingerprint.AppendWire(nil, k))
		req.BlockTokenCounts = append(req.BlockTokenCounts, 16)
	}
	return req
}

// exactRequest is the legacy single-key lookup of the block whose prefix
// is tokens.
func exactRequest(tokens []uint32) *icv1.LookupRouteRequest {
	keys := fingerprint.AppendChain(nil, tokens, 16, 0, false)
	return &icv1.LookupRouteRequest{ModelId: "m", TenantId: "t", HashScheme: "vllm", PrefixHash: fingerprint.AppendWire(nil, keys[len(keys)-1])}
}

// answerOf renders a LookupRoute answer without its scores (which move
// with the clock): reason, then each replica's id, matched tokens and tier,
// by replica id (replicas of equal score come in no defined order).
func answerOf(t testing.TB, s *realServer, req *icv1.LookupRouteRequest) (string, []float64) {
	t.Helper()
	resp, err := s.Service().LookupRoute(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	out := resp.GetReasonCode()
	var scores []float64
	rs := slices.Clone(resp.GetReplicaScores())
	slices.SortFunc(rs, func(a, b *icv1.ReplicaScore) int { return strings.Compare(a.GetReplicaId(), b.GetReplicaId()) })
	for _, sc := range rs {
		out += fmt.Sprintf(" %s/%d/%v", sc.GetReplicaId(), sc.GetMatchedTokens(), sc.GetTier())
		scores = append(scores, float64(sc.GetScore()))
	}
	return out, scores
}

// Target: two servers fed by one subscriber per replica through NATS give
// identical answers on 10,000 random chain lookups once both caught up. The
// second server starts halfway, so it replays the first half and follows
// the second live.
func TestNATSTwoServersIdentical(t *testing.T) {
	ns := bustest.Start(t)
	a := startNATSServer(t, ns.URL())
	sink := natsSink(t, ns.URL())
	turns := 300
	if raceEnabled {
		turns = 80
	}
	var pipes []*natsPipe
	var ws []*fakeengine.Synthetic
	for i := range 3 {
		pipes = append(pipes, newPipe(t, fmt.Sprintf("r%d", i), sink, nil))
		ws = append(ws, fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 6, CapacityBlocks: 1500, Seed: uint64(7 + i%2),
			Start: time.Now().Add(-time.Minute)}))
	}
	drive := func(n int) {
		for range n {
			for i, p := range pipes {
				b, _, _ := ws[i].Next()
				p.apply(t, b)
			}
		}
	}
	drive(turns / 2)
	flushPipes(t, sink, pipes...)
	b := startNATSServer(t, ns.URL()) // replays the first half
	drive(turns - turns/2)
	flushPipes(t, sink, pipes...)
	waitConverged(t, sink, 30*time.Second, a.Server, b.Server)

	var chains [][]uint32
	for _, p := range pipes {
		for _, h := range p.model.order {
			chains = append(chains, p.model.blocks[h].tokens)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	matches := 0
	for i := 0; i < 10000; i++ {
		tokens := chains[r.IntN(len(chains))]
		if r.IntN(4) == 0 { // a prompt that diverges after a cached prefix
			tokens = append(slices.Clip(tokens[:16*(1+r.IntN(len(tokens)/16))]), fakeengine.BlockTokens(uint64(1<<40+i), 16)...)
		}
		req := chainRequest(tokens)
		if i%2 == 1 {
			req = exactRequest(tokens)
		}
		ga, sa := answerOf(t, a, req)
		gb, sb := answerOf(t, b, req)
		if ga != gb {
			t.Fatalf("lookup %d differs:\n a: %s\n b: %s", i, ga, gb)
		}
		for j := range sa {
			// Freshness decays with the clock between the two calls (at
			// 1/1800 per second at the default TTL): compare relatively.
			if math.Abs(sa[j]-sb[j]) > 1e-3*max(math.Abs(sa[j]), 1) {
				t.Fatalf("lookup %d: scores %v vs %v", i, sa, sb)
			}
		}
		if len(sa) > 0 {
			matches++
		}
	}
	ea, ka := a.Engine().Counts()
	eb, kb := b.Engine().Counts()
	if ea != eb || ka != kb || ea == 0 {
		t.Fatalf("server a holds %d entries (%d keys), b %d (%d)", ea, ka, eb, kb)
	}
	if matches < 1000 {
		t.Fatalf("only %d of 10000 lookups matched a replica: the comparison says little", matches)
	}
	held := 0
	for i := range ws {
		held += ws[i].CachedBlocks()
	}
	if ea != int64(held) {
		t.Fatalf("servers hold %d entries, the engines %d blocks", ea, held)
	}
	t.Logf("10000 lookups identical (%d matched a replica); %d entries on each server", matches, ea)
}

// publishEntries publishes n distinct entries for replica through sink in
// updates of DefaultMaxPending, as the forwarder cuts them.
func publishEntries(t testing.TB, sink *NATSSink, replica string, n int, salt uint64) {
	t.Helper()
	ctx := testCtx(t, 120*time.Second)
	now := time.Now().UnixMicro()
	for done := 0; done < n; {
		k := min(DefaultMaxPending, n-done)
		u := &icv1.CacheStateUpdate{ReplicaId: replica, ModelId: "m", TenantId: "t", HashScheme: "vllm", TimestampUs: now}
		entries := make([]icv1.PrefixEntry, k)
		u.Prefixes = make([]*icv1.PrefixEntry, k)
		for i := range entries {
			key := salt<<40 | uint64(done+i)
			entries[i] = icv1.PrefixEntry{PrefixHash: fingerprint.AppendWire(nil, key), TokenCount: 16, Tier: icv1.CacheTier_CACHE_TIER_T1}
			u.Prefixes[i] = &entries[i]
		}
		for {
			err := sink.ReportCacheState(ctx, u)
			if err == nil {
				break
			}
			if !sleepCtx(ctx, time.Millisecond) {
				t.Fatalf("publish: %v", err)
			}
		}
		done += k
	}
}

// Target: a server restarted with 1M entries in the retained window is
// ready within 10 s, with at least 99 % of them back (scaled to 100k under
// -race). Logs the restart-to-ready time and the replay rate.
func TestNATSRestartReplaysWindow(t *testing.T) {
	ns := bustest.Start(t)
	sink := natsSink(t, ns.URL())
	total := 1 << 20
	if raceEnabled {
		total = 100_000
	}
	const replicas = 4
	for r := range replicas {
		publishEntries(t, sink, fmt.Sprintf("r%d", r), total/replicas, uint64(r+1))
	}
	flushPipes(t, sink)
	first, stopFirst := runNATSServer(t, ns.URL())
	<-first.Ready()
	waitConverged(t, sink, 60*time.Second, first)
	want, _ := first.Engine().Counts()
	if want != int64(total/replicas*replicas) {
		t.Fatalf("first server holds %d entries, published %d", want, total)
	}
	stopFirst()

	start := time.Now()
	srv, _ := runNATSServer(t, ns.URL())
	select {
	case <-srv.Ready():
	case <-time.After(10 * time.Second):
		got, _ := srv.Engine().Counts()
		t.Fatalf("not ready within 10 s of start; %d of %d entries back", got, want)
	}
	ready := time.Since(start)
	got, _ := srv.Engine().Counts()
	if float64(got) < 0.99*float64(want) {
		t.Fatalf("ready with %d of %d entries (< 99 %%)", got, want)
	}
	rate := float64(got) / ready.Seconds()
	t.Logf("restart to ready: %v with %d of %d entries back (%.1f %%); replay rate %.0f entries/s (%d messages)",
		ready.Round(time.Millisecond), got, want, 100*float64(got)/float64(want), rate, srv.Bus().Progress().ReplayTarget)
}

// runNATSServer runs a server consuming the stream at url until stop is
// called or the test ends; it does not wait for it to be ready.
func runNATSServer(t testing.TB, url string) (srv *server.Server, stop func()) {
	t.Helper()
	srv, err := server.New(servertestConfigNATS(url))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = srv.Run(ctx); close(done) }()
	stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("server did not stop within 15 s")
		}
	}
	t.Cleanup(stop)
	return srv, stop
}

// servertestConfigNATS is a server configuration on loopback ports
// consuming the stream at url.
func servertestConfigNATS(url string) server.Config {
	cfg := server.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.InternalAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.InsecureDisableAuth = true
	cfg.DrainTimeout = 2 * time.Second
	cfg.MaxIndexEntries = 0
	cfg.NATS.URL = url
	cfg.NATS.Stream.Name = bus.DefaultStream
	cfg.Logger = slog.New(slog.DiscardHandler)
	return cfg
}

// ingestNATS drives blocks through pipe → NATS → srv and returns the rate.
func ingestNATS(t testing.TB, events int) (blocks int, elapsed time.Duration) {
	ns := bustest.Start(t)
	srv := startNATSServer(t, ns.URL())
	sink := natsSink(t, ns.URL())
	p := newPipe(t, "r1", sink, nil)
	payloads, blocks := benchBatches(t, events)
	ctx := testCtx(t, 5*time.Minute)
	start := time.Now()
	for _, raw := range payloads {
		for p.fwd.Buffered() > DefaultMaxBuffered/2 {
			if !sleepCtx(ctx, 20*time.Microsecond) {
				t.Fatal("forwarder stalled")
			}
		}
		if err := p.dec.Decode(raw, &p.batch); err != nil {
			t.Fatal(err)
		}
		p.proc.Apply(&p.batch)
	}
	if err := p.fwd.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		if e, _ := srv.Engine().Counts(); e == int64(blocks) {
			break
		}
		if !sleepCtx(ctx, 100*time.Microsecond) {
			e, _ := srv.Engine().Counts()
			t.Fatalf("server holds %d of %d blocks", e, blocks)
		}
	}
	elapsed = time.Since(start)
	if n := counter(t, p.metrics.overflows); n != 0 {
		t.Fatalf("the forward buffer overflowed %v times: not a sustained rate", n)
	}
	if n := counter(t, p.metrics.lostDeliveries); n != 0 {
		t.Fatalf("%v deliveries lost", n)
	}
	return blocks, elapsed
}

// Target: end-to-end ingest subscriber → NATS → server (the server's
// entry count reaches every block sent). The rate is logged; the benchmark
// reports it.
func TestNATSIngestEndToEnd(t *testing.T) {
	events := 40_000
	if raceEnabled {
		events = 4_000
	}
	blocks, elapsed := ingestNATS(t, events)
	t.Logf("ingest subscriber → NATS → server: %d blocks in %v, %.0f blocks/s", blocks, elapsed.Round(time.Millisecond), float64(blocks)/elapsed.Seconds())
}

// BenchmarkE2EEventsThroughNATS: the processor variant of
// BenchmarkE2EEventsThroughServer with NATS between the subscriber and the
// server; one op is one 16-block event.
// go test ./kvevents -run XXX -bench E2EEventsThroughNATS -benchtime 40000x
func BenchmarkE2EEventsThroughNATS(b *testing.B) {
	b.ReportAllocs()
	blocks, elapsed := ingestNATS(b, b.N)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(blocks)/elapsed.Seconds(), "blocks/s")
}

// Target: NATS stopped while the engine keeps publishing (30 s in
// production terms; scaled to 3 s, 1 s under -race, NATS_OUTAGE=30s for the
// full length: the mechanism is the same, the forward buffer overflows and
// the replica is cleared and resynced). Once NATS is back, the NATS-fed server's index equals that of
// a server fed directly over gRPC by a second subscriber of the same
// engine.
func TestNATSOutageLosesNothing(t *testing.T) {
	ns := bustest.Start(t)
	viaNATS := startNATSServer(t, ns.URL())
	direct := startRealServer(t, nil)
	conn, err := DialServer(direct.addr, TLSFiles{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	sink := natsSink(t, ns.URL())
	small := func(c *ForwarderConfig) { c.MaxBuffered, c.MaxPending = 512, 256; c.Window = 20 * time.Millisecond }
	pn := newPipe(t, "r1", sink, small)
	pd := newPipe(t, "r1", NewGRPCSink(conn, nil), small)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 8, CapacityBlocks: 2500, Seed: 3, Start: time.Now().Add(-time.Minute)})
	outage := 3 * time.Second
	if raceEnabled {
		outage = time.Second
	}
	if v := os.Getenv("NATS_OUTAGE"); v != "" { // e.g. NATS_OUTAGE=30s: the full-length target
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("NATS_OUTAGE: %v", err)
		}
		outage = d
	}
	step := func() {
		b, _, _ := w.Next()
		pn.apply(t, b)
		pd.apply(t, b)
	}
	for range 100 {
		step()
	}
	flushPipes(t, sink, pn, pd)
	waitConverged(t, sink, 30*time.Second, viaNATS.Server)

	ns.Stop()
	end := time.Now().Add(outage)
	steps := 0
	for time.Now().Before(end) {
		step()
		steps++
		time.Sleep(2 * time.Millisecond) // the engine's pace
	}
	if !pn.fwd.Resyncing() && counter(t, pn.metrics.overflows) == 0 {
		t.Fatalf("after %d batches in the outage the buffer neither overflowed nor holds them (buffered %d)", steps, pn.fwd.Buffered())
	}
	ns.Restart()
	for range 50 {
		step()
	}
	flushPipes(t, sink, pn, pd)
	waitConverged(t, sink, 30*time.Second, viaNATS.Server)
	if n := counter(t, pn.metrics.resyncs); n == 0 {
		t.Fatal("no clear-and-resync after the outage")
	}

	en, kn := viaNATS.Engine().Counts()
	ed, kd := direct.Engine().Counts()
	if en != ed || kn != kd || en != int64(w.CachedBlocks()) {
		t.Fatalf("via NATS %d entries (%d keys), direct %d (%d), engine %d blocks", en, kn, ed, kd, w.CachedBlocks())
	}
	matched := 0
	for _, h := range pn.model.order {
		for _, req := range []*icv1.LookupRouteRequest{chainRequest(pn.model.blocks[h].tokens), exactRequest(pn.model.blocks[h].tokens)} {
			gn, sn := answerOf(t, viaNATS, req)
			gd, _ := answerOf(t, direct, req)
			if gn != gd {
				t.Fatalf("block %x: via NATS %s, direct %s", h, gn, gd)
			}
			if len(sn) > 0 && req.PrefixHash != nil {
				matched++
			}
		}
	}
	if matched != w.CachedBlocks() {
		t.Fatalf("%d of %d blocks matched by an exact lookup, the engine holds %d: ", matched, len(pn.model.order), w.CachedBlocks())
	}
	t.Logf("outage %v, %d batches published meanwhile, %v overflows, %v resyncs; %d entries equal on both servers, %d of %d blocks match",
		outage, steps, counter(t, pn.metrics.overflows), counter(t, pn.metrics.resyncs), en, matched, len(pn.model.order))
}
