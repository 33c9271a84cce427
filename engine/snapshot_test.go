package engine

import (
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/policy"
)

func TestSnapshot(t *testing.T) {
	x := newTix(t)
	x.chainIn("b-team", "m1", "vllm", "", "r1", tT-min1, 0, 1, 2)
	x.chainIn("b-team", "m2", "vllm", "", "r1", tT, 0, 3) // same (tenant, replica), another model: one row
	x.chainIn("a-team", "m1", "vllm", "", "r9", tT, 0, 1)
	x.chainIn("", "m1", "vllm", "", "r0", tT, 0, 5) // untenanted keys count under ""
	x.chainIn(policy.ReservedTenantID, "m1", "vllm", "", "__probe-x", tT, 0, 8)
	x.e.Ingest(&Update{TenantID: "b-team", ModelID: "m1", ReplicaID: "r1", TimestampUs: tT - 2*min1,
		Stats: &ReplicaStats{CacheMemoryBytes: 1 << 30, HitRate: 0.25, Pressure: 0.5, T2HitTokens: 7, T2QueryTokens: 9}}, tT)
	x.e.Ingest(&Update{TenantID: "b-team", ModelID: "m1", ReplicaID: "r2", TimestampUs: tT,
		Stats: &ReplicaStats{HitRate: 0.75}}, tT) // stats-only replica
	s := x.e.Snapshot()
	if len(s.Replicas) != 4 {
		t.Fatalf("rows %+v", s.Replicas)
	}
	// Sorted by (tenant, id): "" r0, a-team r9, b-team r1, b-team r2.
	order := []string{"/r0", "a-team/r9", "b-team/r1", "b-team/r2"}
	for i, r := range s.Replicas {
		if r.Tenant+"/"+r.ReplicaID != order[i] {
			t.Fatalf("row %d is %s/%s, want %s", i, r.Tenant, r.ReplicaID, order[i])
		}
	}
	r1 := s.Replicas[2]
	if r1.PrefixCount != 3 || !r1.LastEventAt.Equal(time.UnixMicro(tT)) || !r1.StatsReported ||
		r1.HitRate != 0.25 || r1.CacheMemoryBytes != 1<<30 || r1.T2HitTokens != 7 || r1.T2QueryTokens != 9 ||
		!r1.LastUpdate.Equal(time.UnixMicro(tT-2*min1)) {
		t.Fatalf("r1 row %+v", r1)
	}
	if r2 := s.Replicas[3]; r2.PrefixCount != 0 || !r2.LastEventAt.IsZero() || !r2.StatsReported {
		t.Fatalf("stats-only row %+v", r2)
	}
	if r0 := s.Replicas[0]; r0.StatsReported || r0.PrefixCount != 1 {
		t.Fatalf("prefix-only row %+v", r0)
	}
	var sum int64
	for _, tn := range s.Tenants {
		sum += tn.IndexEntries
		if tn.TenantID == policy.ReservedTenantID {
			t.Fatal("reserved tenant in the snapshot")
		}
	}
	if sum != s.TotalPrefixes || s.TotalPrefixes != 5 || s.HotPrefixes != 0 {
		t.Fatalf("tenants %+v total %d", s.Tenants, s.TotalPrefixes)
	}
	if len(s.Tenants) != 3 || s.Tenants[0].TenantID != "" || s.Tenants[2].TenantID != "b-team" {
		t.Fatalf("tenant order %+v", s.Tenants)
	}
	if b := s.Tenants[2]; b.IndexEntries != 3 || !b.HitRateReported || b.HitRate != 0.5 || b.MemoryUsed != 0 {
		t.Fatalf("b-team %+v (mean hit rate of r1 and r2)", b)
	}
}

func TestMemoryAccounting(t *testing.T) {
	x := newTix(t)
	for i := range 1000 {
		x.chain("a", tT, 0, uint64(i))
		x.chain("b", tT, 0, uint64(i))
	}
	m := x.e.Memory()
	if m.Entries != 2000 || m.Keys != 1000 {
		t.Fatalf("counts %+v", m)
	}
	// 1000 nodes of 32 B and 1000 two-holder blocks of 40 B live in the arena.
	if m.ArenaLiveBytes != 1000*(nodeBytes+2*holderWord*4) {
		t.Fatalf("arena live bytes %d", m.ArenaLiveBytes)
	}
	// The budgeted bytes are what evicting entries frees; the overhead is
	// held (TotalBytes) but not budgeted.
	if m.IndexBytes != m.ArenaLiveBytes+m.TableBytes+m.QueueBytes || m.OverheadBytes <= 0 ||
		m.TotalBytes != m.ArenaSlabBytes+m.TableBytes+m.QueueBytes+m.OverheadBytes {
		t.Fatalf("breakdown %+v", m)
	}
	// Removing everything returns the arena's live bytes to zero.
	x.e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: "team", ModelID: "m", ReplicaID: "a"}, tT)
	x.e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: "team", ModelID: "m", ReplicaID: "b"}, tT)
	if m := x.e.Memory(); m.ArenaLiveBytes != 0 || m.Entries != 0 {
		t.Fatalf("after clearing: %+v", m)
	}
}
