package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func stored(r int, blocks ...uint64) *Event {
	return &Event{Kind: BlockStored, Replica: r, Blocks: blocks}
}

func removed(r int, blocks ...uint64) *Event {
	return &Event{Kind: BlockRemoved, Replica: r, Blocks: blocks}
}

func TestPrefixIndexHandComputed(t *testing.T) {
	x := NewPrefixIndex(3)
	x.Apply(stored(0, 1, 2, 3))
	x.Apply(stored(1, 1, 2))
	x.Apply(stored(2, 5))
	x.Apply(stored(1, 2)) // duplicate: no change
	f := func(chain []uint64, want ...int) {
		t.Helper()
		if got := x.Overlaps(chain, nil); !slices.Equal(got, want) {
			t.Fatalf("Overlaps(%v) = %v, want %v", chain, got, want)
		}
	}
	f([]uint64{1, 2, 3, 4}, 3, 2, 0)
	f([]uint64{1, 2}, 2, 2, 0)
	f([]uint64{5, 1}, 0, 0, 1)
	f(nil, 0, 0, 0)
	if x.Blocks(0) != 3 || x.Blocks(1) != 2 || x.Blocks(2) != 1 || x.Len() != 4 {
		t.Fatalf("counts %d %d %d, len %d", x.Blocks(0), x.Blocks(1), x.Blocks(2), x.Len())
	}
	x.Apply(removed(0, 2, 9)) // 9 was never stored
	f([]uint64{1, 2, 3, 4}, 1, 2, 0)
	x.Apply(&Event{Kind: AllCleared, Replica: 1})
	f([]uint64{1, 2, 3, 4}, 1, 0, 0)
	if x.Blocks(0) != 2 || x.Blocks(1) != 0 || x.Len() != 3 {
		t.Fatalf("after removal and clear: counts %d %d, len %d", x.Blocks(0), x.Blocks(1), x.Len())
	}
	x.Apply(stored(7, 1)) // out of range: ignored
	if x.Len() != 3 {
		t.Fatal("an event for an unknown replica changed the index")
	}
}

func TestPrefixIndexMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 64 // the full mask width
	x := NewPrefixIndex(n)
	model := make([]map[uint64]bool, n)
	for i := range model {
		model[i] = map[uint64]bool{}
	}
	for op := 0; op < 5000; op++ {
		r := rng.IntN(n)
		ids := make([]uint64, 1+rng.IntN(4))
		for i := range ids {
			ids[i] = uint64(rng.IntN(12))
		}
		switch k := rng.IntN(20); {
		case k == 0:
			x.Apply(&Event{Kind: AllCleared, Replica: r})
			clear(model[r])
		case k < 12:
			x.Apply(stored(r, ids...))
			for _, id := range ids {
				model[r][id] = true
			}
		default:
			x.Apply(removed(r, ids...))
			for _, id := range ids {
				delete(model[r], id)
			}
		}
		chain := []uint64{uint64(rng.IntN(12)), uint64(rng.IntN(12)), uint64(rng.IntN(12))}
		got := x.Overlaps(chain, nil)
		for rr := range model {
			want := 0
			for want < len(chain) && model[rr][chain[want]] {
				want++
			}
			if got[rr] != want {
				t.Fatalf("op %d replica %d: overlap %d, want %d", op, rr, got[rr], want)
			}
			if x.Blocks(rr) != len(model[rr]) {
				t.Fatalf("op %d replica %d: %d blocks, want %d", op, rr, x.Blocks(rr), len(model[rr]))
			}
		}
	}
}
