package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/inferencecache/inferencecache/policy"
)

// Load-aware routing (load.go, docs/routing.md): activation, the overload
// bound, the TTFT cost and its ranking, the explore walk, and exactness
// whenever loads say nothing.

// uniformLoadConfig is the default configuration with one prefill weight
// for every replica (EvictionShare 0), for tests that pin costs by hand;
// TestLoadEvictionShare covers the occupancy-scaled weight.
func uniformLoadConfig() LoadConfig {
	c := DefaultLoadConfig()
	c.EvictionShare = 0
	return c
}

func newLoadTix(t *testing.T, cfg LoadConfig) *tix {
	store := policy.NewStore()
	return &tix{t: t, e: New(Config{Policies: store, Load: cfg}), store: store}
}

// load reports replica's load at server time now (µs); queued < 0 sends
// none.
func (x *tix) load(replica string, now int64, waiting, running int32, queued int64) {
	x.e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: replica,
		Stats: &ReplicaStats{Load: LoadStats{Reported: true, Waiting: waiting, Running: running, QueuedTokens: queued}}}, now)
}

// advise runs a lookup and the load-aware step the way the rpc handler
// does (matched floor 0, routing floor 0): the contract pick is the top
// score, or the affinity pin on a miss.
func (x *tix) advise(req LookupRequest, now int64) (*LookupResult, LoadDecision, string) {
	x.t.Helper()
	if req.TenantID == "" {
		req.TenantID, req.ModelID, req.HashScheme = "team", "m", "vllm"
	}
	res := &LookupResult{}
	x.e.LookupRoute(&req, now, res)
	seed := []byte(fmt.Sprint(req.BlockHashes))
	var pick ContractPick
	var pin string
	if res.Strategy == StrategyPrefixMatch {
		pick = PickOfScore(&res.Scores[0])
	} else {
		res.Scores = res.Scores[:0]
		pin, pick, _ = x.e.AffinityPick(res, req.TenantID, req.ModelID, req.HashScheme, seed, AffinityContract)
	}
	var tokens int64
	for _, c := range req.BlockTokenCounts {
		tokens += int64(c)
	}
	d := x.e.AdviseByLoad(&req, now, res, pick, tokens)
	switch d {
	case LoadExplore:
		pin, _, _ = x.e.AffinityPick(res, req.TenantID, req.ModelID, req.HashScheme, seed, AffinityExplore)
	case LoadExpected:
		pin, _, _ = x.e.AffinityPick(res, req.TenantID, req.ModelID, req.HashScheme, seed, AffinityExpected)
	case LoadRerank:
		pin = res.Scores[0].ReplicaID
	case LoadKeep:
		if res.Strategy == StrategyPrefixMatch {
			pin = res.Scores[0].ReplicaID
		}
	}
	return res, d, pin
}

func TestLoadActivationHysteresis(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig()) // MinQueue 4: on at 4 in flight, off below 2
	now := tT
	x.chain("a", now, 0, 1, 2)
	x.chain("b", now, 0, 1, 2)
	d := x.e.lookupDomain("team", "m")
	steps := []struct {
		waiting, running int32
		want             bool
	}{
		{0, 0, false}, {1, 2, false}, {2, 2, true}, {0, 3, true}, {0, 2, true}, {1, 0, false}, {0, 3, false}, {4, 0, true},
	}
	for i, s := range steps {
		now += 1_000_000
		x.load("a", now, s.waiting, s.running, -1)
		x.load("b", now, 0, 0, -1)
		if got := d.loadActive.Load(); got != s.want {
			t.Fatalf("step %d (a: %d waiting, %d running): active %v, want %v", i, s.waiting, s.running, got, s.want)
		}
	}
	// A report older than MaxAge does not keep it on.
	now += DefaultLoadMaxAge.Microseconds() + 1
	x.load("b", now, 0, 0, -1)
	if d.loadActive.Load() {
		t.Fatal("a stale busy report kept load-awareness on")
	}
}

// TestLoadCostRanking: the TTFT estimate (queue + PrefillWeight × uncached
// tokens) decides; the contract's pick stands unless another replica is
// both cheaper and less loaded, or the pick is overloaded.
func TestLoadCostRanking(t *testing.T) {
	type rep struct {
		name             string
		blocks           int   // leading blocks of the request held
		waiting, running int32 // reported
		queued           int64
	}
	cases := []struct {
		name      string
		reps      []rep
		decision  LoadDecision
		first     string
		wantOrder []string
		wantScore []float32
	}{{
		// α=16: a 32-token shorter match costs 512 queue tokens; a queue of
		// 20000 tokens outweighs it. b's advantage over computing the
		// 160-token prompt cold on c: 16 × 96.
		name:      "shorter match on an idle replica beats a longer one behind a long queue",
		reps:      []rep{{"a", 8, 4, 1, 20000}, {"b", 6, 0, 1, 0}, {"c", 0, 0, 1, 0}},
		decision:  LoadRerank,
		first:     "b",
		wantOrder: []string{"b", "a"},
		wantScore: []float32{16 * 96, 0},
	}, {
		name:     "a short queue does not outweigh the saved prefill",
		reps:     []rep{{"a", 8, 4, 1, 500}, {"b", 6, 0, 1, 0}, {"c", 0, 0, 1, 0}},
		decision: LoadKeep,
		first:    "a",
	}, {
		// b covers 4 of 10 blocks, less than half the prompt: in the
		// decision its match counts as none (no better than computing the
		// prompt cold), so the request explores; the explore walk still
		// counts the 64 tokens b saves, so b beats the idle c.
		name:     "a match under half the prompt explores, where it still counts",
		reps:     []rep{{"a", 8, 4, 1, 20000}, {"b", 4, 0, 1, 0}, {"c", 0, 0, 1, 0}},
		decision: LoadExplore,
		first:    "b",
	}, {
		// The same with a's queue short: a's 128 matched tokens are worth
		// more than its queue, and b's short match does not pull the
		// request away.
		name:     "a match under half the prompt does not beat a moderately busy long match",
		reps:     []rep{{"a", 8, 4, 1, 1500}, {"b", 4, 0, 1, 0}, {"c", 0, 0, 1, 0}},
		decision: LoadKeep,
		first:    "a",
	}, {
		name:     "equal loads keep the contract",
		reps:     []rep{{"a", 8, 4, 1, 900}, {"b", 4, 4, 1, 900}, {"c", 0, 4, 1, 900}},
		decision: LoadKeep,
		first:    "a",
	}, {
		// Every holder's queue costs more than recomputing the prompt on c.
		name:     "explore when no holder is worth its queue",
		reps:     []rep{{"a", 2, 4, 1, 90000}, {"b", 2, 4, 1, 90000}, {"c", 0, 0, 1, 0}},
		decision: LoadExplore,
		first:    "c",
	}, {
		// b's 40 in flight exceed max(1.5 × mean + 2√mean, 4): overloaded
		// even with no queued tokens, so a takes the lead.
		name:      "an overloaded pick yields",
		reps:      []rep{{"a", 6, 0, 1, 0}, {"b", 8, 0, 40, 0}, {"c", 0, 0, 1, 0}},
		decision:  LoadRerank,
		first:     "a",
		wantOrder: []string{"a", "b"},
		wantScore: []float32{16 * 96, 0},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := newLoadTix(t, uniformLoadConfig())
			now := tT
			// The request: 10 blocks of 16 tokens; c holds an unrelated key
			// so that it serves the scheme.
			req := chainReq(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
			for _, r := range tc.reps {
				if r.blocks > 0 {
					x.chain(r.name, now, 0, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}[:r.blocks]...)
				} else {
					x.chain(r.name, now, 0, 999)
				}
			}
			for _, r := range tc.reps {
				x.load(r.name, now, r.waiting, r.running, r.queued)
			}
			res, d, first := x.advise(req, now)
			if d != tc.decision || first != tc.first {
				t.Fatalf("decision %v first %q, want %v %q (scores %+v)", d, first, tc.decision, tc.first, res.Scores)
			}
			if tc.wantOrder != nil {
				var order []string
				var scores []float32
				for _, s := range res.Scores {
					order = append(order, s.ReplicaID)
					scores = append(scores, s.Score)
				}
				if !slices.Equal(order, tc.wantOrder) || !slices.Equal(scores, tc.wantScore) {
					t.Fatalf("ranked %v scores %v, want %v %v", order, scores, tc.wantOrder, tc.wantScore)
				}
			}
			for i := 1; i < len(res.Scores); i++ {
				if res.Scores[i].Score > res.Scores[i-1].Score {
					t.Fatalf("scores not monotone: %+v", res.Scores)
				}
			}
		})
	}
}

// TestLoadEqualOrUnknownLoadsAreExact: with load-awareness active but
// equal loads (reported, or reported plus equal picker counts), with
// pressure-only replicas, or with load-aware routing off,
// every decision keeps the contract's answer and the explore walk picks
// the contract's pin.
func TestLoadEqualOrUnknownLoadsAreExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, mode := range []string{"equal", "equal-live", "pressure-only", "off"} {
		cfg := DefaultLoadConfig()
		if mode == "off" {
			cfg.Enabled = false
		}
		x := newLoadTix(t, cfg)
		now := tT
		names := []string{"r0", "r1", "r2", "r3", "r4", "r5"}
		for i := 0; i < 200; i++ {
			n := 1 + rng.IntN(6)
			var hs []uint64
			for j := 0; j < n; j++ {
				hs = append(hs, uint64(rng.IntN(4)*100+j))
			}
			x.chain(names[rng.IntN(len(names))], now-int64(rng.IntN(600))*1_000_000, 0, hs...)
		}
		for i, n := range names {
			switch mode {
			case "equal", "off":
				x.load(n, now, 6, 3, 5000)
			case "equal-live":
				// A picker here started 7 requests on each and saw 2 end.
				x.load(n, now, 6, 3, 5000)
				for range 7 {
					x.e.RequestStarted("team", "m", n, now)
				}
				for range 2 {
					x.e.RequestFinished("team", "m", n, now)
				}
			case "pressure-only":
				x.stats(n, now, 0.5, float32(i)/10)
			}
		}
		for i := 0; i < 500; i++ {
			n := 1 + rng.IntN(6)
			var hs []uint64
			for j := 0; j < n; j++ {
				hs = append(hs, uint64(rng.IntN(5)*100+j))
			}
			req := chainReq(hs...)
			contract := x.lookup(req)
			res, d, _ := x.advise(req, tT)
			if d != LoadKeep {
				t.Fatalf("%s: lookup %v: decision %v, want keep", mode, hs, d)
			}
			if !slices.EqualFunc(res.Scores, contract.Scores, func(a, b Score) bool { return a == b }) && res.Strategy == StrategyPrefixMatch {
				t.Fatalf("%s: scores changed: %+v vs %+v", mode, res.Scores, contract.Scores)
			}
			if res.Strategy != StrategyPrefixMatch {
				seed := []byte(fmt.Sprint(req.BlockHashes))
				want, _ := x.e.AffinityHint("team", "m", "vllm", seed)
				if _, _, got := x.advise(req, tT); got != want {
					t.Fatalf("%s: affinity answer %q, contract %q", mode, got, want)
				}
			}
		}
	}
}

// TestBoundedLoadAffinity: with equal loads the walk is the contract's
// pick; an overloaded replica's keys move to the next replica in ring
// order, and only those; the answer is stable across calls.
func TestBoundedLoadAffinity(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	names := []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"}
	for i, n := range names {
		x.chain(n, now, 0, uint64(1000+i))
	}
	for _, n := range names {
		x.load(n, now, 0, 3, 0)
	}
	x.load("r3", now, 0, 30, 0) // overloaded: 30 > max(1.5 × 6.4 + 2√6.4, 4) = 14.7
	moved := 0
	for i := 0; i < 2000; i++ {
		req := chainReq(uint64(50_000 + i)) // a miss: the affinity branch
		seed := []byte(fmt.Sprint(req.BlockHashes))
		contract, _ := x.e.AffinityHint("team", "m", "vllm", seed)
		for rep := 0; rep < 2; rep++ {
			_, d, got := x.advise(req, now)
			want := contract
			if contract == "r3" {
				want = "r4"
				if d != LoadExplore {
					t.Fatalf("pin r3 overloaded: decision %v", d)
				}
			}
			if got != want {
				t.Fatalf("seed %d (call %d): pick %q, want %q (contract %q)", i, rep, got, want, contract)
			}
		}
		if contract == "r3" {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no key was pinned to the overloaded replica; the test proves nothing")
	}
}

// TestLoadExploreLeavesTheRing: a replica that reports load for the
// scheme but holds none of its keys is where a cold request goes when the
// ring is overloaded (otherwise herding onto the only holder never ends).
func TestLoadExploreLeavesTheRing(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	x.chain("hot", now, 0, 1, 2, 3)
	x.load("hot", now, 0, 12, 0)
	x.load("idle-a", now, 0, 0, 0)
	x.load("idle-b", now, 0, 0, 0)
	_, d, first := x.advise(chainReq(1, 2, 3, 4), now)
	if d != LoadExplore || first != "idle-a" {
		t.Fatalf("decision %v first %q, want explore to idle-a", d, first)
	}
}

// TestLoadQueueEstimate: the reported queue, plus what was routed since,
// minus what KV events show stored since; counts-only reports price
// waiting requests at the mean routed request.
func TestLoadQueueEstimate(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	x.chain("a", now, 0, 1)
	// KV evidence that a prefilled 320 tokens: it pays for the price
	// samples below (requestPrice).
	x.chain("a", now, 0, 900, 901, 902, 903, 904, 905, 906, 907, 908, 909, 910, 911, 912, 913, 914, 915, 916, 917, 918, 919)
	x.load("a", now, 2, 4, 1000)
	est := func() float64 {
		var q float64
		x.e.Loads(now, func(v LoadView) {
			if v.Replica == "a" {
				q = v.QueueTokens
			}
		})
		return q
	}
	if q := est(); q != 1000 {
		t.Fatalf("reported queue: %v", q)
	}
	route := func(uncached int64) {
		res := &LookupResult{}
		x.e.LookupRoute(&LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(1), BlockTokenCounts: []int32{16}}, now, res)
		x.e.NoteRouted(res, PickOfScore(&res.Scores[0]), uncached, now)
	}
	route(300)
	if q := est(); q != 1300 {
		t.Fatalf("after routing 300 uncached tokens: %v", q)
	}
	x.chain("a", now, 0, 1, 2, 3) // two new blocks of 16 tokens
	if q := est(); q != 1300-32 {
		t.Fatalf("after two stored blocks: %v", q)
	}
	x.chain("a", now, 0, 1, 2, 3) // a re-report stores nothing new
	if q := est(); q != 1300-32 {
		t.Fatalf("after a re-report: %v", q)
	}
	// A counts-only report prices its waiting requests at the mean routed
	// request (300 so far), and carries what was routed and not yet seen
	// stored (268) if that is more.
	x.load("a", now, 3, 4, -1)
	if q := est(); q != 3*300 {
		t.Fatalf("counts-only report: %v", q)
	}
	// The carried part survives counts-only reports while the engine has
	// requests in flight (a prefill in progress is running, not waiting) ...
	x.load("a", now, 0, 1, -1)
	if q := est(); q != 268 {
		t.Fatalf("routed, unstored work across a report: %v", q)
	}
	// ... up to carriedPerRequest mean requests, or the largest request
	// routed there, per request in flight: a 5000-token claim moves the
	// mean to 345 (one sample counts at most 4× the mean; 8 × 345 = 2760),
	// but it is itself the largest, so one request in flight carries 5000
	// of the 5268: a prompt many times the mean stays in the estimate
	// while it is prefilled.
	route(5000)
	x.load("a", now, 0, 1, -1)
	if q := est(); q != 5000 {
		t.Fatalf("carried work over the in-flight cap: %v", q)
	}
	x.chain("a", now, 0, 1, 2, 3, 4, 5) // two more new blocks
	x.load("a", now, 0, 1, -1)
	if q := est(); q != 5000*peakRoutedDecay {
		t.Fatalf("after two stored blocks, across a report (the largest request's bound decays): %v", q)
	}
	// Work that never shows up stored fades with the largest request's
	// bound, down to the mean's.
	for range 20 {
		x.load("a", now, 0, 1, -1)
	}
	if q := est(); q != 8*345 {
		t.Fatalf("carried work after 20 more reports: %v, want the mean's bound %v", q, 8*345)
	}
	// ... and is dropped once the engine is idle.
	x.load("a", now, 0, 0, -1)
	if q := est(); q != 0 {
		t.Fatalf("idle counts-only report: %v", q)
	}
}

// TestLoadAwareAllocs: the lookup path with load-awareness active
// allocates nothing once its scratch is warm.
func TestLoadAwareAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	for i := 0; i < 8; i++ {
		n := fmt.Sprintf("r%d", i)
		x.chain(n, now, 0, 1, 2, 3, uint64(10+i))
		x.load(n, now, int32(i), 4, int64(1000*i))
	}
	reqs := []LookupRequest{chainReq(1, 2, 3, 10), chainReq(1, 2, 3, 17), chainReq(77, 78)}
	res := &LookupResult{}
	seed := []byte("seed")
	run := func() {
		for i := range reqs {
			req := &reqs[i]
			req.TenantID, req.ModelID, req.HashScheme = "team", "m", "vllm"
			x.e.LookupRoute(req, now, res)
			var pick ContractPick
			if res.Strategy == StrategyPrefixMatch {
				pick = PickOfScore(&res.Scores[0])
			} else {
				_, pick, _ = x.e.AffinityPick(res, "team", "m", "vllm", seed, AffinityContract)
			}
			if x.e.AdviseByLoad(req, now, res, pick, 64) == LoadExplore {
				_, pick, _ = x.e.AffinityPick(res, "team", "m", "vllm", seed, AffinityExplore)
			}
			x.e.NoteRouted(res, pick, 16, now)
		}
	}
	run()
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Fatalf("load-aware lookup allocates %v times per run", n)
	}
}

// TestLoadHostileFigures: producer and gateway figures at their extremes
// (int32 request counts, huge token claims) neither wrap nor poison the
// estimates: a saturated replica is overloaded, not idle, and one routed
// request adds at most maxRoutedTokens.
func TestLoadHostileFigures(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	x.chain("a", now, 0, 1, 2)
	x.chain("b", now, 0, 1, 2)
	x.load("a", now, math.MaxInt32, math.MaxInt32, math.MaxInt64)
	x.load("b", now, 0, 1, 0)
	if !x.e.lookupDomain("team", "m").loadActive.Load() {
		t.Fatal("int32-saturated counts did not activate load-awareness (wrapped negative?)")
	}
	_, d, first := x.advise(chainReq(1, 2), now)
	if d == LoadKeep || first != "b" {
		t.Fatalf("saturated a: decision %v first %q, want b", d, first)
	}
	res := &LookupResult{}
	x.e.LookupRoute(&LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(1), BlockTokenCounts: []int32{16}}, now, res)
	var bIdx int
	for i := range res.Scores {
		if res.Scores[i].ReplicaID == "b" {
			bIdx = i
		}
	}
	x.e.NoteRouted(res, PickOfScore(&res.Scores[bIdx]), math.MaxInt64, now)
	x.e.Loads(now, func(v LoadView) {
		if v.Replica == "b" && v.QueueTokens != maxRoutedTokens {
			t.Fatalf("one routed request with a huge claim: queue %v, want %d", v.QueueTokens, maxRoutedTokens)
		}
	})
}

// TestLoadExploreSurvivesFreedReplica: a load-reporting replica off the
// ring that is freed between the load view and the explore walk (an
// ALL_CLEARED in between) is still named from the view, never a panic.
func TestLoadExploreSurvivesFreedReplica(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	x.chain("hot", now, 0, 1, 2, 3)
	x.load("hot", now, 0, 12, 0)
	x.load("idle-a", now, 0, 0, 0)
	x.load("idle-b", now, 0, 0, 0)
	req := chainReq(1, 2, 3, 4)
	req.TenantID, req.ModelID, req.HashScheme = "team", "m", "vllm"
	res := &LookupResult{}
	x.e.LookupRoute(&req, now, res)
	if d := x.e.AdviseByLoad(&req, now, res, PickOfScore(&res.Scores[0]), 64); d != LoadExplore {
		t.Fatalf("decision %v, want explore", d)
	}
	for _, r := range []string{"idle-a", "idle-b"} {
		x.e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: "team", ModelID: "m", ReplicaID: r}, now)
	}
	x.e.Sweep(now + replicaQuarantineUs + 1) // frees the cleared replicas' ids
	name, _, ok := x.e.AffinityPick(res, "team", "m", "vllm", []byte("seed"), AffinityExplore)
	if !ok || name != "idle-a" {
		t.Fatalf("pick %q %v, want idle-a from the view", name, ok)
	}
}

// TestLoadCountsOnlyEqualFigures: engines reporting equal waiting and
// running counts (no queued tokens) are equally loaded even when the
// requests routed to them had very different sizes: a waiting request is
// priced at one mean for the whole domain.
func TestLoadCountsOnlyEqualFigures(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	x.chain("a", now, 0, 1, 2, 3, 4)
	x.chain("b", now, 0, 1, 2, 3, 4)
	x.load("a", now, 6, 3, -1)
	x.load("b", now, 6, 3, -1)
	for i, size := range []int64{2000, 10} { // a gets big requests, b tiny ones
		name := []string{"a", "b"}[i]
		res := &LookupResult{}
		x.e.LookupRoute(&LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(1), BlockTokenCounts: []int32{16}}, now, res)
		for j := range res.Scores {
			if res.Scores[j].ReplicaID == name {
				for range 20 {
					x.e.NoteRouted(res, PickOfScore(&res.Scores[j]), size, now)
				}
			}
		}
	}
	// New reports with the same figures and nothing carried (the engines
	// were idle in between): the queues must be equal again.
	x.load("a", now, 0, 0, -1)
	x.load("b", now, 0, 0, -1)
	x.load("a", now, 6, 3, -1)
	x.load("b", now, 6, 3, -1)
	q := map[string]float64{}
	x.e.Loads(now, func(v LoadView) { q[v.Replica] = v.QueueTokens })
	if q["a"] != q["b"] || q["a"] == 0 {
		t.Fatalf("equal counts priced differently: %v", q)
	}
	if _, d, first := x.advise(chainReq(1, 2, 3, 4), now); d != LoadKeep || first != "a" {
		t.Fatalf("equal counts: decision %v first %q, want the contract's a", d, first)
	}
}

// loadP reports replica's load and pressure in one stats report at now.
func (x *tix) loadP(replica string, now int64, waiting, running int32, queued int64, pressure float32) {
	x.e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: replica, TimestampUs: now,
		Stats: &ReplicaStats{Pressure: pressure, Load: LoadStats{Reported: true, Waiting: waiting, Running: running, QueuedTokens: queued}}}, now)
}

// TestLoadPickComparesEveryCheaperOption: the contract's pick yields when
// any option is both cheaper and has a shorter queue, not only the
// cheapest one. Here the cheapest option (b, the longest match, ranked
// below a by the contract because of its pressure) has a longer queue than
// the pick a, while d is cheaper than a and has a shorter queue.
func TestLoadPickComparesEveryCheaperOption(t *testing.T) {
	x := newLoadTix(t, uniformLoadConfig())
	now := tT
	blocks := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	x.chain("a", now, 0, blocks[:8]...)
	x.chain("b", now, 0, blocks...)
	x.chain("d", now, 0, blocks[:6]...)
	x.chain("e", now, 0, 999) // serves the scheme, holds nothing of the request
	// Queues in prefill tokens; equal requests in flight, so nobody is
	// overloaded. Costs (α = 16, 160-token prompt): a 20000 + 16×32 =
	// 20512, b 20010 + 0 = 20010, d 19000 + 16×64 = 20024; exploring costs
	// 19000 + 16×160 = 21560.
	x.loadP("a", now, 4, 1, 20000, 0)
	x.loadP("b", now, 4, 1, 20010, 0.5) // halves b's contract score below a's
	x.loadP("d", now, 4, 1, 19000, 0)
	x.loadP("e", now, 4, 1, 30000, 0)
	if c := x.lookup(chainReq(blocks...)); c.Strategy != StrategyPrefixMatch || c.Scores[0].ReplicaID != "a" {
		t.Fatalf("setup: the contract's pick is not a: %+v", c.Scores)
	}
	res, d, first := x.advise(chainReq(blocks...), now)
	if d != LoadRerank || first != "b" {
		t.Fatalf("decision %v first %q, want rerank with b first (d is cheaper than a and has a shorter queue; scores %+v)", d, first, res.Scores)
	}
	var order []string
	var scores []float32
	for _, s := range res.Scores {
		order = append(order, s.ReplicaID)
		scores = append(scores, s.Score)
	}
	// Advantages over exploring: b 21560 − 20010, d 21560 − 20024, a 21560 − 20512.
	if want, wantS := []string{"b", "d", "a"}, []float32{1550, 1536, 1048}; !slices.Equal(order, want) || !slices.Equal(scores, wantS) {
		t.Fatalf("ranked %v scores %v, want %v %v", order, scores, want, wantS)
	}
}

// TestLoadPriceUnroutedLookupsBounded: lookups that are never routed
// (retries, probes, hedges, huge prompts never sent) move the price of a
// waiting request by a bounded amount however many there are: the price
// of a counts-only report must not follow a gateway's claims without
// evidence that replicas prefilled them.
func TestLoadPriceUnroutedLookupsBounded(t *testing.T) {
	for _, n := range []int{100, 10_000} {
		x := newLoadTix(t, DefaultLoadConfig())
		now := tT
		next := uint64(1000)
		for _, r := range []string{"a", "b"} {
			x.chain(r, now, 0, 1)
			// A first prefill's KV events: 20 blocks of 16 tokens.
			var hs []uint64
			for range 20 {
				hs = append(hs, next)
				next++
			}
			x.chain(r, now, 0, hs...)
		}
		x.load("a", now, 3, 1, -1)
		x.load("b", now, 3, 1, -1)
		price := func() float64 { return meanRequestTokens(x.e.lookupDomain("team", "m").replicaSlots()) }
		route := func(replica string, uncached int64) {
			res := &LookupResult{}
			x.e.LookupRoute(&LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(1), BlockTokenCounts: []int32{16}}, now, res)
			for i := range res.Scores {
				if res.Scores[i].ReplicaID == replica {
					x.e.NoteRouted(res, PickOfScore(&res.Scores[i]), uncached, now)
					return
				}
			}
			t.Fatalf("%s holds nothing of the request", replica)
		}
		// Real traffic: every request routed is then prefilled, and its
		// KV events show 320 new tokens stored (20 blocks of 16).
		for range 40 {
			for _, r := range []string{"a", "b"} {
				route(r, 320)
				var hs []uint64
				for range 20 {
					hs = append(hs, next)
					next++
				}
				x.chain(r, now, 0, hs...)
			}
		}
		p0 := price()
		if math.Abs(p0-320) > 1 {
			t.Fatalf("price after real traffic %v, want 320", p0)
		}
		// n lookups for a with the longest prompt a lookup resolves, never
		// sent: nothing new is stored.
		for range n {
			route("a", maxRoutedTokens)
		}
		p := price()
		t.Logf("%d unrouted lookups: price %.1f -> %.1f", n, p0, p)
		if p > 2*p0 {
			t.Fatalf("%d unrouted lookups moved the price from %v to %v (> 2×)", n, p0, p)
		}
		// Sent requests bring it back: their prefills pay for their samples.
		for range 100 {
			route("a", 320)
			var hs []uint64
			for range 20 {
				hs = append(hs, next)
				next++
			}
			x.chain("a", now, 0, hs...)
		}
		if p := price(); math.Abs(p-p0) > 0.05*p0 {
			t.Fatalf("price %v after real traffic resumed, want about %v", p, p0)
		}
	}
	// A replica with no price yet: the first sample counts at most 8× what
	// KV events showed it storing, and the rest find no budget.
	x := newLoadTix(t, DefaultLoadConfig())
	x.chain("c", tT, 0, 1, 2) // 32 tokens stored
	x.load("c", tT, 3, 1, -1)
	res := &LookupResult{}
	for range 1000 {
		x.e.LookupRoute(&LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(1), BlockTokenCounts: []int32{16}}, tT, res)
		x.e.NoteRouted(res, PickOfScore(&res.Scores[0]), maxRoutedTokens, tT)
	}
	if p := meanRequestTokens(x.e.lookupDomain("team", "m").replicaSlots()); p > priceRefill*32 {
		t.Fatalf("1000 unrouted lookups against a replica without a price: price %v, want at most %d", p, priceRefill*32)
	}
}

// view returns replica's LoadView (the figures routing uses).
func (x *tix) view(replica string, now int64) LoadView {
	x.t.Helper()
	var v LoadView
	found := false
	x.e.Loads(now, func(l LoadView) {
		if l.Replica == replica {
			v, found = l, true
		}
	})
	if !found {
		x.t.Fatalf("no load view for %s", replica)
	}
	return v
}

// TestRequestStartedFinished: what an endpoint picker sees reaches the
// in-flight estimate at once (the overload guard acts on it between
// reports), finished requests leave it, a request the lookup counted as
// routed and the picker then started counts once, and the live count is
// never negative.
func TestRequestStartedFinished(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	x.chain("a", now, 0, 1, 2, 3, 4)
	x.chain("b", now, 0, 1, 2, 3)
	x.chain("c", now, 0, 1, 2, 3)
	for _, r := range []string{"a", "b", "c"} {
		x.load(r, now, 0, 4, 0) // 4 in flight each: active, nobody overloaded
	}
	req := chainReq(1, 2, 3, 4)
	if _, d, first := x.advise(req, now); d != LoadKeep || first != "a" {
		t.Fatalf("setup: decision %v first %q, want the contract's a", d, first)
	}
	// 20 requests the picker sent to a: 24 in flight exceeds
	// max(1.5 × 10.7 + 2√10.7, 4) = 22.5, so a yields to b.
	for range 20 {
		x.e.RequestStarted("team", "m", "a", now)
	}
	if v := x.view("a", now); v.InFlight != 24 || v.Live != 20 || v.StartedSinceReport != 20 {
		t.Fatalf("after 20 starts: %+v", v)
	}
	if _, d, first := x.advise(req, now); d == LoadKeep || first == "a" {
		t.Fatalf("24 in flight on a: decision %v first %q, want a to yield", d, first)
	}
	// They end: a is back to what its engine reported.
	for range 20 {
		x.e.RequestFinished("team", "m", "a", now)
	}
	if v := x.view("a", now); v.InFlight != 4 || v.Live != 0 {
		t.Fatalf("after 20 ends: %+v", v)
	}
	if _, d, first := x.advise(req, now); d != LoadKeep || first != "a" {
		t.Fatalf("after the ends: decision %v first %q, want the contract's a", d, first)
	}
	// A request the lookup counted as routed and the picker then started
	// counts once.
	res := &LookupResult{}
	req.TenantID, req.ModelID, req.HashScheme = "team", "m", "vllm"
	x.e.LookupRoute(&req, now, res)
	x.e.NoteRouted(res, PickOfScore(&res.Scores[0]), 64, now)
	if v := x.view("a", now); v.InFlight != 5 || v.RoutedSinceReport != 1 {
		t.Fatalf("after one routed lookup: %+v", v)
	}
	x.e.RequestStarted("team", "m", "a", now)
	if v := x.view("a", now); v.InFlight != 5 || v.RoutedSinceReport != 0 || v.Live != 1 {
		t.Fatalf("the routed request, started: %+v (want 5 in flight, counted once)", v)
	}
	// Ends with no start (the replica was unknown when the request
	// started): the live count stays at zero, never below.
	x.e.RequestFinished("team", "m", "a", now)
	for range 3 {
		x.e.RequestFinished("team", "m", "b", now)
	}
	if v := x.view("b", now); v.Live != 0 || v.InFlight != 1 {
		t.Fatalf("b after 3 ends without a start: %+v (want live 0, 4 reported − 3 ended)", v)
	}
	x.e.RequestStarted("team", "m", "b", now)
	if v := x.view("b", now); v.Live != 1 {
		t.Fatalf("b after the ends and one start: live %d, want 1", v.Live)
	}
	// A report resets the since-report counts (its figures include them)
	// and keeps the live count within what the engine can have in flight.
	for range 9 {
		x.e.RequestStarted("team", "m", "c", now)
	}
	x.load("c", now, 0, 12, 0)
	if v := x.view("c", now); v.InFlight != 12 || v.Live != 9 || v.StartedSinceReport != 0 {
		t.Fatalf("c after a report that includes its 9 starts: %+v", v)
	}
	// The engine says 3 in flight and nothing started since: 6 of the
	// picker's live requests must have ended without RequestFinished.
	x.load("c", now, 0, 3, 0)
	if v := x.view("c", now); v.Live != 3 || v.InFlight != 3 {
		t.Fatalf("c after a report below its live count: %+v, want live 3", v)
	}
}

// TestRequestStartedNoOps: calls naming what the index does not know leave
// no trace (ids come from requests), and none count while load-aware
// routing is off.
func TestRequestStartedNoOps(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	x.chain("a", now, 0, 1)
	x.load("a", now, 0, 4, 0)
	for _, c := range [][3]string{{"nobody", "m", "a"}, {"team", "other", "a"}, {"team", "m", "zz"}, {"", "", ""}} {
		x.e.RequestStarted(c[0], c[1], c[2], now)
		x.e.RequestFinished(c[0], c[1], c[2], now)
	}
	if x.e.lookupDomain("nobody", "m") != nil || x.e.lookupDomain("team", "other") != nil {
		t.Fatal("a call for an unknown tenant or model created a domain")
	}
	if x.e.lookupDomain("team", "m").table().find("zz") != nil {
		t.Fatal("a call for an unknown replica created it")
	}
	if v := x.view("a", now); v.InFlight != 4 || v.Live != 0 || v.StartedSinceReport != 0 || v.FinishedSinceReport != 0 {
		t.Fatalf("a moved: %+v", v)
	}
	off := DefaultLoadConfig()
	off.Enabled = false
	y := newLoadTix(t, off)
	y.chain("a", now, 0, 1)
	y.load("a", now, 0, 4, 0)
	y.e.RequestStarted("team", "m", "a", now)
	if v := y.view("a", now); v.Live != 0 || v.StartedSinceReport != 0 {
		t.Fatalf("load-aware routing off counted a start: %+v", v)
	}
}

// TestRequestStartedKeepsLightLoadExact: activation stays driven by
// engine reports only. However many requests a picker starts against an
// idle fleet, answers stay the contract's until an engine reports load.
func TestRequestStartedKeepsLightLoadExact(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	x.chain("a", now, 0, 1, 2, 3)
	x.chain("b", now, 0, 1, 2)
	x.load("a", now, 0, 1, 0)
	x.load("b", now, 0, 0, 0)
	for range 500 {
		x.e.RequestStarted("team", "m", "a", now)
	}
	if x.e.lookupDomain("team", "m").loadActive.Load() {
		t.Fatal("picker starts activated load-awareness")
	}
	req := chainReq(1, 2, 3)
	contract := x.lookup(req)
	res, d, first := x.advise(req, now)
	if d != LoadKeep || first != "a" || !slices.Equal(res.Scores, contract.Scores) {
		t.Fatalf("decision %v first %q scores %+v, want the contract's %+v", d, first, res.Scores, contract.Scores)
	}
}

// TestRequestStartedAllocs: the picker's calls allocate nothing.
func TestRequestStartedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	names := []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"}
	for _, n := range names {
		x.chain(n, now, 0, 1)
		x.load(n, now, 1, 4, 100)
	}
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		name := names[i%len(names)]
		i++
		x.e.RequestStarted("team", "m", name, now)
		x.e.RequestFinished("team", "m", name, now)
		x.e.RequestStarted("team", "m", "unknown", now)
		x.e.RequestFinished("nobody", "m", name, now)
	}); n != 0 {
		t.Fatalf("RequestStarted/RequestFinished allocate %v times per run", n)
	}
}

// TestRequestStartedConcurrent: pickers on many goroutines, lookups and
// load reports at once (run with -race). Once every request ended and a
// report came, the live counts are zero and the estimate is the report's.
func TestRequestStartedConcurrent(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	names := []string{"r0", "r1", "r2", "r3"}
	for _, n := range names {
		x.chain(n, now, 0, 1, 2)
		x.load(n, now, 2, 4, 100)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				n := names[(g+i)%len(names)]
				x.e.RequestStarted("team", "m", n, now)
				if i%3 == 0 {
					x.e.RequestStarted("team", "m", "ghost", now)
				}
				x.e.RequestFinished("team", "m", n, now)
			}
		})
	}
	wg.Go(func() {
		res := &LookupResult{}
		req := chainReq(1, 2)
		req.TenantID, req.ModelID, req.HashScheme = "team", "m", "vllm"
		for range 2000 {
			x.e.LookupRoute(&req, now, res)
			if len(res.Scores) > 0 {
				pick := PickOfScore(&res.Scores[0])
				x.e.AdviseByLoad(&req, now, res, pick, 32)
				x.e.NoteRouted(res, pick, 32, now)
			}
		}
	})
	wg.Go(func() {
		for i := range 200 {
			x.load(names[i%len(names)], now, int32(i%5), 4, 100)
		}
	})
	wg.Wait()
	for _, n := range names {
		x.load(n, now, 1, 2, 100)
		if v := x.view(n, now); v.Live != 0 || v.InFlight != 3 {
			t.Fatalf("%s after every request ended and a report: %+v", n, v)
		}
	}
}

// TestLoadEvictionShare: a replica with room in its cache (fewer keys than
// the fullest replica) weighs uncached tokens less, by the eviction share:
// here b's shorter match on a shorter queue wins only because b's cache is
// nearly empty, while a's is full.
func TestLoadEvictionShare(t *testing.T) {
	for _, c := range []struct {
		share float64
		want  string
	}{{0, "a"}, {DefaultEvictionShare, "b"}} {
		cfg := DefaultLoadConfig()
		cfg.EvictionShare = c.share
		x := newLoadTix(t, cfg)
		now := tT
		blocks := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
		x.chain("a", now, 0, blocks[:8]...)
		for k := range uint64(100) {
			x.chain("a", now, 0, 1000+k)
		}
		x.chain("b", now, 0, blocks[:6]...)
		now += 1000
		// Uniform (α = 16): a 1000 + 16×32 = 1512, b 900 + 16×64 = 1924.
		// Share 0.75: b's weight 16 × (1 − 0.75 × (1 − 6/108)) ≈ 4.67, so
		// b costs about 1199.
		x.load("a", now, 2, 2, 1000)
		x.load("b", now, 2, 2, 900)
		if _, d, pin := x.advise(chainReq(blocks...), now); pin != c.want {
			t.Fatalf("share %v: decision %v to %q, want %q", c.share, d, pin, c.want)
		}
	}
	// The live key count dips while a prefill runs (the engine evicted for
	// it and stores its blocks when it completes): the high-water mark of
	// the reports keeps the replica full.
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	for k := range uint64(100) {
		x.chain("a", now, 0, k)
	}
	x.load("a", now, 0, 0, 0)
	for k := range uint64(40) {
		x.e.ApplyEvent(&Event{Type: EventPrefixEvicted, TenantID: "team", ModelID: "m", ReplicaID: "a", PrefixHash: h8(k), TimestampUs: now}, now)
	}
	x.load("a", now+1_000_000, 0, 0, 0)
	r := x.e.lookupDomain("team", "m").table().find("a")
	if got := r.occupancy(); got < 99 {
		t.Fatalf("occupancy %d after a dip from 100 to 60 keys, want the high-water mark (~99.5)", got)
	}
}

// TestLoadEvictionShareRoom: the eviction share discounts only the tokens
// a replica's room can take (the keys it holds fewer than the fullest
// one's); past them a prompt evicts there too. A 300-block prompt that no
// replica holds more than a block of goes to the full replica with the
// short queue, not to the one with 102 blocks of room and a queue 30,000
// tokens longer: pricing all of it at the roomy replica's discounted
// weight would have sent it there (about 53,000 against 77,500).
func TestLoadEvictionShareRoom(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	now := tT
	prompt := make([]uint64, 300)
	for i := range prompt {
		prompt[i] = uint64(i + 1)
	}
	x.chain("c", now, 0, 1) // the contract's pick: one block of the prompt
	for k := range uint64(107) {
		x.chain("a", now, 0, 5000+k)
		x.chain("c", now, 0, 6000+k)
	}
	x.chain("a", now, 0, 4999)
	for k := range uint64(6) {
		x.chain("b", now, 0, 7000+k)
	}
	now += 1000
	x.load("a", now, 2, 2, 1000)
	x.load("b", now, 2, 2, 31000)
	x.load("c", now, 2, 2, 40000)
	// a: 1000 + 16 × 4800 = 77,800. b: its weight 16 × (1 − 0.75 × (1 −
	// 6/108)) ≈ 4.67 for 102 × 16 = 1632 tokens, 16 for the other 3168:
	// 31,000 + 7,600 + 50,700 ≈ 89,300. c: 40,000 + 16 × 4800 (one block
	// is under --load-min-match).
	if _, d, pin := x.advise(chainReq(prompt...), now); pin != "a" {
		t.Fatalf("decision %v to %q, want a", d, pin)
	}
}

// TestLoadTieGoesToFewerInFlight: replicas that hold the same prefix and
// queue the same prefill are as cheap as each other whatever the age of
// their entries (freshness is the contract's confidence, not prefill it
// saves), so the one with fewer requests in flight takes the request: its
// prefill runs beside fewer decodes. Among equally light ones the ring
// order from the contract's pick decides, so ties spread the way pins do.
// Equal loads keep the contract's answer.
func TestLoadTieGoesToFewerInFlight(t *testing.T) {
	blocks := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	cases := []struct {
		name     string
		running  [3]int32 // a, b, c
		queued   [3]int64
		decision LoadDecision
		first    string
	}{
		// b stored the prefix last (the contract's pick); a and c are as
		// light, and c comes first after b in name order.
		{"the lighter holders take it, next in ring order", [3]int32{2, 6, 2}, [3]int64{0, 0, 0}, LoadRerank, "c"},
		// a's entries are 20 minutes old (freshness 1/3): still as cheap.
		{"an older entry is as cheap", [3]int32{2, 6, 6}, [3]int64{0, 0, 0}, LoadRerank, "a"},
		{"one request fewer is enough", [3]int32{5, 6, 6}, [3]int64{0, 0, 0}, LoadRerank, "a"},
		{"equal loads keep the contract", [3]int32{4, 4, 4}, [3]int64{0, 0, 0}, LoadKeep, "b"},
		{"a longer queue is not lighter", [3]int32{2, 6, 2}, [3]int64{300, 0, 300}, LoadKeep, "b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := newLoadTix(t, uniformLoadConfig())
			now := tT
			x.chain("a", now-20*min1, 0, blocks...)
			x.chain("c", now-5*min1, 0, blocks...)
			x.chain("b", now, 0, blocks...)
			x.chain("d", now, 0, 999) // serves the scheme, holds none of the prompt
			for i, name := range []string{"a", "b", "c"} {
				x.load(name, now, 0, tc.running[i], tc.queued[i])
			}
			x.load("d", now, 0, 4, 0)
			res, d, first := x.advise(chainReq(blocks...), now)
			if d != tc.decision || first != tc.first {
				t.Fatalf("decision %v first %q, want %v %q (scores %+v)", d, first, tc.decision, tc.first, res.Scores)
			}
			if d == LoadKeep && (res.Scores[0].ReplicaID != "b" || res.Scores[0].Prob != 1) {
				t.Fatalf("kept answer changed: %+v", res.Scores)
			}
			for i := 1; i < len(res.Scores); i++ {
				if res.Scores[i].Score > res.Scores[i-1].Score {
					t.Fatalf("scores not monotone: %+v", res.Scores)
				}
			}
		})
	}
}
