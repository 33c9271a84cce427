package engine

import (
	"math/bits"
	"sync/atomic"
)

// table is one scope's open-addressing hash table from key to node offset,
// with linear probing. A slot holds tag<<32 | offset, where tag is the upper
// half of the key's table hash forced non-zero; 0 is an empty slot and
// slotTomb a deleted one. A key's home slot is the top bits of its tag
// (home), so a rebuild places every slot from the slot alone, without
// reading its node's key (a cache miss per key on a large index); the tag
// bits below the home bits still tell keys of one home apart. The writer stores whole slots atomically, so a
// reader sees either the old or the new slot; a reader on a table that the
// writer has since replaced sees a consistent, older view and validates
// every node it finds (see node.go), so replacement needs no grace period:
// the old table is reclaimed by the Go collector once no reader holds it.
type table struct {
	slots []atomic.Uint64
	mask  uint64
	// shift is 64 - log2(len(slots)): a slot value's home is value>>shift.
	shift uint8
	// used and tombs count live and deleted slots (writer only).
	used, tombs int
}

const (
	slotTomb      = 1
	minTableSlots = 16
	// maxLoadNum/maxLoadDen bounds (used+tombs)/len before a rebuild.
	maxLoadNum, maxLoadDen = 4, 5
)

func newTable(n int) *table {
	size := minTableSlots
	for size < n {
		size <<= 1
	}
	return &table{slots: make([]atomic.Uint64, size), mask: uint64(size - 1), shift: uint8(64 - bits.TrailingZeros(uint(size)))}
}

func slotTag(th uint64) uint64 { return (th>>32 | 1) << 32 }

// home is the first slot probed for a key with slot tag tag (or for the
// slot value tag|offset: the offset is below the shift).
func (t *table) home(tag uint64) uint64 { return tag >> t.shift }

// bytes is the table's memory.
func (t *table) bytes() int64 { return int64(len(t.slots)) * 8 }

// find returns the node holding k in scope sc, or 0. Safe for readers.
func (e *Engine) find(t *table, sc uint32, k *key) uint32 {
	tag := slotTag(e.tableHash(k))
	i := t.home(tag)
	for n := uint64(0); n <= t.mask; n++ {
		s := t.slots[i].Load()
		if s == 0 {
			return 0
		}
		if s&^0xFFFFFFFF == tag {
			off := uint32(s)
			if e.nodeIs(off, sc, k) {
				return off
			}
		}
		i = (i + 1) & t.mask
	}
	return 0
}

// nodeIs validates, under the node's sequence lock, that off is a live node
// for k in scope sc. A node that keeps changing through maxReadRetries
// attempts counts as not matching.
func (e *Engine) nodeIs(off, sc uint32, k *key) bool {
	for range maxReadRetries {
		s1, ok := e.readSeq(off)
		if !ok {
			return false
		}
		match := e.keyMatches(off, sc, k)
		if e.w(off+nSeq) == s1 {
			return match
		}
	}
	return false
}

// findLocked is find for the writer, which needs no sequence lock. It also
// returns the slot index of the key, or of the first reusable slot.
func (e *Engine) findLocked(t *table, sc uint32, k *key) (off uint32, slot uint64) {
	tag := slotTag(e.tableHash(k))
	i := t.home(tag)
	free := ^uint64(0)
	for n := uint64(0); n <= t.mask; n++ {
		s := t.slots[i].Load()
		if s == 0 {
			if free == ^uint64(0) {
				free = i
			}
			return 0, free
		}
		if s == slotTomb {
			if free == ^uint64(0) {
				free = i
			}
		} else if s&^0xFFFFFFFF == tag && e.keyMatches(uint32(s), sc, k) {
			return uint32(s), i
		}
		i = (i + 1) & t.mask
	}
	return 0, free
}

// insertLocked stores node off for k into slot (from findLocked), growing or
// cleaning the table first when it is too full.
func (e *Engine) insertLocked(sc *scope, k *key, off uint32, slot uint64) {
	t := sc.table.Load()
	if (t.used+t.tombs+1)*maxLoadDen > len(t.slots)*maxLoadNum || slot == ^uint64(0) {
		t = e.rebuildLocked(sc, t.used+1)
		_, slot = e.findLocked(t, sc.id, k)
	} else if t.slots[slot].Load() == slotTomb {
		t.tombs--
	}
	t.slots[slot].Store(slotTag(e.tableHash(k)) | uint64(off))
	t.used++
}

// deleteLocked tombstones the slot of node off holding k, shrinking the table
// when it has become mostly empty.
func (e *Engine) deleteLocked(sc *scope, k *key, off uint32) {
	t := sc.table.Load()
	got, slot := e.findLocked(t, sc.id, k)
	if got != off {
		panic("BUG: deleting a node its table does not index")
	}
	t.slots[slot].Store(slotTomb)
	t.used--
	t.tombs++
	if len(t.slots) > minTableSlots && t.used*8 < len(t.slots) {
		e.rebuildLocked(sc, t.used)
	}
}

// rebuildLocked publishes a fresh table sized for about n live keys with the
// current live slots (dropping tombstones) and returns it.
func (e *Engine) rebuildLocked(sc *scope, n int) *table {
	old := sc.table.Load()
	nt := newTable(n * 2)
	for i := range old.slots {
		s := old.slots[i].Load()
		if s == 0 || s == slotTomb {
			continue
		}
		j := nt.home(s)
		for nt.slots[j].Load() != 0 {
			j = (j + 1) & nt.mask
		}
		nt.slots[j].Store(s)
		nt.used++
	}
	e.tableBytes += nt.bytes() - old.bytes()
	sc.table.Store(nt)
	return nt
}
