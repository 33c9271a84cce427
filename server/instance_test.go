package server_test

import (
	"encoding/json"
	"math"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server/servertest"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// snapshot GETs /snapshot from s's internal listener.
func snapshot(t *testing.T, s *running) controlapi.CacheSnapshot {
	t.Helper()
	code, body := httpDo(t, http.MethodGet, "http://"+s.InternalAddr().String()+"/snapshot", "", nil)
	if code != http.StatusOK {
		t.Fatalf("/snapshot: %d %s", code, body)
	}
	var snap controlapi.CacheSnapshot
	if err := json.Unmarshal([]byte(body), &snap); err != nil {
		t.Fatal(err)
	}
	return snap
}

// TestInstanceID: each server start draws its own instance id; producers
// read it from the response headers of ReportCacheState and PublishEvent,
// the controller from /snapshot's serverInstanceId.
func TestInstanceID(t *testing.T) {
	a, b := start(t, testConfig()), start(t, testConfig())
	if a.InstanceID() == "" || a.InstanceID() == b.InstanceID() {
		t.Fatalf("instance ids %q and %q: want two distinct non-empty ids", a.InstanceID(), b.InstanceID())
	}
	for _, s := range []*running{a, b} {
		st, err := s.cli.ReportCacheState(tctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.CloseAndRecv(); err != nil {
			t.Fatal(err)
		}
		md, err := st.Header()
		if err != nil {
			t.Fatal(err)
		}
		if got := md.Get(rpc.InstanceIDHeader); len(got) != 1 || got[0] != s.InstanceID() {
			t.Fatalf("ReportCacheState header %q, want %q", got, s.InstanceID())
		}
		var hdr metadata.MD
		if _, err := s.cli.PublishEvent(tctx(t), &pb.CacheEvent{Type: pb.CacheEvent_REPLICA_UPDATED}, grpc.Header(&hdr)); err != nil {
			t.Fatal(err)
		}
		if got := hdr.Get(rpc.InstanceIDHeader); len(got) != 1 || got[0] != s.InstanceID() {
			t.Fatalf("PublishEvent header %q, want %q", got, s.InstanceID())
		}
		if got := snapshot(t, s).ServerInstanceID; got != s.InstanceID() {
			t.Fatalf("/snapshot serverInstanceId %q, want %q", got, s.InstanceID())
		}
	}
}

// TestFarFutureTimestamp: a ReportCacheState stamped MaxInt64 µs (year
// 294247) is stored clamped to now + MaxClockSkew and counted; GET /snapshot
// answers 200 with the clamped lastEventAt (it answered 500, "year outside
// of range", before timestamps were clamped).
func TestFarFutureTimestamp(t *testing.T) {
	cfg := testConfig()
	cfg.MaxClockSkew = 2 * time.Second
	s := start(t, cfg)
	before := time.Now()
	report(t, s.cli, &pb.CacheStateUpdate{TenantId: "team", ModelId: "llama", HashScheme: "vllm", ReplicaId: "r-future",
		TimestampUs: math.MaxInt64, Prefixes: []*pb.PrefixEntry{{PrefixHash: []byte("future-key"), TokenCount: 16}}})
	after := time.Now()
	var row *controlapi.ReplicaSnapshot
	snap := snapshot(t, s)
	for i := range snap.Replicas {
		if snap.Replicas[i].ReplicaID == "r-future" {
			row = &snap.Replicas[i]
		}
	}
	if row == nil {
		t.Fatalf("no r-future row in %+v", snap.Replicas)
	}
	if lo, hi := before.Add(2*time.Second).Truncate(time.Microsecond), after.Add(2*time.Second); row.LastEventAt.Before(lo) || row.LastEventAt.After(hi) {
		t.Fatalf("lastEventAt %v, want now + 2s within [%v, %v]", row.LastEventAt, lo, hi)
	}
	if v, _ := servertest.Value(servertest.Scrape(t, s.Server), servermetrics.NameTimestampsClamped, "rpc=ReportCacheState"); v != 1 {
		t.Fatalf("%s{rpc=ReportCacheState} = %v, want 1", servermetrics.NameTimestampsClamped, v)
	}
}
