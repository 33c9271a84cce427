package bench

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/inferencecache/inferencecache/bench/workload"
)

// contents returns the cached ids from most to least recent.
func (c *LRU) contents() []uint64 {
	var out []uint64
	for n, steps := c.nodes[0].next, 0; n != 0 && steps <= c.size; n, steps = c.nodes[n].next, steps+1 {
		out = append(out, c.nodes[n].key)
	}
	return out
}

func TestLRUHandComputed(t *testing.T) {
	c := NewLRU(4)
	f := func(chain []uint64, wantRun int, wantIns []int, wantEv []uint64, wantMRU []uint64) {
		t.Helper()
		if got := c.LeadingRun(chain); got != wantRun {
			t.Fatalf("LeadingRun(%v) = %d, want %d", chain, got, wantRun)
		}
		ins, ev := c.Access(chain, nil, nil)
		if !slices.Equal(ins, wantIns) || !slices.Equal(ev, wantEv) {
			t.Fatalf("Access(%v): inserted %v evicted %v, want %v and %v", chain, ins, ev, wantIns, wantEv)
		}
		if got := c.contents(); !slices.Equal(got, wantMRU) {
			t.Fatalf("after %v cache (MRU first) = %v, want %v", chain, got, wantMRU)
		}
	}
	f([]uint64{1, 2, 3}, 0, []int{0, 1, 2}, nil, []uint64{3, 2, 1})
	f([]uint64{1, 2, 4}, 2, []int{2}, nil, []uint64{4, 2, 1, 3})
	f([]uint64{1, 2, 3, 5}, 3, []int{3}, []uint64{4}, []uint64{5, 3, 2, 1})
	f([]uint64{6}, 0, []int{0}, []uint64{1}, []uint64{6, 5, 3, 2})
	// 1 is gone, so nothing hits even though 2 is still cached. Inserting
	// 1 evicts 2 (the least recent), which the chain then inserts again:
	// 2 is reported both evicted and inserted, in that order.
	f([]uint64{1, 2, 4, 7}, 0, []int{0, 1, 2, 3}, []uint64{2, 3, 5, 6}, []uint64{7, 4, 2, 1})
	// A chain longer than the cache evicts its own head: blocks inserted
	// and evicted within one call are reported in neither list.
	f([]uint64{8, 9, 10, 11, 12, 13}, 0, []int{2, 3, 4, 5}, []uint64{1, 2, 4, 7}, []uint64{13, 12, 11, 10})
	if c.Len() != 4 || c.Contains(8) || !c.Contains(10) {
		t.Fatalf("Len %d, Contains(8) %v, Contains(10) %v", c.Len(), c.Contains(8), c.Contains(10))
	}
	c.Clear()
	if c.Len() != 0 || c.Contains(10) || len(c.contents()) != 0 {
		t.Fatal("Clear left blocks behind")
	}
	f([]uint64{1}, 0, []int{0}, nil, []uint64{1})
}

// refLRU is the obviously correct model: a slice, most recent first.
type refLRU struct {
	cap  int
	keys []uint64
}

func (r *refLRU) access(chain []uint64) (hit int, evicted []uint64) {
	for hit < len(chain) && slices.Contains(r.keys, chain[hit]) {
		hit++
	}
	for _, id := range chain {
		if i := slices.Index(r.keys, id); i >= 0 {
			r.keys = slices.Delete(r.keys, i, i+1)
		}
		r.keys = slices.Insert(r.keys, 0, id)
		if r.cap > 0 && len(r.keys) > r.cap {
			evicted = append(evicted, r.keys[len(r.keys)-1])
			r.keys = r.keys[:len(r.keys)-1]
		}
	}
	return hit, evicted
}

func TestLRUMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 50; trial++ {
		capacity := rng.IntN(12) // 0 = unbounded
		c, ref := NewLRU(capacity), &refLRU{cap: capacity}
		for op := 0; op < 300; op++ {
			if rng.IntN(50) == 0 {
				c.Clear()
				ref.keys = nil
				continue
			}
			chain := make([]uint64, 1+rng.IntN(8))
			for i := range chain {
				chain[i] = uint64(rng.IntN(30))
			}
			chain = slices.Compact(chain) // adjacent repeats would be odd chains
			wantHit, refEv := ref.access(chain)
			if got := c.LeadingRun(chain); got != wantHit {
				t.Fatalf("trial %d op %d: LeadingRun = %d, want %d", trial, op, got, wantHit)
			}
			_, ev := c.Access(chain, nil, nil)
			if got := c.contents(); !slices.Equal(got, ref.keys) {
				t.Fatalf("trial %d op %d: cache %v, want %v", trial, op, got, ref.keys)
			}
			// Every id the reference evicted and that is not in chain was
			// cached before the call, and LRU must report it.
			for _, id := range refEv {
				if !slices.Contains(chain, id) && !slices.Contains(ev, id) {
					t.Fatalf("trial %d op %d: eviction of %d not reported (%v)", trial, op, id, ev)
				}
			}
		}
	}
}

// handTrace is the five-request trace the pooled-bound tests compute by
// hand (block size 4).
func handTrace() []workload.Request {
	mk := func(ms int, input int, blocks ...uint64) workload.Request {
		return workload.Request{Arrival: msec(ms), Blocks: blocks, BlockSize: 4, InputTokens: input, OutputTokens: 1}
	}
	reqs := []workload.Request{
		mk(0, 10, 1, 2, 3),
		mk(1, 12, 1, 2, 4),
		mk(2, 13, 1, 2, 3, 5),
		mk(3, 3, 6),
		mk(4, 16, 1, 2, 4, 7),
	}
	for i := range reqs {
		reqs[i].ID = i
	}
	return reqs
}

func TestPooledHitsHandComputed(t *testing.T) {
	f := func(capacity int, want Hits) {
		t.Helper()
		if got := PooledHits(handTrace(), capacity); got != want {
			t.Fatalf("PooledHits(cap %d) = %+v, want %+v", capacity, got, want)
		}
	}
	// Infinite: r1 hits [1 2], r2 hits [1 2 3], r4 hits [1 2 4].
	f(0, Hits{Requests: 5, Blocks: 15, HitBlocks: 8, Tokens: 54, HitTokens: 8 + 12 + 12})
	// Four blocks (see TestLRUHandComputed): only r1 (2) and r2 (3) hit.
	f(4, Hits{Requests: 5, Blocks: 15, HitBlocks: 5, Tokens: 54, HitTokens: 8 + 12})
	// One block: each request leaves only its last block; nothing hits.
	f(1, Hits{Requests: 5, Blocks: 15, HitBlocks: 0, Tokens: 54, HitTokens: 0})
}
