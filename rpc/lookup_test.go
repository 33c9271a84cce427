package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// tokens returns n token ids 0..n-1 (offset by base).
func tokens(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

// tokenChain fingerprints toks at 16 tokens a block into wire hashes.
func tokenChain(toks []uint32) ([][]byte, []int32) {
	var hs [][]byte
	var cs []int32
	for _, h := range fingerprint.AppendChain(nil, toks, 16, 0, false) {
		hs = append(hs, fingerprint.AppendWire(nil, h))
		cs = append(cs, 16)
	}
	return hs, cs
}

// reasonEnv builds the shared fixture of TestLookupRouteReasonCodes: the
// policies below, the standard data set under each tenant, token-derived
// chains for r5, and an adapter-partitioned replica.
func reasonEnv(t *testing.T, load bool) *env { return reasonEnvAt(t, load, nil) }

// reasonEnvAt is reasonEnv with the service clock now (nil: the wall clock).
func reasonEnvAt(t *testing.T, load bool, now func() time.Time) *env {
	env := newEnv(t, envOpts{load: load, now: now})
	no, yes := ptr(false), ptr(true)
	env.policies(t,
		policy.ResolvedPolicy{Namespace: "noaff", AffinityRouting: no, MinimumMatchedTokens: 64},
		policy.ResolvedPolicy{Namespace: "reqchain", Strategy: &policy.LookupStrategy{RequireChain: yes}, MinimumMatchedTokens: 64},
		policy.ResolvedPolicy{Namespace: "timeout", LookupTimeoutMs: 50, MinimumMatchedTokens: 64},
		policy.ResolvedPolicy{Namespace: "tiny", MinimumPrefixTokens: 1000, MinimumMatchedTokens: 64},
		policy.ResolvedPolicy{Namespace: "tinynoaff", MinimumPrefixTokens: 1000, MinimumMatchedTokens: 64, AffinityRouting: no},
		policy.ResolvedPolicy{Namespace: "floor", MinimumMatchedTokens: 200, AffinityRouting: no},
		policy.ResolvedPolicy{Namespace: "flooraff", MinimumMatchedTokens: 200},
		policy.ResolvedPolicy{Namespace: "score", MinimumMatchedTokens: 64, RoutingFloorScore: ptr(float32(1000)), AffinityRouting: no},
		policy.ResolvedPolicy{Namespace: "optout", MinimumMatchedTokens: 0, RoutingFloorScore: ptr(float32(0))},
		policy.ResolvedPolicy{Namespace: "nohot", MinimumMatchedTokens: 64, Strategy: &policy.LookupStrategy{EnableTenantHot: no}},
		policy.ResolvedPolicy{Namespace: "nochain", MinimumMatchedTokens: 64, Strategy: &policy.LookupStrategy{EnableChainMatching: no}},
	)
	for _, tenant := range []string{"team", "noaff", "reqchain", "timeout", "tiny", "tinynoaff", "floor", "flooraff", "score", "optout", "nohot", "nochain", "tok"} {
		env.seed(t, tenant)
	}
	env.seedModel(t, "timeout", slowModel)
	env.seedModel(t, "team", slowModel)
	th, tc := tokenChain(tokens(0, 128))
	nowUs := time.Now().UnixMicro()
	for _, tenant := range []string{"tok", "nochain"} {
		env.report(t, &pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: "r5", TimestampUs: nowUs,
			Prefixes: []*pb.PrefixEntry{{BlockHashes: th, BlockTokenCounts: tc}}})
	}
	a, ac := chainOf(chainA, 8)
	env.report(t, &pb.CacheStateUpdate{TenantId: "lora", ModelId: model, HashScheme: scheme, ReplicaId: "r1", TimestampUs: nowUs,
		AdapterId: "lora1", Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}})
	return env
}

// TestLookupRouteReasonCodes drives every reason code and the precedence
// rules of contract §2.2 through a real gRPC client, with load-aware
// routing off and on (the server's default): without load reports the
// answers are the same.
func TestLookupRouteReasonCodes(t *testing.T) {
	for _, load := range []bool{false, true} {
		t.Run(fmt.Sprintf("load-aware=%v", load), func(t *testing.T) { testReasonCodes(t, load) })
	}
}

func testReasonCodes(t *testing.T, load bool) {
	env := reasonEnv(t, load)
	env.slow.delay = 150 * time.Millisecond

	a, ac := chainOf(chainA, 8)
	c, cc := chainOf(chainC, 2)
	miss := hashOf(chainC, 9)
	r123 := []string{"r1", "r2", "r3"}

	type tc struct {
		name    string
		req     *pb.LookupRouteRequest
		reason  string
		ids     []string // nil: must be empty
		adapter string
		noIndex bool // the index must not be consulted
		check   func(t *testing.T, r *pb.LookupRouteResponse)
	}
	req := func(tenant string, mod func(*pb.LookupRouteRequest)) *pb.LookupRouteRequest {
		r := &pb.LookupRouteRequest{TenantId: tenant, ModelId: model, HashScheme: scheme}
		if mod != nil {
			mod(r)
		}
		return r
	}
	withChain := func(hs [][]byte, cs []int32) func(*pb.LookupRouteRequest) {
		return func(r *pb.LookupRouteRequest) { r.BlockHashes, r.BlockTokenCounts = hs, cs }
	}
	cases := []tc{
		{
			name: "PREFIX_MATCH chain, matched-tokens floor drops the 32-token holder", req: req("team", withChain(a, ac)),
			reason: rpc.ReasonPrefixMatch, ids: []string{"r1"},
			check: func(t *testing.T, r *pb.LookupRouteResponse) {
				s := r.GetReplicaScores()[0]
				// 128 tokens x freshness ~1 x pressure 1 x distinguishing 2/3.
				if s.GetMatchedTokens() != 128 || math.Abs(float64(s.GetScore())-128*2.0/3) > 0.5 ||
					s.GetEstimatedCacheHitProb() < 0.99 || s.GetTier() != pb.CacheTier_CACHE_TIER_T1 {
					t.Fatalf("score = %v", s)
				}
			},
		},
		{
			name: "PREFIX_MATCH echoes the adapter partition", req: req("lora", func(r *pb.LookupRouteRequest) { withChain(a, ac)(r); r.AdapterId = "lora1" }),
			reason: rpc.ReasonPrefixMatch, ids: []string{"r1"}, adapter: "lora1",
		},
		{
			name: "TENANT_HOT on an exact miss with warm replicas", req: req("team", func(r *pb.LookupRouteRequest) { r.PrefixHash = miss }),
			reason: rpc.ReasonTenantHot, ids: r123,
			check: func(t *testing.T, r *pb.LookupRouteResponse) {
				for _, s := range r.GetReplicaScores() {
					if s.GetMatchedTokens() != 0 || s.GetEstimatedCacheHitProb() != 0.5 || s.GetTier() != pb.CacheTier_CACHE_TIER_UNSPECIFIED {
						t.Fatalf("tenant-hot score = %v", s)
					}
				}
			},
		},
		{
			name: "AFFINITY_HINT on a chain miss, seed = length-prefixed chain", req: req("team", withChain(c, cc)),
			reason: rpc.ReasonAffinityHint, ids: []string{affinityPick(r123, chainSeed(c))},
			check: checkAffinityZeros,
		},
		{
			name: "AFFINITY_HINT on a partition without data echoes the partition", req: req("lora", func(r *pb.LookupRouteRequest) { withChain(c, cc)(r); r.AdapterId = "lora-x" }),
			reason: rpc.ReasonAffinityHint, ids: []string{"r1"}, adapter: "lora-x",
		},
		{name: "NO_HINT on a miss with affinity disabled", req: req("noaff", withChain(c, cc)), reason: rpc.ReasonNoHint},
		{name: "NO_HINT on an unbalanced chain (fail open, before the index)", req: req("team", withChain(a, ac[:3])), reason: rpc.ReasonNoHint, noIndex: true},
		{name: "NO_HINT on counts without hashes", req: req("team", withChain(nil, ac)), reason: rpc.ReasonNoHint, noIndex: true},
		{name: "NO_HINT on an empty tenant", req: req("", withChain(a, ac)), reason: rpc.ReasonNoHint},
		{name: "NO_HINT on an empty model", req: func() *pb.LookupRouteRequest { r := req("team", withChain(a, ac)); r.ModelId = ""; return r }(), reason: rpc.ReasonNoHint},
		{name: "NO_HINT on an empty hash scheme", req: func() *pb.LookupRouteRequest { r := req("team", withChain(a, ac)); r.HashScheme = ""; return r }(), reason: rpc.ReasonNoHint},
		{name: "NO_HINT for the reserved probe tenant", req: req(policy.ReservedTenantID, withChain(a, ac)), reason: rpc.ReasonNoHint, noIndex: true},

		// UNKNOWN_* keep precedence over AFFINITY_HINT (affinity is on).
		{name: "UNKNOWN_TENANT over AFFINITY_HINT", req: req("ghost", withChain(a, ac)), reason: rpc.ReasonUnknownTenant},
		{name: "UNKNOWN_MODEL over AFFINITY_HINT", req: func() *pb.LookupRouteRequest { r := req("team", withChain(a, ac)); r.ModelId = "other"; return r }(), reason: rpc.ReasonUnknownModel},
		{name: "UNKNOWN_HASH_SCHEME over AFFINITY_HINT", req: func() *pb.LookupRouteRequest { r := req("team", withChain(a, ac)); r.HashScheme = "sglang"; return r }(), reason: rpc.ReasonUnknownHashScheme},

		// POLICY_REQUIRES_CHAIN runs on the wire fields, before resolution.
		{name: "POLICY_REQUIRES_CHAIN without a chain", req: req("reqchain", func(r *pb.LookupRouteRequest) { r.PrefixHash = a[7] }), reason: rpc.ReasonPolicyRequiresChain, noIndex: true},
		{name: "POLICY_REQUIRES_CHAIN for token_ids", req: req("reqchain", func(r *pb.LookupRouteRequest) { r.TokenIds = tokens(0, 128) }), reason: rpc.ReasonPolicyRequiresChain, noIndex: true},
		{name: "POLICY_REQUIRES_CHAIN for an unbalanced chain", req: req("reqchain", withChain(a, ac[:1])), reason: rpc.ReasonPolicyRequiresChain, noIndex: true},
		{name: "requireChain passes a valid chain", req: req("reqchain", withChain(a, ac)), reason: rpc.ReasonPrefixMatch, ids: []string{"r1"}},

		// TIMEOUT: the lookup takes 150 ms against a 50 ms budget.
		{name: "TIMEOUT over PREFIX_MATCH", req: func() *pb.LookupRouteRequest { r := req("timeout", withChain(a, ac)); r.ModelId = slowModel; return r }(), reason: rpc.ReasonTimeout},
		{name: "TIMEOUT over AFFINITY_HINT", req: func() *pb.LookupRouteRequest { r := req("timeout", withChain(c, cc)); r.ModelId = slowModel; return r }(), reason: rpc.ReasonTimeout},
		{name: "budget not reached", req: req("timeout", withChain(a, ac)), reason: rpc.ReasonPrefixMatch, ids: []string{"r1"}},

		// minimumPrefixTokens (1000): effective tokens come from the chain.
		{name: "tiny chain loses PREFIX_MATCH, gets AFFINITY_HINT", req: req("tiny", withChain(a, ac)),
			reason: rpc.ReasonAffinityHint, ids: []string{affinityPick(r123, chainSeed(a))}, check: checkAffinityZeros},
		{name: "the chain wins over a large legacy count", req: req("tiny", func(r *pb.LookupRouteRequest) { withChain(a, ac)(r); r.PrefixTokenCount = 5000 }),
			reason: rpc.ReasonAffinityHint, ids: []string{affinityPick(r123, chainSeed(a))}},
		{name: "tiny exact request loses TENANT_HOT, gets AFFINITY_HINT (seed = prefix hash)", req: req("tiny", func(r *pb.LookupRouteRequest) { r.PrefixHash = miss; r.PrefixTokenCount = 10 }),
			reason: rpc.ReasonAffinityHint, ids: []string{affinityPick(r123, miss)}},
		{name: "exact request above the gate keeps PREFIX_MATCH", req: req("tiny", func(r *pb.LookupRouteRequest) { r.PrefixHash = a[7]; r.PrefixTokenCount = 2000 }),
			reason: rpc.ReasonPrefixMatch, ids: []string{"r1"}},
		{name: "tiny request still gets UNKNOWN_MODEL with affinity on", req: func() *pb.LookupRouteRequest { r := req("tiny", withChain(a, ac)); r.ModelId = "other"; return r }(), reason: rpc.ReasonUnknownModel},
		{name: "tiny request short-circuits to NO_HINT with affinity off", req: req("tinynoaff", func(r *pb.LookupRouteRequest) { withChain(a, ac)(r); r.AdapterId = "x" }), reason: rpc.ReasonNoHint, noIndex: true},

		// Result floors.
		{name: "matched-tokens floor empties the result: NO_HINT", req: req("floor", withChain(a, ac)), reason: rpc.ReasonNoHint},
		{name: "matched-tokens floor empties the result: AFFINITY_HINT", req: req("flooraff", withChain(a, ac)), reason: rpc.ReasonAffinityHint, ids: []string{affinityPick(r123, chainSeed(a))}},
		{name: "routing floor on the top score", req: req("score", withChain(a, ac)), reason: rpc.ReasonNoHint},
		{name: "explicit floor opt-outs keep every holder", req: req("optout", withChain(a, ac)), reason: rpc.ReasonPrefixMatch, ids: []string{"r1", "r2"}},

		// Strategy gates.
		{name: "enableTenantHot=false is NO_HINT, not AFFINITY_HINT", req: req("nohot", func(r *pb.LookupRouteRequest) { r.PrefixHash = miss }), reason: rpc.ReasonNoHint},
		{name: "enableChainMatching=false: a chain-only request fails open", req: req("nochain", withChain(a, ac)), reason: rpc.ReasonNoHint, noIndex: true},
		{name: "enableChainMatching=false: prefix_hash is used alone", req: req("nochain", func(r *pb.LookupRouteRequest) { withChain(c, cc)(r); r.PrefixHash = a[7] }),
			reason: rpc.ReasonPrefixMatch, ids: []string{"r1"}},
		{name: "enableChainMatching=false: token_ids look up the last block exactly", req: req("nochain", func(r *pb.LookupRouteRequest) { withChain(c, cc)(r); r.TokenIds = tokens(0, 130) }),
			reason: rpc.ReasonPrefixMatch, ids: []string{"r5"}},

		// Dual input.
		{name: "token_ids are fingerprinted and not echoed", req: req("tok", func(r *pb.LookupRouteRequest) { r.TokenIds = tokens(0, 135) }),
			reason: rpc.ReasonPrefixMatch, ids: []string{"r5"},
			check: func(t *testing.T, r *pb.LookupRouteResponse) {
				if r.GetReplicaScores()[0].GetMatchedTokens() != 128 {
					t.Fatalf("matched = %d, want 128", r.GetReplicaScores()[0].GetMatchedTokens())
				}
			}},
		{name: "an explicit chain wins over token_ids", req: req("tok", func(r *pb.LookupRouteRequest) { withChain(a, ac)(r); r.TokenIds = tokens(0, 135) }),
			reason: rpc.ReasonPrefixMatch, ids: []string{"r1"}},
		{name: "token_ids shorter than one block fail open", req: req("tok", func(r *pb.LookupRouteRequest) { r.TokenIds = tokens(0, 15) }), reason: rpc.ReasonNoHint, noIndex: true},
		{name: "a token_ids miss seeds affinity with the derived chain", req: req("tok", func(r *pb.LookupRouteRequest) { r.TokenIds = tokens(1000, 32) }),
			reason: rpc.ReasonAffinityHint, ids: []string{func() string {
				h, _ := tokenChain(tokens(1000, 32))
				return affinityPick([]string{"r1", "r2", "r3", "r5"}, chainSeed(h))
			}()}},
		{name: "prompt_text fails open without a tokenizer", req: req("team", func(r *pb.LookupRouteRequest) { r.PromptText = "hello"; r.AdapterId = "x" }), reason: rpc.ReasonNoHint, noIndex: true},
	}
	stream, err := env.client.LookupRouteStream(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, lookups := env.obs.len(), env.slow.count()
			resp, err := env.client.LookupRoute(ctx(t), tc.req)
			if err != nil {
				t.Fatalf("LookupRoute error (it must fail open): %v", err)
			}
			if resp.GetReasonCode() != tc.reason {
				t.Fatalf("reason = %s, want %s (scores %v)", resp.GetReasonCode(), tc.reason, replicaIDs(resp))
			}
			if got := replicaIDs(resp); !slices.Equal(got, tc.ids) {
				t.Fatalf("replicas = %v, want %v", got, tc.ids)
			}
			if resp.GetAdapterId() != tc.adapter {
				t.Fatalf("adapter_id = %q, want %q", resp.GetAdapterId(), tc.adapter)
			}
			if len(resp.GetTokenIds()) != 0 {
				t.Fatalf("token_ids echoed without prompt_text: %d", len(resp.GetTokenIds()))
			}
			if tc.noIndex != (env.slow.count() == lookups) {
				t.Fatalf("index consulted = %v, want %v", env.slow.count() != lookups, !tc.noIndex)
			}
			if n := env.obs.len(); n != before+1 {
				t.Fatalf("observer calls = %d, want exactly one", n-before)
			}
			o := env.obs.last()
			if o.reason != tc.reason || o.hint != (len(tc.ids) > 0) || o.model != tc.req.GetModelId() {
				t.Fatalf("observed %+v for reason %s", o, tc.reason)
			}
			if tc.req.GetTenantId() == policy.ReservedTenantID && (o.elapsed != 0 || resp.GetLookupLatencyUs() != 0) {
				t.Fatalf("reserved tenant latency = %v / %dµs, want 0", o.elapsed, resp.GetLookupLatencyUs())
			}
			if tc.reason == rpc.ReasonTimeout && resp.GetLookupLatencyUs() < 50_000 {
				t.Fatalf("TIMEOUT latency = %dµs, want >= the 50 ms budget", resp.GetLookupLatencyUs())
			}
			if tc.check != nil {
				tc.check(t, resp)
			}
			// The same request on the long-lived stream gets the same
			// answer, through the same steps (scores decay with the wall
			// clock in between; TestLookupRouteStreamMatchesUnary compares
			// exactly, on a frozen clock).
			before, lookups = env.obs.len(), env.slow.count()
			streamed := streamLookup(t, stream, tc.req)
			if !sameAnswer(streamed, resp) {
				t.Fatalf("LookupRouteStream answered %v, LookupRoute %v", streamed, resp)
			}
			if tc.noIndex != (env.slow.count() == lookups) || env.obs.len() != before+1 {
				t.Fatalf("streamed: index consulted = %v, observer calls = %d", env.slow.count() != lookups, env.obs.len()-before)
			}
		})
	}
	if n := env.svc.PromptTextFailOpens(); n != 2 {
		t.Fatalf("PromptTextFailOpens = %d, want 2 (unary and streamed)", n)
	}
}

// sameAnswer reports whether two answers agree on everything but latency,
// scores and probabilities up to a relative 1e-4 (the clock moved between
// them).
func sameAnswer(a, b *pb.LookupRouteResponse) bool {
	near := func(x, y float32) bool { return math.Abs(float64(x-y)) <= 1e-4*math.Max(1, math.Abs(float64(y))) }
	as, bs := a.GetReplicaScores(), b.GetReplicaScores()
	if a.GetReasonCode() != b.GetReasonCode() || a.GetAdapterId() != b.GetAdapterId() ||
		!slices.Equal(a.GetTokenIds(), b.GetTokenIds()) || len(as) != len(bs) {
		return false
	}
	for i := range as {
		x, y := as[i], bs[i]
		if x.GetReplicaId() != y.GetReplicaId() || x.GetMatchedTokens() != y.GetMatchedTokens() || x.GetTier() != y.GetTier() ||
			!near(x.GetScore(), y.GetScore()) || !near(x.GetEstimatedCacheHitProb(), y.GetEstimatedCacheHitProb()) {
			return false
		}
	}
	return true
}

func checkAffinityZeros(t *testing.T, r *pb.LookupRouteResponse) {
	t.Helper()
	s := r.GetReplicaScores()[0]
	if s.GetScore() != 0 || s.GetMatchedTokens() != 0 || s.GetEstimatedCacheHitProb() != 0 || s.GetTier() != pb.CacheTier_CACHE_TIER_UNSPECIFIED {
		t.Fatalf("affinity score not zero: %v", s)
	}
}

// TestLookupRouteTimeoutPrecedence covers the caller-deadline half of
// TIMEOUT, which a gRPC client cannot observe over the wire (it stops
// waiting): calls go straight to the handler.
func TestLookupRouteTimeoutPrecedence(t *testing.T) {
	env := reasonEnv(t, false)
	a, ac := chainOf(chainA, 8)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, r := range []*pb.LookupRouteRequest{
		{TenantId: "reqchain", ModelId: model, HashScheme: scheme, PrefixHash: a[0]},                  // would be POLICY_REQUIRES_CHAIN
		{TenantId: "ghost", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac}, // would be UNKNOWN_TENANT
		{TenantId: "team", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac[:1]},
		{TenantId: "team", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac},
	} {
		resp, err := env.svc.LookupRoute(done, r)
		if err != nil || resp.GetReasonCode() != rpc.ReasonTimeout || len(resp.GetReplicaScores()) != 0 || resp.GetAdapterId() != "" {
			t.Fatalf("%v: resp %v, err %v; want an empty TIMEOUT", r.GetTenantId(), resp, err)
		}
	}
	// A caller deadline that passes during the (slow) lookup.
	env.slow.delay = 30 * time.Millisecond
	c, cancel2 := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel2()
	resp, _ := env.svc.LookupRoute(c, &pb.LookupRouteRequest{TenantId: "team", ModelId: slowModel, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac})
	if resp.GetReasonCode() != rpc.ReasonTimeout {
		t.Fatalf("reason = %s, want TIMEOUT after the caller deadline", resp.GetReasonCode())
	}
	// The reserved tenant is answered before the deadline is even read.
	resp, _ = env.svc.LookupRoute(done, &pb.LookupRouteRequest{TenantId: policy.ReservedTenantID, ModelId: model})
	if resp.GetReasonCode() != rpc.ReasonNoHint {
		t.Fatalf("reserved tenant: %s, want NO_HINT", resp.GetReasonCode())
	}
}

// TestLookupRouteHugeInputs: oversized repeated fields fail open or are
// answered, never an error.
func TestLookupRouteHugeInputs(t *testing.T) {
	env := reasonEnv(t, false)
	big := make([]uint32, rpc.MaxLookupTokens+1)
	resp, err := env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: "tok", ModelId: model, HashScheme: scheme, TokenIds: big})
	if err != nil || resp.GetReasonCode() != rpc.ReasonNoHint {
		t.Fatalf("2^20+1 token_ids: %v, %v; want NO_HINT", resp, err)
	}
	// Exactly the limit is fingerprinted (65,536 blocks) and misses.
	resp, err = env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: "tok", ModelId: model, HashScheme: scheme, TokenIds: big[:rpc.MaxLookupTokens]})
	if err != nil || resp.GetReasonCode() != rpc.ReasonAffinityHint {
		t.Fatalf("2^20 token_ids: %v, %v; want AFFINITY_HINT", resp.GetReasonCode(), err)
	}
	// A 100,000-block chain that starts with a stored prefix.
	a, ac := chainOf(chainA, 8)
	hs, cs := chainOf(chainC, 100_000)
	copy(hs, a)
	resp, err = env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, BlockHashes: hs, BlockTokenCounts: cs})
	if err != nil || resp.GetReasonCode() != rpc.ReasonPrefixMatch || replicaIDs(resp)[0] != "r1" {
		t.Fatalf("long chain: %v, %v", resp, err)
	}
	// Oversized and empty hashes never match and never fail.
	resp, err = env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme,
		BlockHashes: [][]byte{make([]byte, 4096), {}}, BlockTokenCounts: []int32{16, 16}})
	if err != nil || resp.GetReasonCode() != rpc.ReasonAffinityHint {
		t.Fatalf("odd hashes: %v, %v", resp.GetReasonCode(), err)
	}
	// A hostile count sum must not wrap below the gate.
	resp, err = env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: "tiny", ModelId: model, HashScheme: scheme,
		BlockHashes: a, BlockTokenCounts: []int32{math.MaxInt32, math.MaxInt32, 16, 16, 16, 16, 16, 16}})
	if err != nil || resp.GetReasonCode() != rpc.ReasonPrefixMatch {
		t.Fatalf("huge counts: %v, %v; want PREFIX_MATCH (the sum is far above the gate)", resp.GetReasonCode(), err)
	}
	_ = ac
	// The state survived every one of them.
	resp, _ = env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac})
	if resp.GetReasonCode() != rpc.ReasonPrefixMatch {
		t.Fatalf("after bad input: %s", resp.GetReasonCode())
	}
}

// fakeTokenizer returns fixed tokens, an error, or blocks until ctx ends.
type fakeTokenizer struct {
	toks  []uint32
	err   error
	block bool
}

func (f fakeTokenizer) Encode(ctx context.Context, _, _ string) ([]uint32, error) {
	if f.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return f.toks, f.err
}

// TestLookupRoutePromptText covers the prompt_text path with a tokenizer:
// tokens are echoed (only there), a sub-block prompt echoes and fails open,
// a failing tokenizer fails open, a slow one times out.
func TestLookupRoutePromptText(t *testing.T) {
	run := func(tok rpc.Tokenizer, tenant string) (*pb.LookupRouteResponse, *env) {
		env := newEnv(t, envOpts{tokenizer: tok})
		env.policies(t, policy.ResolvedPolicy{Namespace: "timeout", LookupTimeoutMs: 20, MinimumMatchedTokens: 64})
		th, tc := tokenChain(tokens(0, 128))
		env.report(t, &pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: "r5", AdapterId: "a",
			Prefixes: []*pb.PrefixEntry{{BlockHashes: th, BlockTokenCounts: tc}}})
		resp, err := env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: tenant, ModelId: model, HashScheme: scheme, PromptText: "hi", AdapterId: "a"})
		if err != nil {
			t.Fatal(err)
		}
		return resp, env
	}
	resp, _ := run(fakeTokenizer{toks: tokens(0, 130)}, "team")
	if resp.GetReasonCode() != rpc.ReasonPrefixMatch || len(resp.GetTokenIds()) != 130 || resp.GetAdapterId() != "a" {
		t.Fatalf("tokenized: %s, %d tokens echoed, adapter %q", resp.GetReasonCode(), len(resp.GetTokenIds()), resp.GetAdapterId())
	}
	resp, _ = run(fakeTokenizer{toks: tokens(0, 5)}, "team")
	if resp.GetReasonCode() != rpc.ReasonNoHint || len(resp.GetTokenIds()) != 5 || resp.GetAdapterId() != "" {
		t.Fatalf("sub-block: %s, %d tokens echoed, adapter %q", resp.GetReasonCode(), len(resp.GetTokenIds()), resp.GetAdapterId())
	}
	resp, env := run(fakeTokenizer{err: errors.New("boom")}, "team")
	if resp.GetReasonCode() != rpc.ReasonNoHint || len(resp.GetTokenIds()) != 0 || env.svc.PromptTextFailOpens() != 1 {
		t.Fatalf("tokenizer error: %s, %d tokens, %d fail-opens", resp.GetReasonCode(), len(resp.GetTokenIds()), env.svc.PromptTextFailOpens())
	}
	resp, _ = run(fakeTokenizer{block: true}, "timeout")
	if resp.GetReasonCode() != rpc.ReasonTimeout {
		t.Fatalf("slow tokenizer under a 20 ms budget: %s, want TIMEOUT", resp.GetReasonCode())
	}
}
