package rpc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Load-aware routing through the real handler over loopback gRPC
// (docs/routing.md; engine/load_test.go covers the mechanism).

// loadStats is a stats-only update carrying load for replica.
func loadStats(tenant, replica string, waiting, running int32, queued int64) *pb.CacheStateUpdate {
	st := &pb.ReplicaStats{WaitingRequests: proto.Int32(waiting), RunningRequests: proto.Int32(running)}
	if queued >= 0 {
		st.QueuedPrefillTokens = proto.Int64(queued)
	}
	return &pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: replica, Stats: st}
}

func (env *env) chainLookup(t *testing.T, tenant string, hs [][]byte, cs []int32) *pb.LookupRouteResponse {
	t.Helper()
	resp, err := env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: tenant, ModelId: model, HashScheme: scheme, BlockHashes: hs, BlockTokenCounts: cs})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestLoadAwareLookupRoute: with r1 (the longest match) behind a long
// queue the answer's first replica is r2; a cold request goes to the least
// loaded replica as AFFINITY_HINT; once the queue clears the contract's
// answer is back; load-aware routing off never changes an answer.
func TestLoadAwareLookupRoute(t *testing.T) {
	const tenant = "team"
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("load-aware=%v", on), func(t *testing.T) {
			frozen := time.Now()
			env := newEnv(t, envOpts{load: on, now: func() time.Time { return frozen }})
			env.policies(t, policy.ResolvedPolicy{Namespace: tenant, MinimumMatchedTokens: 16})
			env.seed(t, tenant) // r1: A×8, r2: A×2, r3: B×8
			a, ac := chainOf(chainA, 8)
			contract := env.chainLookup(t, tenant, a, ac)
			if got := replicaIDs(contract); !slices.Equal(got, []string{"r1", "r2"}) || contract.ReasonCode != "PREFIX_MATCH" {
				t.Fatalf("idle: %s %v", contract.ReasonCode, got)
			}
			// Idle load reports change nothing (no replica has 4 in flight).
			env.report(t, loadStats(tenant, "r1", 0, 1, 0), loadStats(tenant, "r2", 0, 0, 0), loadStats(tenant, "r3", 0, 0, 0))
			if got := env.chainLookup(t, tenant, a, ac); !proto.Equal(withoutLatency(got), withoutLatency(contract)) {
				t.Fatalf("idle load changed the answer: %v vs %v", got, contract)
			}
			// r2 now holds 6 of the 8 blocks; r1 falls 200k tokens behind:
			// r2's 96 matched tokens win.
			env.report(t, &pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: "r2",
				TimestampUs: frozen.UnixMicro(), Prefixes: []*pb.PrefixEntry{{BlockHashes: a[:6], BlockTokenCounts: ac[:6]}}})
			contract = env.chainLookup(t, tenant, a, ac)
			env.report(t, loadStats(tenant, "r1", 20, 8, 200_000))
			got := env.chainLookup(t, tenant, a, ac)
			if !on {
				if !proto.Equal(withoutLatency(got), withoutLatency(contract)) {
					t.Fatalf("load-aware off changed the answer: %v", got)
				}
				return
			}
			if ids := replicaIDs(got); got.ReasonCode != "PREFIX_MATCH" || !slices.Equal(ids, []string{"r2", "r1"}) {
				t.Fatalf("r1 behind a long queue: %s %v", got.ReasonCode, ids)
			}
			if s := got.ReplicaScores; s[0].Score <= s[1].Score || s[0].MatchedTokens != 96 || s[1].MatchedTokens != 128 {
				t.Fatalf("scores %v", s)
			}
			// A cold request (nobody holds chain C): the contract pins by
			// hash; with r1 far busier the pin avoids it.
			c, cc := chainOf(chainC, 4)
			for i := 0; i < 50; i++ {
				c[0] = hashOf(chainC+100+i, 0)
				cold := env.chainLookup(t, tenant, c, cc)
				if cold.ReasonCode != "AFFINITY_HINT" || len(cold.ReplicaScores) != 1 || cold.ReplicaScores[0].ReplicaId == "r1" {
					t.Fatalf("cold request: %s %v", cold.ReasonCode, replicaIDs(cold))
				}
				checkAffinityZeros(t, cold)
			}
			// The queue clears: below half of the minimum queue everywhere,
			// load-awareness turns off and the contract's answer is back.
			env.report(t, loadStats(tenant, "r1", 0, 1, 0), loadStats(tenant, "r2", 0, 0, 0), loadStats(tenant, "r3", 0, 0, 0))
			if got := env.chainLookup(t, tenant, a, ac); !proto.Equal(withoutLatency(got), withoutLatency(contract)) {
				t.Fatalf("after the queue cleared: %v vs %v", got, contract)
			}
		})
	}
}

func withoutLatency(r *pb.LookupRouteResponse) *pb.LookupRouteResponse {
	c := proto.Clone(r).(*pb.LookupRouteResponse)
	c.LookupLatencyUs = 0
	return c
}

// TestLoadAwareEqualLoadsDifferential: two servers fed the same random
// reports, one with load-aware routing: while every replica's load is the
// same (busy enough to activate load-awareness), and for pressure-only
// replicas, every answer (reason, order, scores, matched tokens,
// probabilities, tiers) is identical. A delivered answer counts as routed
// load on its first replica, so the equal loads are re-reported before
// each lookup.
func TestLoadAwareEqualLoadsDifferential(t *testing.T) {
	frozen := time.Now()
	clock := func() time.Time { return frozen }
	on, off := newEnv(t, envOpts{load: true, now: clock}), newEnv(t, envOpts{now: clock})
	rng := rand.New(rand.NewPCG(3, 9))
	replicas := []string{"r0", "r1", "r2", "r3", "r4"}
	tenants := []string{"t1", "t2"}
	now := frozen.UnixMicro()
	for i := 0; i < 150; i++ {
		tenant, rep := tenants[rng.IntN(2)], replicas[rng.IntN(len(replicas))]
		hs, cs := chainOf(rng.IntN(6), 1+rng.IntN(8))
		u := &pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: rep,
			TimestampUs: now - int64(rng.IntN(900))*1_000_000, Prefixes: []*pb.PrefixEntry{{BlockHashes: hs, BlockTokenCounts: cs}}}
		if rng.IntN(4) == 0 {
			u.Stats = &pb.ReplicaStats{HitRate: rng.Float32(), Pressure: rng.Float32()}
		}
		on.report(t, u)
		off.report(t, u)
	}
	equalLoads := func() { // t1: equal busy loads; t2: pressure only
		var us []*pb.CacheStateUpdate
		for _, rep := range replicas {
			us = append(us, loadStats("t1", rep, 6, 10, 40_000))
		}
		on.report(t, us...)
		off.report(t, us...)
		// An endpoint picker's counts, equal on every replica: 3 started
		// since the report, 1 of them ended.
		for _, e := range []*engine.Engine{on.e, off.e} {
			for _, rep := range replicas {
				for range 3 {
					e.RequestStarted("t1", model, rep, now)
				}
				e.RequestFinished("t1", model, rep, now)
			}
		}
	}
	checked := 0
	for i := 0; i < 400; i++ {
		equalLoads()
		tenant := tenants[rng.IntN(2)]
		hs, cs := chainOf(rng.IntN(8), 1+rng.IntN(10))
		req := &pb.LookupRouteRequest{TenantId: tenant, ModelId: model, HashScheme: scheme, BlockHashes: hs, BlockTokenCounts: cs}
		if rng.IntN(3) == 0 {
			req = &pb.LookupRouteRequest{TenantId: tenant, ModelId: model, HashScheme: scheme, PrefixHash: hs[len(hs)-1], PrefixTokenCount: 16 * int32(len(hs))}
		}
		a, err := on.client.LookupRoute(ctx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := off.client.LookupRoute(ctx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(withoutLatency(a), withoutLatency(b)) {
			t.Fatalf("lookup %d (%v): load-aware %v, contract %v", i, req, a, b)
		}
		if len(a.ReplicaScores) > 0 {
			checked++
		}
	}
	if checked < 100 {
		t.Fatalf("only %d answers named replicas; the comparison proves little", checked)
	}
}

// TestLoadAwarePrefixHashWithoutCount: a prefix-hash lookup that leaves
// prefix_token_count at 0 (it only feeds the minimum-prefix gate) still
// has its cached prefix counted: the holder with a short queue keeps it.
func TestLoadAwarePrefixHashWithoutCount(t *testing.T) {
	env := newEnv(t, envOpts{load: true})
	const tenant = "team"
	env.policies(t, policy.ResolvedPolicy{Namespace: tenant, MinimumMatchedTokens: 16})
	key := hashOf(chainC, 99)
	env.report(t,
		&pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: "a", Prefixes: []*pb.PrefixEntry{{PrefixHash: key, TokenCount: 4096}}},
		&pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: "b", Prefixes: []*pb.PrefixEntry{{PrefixHash: hashOf(chainC, 98), TokenCount: 16}}},
		loadStats(tenant, "a", 1, 4, 300), loadStats(tenant, "b", 0, 4, 100))
	for _, count := range []int32{4096, 0} {
		resp, err := env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: tenant, ModelId: model, HashScheme: scheme, PrefixHash: key, PrefixTokenCount: count})
		if err != nil {
			t.Fatal(err)
		}
		if resp.ReasonCode != "PREFIX_MATCH" || replicaIDs(resp)[0] != "a" {
			t.Fatalf("prefix_token_count %d: %s %v, want PREFIX_MATCH led by a", count, resp.ReasonCode, replicaIDs(resp))
		}
	}
}

// TestLoadNegativeQueuedTokensIsUnknown: a negative queued_prefill_tokens
// is no figure (unknown), not an idle queue.
func TestLoadNegativeQueuedTokensIsUnknown(t *testing.T) {
	env := newEnv(t, envOpts{load: true})
	env.seed(t, "team")
	env.report(t, loadStats("team", "r1", 2, 4, -5))
	for _, r := range env.e.Snapshot().Replicas {
		if r.ReplicaID == "r1" && (r.Load == nil || r.Load.QueuedPrefillTokens != nil) {
			t.Fatalf("r1 load row %+v, want a load without queued tokens", r.Load)
		}
	}
}

// TestOversizedIDPrecedence: an id over MaxIDBytes answers NO_HINT, but
// after what contract §2.2 ranks above it: the reserved tenant (NO_HINT,
// latency 0), TIMEOUT and POLICY_REQUIRES_CHAIN.
func TestOversizedIDPrecedence(t *testing.T) {
	env := newEnv(t, envOpts{})
	env.policies(t, policy.ResolvedPolicy{Namespace: "rc", Strategy: &policy.LookupStrategy{RequireChain: ptr(true)}})
	long := strings.Repeat("m", rpc.MaxIDBytes+1)
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r, _ := env.svc.LookupRoute(cctx, &pb.LookupRouteRequest{TenantId: "t", ModelId: long, HashScheme: scheme}); r.ReasonCode != rpc.ReasonTimeout {
		t.Fatalf("expired context + oversized model: %s, want TIMEOUT", r.ReasonCode)
	}
	if r, _ := env.svc.LookupRoute(context.Background(), &pb.LookupRouteRequest{TenantId: "rc", ModelId: long, HashScheme: scheme}); r.ReasonCode != rpc.ReasonPolicyRequiresChain {
		t.Fatalf("requireChain tenant without a chain + oversized model: %s, want POLICY_REQUIRES_CHAIN", r.ReasonCode)
	}
	if r, _ := env.svc.LookupRoute(context.Background(), &pb.LookupRouteRequest{TenantId: policy.ReservedTenantID, ModelId: long, HashScheme: scheme}); r.ReasonCode != rpc.ReasonNoHint || env.obs.last().elapsed != 0 {
		t.Fatalf("reserved tenant + oversized model: %s, latency %v; want NO_HINT at 0", r.ReasonCode, env.obs.last().elapsed)
	}
	if r, _ := env.svc.LookupRoute(context.Background(), &pb.LookupRouteRequest{TenantId: "t", ModelId: long, HashScheme: scheme}); r.ReasonCode != rpc.ReasonNoHint {
		t.Fatalf("oversized model: %s, want NO_HINT", r.ReasonCode)
	}
}

// TestFollowsAnswer: a gateway that follows its answers (follows_answer)
// makes the chain expected on the first replica, so the conversation's
// next turn, asked before the first turn's blocks were stored, goes where
// the first turn is queued; without the field the server has no such
// record and the next turn goes to the shortest queue.
func TestFollowsAnswer(t *testing.T) {
	const tenant = "team"
	for _, follow := range []bool{true, false} {
		t.Run(fmt.Sprintf("follows=%v", follow), func(t *testing.T) {
			frozen := time.Now()
			env := newEnv(t, envOpts{load: true, now: func() time.Time { return frozen }})
			env.seed(t, tenant) // r1: A×8, r2: A×2, r3: B×8
			// r2 holds as many keys as the others, so occupancy weighs
			// nobody's uncached tokens differently.
			d, dc := chainOf(chainC+1, 6)
			env.report(t, &pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: "r2",
				TimestampUs: frozen.UnixMicro(), Prefixes: []*pb.PrefixEntry{{BlockHashes: d, BlockTokenCounts: dc}}})
			env.report(t, loadStats(tenant, "r1", 2, 2, 1000), loadStats(tenant, "r2", 2, 2, 100), loadStats(tenant, "r3", 2, 2, 1000))
			c, cc := chainOf(chainC, 6)
			first, err := env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: tenant, ModelId: model, HashScheme: scheme,
				BlockHashes: c[:4], BlockTokenCounts: cc[:4], FollowsAnswer: follow})
			if err != nil {
				t.Fatal(err)
			}
			if ids := replicaIDs(first); len(ids) != 1 || ids[0] != "r2" {
				t.Fatalf("turn 1: %s %v, want r2 (the shortest queue)", first.ReasonCode, ids)
			}
			env.report(t, loadStats(tenant, "r1", 2, 2, 1000), loadStats(tenant, "r2", 3, 2, 600), loadStats(tenant, "r3", 2, 2, 100))
			// r2: 600 + 16 × (96 − 0.75 × 64) = 1,368; r3: 100 + 16 × 96 = 1,636.
			want := "r3"
			if follow {
				want = "r2"
			}
			second := env.chainLookup(t, tenant, c, cc)
			if ids := replicaIDs(second); len(ids) != 1 || ids[0] != want || second.ReasonCode != "AFFINITY_HINT" {
				t.Fatalf("turn 2: %s %v, want AFFINITY_HINT to %s", second.ReasonCode, ids, want)
			}
			checkAffinityZeros(t, second)
		})
	}
}
