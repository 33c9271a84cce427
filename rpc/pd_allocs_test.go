package rpc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// pdService is a service over an engine with a P/D topology: 4 prefill and
// 4 decode replicas of (team, model), each holding the first blocks of the
// prompt and reporting load.
func pdService(t testing.TB) (*rpc.Service, [][]byte, []int32) {
	t.Helper()
	store := policy.NewStore()
	b, err := policy.Decode(strings.NewReader(`{"version": 8, "pdTopologies": [{"namespace": "team", "name": "pd",
	  "prefillPools": [{"name": "p"}], "decodePools": [{"name": "d"}], "transport": "NIXL", "kvLocality": "Zone"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	store.Apply(b)
	e := engine.New(engine.Config{Policies: store, Load: engine.DefaultLoadConfig()})
	hs, cs := chainOf(chainA, 16)
	now := time.Now().UnixMicro()
	for i := range 8 {
		role, pool := engine.RolePrefill, "p"
		if i >= 4 {
			role, pool = engine.RoleDecode, "d"
		}
		e.Ingest(&engine.Update{TenantID: "team", ModelID: model, HashScheme: scheme, ReplicaID: fmt.Sprint("r", i), TimestampUs: now,
			Placement: &engine.Placement{Role: role, Pool: pool, Zone: "z"},
			Prefixes:  []engine.PrefixEntry{{BlockHashes: hs[:1+i], BlockTokenCounts: cs[:1+i]}},
			Stats:     &engine.ReplicaStats{Load: engine.LoadStats{Reported: true, Waiting: int32(i % 3), Running: 1, QueuedTokens: -1}}}, now)
	}
	m := servermetrics.New()
	f := m.RegisterFeatures(rpc.PDReasons, rpc.RenderReasons, []string{rpc.StreamCacheEventsName, rpc.StreamMetricsName}, rpc.StreamOutcomes, func(string) int64 { return 0 })
	svc, err := rpc.NewService(rpc.Config{Index: e, Policies: store, Observer: m, Features: f})
	if err != nil {
		t.Fatal(err)
	}
	return svc, hs, cs
}

// TestLookupPDRouteAllocs: a LookupPDRoute allocates its response only;
// the scratch, the pick and the metrics allocate nothing in steady state.
func TestLookupPDRouteAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; counts are pinned without it")
	}
	svc, hs, cs := pdService(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		req    *pb.LookupPDRouteRequest
		reason string
	}{
		{"chain", &pb.LookupPDRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, PdTopologyRef: "pd", BlockHashes: hs, BlockTokenCounts: cs, PrefixTokenCount: 4000}, rpc.ReasonPDDisaggregated},
		{"token_ids", &pb.LookupPDRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, PdTopologyRef: "team/pd", TokenIds: tokens(0, 3000)}, rpc.ReasonPDDisaggregated},
		{"unknown topology", &pb.LookupPDRouteRequest{TenantId: "team", ModelId: model, PdTopologyRef: "nope"}, rpc.ReasonUnknownTopology},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reason string
			got := testing.AllocsPerRun(200, func() {
				resp, _ := svc.LookupPDRoute(ctx, tc.req)
				reason = resp.GetReasonCode()
			})
			if reason != tc.reason {
				t.Fatalf("reason %s, want %s", reason, tc.reason)
			}
			if got != 1 {
				t.Fatalf("allocs/op = %v, want 1 (the response)", got)
			}
		})
	}
}

func BenchmarkLookupPDRoute(b *testing.B) {
	svc, hs, cs := pdService(b)
	req := &pb.LookupPDRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, PdTopologyRef: "pd", BlockHashes: hs, BlockTokenCounts: cs, PrefixTokenCount: 4000}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = svc.LookupPDRoute(ctx, req)
	}
}
