package fakeengine

import (
	"slices"
	"sync"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
)

// Truth is what an engine holds according to the batches it published:
// the key (our fingerprint, as a gateway computes it from the token ids) of
// every block stored and not removed since, on any medium. It is the
// ground truth a server's index is checked against. Safe for concurrent
// use.
type Truth struct {
	blockSize int // for BlockStored events that carry none

	// mu guards the fields below.
	mu   sync.Mutex
	keys map[uint64]uint64 // engine hash → our key
	// unkeyed counts blocks stored on a parent the engine did not hold: the
	// engine has them but nothing gives them a key (a workload never does
	// this; a subscriber drops such events as unknown_parent).
	unkeyed int
}

// NewTruth returns an empty truth; blockSize is the block size of events
// without one.
func NewTruth(blockSize int) *Truth {
	return &Truth{blockSize: blockSize, keys: make(map[uint64]uint64)}
}

// Apply records a published batch.
func (t *Truth) Apply(b Batch) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ev := range b.Events {
		switch ev.Kind {
		case BlockStored:
			var parent uint64
			if ev.Parent != nil {
				p, ok := t.keys[*ev.Parent]
				if !ok {
					t.unkeyed += len(ev.BlockHashes)
					continue
				}
				parent = p
			}
			size := ev.BlockSize
			if size <= 0 {
				size = t.blockSize
			}
			ks := fingerprint.AppendChain(nil, ev.TokenIDs, size, parent, ev.Parent != nil)
			for i, h := range ev.BlockHashes {
				if i < len(ks) {
					t.keys[h] = ks[i]
				}
			}
		case BlockRemoved:
			for _, h := range ev.BlockHashes {
				delete(t.keys, h)
			}
		case AllBlocksCleared:
			clear(t.keys)
		}
	}
}

// Keys returns the keys of the blocks held, sorted, and how many held
// blocks have no key (see Truth).
func (t *Truth) Keys() (keys []uint64, unkeyed int) {
	t.mu.Lock()
	keys = make([]uint64, 0, len(t.keys))
	for _, k := range t.keys {
		keys = append(keys, k)
	}
	unkeyed = t.unkeyed
	t.mu.Unlock()
	slices.Sort(keys)
	return keys, unkeyed
}

// Len returns how many blocks with a key the engine holds.
func (t *Truth) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.keys)
}
