package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/policy"
)

// Hand-computed cases for every strategy path and every score factor
// (contract §2.2 step 8 and §3). TTL is the default 30 min unless a case
// pushes a policy.

const (
	tT   = int64(1_800_000_000_000_000) // "now" in µs
	min1 = int64(60_000_000)
)

func h8(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func chainOf(vs ...uint64) [][]byte {
	var out [][]byte
	for _, v := range vs {
		out = append(out, h8(v))
	}
	return out
}

func sixteens(n int) []int32 {
	c := make([]int32, n)
	for i := range c {
		c[i] = 16
	}
	return c
}

// tix is a small fixture: an engine plus helpers to report state.
type tix struct {
	t     *testing.T
	e     *Engine
	store *policy.Store
}

func newTix(t *testing.T) *tix {
	store := policy.NewStore()
	return &tix{t: t, e: New(Config{Policies: store}), store: store}
}

func (x *tix) chain(replica string, ts int64, tier int32, hashes ...uint64) {
	x.chainIn("team", "m", "vllm", "", replica, ts, tier, hashes...)
}

func (x *tix) chainIn(tenant, model, scheme, adapter, replica string, ts int64, tier int32, hashes ...uint64) {
	x.e.Ingest(&Update{TenantID: tenant, ModelID: model, HashScheme: scheme, ReplicaID: replica, TimestampUs: ts,
		Prefixes: []PrefixEntry{{BlockHashes: chainOf(hashes...), BlockTokenCounts: sixteens(len(hashes)), Tier: tier, AdapterID: adapter}}}, tT)
}

func (x *tix) legacy(replica string, ts int64, hash uint64, tokens int32) {
	x.e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: replica, TimestampUs: ts,
		Prefixes: []PrefixEntry{{PrefixHash: h8(hash), TokenCount: tokens}}}, tT)
}

func (x *tix) stats(replica string, ts int64, hit, pressure float32) {
	x.e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: replica, TimestampUs: ts,
		Stats: &ReplicaStats{HitRate: hit, Pressure: pressure}}, tT)
}

func (x *tix) lookup(req LookupRequest) *LookupResult {
	if req.TenantID == "" && req.ModelID == "" {
		req.TenantID, req.ModelID, req.HashScheme = "team", "m", "vllm"
	}
	res := &LookupResult{}
	x.e.LookupRoute(&req, tT, res)
	return res
}

func chainReq(hashes ...uint64) LookupRequest {
	return LookupRequest{BlockHashes: chainOf(hashes...), BlockTokenCounts: sixteens(len(hashes))}
}

type wantScore struct {
	id      string
	score   float64
	matched int32
	prob    float64
	tier    int32
}

func (x *tix) expect(res *LookupResult, strategy Strategy, want ...wantScore) {
	x.t.Helper()
	if res.Strategy != strategy || len(res.Scores) != len(want) {
		x.t.Fatalf("got %v with %+v, want %v with %d scores", res.Strategy, res.Scores, strategy, len(want))
	}
	for i, w := range want {
		s := res.Scores[i]
		if s.ReplicaID != w.id || s.MatchedTokens != w.matched || s.Tier.Wire() != w.tier ||
			math.Abs(float64(s.Score)-w.score) > 1e-4 || math.Abs(float64(s.Prob)-w.prob) > 1e-6 {
			x.t.Fatalf("score %d: got %+v, want %+v", i, s, w)
		}
	}
}

func TestStrategyPaths(t *testing.T) {
	t.Run("empty keys and malformed chains are NO_HINT", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT, 0, 1, 2)
		for _, req := range []LookupRequest{
			{TenantID: "", ModelID: "m", HashScheme: "vllm", PrefixHash: h8(1)},
			{TenantID: "team", ModelID: "", HashScheme: "vllm", PrefixHash: h8(1)},
			{TenantID: "team", ModelID: "m", HashScheme: "", PrefixHash: h8(1)},
			{TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(1, 2), BlockTokenCounts: []int32{16}},
			{TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockTokenCounts: []int32{16}},
		} {
			x.expect(x.lookup(req), StrategyNone)
		}
	})
	t.Run("cold start is NO_HINT, not UNKNOWN_TENANT", func(t *testing.T) {
		x := newTix(t)
		x.expect(x.lookup(chainReq(1)), StrategyNone)
		// The probe tenant's transient state does not end the cold start.
		x.e.Ingest(&Update{TenantID: policy.ReservedTenantID, ModelID: "m", HashScheme: "vllm", ReplicaID: "__probe-x",
			Prefixes: []PrefixEntry{{BlockHashes: chainOf(9), BlockTokenCounts: sixteens(1)}}}, tT)
		x.expect(x.lookup(chainReq(1)), StrategyNone)
	})
	t.Run("miss classifier, outermost key first", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT, 0, 1, 2)
		x.expect(x.lookup(LookupRequest{TenantID: "other", ModelID: "m", HashScheme: "vllm", PrefixHash: h8(1)}), StrategyUnknownTenant)
		x.expect(x.lookup(LookupRequest{TenantID: "team", ModelID: "other", HashScheme: "vllm", PrefixHash: h8(1)}), StrategyUnknownModel)
		x.expect(x.lookup(LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "sglang", PrefixHash: h8(1)}), StrategyUnknownHashScheme)
		x.expect(x.lookup(chainReq(99)), StrategyNone) // known scope, novel prefix
		x.expect(x.lookup(LookupRequest{TenantID: "other", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(1), BlockTokenCounts: sixteens(1)}), StrategyUnknownTenant)
	})
	t.Run("chain match: weakest link, per-depth distinguishing power", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT-6*min1, 0, 1, 2, 3) // age 6 min: freshness 1 - 360/1800 = 0.8
		x.chain("b", tT, 0, 1, 2)
		x.chain("c", tT, 0, 50) // serves the scope, holds nothing matching: total = 3
		// a: 48 tokens, matching {a} = 1 -> dp 2/3: 48 * 0.8 * 2/3 = 25.6
		// b: 32 tokens, matching {a, b} = 2 -> dp 1/3: 32 * 1 * 1/3
		x.expect(x.lookup(chainReq(1, 2, 3)), StrategyPrefixMatch,
			wantScore{"a", 25.6, 48, 0.8, 1}, wantScore{"b", 32.0 / 3, 32, 1, 1})
	})
	t.Run("oldest lastSeen over the run, stale block finalizes", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT, 0, 1)
		x.chain("a", tT-6*min1, 0, 1, 2) // block 1 refreshed to -6 min too (same replica rewrite)
		x.chain("a", tT, 0, 1)           // block 1 back to now; block 2 stays at -6 min
		x.chain("b", tT-31*min1, 0, 1)   // stale: never seeds
		x.chain("b", tT, 0, 99)
		x.chain("c", tT, 0, 1)
		x.chain("c", tT-31*min1, 0, 2)
		x.chain("c", tT, 0, 3)
		// a: blocks 1(now), 2(-6min), 3 missing -> 32 tokens, freshness 0.8
		// c: block 2 stale -> finalized after block 1: 16 tokens, freshness 1
		// total serving = 3 (a, b, c): a matching 1 -> 2/3; c matching 2 -> 1/3
		x.expect(x.lookup(chainReq(1, 2, 3)), StrategyPrefixMatch,
			wantScore{"a", 32 * 0.8 * 2.0 / 3, 32, 0.8, 1}, wantScore{"c", 16.0 / 3, 16, 1, 1})
	})
	t.Run("pressure only from fresh stats, SLO bias only strictly below 200 ms", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT, 0, 1, 2)
		x.chain("b", tT, 0, 1)
		x.chain("c", tT, 0, 7)
		x.chain("d", tT, 0, 8)
		x.stats("a", tT, 0.5, 0.25)        // fresh: factor 0.75
		x.stats("b", tT-31*min1, 0.5, 0.9) // stale payload: factor 1
		x.e.ApplyEvent(&Event{Type: EventReplicaUpdated, TenantID: "team", ModelID: "m", ReplicaID: "b", TimestampUs: tT}, tT)
		// total 4; a: 32 tok, matching 1 -> 3/4; b: 16 tok, matching 2 -> 1/2
		x.expect(x.lookup(chainReq(1, 2)), StrategyPrefixMatch,
			wantScore{"a", 32 * 0.75 * 0.75, 32, 1, 1}, wantScore{"b", 16 * 0.5, 16, 1, 1})
		req := chainReq(1, 2)
		req.SLOTTFTMs = 100 // bias 1 + freshness(1) * 1 = 2
		x.expect(x.lookup(req), StrategyPrefixMatch,
			wantScore{"a", 32 * 0.75 * 0.75 * 2, 32, 1, 1}, wantScore{"b", 16 * 0.5 * 2, 16, 1, 1})
		req.SLOTTFTMs = 200 // not strictly below: no bias
		x.expect(x.lookup(req), StrategyPrefixMatch,
			wantScore{"a", 32 * 0.75 * 0.75, 32, 1, 1}, wantScore{"b", 16 * 0.5, 16, 1, 1})
	})
	t.Run("pressure clamps: NaN and Inf stats count as 0, pressure above 1 gives 0", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT, 0, 1)
		x.chain("b", tT, 0, 1)
		x.stats("a", tT, float32(math.NaN()), float32(math.Inf(1))) // clamped to 0: factor 1
		x.stats("b", tT, 0.5, 2)                                    // factor clamps to 0
		// total 2, matching 2 -> dp 0 for both: every replica holds it.
		x.expect(x.lookup(chainReq(1)), StrategyPrefixMatch, wantScore{"a", 0, 16, 1, 1}, wantScore{"b", 0, 16, 1, 1})
	})
	t.Run("tiers: coldest over the run, unknown values sort coldest and read back unspecified", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT, 1, 1)
		x.e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: "a", TimestampUs: tT,
			Prefixes: []PrefixEntry{{PrefixHash: h8(2), TokenCount: 32, Tier: 2}}}, tT)
		x.chain("b", tT, 0, 1)
		x.e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: "b", TimestampUs: tT,
			Prefixes: []PrefixEntry{{PrefixHash: h8(2), TokenCount: 32, Tier: 9}}}, tT)
		x.chain("c", tT, 0, 5)
		// both match 32 tokens over blocks 1 (T1) and 2: a's run is T2, b's unknown (reported 0)
		x.expect(x.lookup(chainReq(1, 2)), StrategyPrefixMatch,
			wantScore{"a", 32.0 / 3, 32, 1, 2}, wantScore{"b", 32.0 / 3, 32, 1, 0})
	})
	t.Run("distinguishing power edges: one serving replica keeps 1, all holding gives 0", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT, 0, 1)
		x.expect(x.lookup(chainReq(1)), StrategyPrefixMatch, wantScore{"a", 16, 16, 1, 1})
		x.chain("b", tT, 0, 1)
		x.expect(x.lookup(chainReq(1)), StrategyPrefixMatch, wantScore{"a", 0, 16, 1, 1}, wantScore{"b", 0, 16, 1, 1})
	})
	t.Run("exact path: stored token counts, uniform distinguishing power", func(t *testing.T) {
		x := newTix(t)
		x.legacy("a", tT, 77, 100)
		x.legacy("b", tT-9*min1, 77, 50) // freshness 0.7
		x.chain("c", tT, 0, 5)
		x.chain("d", tT, 0, 6)
		// total 4, matching 2 -> dp 1/2
		x.expect(x.lookup(LookupRequest{PrefixHash: h8(77)}), StrategyPrefixMatch,
			wantScore{"a", 100 * 0.5, 100, 1, 1}, wantScore{"b", 50 * 0.7 * 0.5, 50, 0.7, 1})
	})
	t.Run("a legacy entry matches chain block 0", func(t *testing.T) {
		x := newTix(t)
		x.legacy("a", tT, 1, 500)
		x.chain("b", tT, 0, 9)
		// matched comes from the request's counts on the chain path
		x.expect(x.lookup(chainReq(1, 2)), StrategyPrefixMatch, wantScore{"a", 16 * 0.5, 16, 1, 1})
	})
	t.Run("non-positive matched tokens are skipped", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT, 0, 1)
		x.chain("b", tT, 0, 2)
		x.expect(x.lookup(LookupRequest{BlockHashes: chainOf(1), BlockTokenCounts: []int32{0}}), StrategyNone)
	})
	t.Run("freshness edges: age == TTL is stale, future timestamps are fresh", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT-30*min1, 0, 1)
		x.chain("b", tT+min1, 0, 1)
		x.chain("c", tT, 0, 3)
		// b: freshness 1; total 3; matching 1 -> dp 2/3
		x.expect(x.lookup(chainReq(1)), StrategyPrefixMatch, wantScore{"b", 16 * 2.0 / 3, 16, 1, 1})
	})
	t.Run("adapter partitions are separate", func(t *testing.T) {
		x := newTix(t)
		x.chainIn("team", "m", "vllm", "lora-a", "a", tT, 0, 1)
		x.chainIn("team", "m", "vllm", "", "b", tT, 0, 1)
		x.chainIn("team", "m", "vllm", "", "c", tT, 0, 2)
		req := chainReq(1)
		req.AdapterID = "lora-a"
		// total counts every replica in (tenant, model, scheme): 3
		x.expect(x.lookup(req), StrategyPrefixMatch, wantScore{"a", 16 * 2.0 / 3, 16, 1, 1})
		x.expect(x.lookup(chainReq(1)), StrategyPrefixMatch, wantScore{"b", 16 * 2.0 / 3, 16, 1, 1})
	})
	t.Run("tenant hot: warm, recent, serving the scheme; never for chains", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT, 0, 1)
		x.chain("b", tT, 0, 2)
		x.chain("c", tT, 0, 3)
		x.chainIn("team", "m", "sglang", "", "d", tT, 0, 4)
		x.stats("a", tT-150_000_000, 0.5, 0.2) // recency 0.5, factor 0.8: 0.5*0.5*0.8
		x.stats("b", tT, 0.05, 0)              // below the 0.1 hit-rate floor
		x.stats("c", tT-6*min1, 0.9, 0)        // older than 5 min
		x.stats("d", tT, 0.9, 0)               // serves sglang only (pass 2)
		x.expect(x.lookup(LookupRequest{PrefixHash: h8(42)}), StrategyTenantHot, wantScore{"a", 0.2, 0, 0.5, 0})
		req := LookupRequest{PrefixHash: h8(42), SLOTTFTMs: 50} // bias 1 + recency 0.5
		x.expect(x.lookup(req), StrategyTenantHot, wantScore{"a", 0.3, 0, 0.5, 0})
		x.expect(x.lookup(chainReq(42)), StrategyNone)
	})
}

func TestAffinityHint(t *testing.T) {
	x := newTix(t)
	for _, r := range []string{"r2", "r0", "r1"} {
		x.chain(r, tT, 0, 1)
	}
	x.chainIn("team", "m", "sglang", "", "zz", tT, 0, 1)
	seed := []byte("seed bytes")
	sum := sha256.Sum256(seed)
	want := []string{"r0", "r1", "r2"}[binary.BigEndian.Uint64(sum[:8])%3]
	if got, ok := x.e.AffinityHint("team", "m", "vllm", seed); !ok || got != want {
		t.Fatalf("AffinityHint = %q, %v; want %q", got, ok, want)
	}
	for _, c := range [][4]string{{"team", "m", "", "x"}, {"team", "m", "vllm", ""}, {"team", "zz", "vllm", "x"}, {"team", "m", "other", "x"}} {
		if _, ok := x.e.AffinityHint(c[0], c[1], c[2], []byte(c[3])); ok {
			t.Fatalf("AffinityHint%v should fail", c)
		}
	}
}

func lfuBody(tenant string) *policy.Body {
	return &policy.Body{Version: 7, Policies: []policy.ResolvedPolicy{{Namespace: tenant, Eviction: "lfu"}}}
}

func TestCreditOnlyLFUAndDelivered(t *testing.T) {
	x := newTix(t)
	x.store.Apply(lfuBody("team"))
	x.chain("a", tT, 0, 1, 2, 3)
	x.chain("b", tT, 0, 1)
	res := x.lookup(chainReq(1, 2, 3))
	// Keep only "a" (as a matched-tokens floor of 32 would), then deliver.
	res.Scores = slices.DeleteFunc(res.Scores, func(s Score) bool { return s.MatchedTokens < 32 })
	x.e.Credit(res)
	x.e.Credit(res)
	counts := map[string]uint32{}
	for _, d := range x.e.dump() {
		counts[d.replica+string(d.key.hash)] = d.lfu
	}
	for i := uint64(1); i <= 3; i++ {
		if got := counts["a"+string(h8(i))]; got != 2 {
			t.Fatalf("a block %d credited %d times, want 2", i, got)
		}
	}
	if got := counts["b"+string(h8(1))]; got != 0 {
		t.Fatalf("b was filtered out but credited %d times", got)
	}
	// LRU tenants are never credited.
	y := newTix(t)
	y.chain("a", tT, 0, 1)
	res = y.lookup(chainReq(1))
	y.e.Credit(res)
	if d := y.e.dump(); d[0].lfu != 0 {
		t.Fatalf("LRU entry credited: %+v", d[0])
	}
}

func TestTierFromWire(t *testing.T) {
	for _, c := range []struct {
		in   int32
		want Tier
		wire int32
	}{{0, TierT1, 1}, {1, TierT1, 1}, {2, TierT2, 2}, {3, TierT3, 3}, {4, tierUnknown, 0}, {-1, tierInvalid, 0}} {
		got := TierFromWire(c.in)
		if got != c.want || got.Wire() != c.wire {
			t.Fatalf("TierFromWire(%d) = %v (wire %d), want %v (wire %d)", c.in, got, got.Wire(), c.want, c.wire)
		}
	}
	if coldest(TierT1, tierInvalid) != tierInvalid || coldest(tierUnknown, TierT3) != tierUnknown {
		t.Fatal("unknown and invalid tiers must sort coldest")
	}
}

func TestRankerDefaults(t *testing.T) {
	r := DefaultRanker()
	if r.PressureWeight != 1 || r.SLOTightTTFTMs != 200 || r.SLOTightBias != 1 || r.TenantHotMinHitRate != 0.1 || r.TenantHotMaxAge != 5*time.Minute {
		t.Fatalf("defaults %+v", r)
	}
}

func TestLegacyEntriesLinkSuccessors(t *testing.T) {
	x := newTix(t)
	// One legacy entry per block, in chain order (as the kvevent subscriber
	// reports), then an unrelated entry with a smaller count.
	x.e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: "a", TimestampUs: tT,
		Prefixes: []PrefixEntry{{PrefixHash: h8(1), TokenCount: 16}, {PrefixHash: h8(2), TokenCount: 32}, {PrefixHash: h8(3), TokenCount: 48}, {PrefixHash: h8(9), TokenCount: 16}}}, tT)
	node := func(v uint64) uint32 {
		k, _ := x.e.makeKey(h8(v))
		sc := x.e.lookupDomain("team", "m").findScheme("vllm").findScope("")
		return x.e.find(sc.table.Load(), sc.id, &k)
	}
	if x.e.w(node(1)+nNext) != node(2) || x.e.w(node(2)+nNext) != node(3) {
		t.Fatal("consecutive legacy entries were not linked")
	}
	if x.e.w(node(3)+nNext) != 0 {
		t.Fatal("an entry with a smaller token count was linked as a successor")
	}
	x.expect(x.lookup(chainReq(1, 2, 3)), StrategyPrefixMatch, wantScore{"a", 48, 48, 1, 1})
}
