package policy

import (
	"sync"
	"sync/atomic"
)

// Store publishes policy snapshots to concurrent readers. Load is one atomic
// load and never blocks; Apply and Replace serialize among themselves only.
// The zero Store is not usable; call NewStore.
type Store struct {
	// cur is the published snapshot. Readers Load it; writers Store a new one
	// under mu. A published snapshot is never mutated.
	cur atomic.Pointer[Snapshot]
	// mu serializes writers so generations are assigned in publish order.
	mu sync.Mutex
	// gen is the last generation handed out; guarded by mu.
	gen uint64
}

// NewStore returns a store holding the Empty snapshot.
func NewStore() *Store {
	s := &Store{}
	e := Empty()
	e.published.Store(true)
	s.cur.Store(e)
	return s
}

// Load returns the current snapshot. It is safe to call from any goroutine
// and the result stays valid (and unchanged) for as long as it is held.
func (s *Store) Load() *Snapshot { return s.cur.Load() }

// Apply resolves a normalized body and publishes it, replacing the previous
// state entirely: a namespace or tenant absent from b reverts to defaults.
func (s *Store) Apply(b *Body) *Snapshot { return s.Replace(Build(b)) }

// Replace publishes a prebuilt snapshot, stamping it with the next generation.
// A snapshot can be published once, to one Store: passing one that was
// already published (including the current one) panics, because stamping it
// again would change Generation under its concurrent readers.
func (s *Store) Replace(snap *Snapshot) *Snapshot {
	if !snap.published.CompareAndSwap(false, true) {
		panic("BUG: policy: snapshot published twice")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	snap.generation = s.gen
	s.cur.Store(snap)
	return snap
}
