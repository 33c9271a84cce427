package rpc_test

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// huge is a 1 MiB id.
var huge = strings.Repeat("x", 1<<20)

// wantInvalidID checks err is InvalidArgument naming field and the limit.
func wantInvalidID(t *testing.T, err error, field string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), field) || !strings.Contains(st.Message(), fmt.Sprint(rpc.MaxIDBytes)) {
		t.Fatalf("err = %v, want InvalidArgument naming %s and the %d-byte limit", err, field, rpc.MaxIDBytes)
	}
	if len(st.Message()) > 512 {
		t.Fatalf("error message of %d bytes (it must not echo the id)", len(st.Message()))
	}
}

// TestReportCacheStateRefusesOversizedIDs: an update with an id over
// MaxIDBytes is refused whole and the stream ends InvalidArgument naming the
// field and the limit; the good updates around it on the same stream are
// applied.
func TestReportCacheStateRefusesOversizedIDs(t *testing.T) {
	a, ac := chainOf(chainA, 2)
	good := func(replica string) *pb.CacheStateUpdate {
		return &pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: replica,
			Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}}
	}
	for _, c := range []struct {
		field string
		set   func(u *pb.CacheStateUpdate)
	}{
		{"tenant_id", func(u *pb.CacheStateUpdate) { u.TenantId = huge }},
		{"model_id", func(u *pb.CacheStateUpdate) { u.ModelId = huge }},
		{"replica_id", func(u *pb.CacheStateUpdate) { u.ReplicaId = huge }},
		{"hash_scheme", func(u *pb.CacheStateUpdate) { u.HashScheme = huge }},
		{"adapter_id", func(u *pb.CacheStateUpdate) { u.AdapterId = huge }},
		{"prefixes[1].adapter_id", func(u *pb.CacheStateUpdate) {
			u.Prefixes = append(u.Prefixes, &pb.PrefixEntry{PrefixHash: hashOf(7, 0), TokenCount: 16, AdapterId: huge})
		}},
	} {
		t.Run(c.field, func(t *testing.T) {
			env := newEnv(t, envOpts{})
			env.policies(t, policy.ResolvedPolicy{Namespace: "team", MinimumMatchedTokens: 0, RoutingFloorScore: ptr(float32(0))})
			bad := good("bad")
			c.set(bad)
			st, err := env.client.ReportCacheState(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range []*pb.CacheStateUpdate{good("r1"), bad, good("r2")} {
				if err := st.Send(u); err != nil && !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
			}
			_, err = st.CloseAndRecv()
			wantInvalidID(t, err, c.field)
			if _, keys := env.e.ModelState("team", model); keys != 2 {
				t.Fatalf("keys = %d, want the good updates' 2", keys)
			}
			r := lookupChain(t, env, "team", a, ac)
			if got := replicaIDs(r); strings.Join(got, ",") != "r1,r2" {
				t.Fatalf("holders %v, want r1 and r2 (the bad update refused whole)", got)
			}
		})
	}
}

// TestPublishEventRefusesOversizedIDs: an event with an id over MaxIDBytes
// is InvalidArgument naming the field, and is not applied.
func TestPublishEventRefusesOversizedIDs(t *testing.T) {
	env := newEnv(t, envOpts{})
	env.policies(t, policy.ResolvedPolicy{Namespace: "team", MinimumMatchedTokens: 0, RoutingFloorScore: ptr(float32(0))})
	env.seed(t, "team")
	a, ac := chainOf(chainA, 8)
	for _, c := range []struct {
		field string
		ev    *pb.CacheEvent
	}{
		{"tenant_id", &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, TenantId: huge, ModelId: model, ReplicaId: "r1"}},
		{"model_id", &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, TenantId: "team", ModelId: huge, ReplicaId: "r1"}},
		{"replica_id", &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, TenantId: "team", ModelId: model, ReplicaId: huge}},
		{"adapter_id", &pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, TenantId: "team", ModelId: model, ReplicaId: "r1", PrefixHash: a[0], AdapterId: huge}},
	} {
		_, err := env.client.PublishEvent(ctx(t), c.ev)
		wantInvalidID(t, err, c.field)
	}
	if got := replicaIDs(lookupChain(t, env, "team", a, ac)); strings.Join(got, ",") != "r1,r2" {
		t.Fatalf("holders after refused events: %v", got)
	}
}

// TestLookupRouteOversizedIDFailsOpen: a lookup with an id over MaxIDBytes
// answers NO_HINT without reaching the index, and is recorded once.
func TestLookupRouteOversizedIDFailsOpen(t *testing.T) {
	env := newEnv(t, envOpts{})
	env.seed(t, "team")
	a, ac := chainOf(chainA, 8)
	for _, req := range []*pb.LookupRouteRequest{
		{TenantId: huge, ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac},
		{TenantId: "team", ModelId: huge, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac},
		{TenantId: "team", ModelId: model, HashScheme: huge, BlockHashes: a, BlockTokenCounts: ac},
		{TenantId: "team", ModelId: model, HashScheme: scheme, AdapterId: huge, BlockHashes: a, BlockTokenCounts: ac},
	} {
		lookups, calls := env.slow.count(), env.obs.len()
		resp, err := env.client.LookupRoute(ctx(t), req)
		if err != nil || resp.GetReasonCode() != rpc.ReasonNoHint || len(resp.GetReplicaScores()) != 0 || resp.GetAdapterId() != "" {
			t.Fatalf("oversized id: %v, %v; want an empty NO_HINT", resp, err)
		}
		if env.slow.count() != lookups {
			t.Fatal("an oversized-id lookup reached the index")
		}
		if env.obs.len() != calls+1 {
			t.Fatalf("recorded %d times, want once", env.obs.len()-calls)
		}
	}
	// At the limit is fine.
	resp, err := env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: strings.Repeat("m", rpc.MaxIDBytes), HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac})
	if err != nil || resp.GetReasonCode() != rpc.ReasonUnknownModel {
		t.Fatalf("id at the limit: %v, %v; want UNKNOWN_MODEL", resp, err)
	}
}
