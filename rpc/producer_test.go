package rpc_test

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

func lookupChain(t *testing.T, env *env, tenant string, hs [][]byte, cs []int32) *pb.LookupRouteResponse {
	t.Helper()
	resp, err := env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: tenant, ModelId: model, HashScheme: scheme, BlockHashes: hs, BlockTokenCounts: cs})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestReportCacheStateBadInput sends malformed updates on one stream next to
// good ones: each is dropped or normalized per contract, the stream is
// acknowledged, nothing panics and the good state is intact.
func TestReportCacheStateBadInput(t *testing.T) {
	env := newEnv(t, envOpts{})
	env.policies(t, policy.ResolvedPolicy{Namespace: "team", MinimumMatchedTokens: 0, RoutingFloorScore: ptr(float32(0))})
	env.seed(t, "team")
	a, ac := chainOf(chainA, 8)
	d, dc := chainOf(4, 2)
	e, ec := chainOf(5, 2)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	env.report(t,
		// Unbalanced chains (and counts without hashes) are dropped; the
		// balanced entry beside them is kept.
		&pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: "bad1",
			Prefixes: []*pb.PrefixEntry{{BlockHashes: d, BlockTokenCounts: dc[:1]}, {BlockTokenCounts: dc}, {BlockHashes: e, BlockTokenCounts: ec}}},
		// Empty keys: no replica id, empty hashes, an oversized hash.
		&pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: "",
			Prefixes: []*pb.PrefixEntry{{PrefixHash: a[0], TokenCount: 16}}},
		&pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: "bad2",
			Prefixes: []*pb.PrefixEntry{{PrefixHash: nil, TokenCount: 16}, {PrefixHash: make([]byte, 1024), TokenCount: 16}, {BlockHashes: [][]byte{{}}, BlockTokenCounts: []int32{16}}}},
		// Empty model and tenant are just keys; empty scheme keeps stats only.
		&pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: "", ReplicaId: "stats-only",
			Stats:    &pb.ReplicaStats{HitRate: nan, Pressure: inf, CacheMemoryBytes: 7, ReplicaId: "ignored"},
			Prefixes: []*pb.PrefixEntry{{BlockHashes: d, BlockTokenCounts: dc}}},
		// Unknown tiers: a positive one and a negative one sort coldest and
		// read back as UNSPECIFIED; T2 reads back as T2.
		&pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: "tiers",
			Prefixes: []*pb.PrefixEntry{
				{BlockHashes: [][]byte{hashOf(6, 0)}, BlockTokenCounts: []int32{16}, Tier: pb.CacheTier(7)},
				{BlockHashes: [][]byte{hashOf(7, 0)}, BlockTokenCounts: []int32{16}, Tier: pb.CacheTier(-3)},
				{BlockHashes: [][]byte{hashOf(8, 0)}, BlockTokenCounts: []int32{16}, Tier: pb.CacheTier_CACHE_TIER_T2},
			}},
		// The reserved tenant is dropped.
		&pb.CacheStateUpdate{TenantId: policy.ReservedTenantID, ModelId: model, HashScheme: scheme, ReplicaId: "intruder",
			Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}},
	)

	// Chain d was only reported unbalanced, or without a scheme.
	if r := lookupChain(t, env, "team", d, dc); r.GetReasonCode() == rpc.ReasonPrefixMatch {
		t.Fatalf("dropped chain matched: %v", replicaIDs(r))
	}
	if r := lookupChain(t, env, "team", e, ec); r.GetReasonCode() != rpc.ReasonPrefixMatch || !slices.Equal(replicaIDs(r), []string{"bad1"}) {
		t.Fatalf("the good entry beside bad ones: %s %v", r.GetReasonCode(), replicaIDs(r))
	}
	for h, want := range map[int]pb.CacheTier{6: pb.CacheTier_CACHE_TIER_UNSPECIFIED, 7: pb.CacheTier_CACHE_TIER_UNSPECIFIED, 8: pb.CacheTier_CACHE_TIER_T2} {
		r := lookupChain(t, env, "team", [][]byte{hashOf(h, 0)}, []int32{16})
		if r.GetReasonCode() != rpc.ReasonPrefixMatch || r.GetReplicaScores()[0].GetTier() != want {
			t.Fatalf("tier chain %d: %s %v, want tier %v", h, r.GetReasonCode(), r.GetReplicaScores(), want)
		}
	}
	st, err := env.client.GetCacheState(ctx(t), &pb.GetCacheStateRequest{TenantId: "team", ModelId: model})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.GetReplicas() {
		if r.GetReplicaId() == "stats-only" && (r.GetHitRate() != 0 || r.GetPressure() != 0 || r.GetCacheMemoryBytes() != 7) {
			t.Fatalf("NaN/Inf stats not clamped: %v", r)
		}
	}
	if !slices.ContainsFunc(st.GetReplicas(), func(r *pb.ReplicaStats) bool { return r.GetReplicaId() == "stats-only" }) {
		t.Fatalf("stats of a scheme-less update lost: %v", st.GetReplicas())
	}
	// The reserved tenant's state is untouched by the intruder.
	var res engine.LookupResult
	env.e.LookupRoute(&engine.LookupRequest{TenantID: policy.ReservedTenantID, ModelID: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac}, time.Now().UnixMicro(), &res)
	if len(res.Scores) != 0 {
		t.Fatalf("reserved tenant written through ReportCacheState: %v", res.Scores)
	}
	// The good state survived.
	if r := lookupChain(t, env, "team", a, ac); !slices.Equal(replicaIDs(r), []string{"r1", "r2"}) {
		t.Fatalf("seeded state after bad input: %s %v", r.GetReasonCode(), replicaIDs(r))
	}
}

// TestReportCacheStateHugeUpdate sends one update with a 20,000-block chain
// and 5,000 legacy entries.
func TestReportCacheStateHugeUpdate(t *testing.T) {
	env := newEnv(t, envOpts{})
	hs, cs := chainOf(9, 20_000)
	u := &pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: "big",
		Prefixes: []*pb.PrefixEntry{{BlockHashes: hs, BlockTokenCounts: cs}}}
	for i := 0; i < 5000; i++ {
		u.Prefixes = append(u.Prefixes, &pb.PrefixEntry{PrefixHash: hashOf(10, i), TokenCount: 16})
	}
	env.report(t, u)
	r := lookupChain(t, env, "team", hs[:100], cs[:100])
	if r.GetReasonCode() != rpc.ReasonPrefixMatch || r.GetReplicaScores()[0].GetMatchedTokens() != 1600 {
		t.Fatalf("huge update: %s %v", r.GetReasonCode(), r.GetReplicaScores())
	}
	if _, keys := env.e.ModelState("team", model); keys != 25_000 {
		t.Fatalf("keys = %d, want 25000", keys)
	}
}

// TestPublishEvent covers every event type and the reserved tenant.
func TestPublishEvent(t *testing.T) {
	env := newEnv(t, envOpts{})
	env.policies(t, policy.ResolvedPolicy{Namespace: "team", MinimumMatchedTokens: 0, RoutingFloorScore: ptr(float32(0))})
	env.seed(t, "team")
	a, ac := chainOf(chainA, 8)
	send := func(ev *pb.CacheEvent) {
		t.Helper()
		ack, err := env.client.PublishEvent(ctx(t), ev)
		if err != nil || !ack.GetAccepted() {
			t.Fatalf("PublishEvent: %v, %v", ack, err)
		}
	}
	base := func(typ pb.CacheEvent_Type, replica string) *pb.CacheEvent {
		return &pb.CacheEvent{Type: typ, TenantId: "team", ModelId: model, ReplicaId: replica}
	}
	send(base(pb.CacheEvent_PREFIX_ADDED, "r1"))
	send(base(pb.CacheEvent_TYPE_UNSPECIFIED, "r1"))
	send(base(pb.CacheEvent_Type(99), "r1"))
	send(base(pb.CacheEvent_REPLICA_UPDATED, "r1"))
	send(&pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, TenantId: policy.ReservedTenantID, ModelId: model, ReplicaId: "r1"})
	if got := replicaIDs(lookupChain(t, env, "team", a, ac)); !slices.Equal(got, []string{"r1", "r2"}) {
		t.Fatalf("no-op events changed state: %v", got)
	}
	// Evicting r2's block 0 ends its run at block 0.
	ev := base(pb.CacheEvent_PREFIX_EVICTED, "r2")
	ev.PrefixHash = a[0]
	send(ev)
	if got := replicaIDs(lookupChain(t, env, "team", a, ac)); !slices.Equal(got, []string{"r1"}) {
		t.Fatalf("after PREFIX_EVICTED: %v", got)
	}
	// ALL_CLEARED drops r1's keys and stats.
	send(base(pb.CacheEvent_ALL_CLEARED, "r1"))
	if r := lookupChain(t, env, "team", a, ac); r.GetReasonCode() == rpc.ReasonPrefixMatch {
		t.Fatalf("after ALL_CLEARED: %v", replicaIDs(r))
	}
	st, _ := env.client.GetCacheState(ctx(t), &pb.GetCacheStateRequest{TenantId: "team", ModelId: model})
	for _, r := range st.GetReplicas() {
		if r.GetReplicaId() == "r1" {
			t.Fatalf("stats survived ALL_CLEARED: %v", r)
		}
	}
	// Events for unknown keys are harmless.
	send(&pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, TenantId: "nobody", ModelId: "none", ReplicaId: "x"})
	send(&pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, TenantId: "team", ModelId: model, ReplicaId: "r3"})
}

// TestGetCacheState checks the summary and replica rows.
func TestGetCacheState(t *testing.T) {
	env := newEnv(t, envOpts{})
	env.seed(t, "team")
	env.report(t, &pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: "sglang", ReplicaId: "r9", AdapterId: "lora",
		Prefixes: []*pb.PrefixEntry{{PrefixHash: hashOf(chainA, 0), TokenCount: 16}},
		Stats:    &pb.ReplicaStats{HitRate: 0.25, Pressure: 0.5, CacheMemoryBytes: 100, T2HitTokens: 3, T2QueryTokens: 9, ClientVersion: "v"}})
	st, err := env.client.GetCacheState(ctx(t), &pb.GetCacheStateRequest{TenantId: "team", ModelId: model})
	if err != nil {
		t.Fatal(err)
	}
	// Chain A has 8 keys, chain B 8, and the sglang/lora key 1.
	if st.GetSummary().GetTotalPrefixes() != 17 || st.GetSummary().GetHotPrefixes() != 0 {
		t.Fatalf("summary = %v, want 17 distinct keys", st.GetSummary())
	}
	var ids []string
	for _, r := range st.GetReplicas() {
		ids = append(ids, r.GetReplicaId())
	}
	if !slices.Equal(ids, []string{"r1", "r2", "r3", "r9"}) {
		t.Fatalf("replicas = %v", ids)
	}
	r9 := st.GetReplicas()[3]
	if r9.GetHitRate() != 0.25 || r9.GetPressure() != 0.5 || r9.GetCacheMemoryBytes() != 100 || r9.GetT2HitTokens() != 3 || r9.GetT2QueryTokens() != 9 || r9.GetClientVersion() != "" {
		t.Fatalf("r9 = %v", r9)
	}
	for _, req := range []*pb.GetCacheStateRequest{{TenantId: policy.ReservedTenantID, ModelId: model}, {TenantId: "ghost", ModelId: model}, {}} {
		st, err := env.client.GetCacheState(ctx(t), req)
		if err != nil || st.GetSummary() == nil || st.GetSummary().GetTotalPrefixes() != 0 || len(st.GetReplicas()) != 0 {
			t.Fatalf("%v: %v, %v; want an empty summary", req, st, err)
		}
	}
}

// TestFormerStubs: what the contract's stubs (§1) answer now on a server
// with no topology, no template and no metrics source (the full behavior
// is tested end to end in package server).
func TestFormerStubs(t *testing.T) {
	env := newEnv(t, envOpts{})
	rt, err := env.client.RenderTemplate(ctx(t), &pb.RenderTemplateRequest{TemplateRef: "ns/x"})
	if err != nil || rt.GetReasonCode() != rpc.ReasonTemplateNotFound || len(rt.GetRenderedPrompt()) != 0 || rt.GetMessage() == "" {
		t.Fatalf("RenderTemplate: %v, %v", rt, err)
	}
	pd, err := env.client.LookupPDRoute(ctx(t), &pb.LookupPDRouteRequest{ModelId: model})
	if err != nil || pd.GetReasonCode() != rpc.ReasonNoHint || pd.GetPrefillReplicaId() != "" {
		t.Fatalf("LookupPDRoute without a tenant: %v, %v", pd, err)
	}
	pd, err = env.client.LookupPDRoute(ctx(t), &pb.LookupPDRouteRequest{TenantId: "team", ModelId: model, PdTopologyRef: "pd"})
	if err != nil || pd.GetReasonCode() != rpc.ReasonUnknownTopology {
		t.Fatalf("LookupPDRoute without a topology: %v, %v", pd, err)
	}
	// The event stream stays open (nothing changes) until the client goes.
	sctx, cancel := context.WithCancel(ctx(t))
	es, err := env.client.StreamCacheEvents(sctx, &pb.StreamEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if md, err := es.Header(); err != nil || len(md.Get(rpc.StreamReadyHeader)) != 1 {
		t.Fatalf("StreamCacheEvents header %v, %v", md, err)
	}
	cancel()
	if _, err := es.Recv(); status.Code(err) != codes.Canceled {
		t.Fatalf("StreamCacheEvents after cancel: %v", err)
	}
	ms, err := env.client.StreamMetrics(ctx(t), &pb.StreamMetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ms.Recv(); status.Code(err) != codes.Unimplemented {
		t.Fatalf("StreamMetrics without a source: %v, want UNIMPLEMENTED", err)
	}
	// An empty ReportCacheState stream is acknowledged too.
	env.report(t)
}
