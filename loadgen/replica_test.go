package loadgen

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

func testCluster(t *testing.T, replicas, blocks int) *cluster {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Replicas, cfg.ReplicaCacheBlocks = replicas, blocks
	src := &source{salt: 1, reqs: []workload.Request{{Blocks: []uint64{1}, BlockSize: 16, InputTokens: 16}}}
	return newCluster(&cfg, nil, src)
}

func TestRouteAndFallback(t *testing.T) {
	c := testCluster(t, 3, 100)
	req := &workload.Request{Blocks: []uint64{1, 2, 3}, BlockSize: 16, InputTokens: 48}
	var buf chainBuf
	_, _, keys := buf.build(c.src, req, 0)
	now := time.Now()

	// A first score naming one of ours routes there.
	c.route(&pb.LookupRouteResponse{ReplicaScores: []*pb.ReplicaScore{{ReplicaId: c.replicas[2].id}}}, req, 0, keys, now)
	if c.replicas[2].inflight.Load() != 1 || c.routedHint.Load() != 1 {
		t.Fatalf("hinted route: inflight %d, routed by hint %d", c.replicas[2].inflight.Load(), c.routedHint.Load())
	}
	// No scores, or a replica that is not ours: the least-loaded replicas
	// take the next two, never replica 2 while the others are idler.
	c.route(&pb.LookupRouteResponse{}, req, 0, keys, now)
	c.route(&pb.LookupRouteResponse{ReplicaScores: []*pb.ReplicaScore{{ReplicaId: "someone-else"}}}, req, 0, keys, now)
	got := []int64{c.replicas[0].inflight.Load(), c.replicas[1].inflight.Load(), c.replicas[2].inflight.Load()}
	if !slices.Equal(got, []int64{1, 1, 1}) || c.routedFallback.Load() != 2 {
		t.Fatalf("in flight per replica %v, fallback routes %d; want [1 1 1] and 2", got, c.routedFallback.Load())
	}
	if c.routedBlocks.Load() != 9 || c.hitBlocks.Load() != 0 {
		t.Fatalf("routed %d blocks with %d hits, want 9 and 0 (caches empty)", c.routedBlocks.Load(), c.hitBlocks.Load())
	}
}

func TestPrefillModel(t *testing.T) {
	c := testCluster(t, 1, 100)
	for _, tc := range []struct {
		tokens int
		want   time.Duration
	}{{0, 2 * time.Millisecond}, {1000, 22 * time.Millisecond}, {1_000_000, 250 * time.Millisecond}} {
		if got := c.prefillDelay(tc.tokens); got != tc.want {
			t.Errorf("prefill of %d uncached tokens: %v, want %v", tc.tokens, got, tc.want)
		}
	}
}

// TestCompleteReportsStoredSuffix checks what a finished prefill reports:
// the blocks from the first newly stored one, with the first count
// cumulative so the server's per-block cumulative counts come out exact.
func TestCompleteReportsStoredSuffix(t *testing.T) {
	c := testCluster(t, 1, 100)
	r := c.replicas[0]
	var buf chainBuf
	turn1 := &workload.Request{Blocks: []uint64{1, 2, 3}, BlockSize: 16, InputTokens: 40} // last block partial
	turn2 := &workload.Request{Blocks: []uint64{1, 2, 4, 5, 6}, BlockSize: 16, InputTokens: 80}
	wire := func(ids ...uint64) []uint64 {
		var out []uint64
		for _, id := range ids {
			out = append(out, c.src.hash(0, id))
		}
		return out
	}
	keysOf := func(e *pb.PrefixEntry) []uint64 {
		var out []uint64
		for _, h := range e.GetBlockHashes() {
			out = append(out, binary.BigEndian.Uint64(h))
		}
		return out
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.completeLocked(turn1, 0, &buf)
	if !slices.Equal(keysOf(e), wire(1, 2)) || !slices.Equal(e.GetBlockTokenCounts(), []int32{16, 16}) || e.GetTier() != pb.CacheTier_CACHE_TIER_T1 {
		t.Fatalf("turn 1 reported %x %v, want the two full blocks", keysOf(e), e.GetBlockTokenCounts())
	}
	e = r.completeLocked(turn2, 0, &buf)
	if !slices.Equal(keysOf(e), wire(4, 5, 6)) || !slices.Equal(e.GetBlockTokenCounts(), []int32{48, 16, 16}) {
		t.Fatalf("turn 2 reported %x %v, want blocks 4..6 with counts [48 16 16]", keysOf(e), e.GetBlockTokenCounts())
	}
	if e := r.completeLocked(turn2, 0, &buf); e != nil {
		t.Fatalf("a fully cached chain reported %v", e)
	}
	if got := r.cache.leadingRun(wire(1, 2, 4, 5, 6)); got != 5 {
		t.Fatalf("cache holds a leading run of %d, want 5", got)
	}
}
