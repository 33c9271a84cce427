package bench

import (
	"testing"

	"github.com/inferencecache/inferencecache/bench/workload"
)

// chainReq is a request of n 4-token blocks with ids 1..n.
func chainReq(n int) *workload.Request {
	r := &workload.Request{BlockSize: 4, InputTokens: 4 * n}
	for i := 1; i <= n; i++ {
		r.Blocks = append(r.Blocks, uint64(i))
	}
	return r
}

func view(loads ...ReplicaLoad) *View { return &View{Replicas: loads} }

func TestSimplePolicies(t *testing.T) {
	q := chainReq(2)
	v := view(ReplicaLoad{PendingPrefillTokens: 5}, ReplicaLoad{PendingPrefillTokens: 5, Running: 1}, ReplicaLoad{PendingPrefillTokens: 9})
	if got := LeastLoadedPolicy().New(3, 1).Route(q, v); got != 0 {
		t.Fatalf("least-loaded picked %d, want 0 (tie on tokens, fewer in flight)", got)
	}
	rr := RoundRobinPolicy().New(3, 1)
	for i, want := range []int{0, 1, 2, 0} {
		if got := rr.Route(q, v); got != want {
			t.Fatalf("round-robin call %d picked %d, want %d", i, got, want)
		}
	}
	a, b := RandomPolicy().New(3, 9), RandomPolicy().New(3, 9)
	seen := map[int]bool{}
	for i := 0; i < 100; i++ {
		x, y := a.Route(q, v), b.Route(q, v)
		if x != y {
			t.Fatal("two random routers with one seed disagree")
		}
		seen[x] = true
	}
	if len(seen) != 3 {
		t.Fatalf("random used replicas %v of 3", seen)
	}
}

func TestLongestPrefix(t *testing.T) {
	r := LongestPrefixPolicy().New(3, 1)
	r.Observe(stored(1, 1, 2))
	r.Observe(stored(2, 1, 2, 3))
	idle := view(ReplicaLoad{}, ReplicaLoad{}, ReplicaLoad{})
	if got := r.Route(chainReq(4), idle); got != 2 {
		t.Fatalf("picked %d, want 2 (3 blocks cached)", got)
	}
	// Equal overlap: the less loaded replica wins, whatever its index.
	r.Observe(stored(1, 3))
	busy2 := view(ReplicaLoad{}, ReplicaLoad{}, ReplicaLoad{PendingPrefillTokens: 1})
	if got := r.Route(chainReq(4), busy2); got != 1 {
		t.Fatalf("picked %d, want 1 (tie, less loaded)", got)
	}
	if got := r.Route(&workload.Request{Blocks: []uint64{99}, BlockSize: 4, InputTokens: 4}, busy2); got != 0 {
		t.Fatalf("no overlap anywhere: picked %d, want least loaded 0", got)
	}
}

func TestDynamoCost(t *testing.T) {
	// Request: 10 blocks of 4 tokens. Replica 0 caches 8 of them but has
	// 40 pending prefill tokens (10 blocks) and 20 active blocks; replica 1
	// is idle and cold.
	//   cost0 = 1×(40+8)/4 + (20+10) = 12 + 30 = 42
	//   cost1 = 1×(0+40)/4 + (0+10)  = 10 + 10 = 20  → replica 1
	// With weight 4: cost0 = 48 + 30 = 78, cost1 = 40 + 10 = 50 → still 1.
	// With 40 active blocks on replica 1 instead: cost1 = 10 + 50 = 60 → 0.
	q := chainReq(10)
	f := func(w float64, v *View, want int) {
		t.Helper()
		r := DynamoCostPolicy(w).New(2, 1)
		r.Observe(stored(0, 1, 2, 3, 4, 5, 6, 7, 8))
		if got := r.Route(q, v); got != want {
			t.Fatalf("weight %v: picked %d, want %d", w, got, want)
		}
	}
	hot := ReplicaLoad{PendingPrefillTokens: 40, ActiveBlocks: 20}
	f(1, view(hot, ReplicaLoad{}), 1)
	f(4, view(hot, ReplicaLoad{}), 1)
	f(1, view(hot, ReplicaLoad{ActiveBlocks: 40}), 0)
	if DynamoCostPolicy(1).Name != "dynamo-cost" || DynamoCostPolicy(2).Name != "dynamo-cost(w=2)" {
		t.Fatal("unexpected policy names")
	}
}

func TestSGLangCacheAware(t *testing.T) {
	inflight := func(n int) ReplicaLoad { return ReplicaLoad{Running: n} }
	events := sglangWithEvents()
	f := func(c SGLangConfig, q *workload.Request, v *View, want int) {
		t.Helper()
		r := SGLangCacheAwarePolicy(c).New(3, 1)
		r.Observe(stored(0, 1, 2, 3)) // replica 0: 3 blocks of the chain
		r.Observe(stored(2, 50))      // replica 2: one unrelated block
		if got := r.Route(q, v); got != want {
			t.Fatalf("%+v: picked %d, want %d", c, got, want)
		}
	}
	balanced := view(inflight(5), inflight(1), inflight(2))
	// Match 3/4 = 0.75 > 0.3: the best match wins despite its load.
	f(events, chainReq(4), balanced, 0)
	// Match 3/20 = 0.15 <= 0.3: the smallest tree wins (replica 1: empty).
	f(events, chainReq(20), balanced, 1)
	// Imbalanced (70 - 1 > 64 and 70 > 1.5 × 1): least in flight wins.
	f(events, chainReq(4), view(inflight(70), inflight(1), inflight(2)), 1)
	// Loads 200 vs 140 differ by 60 <= 64: balanced, cache decides.
	f(events, chainReq(4), view(inflight(200), inflight(140), inflight(150)), 0)
	// Loads 100 vs 30: diff 70 > 64 and 100 > 45: imbalanced.
	f(events, chainReq(4), view(inflight(100), inflight(30), inflight(40)), 1)
	// Loads 300 vs 250: diff 50; and 400 vs 300: diff 100 but 400 < 450.
	f(events, chainReq(4), view(inflight(400), inflight(300), inflight(350)), 0)

	// Without events the router knows only what it routed itself.
	approx := DefaultSGLangConfig()
	r := SGLangCacheAwarePolicy(approx).New(3, 1)
	r.Observe(stored(2, 1, 2, 3, 4)) // ignored
	if got := r.Route(chainReq(4), view(inflight(0), inflight(0), inflight(0))); got != 0 {
		t.Fatalf("first request: picked %d, want 0 (all trees empty, tie)", got)
	}
	if got := r.Route(chainReq(4), view(inflight(3), inflight(0), inflight(0))); got != 0 {
		t.Fatalf("repeat request: picked %d, want 0 (its tree holds the chain)", got)
	}
	if got := r.Route(&workload.Request{Blocks: []uint64{77}, BlockSize: 4, InputTokens: 4}, view(inflight(3), inflight(0), inflight(1))); got != 1 {
		t.Fatalf("cold request: picked %d, want 1 (smallest tree, then least loaded)", got)
	}
	if SGLangCacheAwarePolicy(approx).Name != "sglang-cache-aware" || SGLangCacheAwarePolicy(events).Name != "sglang-cache-aware+events" {
		t.Fatal("unexpected policy names")
	}
}
