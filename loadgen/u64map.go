package loadgen

import "math/bits"

// u64map maps uint64 keys to int32 values with open addressing (linear
// probing, backward-shift deletion) at a load factor of at most 1/2. It is
// the LRU's index: a Go map spent most of the load generator's CPU there.
// Not safe for concurrent use.
type u64map struct {
	keys  []uint64
	vals  []int32 // -1 marks an empty slot
	mask  uint64
	shift uint
	n     int
}

// newU64Map returns a map sized for up to capacity keys.
func newU64Map(capacity int) *u64map {
	size := 1 << bits.Len(uint(max(2*capacity, 8)-1)) // a power of two >= 2*capacity
	m := &u64map{keys: make([]uint64, size), vals: make([]int32, size), mask: uint64(size - 1),
		shift: uint(64 - bits.Len(uint(size-1)))}
	for i := range m.vals {
		m.vals[i] = -1
	}
	return m
}

// slot is the home slot of k (Fibonacci hashing: the top bits of k times
// the golden ratio, so clustered keys spread).
func (m *u64map) slot(k uint64) uint64 { return (k * 0x9e3779b97f4a7c15) >> m.shift }

func (m *u64map) get(k uint64) (int32, bool) {
	for i := m.slot(k); ; i = (i + 1) & m.mask {
		v := m.vals[i]
		if v < 0 {
			return 0, false
		}
		if m.keys[i] == k {
			return v, true
		}
	}
}

// put sets k to v (v >= 0). The caller keeps len below the capacity the
// map was sized for.
func (m *u64map) put(k uint64, v int32) {
	for i := m.slot(k); ; i = (i + 1) & m.mask {
		if m.vals[i] < 0 {
			m.keys[i], m.vals[i] = k, v
			m.n++
			return
		}
		if m.keys[i] == k {
			m.vals[i] = v
			return
		}
	}
}

// del removes k, shifting later entries of its probe run back so no
// tombstones are needed.
func (m *u64map) del(k uint64) {
	i := m.slot(k)
	for ; ; i = (i + 1) & m.mask {
		if m.vals[i] < 0 {
			return
		}
		if m.keys[i] == k {
			break
		}
	}
	m.n--
	for j := (i + 1) & m.mask; m.vals[j] >= 0; j = (j + 1) & m.mask {
		// Move j back to the hole at i unless j's home lies cyclically in
		// (i, j]: then j is still reachable from its home without i.
		h := m.slot(m.keys[j])
		if (j-h)&m.mask >= (j-i)&m.mask {
			m.keys[i], m.vals[i] = m.keys[j], m.vals[j]
			i = j
		}
	}
	m.vals[i] = -1
}

func (m *u64map) len() int { return m.n }

func (m *u64map) reset() {
	for i := range m.vals {
		m.vals[i] = -1
	}
	m.n = 0
}
