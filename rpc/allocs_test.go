package rpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// TestLookupRouteAllocs pins the handler's allocations with the production
// metrics observer: the response message is all a lookup allocates (one
// for an empty answer; the response, the score pointer slice and one
// backing array of scores otherwise). The pooled scratch, the engine
// lookup, the fingerprinting of token_ids, the affinity seed and the metric
// writes allocate nothing in steady state.
func TestLookupRouteAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; counts are pinned without it")
	}
	env := reasonEnv(t, false)
	svc, err := rpc.NewService(rpc.Config{Index: env.e, Policies: env.store, Observer: servermetrics.New()})
	if err != nil {
		t.Fatal(err)
	}
	a, ac := chainOf(chainA, 8)
	c, cc := chainOf(chainC, 2)
	for _, tc := range []struct {
		name   string
		req    *pb.LookupRouteRequest
		reason string
		allocs float64
	}{
		{"PREFIX_MATCH chain", &pb.LookupRouteRequest{TenantId: "optout", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac}, rpc.ReasonPrefixMatch, 3},
		{"PREFIX_MATCH token_ids", &pb.LookupRouteRequest{TenantId: "tok", ModelId: model, HashScheme: scheme, TokenIds: tokens(0, 130)}, rpc.ReasonPrefixMatch, 3},
		{"TENANT_HOT", &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, PrefixHash: hashOf(chainC, 9)}, rpc.ReasonTenantHot, 3},
		{"AFFINITY_HINT", &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, BlockHashes: c, BlockTokenCounts: cc}, rpc.ReasonAffinityHint, 3},
		{"UNKNOWN_TENANT", &pb.LookupRouteRequest{TenantId: "ghost", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac}, rpc.ReasonUnknownTenant, 1},
		{"POLICY_REQUIRES_CHAIN", &pb.LookupRouteRequest{TenantId: "reqchain", ModelId: model, HashScheme: scheme, PrefixHash: a[0]}, rpc.ReasonPolicyRequiresChain, 1},
		{"reserved tenant", &pb.LookupRouteRequest{TenantId: policy.ReservedTenantID, ModelId: model}, rpc.ReasonNoHint, 1},
		{"budgeted tenant", &pb.LookupRouteRequest{TenantId: "timeout", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac}, rpc.ReasonPrefixMatch, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			var reason string
			got := testing.AllocsPerRun(200, func() {
				resp, _ := svc.LookupRoute(ctx, tc.req)
				reason = resp.GetReasonCode()
			})
			if reason != tc.reason {
				t.Fatalf("reason = %s, want %s", reason, tc.reason)
			}
			if got != tc.allocs {
				t.Fatalf("allocs/op = %v, want %v", got, tc.allocs)
			}
		})
	}
}

// TestLookupRouteAllocsLoadAware: with load-aware routing active (every
// replica reports a busy load) the handler still allocates only the
// response, whether it re-ranks or explores. (The measured calls route
// requests without new load reports, so loads drift and the decision may
// change during the run; both kinds of answer allocate the same.)
func TestLookupRouteAllocsLoadAware(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; counts are pinned without it")
	}
	env := newEnv(t, envOpts{load: true})
	env.policies(t, policy.ResolvedPolicy{Namespace: "team", MinimumMatchedTokens: 16})
	env.seed(t, "team")
	// r2 holds all of chain A too, reported a minute earlier than r1, so
	// the contract names r1 first; r1 is overloaded.
	a, ac := chainOf(chainA, 8)
	env.report(t, &pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: "r2",
		TimestampUs: time.Now().Add(-time.Minute).UnixMicro(), Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}})
	env.report(t, loadStats("team", "r1", 30, 10, 500_000), loadStats("team", "r2", 1, 4, 0), loadStats("team", "r3", 0, 4, 0))
	svc, err := rpc.NewService(rpc.Config{Index: env.e, Policies: env.store, Observer: servermetrics.New()})
	if err != nil {
		t.Fatal(err)
	}
	c, cc := chainOf(chainC, 2)
	for _, tc := range []struct {
		name   string
		req    *pb.LookupRouteRequest
		first  string // the first answer's reason and replica
		reason string
	}{
		{"re-ranked PREFIX_MATCH", &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac}, "r2", rpc.ReasonPrefixMatch},
		{"explored AFFINITY_HINT", &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, BlockHashes: c, BlockTokenCounts: cc}, "", rpc.ReasonAffinityHint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			resp, _ := svc.LookupRoute(ctx, tc.req)
			if resp.GetReasonCode() != tc.reason || len(resp.GetReplicaScores()) == 0 || resp.GetReplicaScores()[0].GetReplicaId() == "r1" ||
				(tc.first != "" && resp.GetReplicaScores()[0].GetReplicaId() != tc.first) {
				t.Fatalf("first answer %v, want %s led by %q (never the overloaded r1)", resp, tc.reason, tc.first)
			}
			got := testing.AllocsPerRun(200, func() { _, _ = svc.LookupRoute(ctx, tc.req) })
			if got != 3 {
				t.Fatalf("allocs/op = %v, want 3", got)
			}
		})
	}
}
