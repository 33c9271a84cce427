package rpc_test

import (
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// recProducer counts TimestampClamped calls by rpc.
type recProducer struct {
	mu      sync.Mutex // guards clamped: written by handlers, read by the test
	clamped map[string]int
}

func (p *recProducer) TimestampClamped(rpc string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.clamped == nil {
		p.clamped = map[string]int{}
	}
	p.clamped[rpc]++
}

func (p *recProducer) count(rpc string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.clamped[rpc]
}

// producerEnv serves a Service with an instance id, a fixed clock and a
// recording ProducerObserver.
func producerEnv(t *testing.T, now time.Time) (*engine.Engine, *recProducer, pb.InferenceCacheClient) {
	t.Helper()
	store := policy.NewStore()
	e := engine.New(engine.Config{Policies: store})
	prod := &recProducer{}
	svc, err := rpc.NewService(rpc.Config{Index: e, Policies: store, Logger: slog.New(slog.DiscardHandler),
		InstanceID: "inst-1", MaxClockSkew: 3 * time.Second, Producer: prod, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return e, prod, serve(t, svc)
}

// TestProducerTimestampsClamped: a timestamp beyond now + MaxClockSkew
// (MaxInt64, an hour ahead) is stored as now + MaxClockSkew and counted; one
// within the skew, a past one and 0 ("now") are kept.
func TestProducerTimestampsClamped(t *testing.T) {
	now := time.Now().Truncate(time.Microsecond)
	e, prod, cli := producerEnv(t, now)
	limit := now.Add(3 * time.Second)
	report := func(replica string, ts int64) {
		t.Helper()
		st, err := cli.ReportCacheState(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: replica,
			TimestampUs: ts, Prefixes: []*pb.PrefixEntry{{PrefixHash: hashOf(int(ts%97), len(replica)), TokenCount: 16}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.CloseAndRecv(); err != nil {
			t.Fatal(err)
		}
	}
	report("max", math.MaxInt64)
	report("hour", now.Add(time.Hour).UnixMicro())
	report("skew", now.Add(2*time.Second).UnixMicro())
	report("past", now.Add(-time.Minute).UnixMicro())
	report("zero", 0)
	want := map[string]time.Time{
		"max": limit, "hour": limit, "skew": now.Add(2 * time.Second), "past": now.Add(-time.Minute), "zero": now,
	}
	for _, r := range e.Snapshot().Replicas {
		if w, ok := want[r.ReplicaID]; ok && !r.LastEventAt.Equal(w) {
			t.Errorf("%s: lastEventAt %v, want %v", r.ReplicaID, r.LastEventAt, w)
		}
		delete(want, r.ReplicaID)
	}
	if len(want) != 0 {
		t.Fatalf("replicas missing from the snapshot: %v", want)
	}
	if got := prod.count("ReportCacheState"); got != 2 {
		t.Fatalf("clamped ReportCacheState = %d, want 2", got)
	}

	// PublishEvent: a far-future REPLICA_UPDATED is clamped too.
	if _, err := cli.PublishEvent(ctx(t), &pb.CacheEvent{Type: pb.CacheEvent_REPLICA_UPDATED, TenantId: "team", ModelId: model,
		ReplicaId: "max", TimestampUs: math.MaxInt64}); err != nil {
		t.Fatal(err)
	}
	if got := prod.count("PublishEvent"); got != 1 {
		t.Fatalf("clamped PublishEvent = %d, want 1", got)
	}
}

// TestProducerInstanceHeader: both producer RPCs answer with the instance id
// in their response header; LookupRoute does not carry it.
func TestProducerInstanceHeader(t *testing.T) {
	_, _, cli := producerEnv(t, time.Now())
	st, err := cli.ReportCacheState(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: "r"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	md, err := st.Header()
	if err != nil {
		t.Fatal(err)
	}
	if got := md.Get(rpc.InstanceIDHeader); len(got) != 1 || got[0] != "inst-1" {
		t.Fatalf("ReportCacheState header %s = %q", rpc.InstanceIDHeader, got)
	}

	var hdr metadata.MD
	if _, err := cli.PublishEvent(ctx(t), &pb.CacheEvent{Type: pb.CacheEvent_PREFIX_ADDED, TenantId: "team"}, grpc.Header(&hdr)); err != nil {
		t.Fatal(err)
	}
	if got := hdr.Get(rpc.InstanceIDHeader); len(got) != 1 || got[0] != "inst-1" {
		t.Fatalf("PublishEvent header %s = %q", rpc.InstanceIDHeader, got)
	}

	hdr = nil
	if _, err := cli.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme}, grpc.Header(&hdr)); err != nil {
		t.Fatal(err)
	}
	if got := hdr.Get(rpc.InstanceIDHeader); len(got) != 0 {
		t.Fatalf("LookupRoute carries %s = %q", rpc.InstanceIDHeader, got)
	}
}
