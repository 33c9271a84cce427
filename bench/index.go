package bench

import "math/bits"

// MaxReplicas is the largest cluster the simulator and PrefixIndex
// support; holder sets are 64-bit masks.
const MaxReplicas = 64

// PrefixIndex is a router-side picture of which replica caches which
// block, built only from KV events: the view a real event subscriber has,
// including its lag. Routers in this package share it; it is a reference
// model, not the project's engine index.
//
// A PrefixIndex is not safe for concurrent use. Create it with
// NewPrefixIndex.
type PrefixIndex struct {
	replicas int
	holders  map[uint64]uint64 // block id → bit r set when replica r caches it
	counts   []int             // blocks per replica
}

// NewPrefixIndex returns an empty index for replicas replicas
// (1..MaxReplicas); it panics otherwise (a programmer error).
func NewPrefixIndex(replicas int) *PrefixIndex {
	if replicas < 1 || replicas > MaxReplicas {
		panic("BUG: bench: PrefixIndex replica count out of range")
	}
	return &PrefixIndex{replicas: replicas, holders: make(map[uint64]uint64), counts: make([]int, replicas)}
}

// Apply updates the index with one event. Events for replicas outside the
// index are ignored.
func (x *PrefixIndex) Apply(ev *Event) {
	r := ev.Replica
	if r < 0 || r >= x.replicas {
		return
	}
	bit := uint64(1) << uint(r)
	switch ev.Kind {
	case BlockStored:
		for _, id := range ev.Blocks {
			m := x.holders[id]
			if m&bit == 0 {
				x.holders[id] = m | bit
				x.counts[r]++
			}
		}
	case BlockRemoved:
		for _, id := range ev.Blocks {
			m, ok := x.holders[id]
			if !ok || m&bit == 0 {
				continue
			}
			if m &^= bit; m == 0 {
				delete(x.holders, id)
			} else {
				x.holders[id] = m
			}
			x.counts[r]--
		}
	case AllCleared:
		// Map order does not matter: every entry is updated the same way.
		for id, m := range x.holders {
			if m&bit == 0 {
				continue
			}
			if m &^= bit; m == 0 {
				delete(x.holders, id)
			} else {
				x.holders[id] = m
			}
		}
		x.counts[r] = 0
	}
}

// Overlaps writes into dst[r] the length of the leading run of chain that
// replica r caches, for every replica, and returns dst (grown to the
// replica count if needed). The walk stops at the first block no replica
// still matching holds, so it costs O(longest overlap).
func (x *PrefixIndex) Overlaps(chain []uint64, dst []int) []int {
	if cap(dst) < x.replicas {
		dst = make([]int, x.replicas)
	}
	dst = dst[:x.replicas]
	clear(dst)
	alive := uint64(1)<<uint(x.replicas) - 1
	if x.replicas == 64 {
		alive = ^uint64(0)
	}
	for i, id := range chain {
		next := alive & x.holders[id]
		// Replicas that drop out here matched exactly i blocks.
		for gone := alive &^ next; gone != 0; gone &= gone - 1 {
			dst[bits.TrailingZeros64(gone)] = i
		}
		alive = next
		if alive == 0 {
			return dst
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		dst[bits.TrailingZeros64(alive)] = len(chain)
	}
	return dst
}

// Blocks returns how many blocks replica r caches according to the events
// observed so far.
func (x *PrefixIndex) Blocks(r int) int { return x.counts[r] }

// Len returns the number of distinct blocks cached by any replica.
func (x *PrefixIndex) Len() int { return len(x.holders) }
