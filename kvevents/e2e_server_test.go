package kvevents

// End-to-end tests through the REAL server: fake engine (ZMQ PUB + replay
// ROUTER) → subscriber → production GRPCSink → server.New on 127.0.0.1 →
// LookupRoute / GetCacheState over gRPC. Keys in lookups are computed the
// way a gateway computes them, with engine/fingerprint over the token ids
// the fake engine published (root to block), never taken from the
// subscriber.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	"github.com/inferencecache/inferencecache/policy"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

// realServer is an in-process inferencecache server on loopback ports and
// a gRPC client for the consumer side.
type realServer struct {
	*server.Server
	addr string
	cli  icv1.InferenceCacheClient
}

// startRealServer runs server.New on 127.0.0.1 until the test ends. The
// tenant "t" gets a policy that makes answers crisp: no affinity fallback
// (a miss is NO_HINT, not a consistent-hash pin to the same replica), no
// TENANT_HOT, and a matched-tokens floor of one block. The TTL sweep is
// pushed out so that entries older than the TTL stay visible to
// Engine().Snapshot() (lookups skip them regardless).
func startRealServer(t testing.TB, cfgMut func(*server.Config)) *realServer {
	t.Helper()
	srv := servertest.Start(t, func(cfg *server.Config) {
		cfg.DrainTimeout = 2 * time.Second
		cfg.SweepInterval = time.Hour
		if cfgMut != nil {
			cfgMut(cfg)
		}
	})
	srv.Policies().Apply(&policy.Body{Version: policy.PropagationVersion, Policies: []policy.ResolvedPolicy{{
		Namespace:            "t",
		MinimumMatchedTokens: 16,
		AffinityRouting:      ptr(false),
		Strategy:             &policy.LookupStrategy{EnableTenantHot: ptr(false)},
	}}})
	addr := srv.GRPCAddr().String()
	conn, err := DialServer(addr, TLSFiles{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &realServer{Server: srv, addr: addr, cli: icv1.NewInferenceCacheClient(conn)}
}

// replicaRow returns the server's /snapshot row of replica id in tenant "t".
func (s *realServer) replicaRow(id string) (controlapi.ReplicaSnapshot, bool) {
	for _, r := range s.Engine().Snapshot().Replicas {
		if r.Tenant == "t" && r.ReplicaID == id {
			return r, true
		}
	}
	return controlapi.ReplicaSnapshot{}, false
}

func (s *realServer) cacheState(t *testing.T) *icv1.GetCacheStateResponse {
	t.Helper()
	resp, err := s.cli.GetCacheState(testCtx(t, 5*time.Second), &icv1.GetCacheStateRequest{ModelId: "m", TenantId: "t"})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// routeAnswer is one LookupRoute answer reduced to what the tests check.
type routeAnswer struct {
	reason string
	scores map[string]*icv1.ReplicaScore
}

// of returns replica id's score when the answer is a PREFIX_MATCH that
// names it.
func (l routeAnswer) of(id string) (*icv1.ReplicaScore, bool) {
	s, ok := l.scores[id]
	return s, ok && l.reason == "PREFIX_MATCH"
}

func (s *realServer) lookup(t *testing.T, req *icv1.LookupRouteRequest) routeAnswer {
	t.Helper()
	req.ModelId, req.TenantId, req.HashScheme = "m", "t", "vllm"
	resp, err := s.cli.LookupRoute(testCtx(t, 5*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	l := routeAnswer{reason: resp.ReasonCode, scores: map[string]*icv1.ReplicaScore{}}
	for _, sc := range resp.ReplicaScores {
		l.scores[sc.ReplicaId] = sc
	}
	return l
}

// lookupChain sends the gateway's chain for tokens: the fingerprint of
// every full block (engine/fingerprint), one block_token_count per block.
func (s *realServer) lookupChain(t *testing.T, adapter string, tokens []uint32) routeAnswer {
	t.Helper()
	keys := fingerprint.AppendChain(nil, tokens, 16, 0, false)
	req := &icv1.LookupRouteRequest{AdapterId: adapter}
	for _, k := range keys {
		req.BlockHashes = append(req.BlockHashes, fingerprint.AppendWire(nil, k))
		req.BlockTokenCounts = append(req.BlockTokenCounts, 16)
	}
	return s.lookup(t, req)
}

// lookupExact sends the legacy single-key form for the block whose prefix
// is tokens (the key of its last full block).
func (s *realServer) lookupExact(t *testing.T, adapter string, tokens []uint32) routeAnswer {
	t.Helper()
	keys := fingerprint.AppendChain(nil, tokens, 16, 0, false)
	return s.lookup(t, &icv1.LookupRouteRequest{AdapterId: adapter, PrefixHash: fingerprint.AppendWire(nil, keys[len(keys)-1])})
}

// chainModel rebuilds, from the batches a fake engine published, each
// block's whole token prefix (root to block), its chain of engine hashes
// and its adapter, so a test can compute the keys a gateway would send.
type chainModel struct {
	loras  map[int64]string
	blocks map[uint64]*modelBlock // engine hash →
	order  []uint64               // engine hashes in first-store order
}

type modelBlock struct {
	tokens  []uint32 // root to this block
	engine  []uint64 // engine hashes root to this block
	adapter string
}

func newChainModel(loras map[int64]string) *chainModel {
	return &chainModel{loras: loras, blocks: map[uint64]*modelBlock{}}
}

func (m *chainModel) add(b fakeengine.Batch) {
	for _, ev := range b.Events {
		if ev.Kind != fakeengine.BlockStored {
			continue
		}
		var parent modelBlock
		if ev.Parent != nil {
			p, ok := m.blocks[*ev.Parent]
			if !ok {
				panic(fmt.Sprintf("BUG: test model: parent %x never stored", *ev.Parent))
			}
			parent = *p
		}
		adapter := ev.LoRAName
		if adapter == "" && ev.LoRAID != nil {
			adapter = m.loras[*ev.LoRAID]
		}
		for i, h := range ev.BlockHashes {
			if _, ok := m.blocks[h]; ok {
				continue
			}
			nb := &modelBlock{
				tokens:  append(slices.Clip(parent.tokens), ev.TokenIDs[:(i+1)*ev.BlockSize]...),
				engine:  append(slices.Clip(parent.engine), ev.BlockHashes[:i+1]...),
				adapter: adapter,
			}
			m.blocks[h] = nb
			m.order = append(m.order, h)
		}
	}
}

// recordingWorkload feeds every batch of w into a chain model.
type recordingWorkload struct {
	w fakeengine.Workload
	m *chainModel
}

func (r *recordingWorkload) Next() (fakeengine.Batch, time.Duration, bool) {
	b, d, ok := r.w.Next()
	if ok {
		r.m.add(b)
	}
	return b, d, ok
}

// teeSink forwards to a Sink and records the event types it delivered.
type teeSink struct {
	Sink
	mu     sync.Mutex // guards events
	events []icv1.CacheEvent_Type
}

func (s *teeSink) PublishEvent(ctx context.Context, e *icv1.CacheEvent) error {
	err := s.Sink.PublishEvent(ctx, e)
	if err == nil {
		s.mu.Lock()
		s.events = append(s.events, e.Type)
		s.mu.Unlock()
	}
	return err
}

func (s *teeSink) count(typ icv1.CacheEvent_Type) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.events {
		if e == typ {
			n++
		}
	}
	return n
}

// startOnServer starts a fake engine (map layout; replay on) and a
// subscriber delivering over gRPC to srv through a teeSink.
func startOnServer(t *testing.T, srv *realServer, cfgMut func(*Config)) (*zmqFixture, *teeSink, *chainModel) {
	t.Helper()
	conn, err := DialServer(srv.addr, TLSFiles{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	tee := &teeSink{Sink: NewGRPCSink(conn, nil)}
	f := startZMQSink(t, fakeengine.Config{Encoding: fakeengine.Encoding{Layout: fakeengine.LayoutMap}}, true, cfgMut, tee)
	// Let the startup sync's deliveries finish before anything is
	// published (startZMQSink waited for the sync itself).
	if err := f.sub.Forwarder().Flush(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	return f, tee, newChainModel(f.sub.cfg.LoRAAdapters)
}

// publish publishes b (recording it in m) and waits until the subscriber
// applied it and the server acknowledged everything.
func (f *zmqFixture) publish(t *testing.T, m *chainModel, b fakeengine.Batch) {
	t.Helper()
	m.add(b)
	seq, err := f.pub.Publish(b)
	if err != nil {
		t.Fatal(err)
	}
	f.waitApplied(t, seq+1)
}

// chainBatch stores a chain of synthetic blocks (ids → tokens through
// fakeengine.BlockTokens) under the given engine hashes, at ts.
func chainBatch(ts time.Time, hashes []uint64, ids []uint64, parent *uint64) fakeengine.Batch {
	ev := fakeengine.Event{Kind: fakeengine.BlockStored, BlockHashes: hashes, Parent: parent, BlockSize: 16}
	for _, id := range ids {
		ev.TokenIDs = append(ev.TokenIDs, fakeengine.BlockTokens(id, 16)...)
	}
	return fakeengine.Batch{TS: float64(ts.UnixMicro()) / 1e6, Events: []fakeengine.Event{ev}}
}

func removeBatch(ts time.Time, medium string, hashes ...uint64) fakeengine.Batch {
	return fakeengine.Batch{TS: float64(ts.UnixMicro()) / 1e6,
		Events: []fakeengine.Event{{Kind: fakeengine.BlockRemoved, BlockHashes: hashes, Medium: medium}}}
}

func seq(from, n uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}

// TestE2ERealServerMatchesEngine drives the synthetic workload (two LoRA
// adapters, LRU evictions, a forced gap repaired by replay) into the real
// server and checks, for every block the engine ever stored, that the
// server answers exactly what the engine holds: a chain lookup matches the
// leading run of held blocks at T1, an exact lookup matches iff the block
// is held, and the server's key count equals the engine's.
func TestE2ERealServerMatchesEngine(t *testing.T) {
	srv := startRealServer(t, nil)
	run := driveE2E(t, srv.addr, 120, nil)
	m := run.sub.metrics
	// Two replays: the sync when the SUB socket connected, and the gap.
	if counter(t, m.gaps) != 1 || counter(t, m.replays.WithLabelValues(ReplayOK)) != 2 {
		t.Fatalf("gaps %v, replays ok %v: the forced gap was not repaired by replay",
			counter(t, m.gaps), counter(t, m.replays.WithLabelValues(ReplayOK)))
	}

	held := run.w.CachedBlocks()
	if n := run.sub.Index().Len(); n != held {
		t.Fatalf("positional index %d blocks, engine %d", n, held)
	}
	if row, _ := srv.replicaRow("r1"); row.PrefixCount != int64(held) {
		t.Fatalf("server holds %d keys for r1, the engine %d blocks", row.PrefixCount, held)
	}
	if got := srv.cacheState(t).GetSummary().GetTotalPrefixes(); got != int64(held) {
		t.Fatalf("GetCacheState total_prefixes %d, engine %d", got, held)
	}

	var matched, absent, longest int
	var longestTokens []uint32
	var longestAdapter string
	adapters := map[string]bool{}
	for _, h := range run.model.order {
		b := run.model.blocks[h]
		runLen := 0
		for _, e := range b.engine {
			if !run.w.Holds(e) {
				break
			}
			runLen++
		}
		l := srv.lookupChain(t, b.adapter, b.tokens)
		sc, ok := l.of("r1")
		switch {
		case runLen == 0 && ok:
			t.Fatalf("chain of %d blocks (none held from the root) matched r1: %v", len(b.engine), sc)
		case runLen > 0 && !ok:
			t.Fatalf("chain with %d leading held blocks: reason %s, scores %v", runLen, l.reason, l.scores)
		case runLen > 0 && (sc.MatchedTokens != int32(16*runLen) || sc.Tier != icv1.CacheTier_CACHE_TIER_T1):
			t.Fatalf("chain: matched %d tier %v, want %d T1", sc.MatchedTokens, sc.Tier, 16*runLen)
		}
		if runLen > longest {
			longest, longestTokens, longestAdapter = runLen, b.tokens[:16*runLen], b.adapter
		}

		e := srv.lookupExact(t, b.adapter, b.tokens)
		sc, ok = e.of("r1")
		switch {
		case run.w.Holds(h) && !ok:
			t.Fatalf("held block (adapter %q, %d tokens) not matched: %s", b.adapter, len(b.tokens), e.reason)
		case run.w.Holds(h) && sc.MatchedTokens != int32(len(b.tokens)):
			t.Fatalf("held block matched %d tokens, want %d", sc.MatchedTokens, len(b.tokens))
		case !run.w.Holds(h) && ok:
			t.Fatalf("evicted block (adapter %q) still matched", b.adapter)
		case ok:
			matched++
			adapters[b.adapter] = true
		default:
			absent++
		}
	}
	if matched != held || absent == 0 || !adapters["sql"] || !adapters["chat"] {
		t.Fatalf("exact lookups: %d matched (engine holds %d), %d evicted, adapters %v", matched, held, absent, adapters)
	}

	// The gateway's own path: token ids, fingerprinted by the server.
	l := srv.lookup(t, &icv1.LookupRouteRequest{AdapterId: longestAdapter, TokenIds: longestTokens})
	if sc, ok := l.of("r1"); !ok || sc.MatchedTokens != int32(16*longest) {
		t.Fatalf("token_ids lookup of a %d-block held chain: %s %v", longest, l.reason, l.scores)
	}
}

// TestE2ERealServerRemovalAndClear: without L2, BlockRemoved evicts the key
// (a chain whose root is gone no longer matches; other chains still do) and
// AllBlocksCleared drops the replica from every answer and from
// GetCacheState.
func TestE2ERealServerRemovalAndClear(t *testing.T) {
	srv := startRealServer(t, nil)
	var statsUp atomic.Bool
	statsUp.Store(true)
	metricsSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !statsUp.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprint(w, vllmExposition(50, 100, 0, 0, 0, 0, 0.5, true))
	}))
	t.Cleanup(metricsSrv.Close)
	f, tee, model := startOnServer(t, srv, func(c *Config) {
		c.MetricsURL = metricsSrv.URL
		c.StatsInterval = 20 * time.Millisecond
		c.CacheSizeBytes = 1 << 30
	})

	now := time.Now()
	x := chainBatch(now, seq(1001, 5), seq(1, 5), nil)  // 5 blocks, 80 tokens
	y := chainBatch(now, seq(2001, 4), seq(20, 4), nil) // 4 blocks, 64 tokens
	f.publish(t, model, x)
	f.publish(t, model, y)
	xTokens, yTokens := model.blocks[1005].tokens, model.blocks[2004].tokens

	if sc, ok := srv.lookupChain(t, "", xTokens).of("r1"); !ok || sc.MatchedTokens != 80 || sc.Tier != icv1.CacheTier_CACHE_TIER_T1 {
		t.Fatalf("chain x: %v %v", ok, sc)
	}
	if sc, ok := srv.lookupChain(t, "", yTokens).of("r1"); !ok || sc.MatchedTokens != 64 {
		t.Fatalf("chain y: %v %v", ok, sc)
	}
	// The stats the subscriber scrapes put r1 into GetCacheState.
	ctx := testCtx(t, 10*time.Second)
	for !slices.ContainsFunc(srv.cacheState(t).Replicas, func(r *icv1.ReplicaStats) bool { return r.ReplicaId == "r1" }) {
		if !sleepCtx(ctx, 5*time.Millisecond) {
			t.Fatal("r1 never appeared in GetCacheState")
		}
	}
	if st := srv.cacheState(t); st.Replicas[0].HitRate != 0.5 || st.Summary.TotalPrefixes != 9 {
		t.Fatalf("GetCacheState %v", st)
	}

	// BlockRemoved of x's root (no L2): PREFIX_EVICTED; x no longer
	// matches from its root, its later blocks still match on their own.
	f.publish(t, model, removeBatch(now, "", 1001))
	if l := srv.lookupChain(t, "", xTokens); l.reason != "NO_HINT" || len(l.scores) != 0 {
		t.Fatalf("chain x after its root was removed: %s %v", l.reason, l.scores)
	}
	if sc, ok := srv.lookupExact(t, "", xTokens).of("r1"); !ok || sc.MatchedTokens != 80 {
		t.Fatalf("x's last block after its root was removed: %v %v", ok, sc)
	}
	if _, ok := srv.lookupChain(t, "", yTokens).of("r1"); !ok {
		t.Fatal("chain y lost with x's root")
	}
	if row, _ := srv.replicaRow("r1"); row.PrefixCount != 8 || tee.count(icv1.CacheEvent_PREFIX_EVICTED) != 1 {
		t.Fatalf("after one removal: %d keys, %d PREFIX_EVICTED", row.PrefixCount, tee.count(icv1.CacheEvent_PREFIX_EVICTED))
	}

	// Stop the stats (and make sure no scrape is still on its way), then
	// AllBlocksCleared: r1 leaves every answer and GetCacheState.
	statsUp.Store(false)
	errs := counter(t, f.sub.metrics.scrapes.WithLabelValues("error"))
	for counter(t, f.sub.metrics.scrapes.WithLabelValues("error")) < errs+1 {
		if !sleepCtx(ctx, 5*time.Millisecond) {
			t.Fatal("no failed scrape")
		}
	}
	f.publish(t, model, fakeengine.Batch{TS: float64(now.UnixMicro()) / 1e6, Events: []fakeengine.Event{{Kind: fakeengine.AllBlocksCleared}}})
	for _, toks := range [][]uint32{xTokens, yTokens, yTokens[:32]} {
		if l := srv.lookupChain(t, "", toks); l.reason == "PREFIX_MATCH" || len(l.scores) != 0 {
			t.Fatalf("after AllBlocksCleared: %s %v", l.reason, l.scores)
		}
	}
	if sc, ok := srv.lookupExact(t, "", xTokens).of("r1"); ok {
		t.Fatalf("x's last block after AllBlocksCleared: %v", sc)
	}
	st := srv.cacheState(t)
	if len(st.Replicas) != 0 || st.Summary.TotalPrefixes != 0 {
		t.Fatalf("GetCacheState after AllBlocksCleared: %v", st)
	}
	if _, ok := srv.replicaRow("r1"); ok {
		t.Fatal("r1 still in the snapshot")
	}
	if n := tee.count(icv1.CacheEvent_ALL_CLEARED); n != 1 { // the engine's
		t.Fatalf("%d ALL_CLEARED delivered", n)
	}
}

// TestE2ERealServerL2Demotes: with an L2 tier (--ignore-block-removed) a
// BlockRemoved re-reports the block at T2: it still matches, and the chain's
// tier (the coldest across the run) is T2. A block the engine itself moves
// to CPU is T2 too.
func TestE2ERealServerL2Demotes(t *testing.T) {
	srv := startRealServer(t, nil)
	f, tee, model := startOnServer(t, srv, func(c *Config) { c.L2 = true })
	now := time.Now()
	f.publish(t, model, chainBatch(now, seq(1, 4), seq(1, 4), nil))
	z := model.blocks[4].tokens
	if sc, ok := srv.lookupChain(t, "", z).of("r1"); !ok || sc.Tier != icv1.CacheTier_CACHE_TIER_T1 || sc.MatchedTokens != 64 {
		t.Fatalf("before removal: %v %v", ok, sc)
	}
	f.publish(t, model, removeBatch(now, "", 4))
	sc, ok := srv.lookupChain(t, "", z).of("r1")
	if !ok || sc.Tier != icv1.CacheTier_CACHE_TIER_T2 || sc.MatchedTokens != 64 {
		t.Fatalf("after removal with L2: %v %v", ok, sc)
	}
	if sc, ok := srv.lookupExact(t, "", z).of("r1"); !ok || sc.Tier != icv1.CacheTier_CACHE_TIER_T2 {
		t.Fatalf("removed block exact: %v %v", ok, sc)
	}
	if sc, ok := srv.lookupChain(t, "", z[:48]).of("r1"); !ok || sc.Tier != icv1.CacheTier_CACHE_TIER_T1 {
		t.Fatalf("the blocks before it stay T1: %v %v", ok, sc)
	}
	if n := tee.count(icv1.CacheEvent_PREFIX_EVICTED); n != 0 {
		t.Fatalf("%d PREFIX_EVICTED with L2", n)
	}

	// The engine reports a CPU copy, then drops the GPU one: T2 as well.
	b := chainBatch(now, seq(11, 4), seq(11, 4), nil)
	cpu := b.Events[0]
	cpu.Medium = "CPU"
	b.Events = append(b.Events, cpu)
	f.publish(t, model, b)
	f.publish(t, model, removeBatch(now, "GPU", 12))
	w := model.blocks[14].tokens
	if sc, ok := srv.lookupChain(t, "", w).of("r1"); !ok || sc.Tier != icv1.CacheTier_CACHE_TIER_T2 || sc.MatchedTokens != 64 {
		t.Fatalf("GPU copy dropped, CPU copy kept: %v %v", ok, sc)
	}
	if sc, ok := srv.lookupChain(t, "", w[:16]).of("r1"); !ok || sc.Tier != icv1.CacheTier_CACHE_TIER_T1 {
		t.Fatalf("root still on the GPU: %v %v", ok, sc)
	}
}

// TestE2ERealServerUnrepairableGapClears: when replay cannot cover a gap
// the subscriber sends ALL_CLEARED: the replica leaves every answer (the
// engine still holds the blocks, but nobody can vouch for them) until new
// stores arrive.
func TestE2ERealServerUnrepairableGapClears(t *testing.T) {
	srv := startRealServer(t, nil)
	f, tee, model := startOnServer(t, srv, nil)
	now := time.Now()
	f.publish(t, model, chainBatch(now, seq(1, 4), seq(1, 4), nil))
	x := model.blocks[4].tokens
	if _, ok := srv.lookupChain(t, "", x).of("r1"); !ok {
		t.Fatal("x not matched")
	}

	// Two batches never reach the subscriber and the engine's replay ring
	// forgets them; the next batch (a removal of a block the subscriber
	// never saw: no store) reveals the gap.
	f.pub.Drop(2)
	for i := range uint64(2) {
		b := chainBatch(now, seq(100+10*i, 4), seq(100+10*i, 4), nil)
		model.add(b)
		if _, err := f.pub.Publish(b); err != nil {
			t.Fatal(err)
		}
	}
	f.pub.ForgetRing()
	f.publish(t, model, removeBatch(now, "", 100))

	if got := counter(t, f.sub.metrics.replays.WithLabelValues(ReplayIncomplete)); got != 1 {
		t.Fatalf("replays{incomplete} = %v", got)
	}
	if n := tee.count(icv1.CacheEvent_ALL_CLEARED); n != 1 { // for the gap
		t.Fatalf("%d ALL_CLEARED delivered, want 1", n)
	}
	for _, toks := range [][]uint32{x, x[:16], model.blocks[113].tokens} {
		if l := srv.lookupChain(t, "", toks); l.reason == "PREFIX_MATCH" || len(l.scores) != 0 {
			t.Fatalf("after the unrepairable gap: %s %v", l.reason, l.scores)
		}
	}
	if _, ok := srv.replicaRow("r1"); ok {
		t.Fatal("r1 still holds keys on the server")
	}

	// New stores bring the replica back, for what they store only.
	f.publish(t, model, chainBatch(now, seq(201, 4), seq(201, 4), nil))
	if sc, ok := srv.lookupChain(t, "", model.blocks[204].tokens).of("r1"); !ok || sc.MatchedTokens != 64 {
		t.Fatalf("new chain after the reset: %v %v", ok, sc)
	}
	if _, ok := srv.lookupChain(t, "", x).of("r1"); ok {
		t.Fatal("x came back without being stored again")
	}
	if row, _ := srv.replicaRow("r1"); row.PrefixCount != 4 {
		t.Fatalf("r1 holds %d keys, want the 4 stored after the reset", row.PrefixCount)
	}
}

// TestE2ERealServerRefreshKeepsHeldBlocksFresh: two replicas hold the same
// blocks, stored 40 minutes ago (older than the 30 min TTL). The one whose
// subscriber refreshes is matched again, with full freshness; the one
// without refresh is not, although the server still holds its entries.
func TestE2ERealServerRefreshKeepsHeldBlocksFresh(t *testing.T) {
	srv := startRealServer(t, nil)
	stale, _, staleModel := startOnServer(t, srv, func(c *Config) {
		c.ReplicaID = "r-stale"
		c.RefreshInterval = -1
	})
	fresh, freshTee, freshModel := startOnServer(t, srv, func(c *Config) {
		c.ReplicaID = "r-fresh"
		c.RefreshInterval = 100 * time.Millisecond
	})
	old := time.Now().Add(-40 * time.Minute)
	stale.publish(t, staleModel, chainBatch(old, seq(1, 5), seq(1, 5), nil))
	fresh.publish(t, freshModel, chainBatch(old, seq(1, 5), seq(1, 5), nil))

	// Two more walks complete: the second started after the store.
	refreshes := func() float64 { return counter(t, fresh.sub.metrics.refreshes) }
	c0 := refreshes()
	ctx := testCtx(t, 10*time.Second)
	for refreshes() < c0+2 {
		if !sleepCtx(ctx, 5*time.Millisecond) {
			t.Fatalf("refreshes_total %v, want %v", refreshes(), c0+2)
		}
	}
	if got := counter(t, fresh.sub.metrics.refreshEntries); got < 5 {
		t.Fatalf("refreshed_entries_total %v", got)
	}

	toks := freshModel.blocks[5].tokens
	l := srv.lookupChain(t, "", toks)
	sc, ok := l.of("r-fresh")
	if !ok || sc.MatchedTokens != 80 || sc.EstimatedCacheHitProb < 0.99 {
		row, _ := srv.replicaRow("r-fresh")
		t.Fatalf("refreshed replica: %s %v; server row %+v; refreshes %v (from %v), entries %v, index %d, sink %v",
			l.reason, l.scores, row, refreshes(), c0, counter(t, fresh.sub.metrics.refreshEntries), fresh.sub.Index().Len(), freshTee.events)
	}
	if _, ok := l.scores["r-stale"]; ok {
		t.Fatalf("the replica without refresh matched entries older than the TTL: %v", l.scores)
	}
	// Both replicas hold the chain on the server, one of them fresh:
	// distinguishing power 1 − 1/2 (contract §3.5). Had r-stale's entries
	// been fresh too, it would be 0 and the answer NO_HINT.
	if want := float32(80 * 0.5); sc.Score < want*0.99 || sc.Score > want {
		t.Fatalf("score %v, want about %v", sc.Score, want)
	}
	if row, _ := srv.replicaRow("r-stale"); row.PrefixCount != 5 {
		t.Fatalf("r-stale holds %d keys on the server, want 5 (stale, not swept)", row.PrefixCount)
	}
	if _, ok := srv.lookupExact(t, "", toks).of("r-stale"); ok {
		t.Fatal("r-stale's stale entry matched on the exact path")
	}
}
