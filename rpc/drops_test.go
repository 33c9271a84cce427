package rpc_test

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// TestDroppedReportsCounted sends every kind of report the index cannot
// apply through a real server over a real engine and checks each is counted
// under its reason, and that what is applied (and the reserved tenant) is
// not.
func TestDroppedReportsCounted(t *testing.T) {
	env := newEnv(t, envOpts{})
	env.seed(t, "team")
	if got := env.drops.take(); len(got) != 0 {
		t.Fatalf("good reports counted as dropped: %v", got)
	}
	a, ac := chainOf(chainA, 2)
	stats := &pb.ReplicaStats{HitRate: 0.5}
	two := []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}, {PrefixHash: hashOf(9, 0), TokenCount: 16}}
	for _, c := range []struct {
		name    string
		updates []*pb.CacheStateUpdate
		events  []*pb.CacheEvent
		want    map[string]int
	}{
		{name: "missing replica id: its prefixes and stats",
			updates: []*pb.CacheStateUpdate{{TenantId: "team", ModelId: model, HashScheme: scheme, Prefixes: two, Stats: stats}},
			want:    map[string]int{rpc.DropMissingReplicaID: 3}},
		{name: "missing hash scheme: its prefixes (stats kept)",
			updates: []*pb.CacheStateUpdate{{TenantId: "team", ModelId: model, ReplicaId: "r1", Prefixes: two, Stats: stats}},
			want:    map[string]int{rpc.DropMissingHashScheme: 2}},
		{name: "malformed entries next to good ones",
			updates: []*pb.CacheStateUpdate{{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: "r1", Prefixes: []*pb.PrefixEntry{
				{BlockHashes: a, BlockTokenCounts: ac[:1]},                        // unbalanced
				{BlockTokenCounts: ac},                                            // counts without hashes
				{BlockHashes: [][]byte{a[0], {}}, BlockTokenCounts: ac},           // an empty block hash
				{PrefixHash: make([]byte, engine.MaxHashBytes+1), TokenCount: 16}, // oversized legacy hash
				{TokenCount: 16}, // no hash at all
				{BlockHashes: a, BlockTokenCounts: ac, PrefixHash: make([]byte, engine.MaxHashBytes+1)}, // chain kept, legacy part dropped
				{BlockHashes: a, BlockTokenCounts: ac},                                                  // good
			}}},
			want: map[string]int{rpc.DropMalformedChain: 2, rpc.DropInvalidHash: 4}},
		{name: "reserved tenant is not a drop",
			updates: []*pb.CacheStateUpdate{{TenantId: policy.ReservedTenantID, ModelId: model, HashScheme: scheme, ReplicaId: "x", Prefixes: two}},
			events:  []*pb.CacheEvent{{Type: pb.CacheEvent_ALL_CLEARED, TenantId: policy.ReservedTenantID, ModelId: model, ReplicaId: "x"}},
			want:    map[string]int{}},
		{name: "events",
			events: []*pb.CacheEvent{
				{Type: pb.CacheEvent_TYPE_UNSPECIFIED, TenantId: "team", ModelId: model, ReplicaId: "r1"},
				{Type: pb.CacheEvent_Type(99), TenantId: "team", ModelId: model, ReplicaId: "r1"},
				{Type: pb.CacheEvent_PREFIX_ADDED, TenantId: "team", ModelId: model, ReplicaId: "r1"}, // a documented no-op
				{Type: pb.CacheEvent_PREFIX_EVICTED, TenantId: "team", ModelId: model, ReplicaId: "r1"},
				{Type: pb.CacheEvent_PREFIX_EVICTED, TenantId: "team", ModelId: model, ReplicaId: "r1", PrefixHash: make([]byte, engine.MaxHashBytes+1)},
				{Type: pb.CacheEvent_ALL_CLEARED, TenantId: "team", ModelId: model},
				{Type: pb.CacheEvent_PREFIX_EVICTED, TenantId: "team", ModelId: model, ReplicaId: "nobody", PrefixHash: a[0]}, // nothing to remove: not a drop
			},
			want: map[string]int{rpc.DropUnknownEventType: 2, rpc.DropInvalidHash: 2, rpc.DropMissingReplicaID: 1}},
		{name: "oversized ids: every report of the refused message, at least one",
			updates: []*pb.CacheStateUpdate{
				{TenantId: "team", ModelId: huge, HashScheme: scheme, ReplicaId: "r1", Prefixes: two, Stats: stats},
				{TenantId: huge},
			},
			events: []*pb.CacheEvent{{Type: pb.CacheEvent_ALL_CLEARED, TenantId: "team", ModelId: model, ReplicaId: huge}},
			want:   map[string]int{rpc.DropOversizedID: 3 + 1 + 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if len(c.updates) > 0 {
				st, err := env.client.ReportCacheState(ctx(t))
				if err != nil {
					t.Fatal(err)
				}
				for _, u := range c.updates {
					if err := st.Send(u); err != nil {
						t.Fatal(err)
					}
				}
				_, _ = st.CloseAndRecv()
			}
			for _, ev := range c.events {
				_, _ = env.client.PublishEvent(ctx(t), ev)
			}
			if got := env.drops.take(); !maps.Equal(got, c.want) {
				t.Fatalf("dropped %v, want %v", got, c.want)
			}
		})
	}
}

// fullIndex stands in for an engine whose replica table is full (65,535
// replicas of one model, which takes the engine minutes to register): every
// update of replica "over-capacity" is refused whole, as the engine refuses
// it, and everything else goes to the real engine.
type fullIndex struct{ rpc.Index }

func (f fullIndex) Ingest(u *engine.Update, now int64) engine.IngestResult {
	if u.ReplicaID == "over-capacity" {
		return engine.IngestResult{Dropped: len(u.Prefixes)}
	}
	return f.Index.Ingest(u, now)
}

// TestDroppedReportsIndexFull: entries the index refuses for none of the
// reasons visible in the message are counted as index_full; malformed ones
// in the same update keep their own reason.
func TestDroppedReportsIndexFull(t *testing.T) {
	store := policy.NewStore()
	e := engine.New(engine.Config{Policies: store})
	drops := &recDrops{}
	svc, err := rpc.NewService(rpc.Config{Index: fullIndex{e}, Policies: store, Drops: drops, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	client := serve(t, svc)
	a, ac := chainOf(chainA, 2)
	st, err := client.ReportCacheState(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: "over-capacity", Prefixes: []*pb.PrefixEntry{
		{BlockHashes: a, BlockTokenCounts: ac}, {PrefixHash: hashOf(3, 0), TokenCount: 16}, {BlockHashes: a, BlockTokenCounts: ac[:1]},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	if got, want := drops.take(), map[string]int{rpc.DropIndexFull: 2, rpc.DropMalformedChain: 1}; !maps.Equal(got, want) {
		t.Fatalf("dropped %v, want %v", got, want)
	}
}

// syncBuf is a goroutine-safe log sink.
type syncBuf struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDroppedReportsLogRateLimited: drops are logged at WARN at most once a
// minute (with the reason and the running total), however many there are.
func TestDroppedReportsLogRateLimited(t *testing.T) {
	store := policy.NewStore()
	e := engine.New(engine.Config{Policies: store})
	var logs syncBuf
	var mu sync.Mutex // guards now
	now := time.Unix(1_700_000_000, 0)
	svc, err := rpc.NewService(rpc.Config{Index: e, Policies: store, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	if err != nil {
		t.Fatal(err)
	}
	bad := &pb.CacheEvent{Type: pb.CacheEvent_Type(42), TenantId: "team", ModelId: model, ReplicaId: "r1"}
	for range 100 {
		if _, err := svc.PublishEvent(context.Background(), bad); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Fatalf("%d WARN lines for 100 drops in one minute, want 1:\n%s", n, logs.String())
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	if _, err := svc.PublishEvent(context.Background(), bad); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 2 || !strings.Contains(out, "reason="+rpc.DropUnknownEventType) || !strings.Contains(out, "total=101") {
		t.Fatalf("want a second WARN with the reason and total=101:\n%s", out)
	}
}
