// Package arena is an offset-addressed word arena for data that concurrent
// readers traverse without locks and the garbage collector never scans.
//
// Memory is a directory of fixed-size slabs of 32-bit words. A block is
// addressed by a uint32 word offset; offset 0 (and every offset below
// FirstOffset) is never handed out, so 0 serves as a nil reference. Slabs
// hold no Go pointers, so the GC treats them as opaque (noscan) memory no
// matter how many blocks they hold.
//
// Concurrency contract:
//   - Alloc, Free and Reset are for one writer at a time (the caller
//     serializes them, e.g. under the index writer lock).
//   - Word is safe from any goroutine at any time for any offset that the
//     caller obtained from a published reference. Every word is an
//     atomic.Uint32, so a reader racing a writer reads either the old or the
//     new value of each word, never a torn one. Whether a multi-word read is
//     consistent is the caller's protocol (the index uses a per-node
//     sequence lock); the arena only guarantees that a freed block stays
//     addressable memory forever, so a stale offset never faults.
//   - A block is reused only after Free. Free writes a free-list link into
//     the block's LAST word; a reader that reads a freed block must be able
//     to tell (the index checks a liveness bit under its sequence lock).
package arena

import (
	"fmt"
	"sync/atomic"
)

const (
	// SlabShift is log2 of the slab size in words. 1<<20 words = 4 MiB per
	// slab, large enough for any single block the index allocates.
	SlabShift = 20
	// SlabWords is the number of words in one slab.
	SlabWords = 1 << SlabShift
	// SlabBytes is the size of one slab in bytes.
	SlabBytes = SlabWords * 4
	// MaxSlabs bounds the directory: 4096 slabs of 4 MiB address 16 GiB.
	MaxSlabs = 1 << (32 - SlabShift)
	// FirstOffset is the first offset ever handed out; smaller offsets are
	// reserved so that 0 (and other tiny values) can mean "none".
	FirstOffset = 8
	// MaxBlockWords is the largest block Alloc accepts.
	MaxBlockWords = SlabWords
	slabMask      = SlabWords - 1
	smallSizes    = 1024
)

type slab [SlabWords]atomic.Uint32

// ErrFull is returned when the arena has no room for another slab.
var ErrFull = fmt.Errorf("arena: all %d slabs in use", MaxSlabs)

// Arena is a word arena. The zero Arena is ready for use. An Arena must not
// be copied after first use.
type Arena struct {
	// dir holds the slabs. A slot goes from nil to a slab exactly once (by
	// the writer, before any offset inside that slab is published) and is
	// never cleared, so a reader's single atomic load of dir[i] is always
	// valid for offsets in slab i.
	dir [MaxSlabs]atomic.Pointer[slab]

	// The fields below belong to the single writer.

	// slabs is the number of slabs allocated so far.
	slabs uint32
	// next is the bump pointer: the next unallocated offset in the newest slab.
	next uint32
	// free holds, per block size in words, the head of that size's free
	// list (sizes up to smallSizes index freeSmall, larger ones the map). A
	// free block's last word links to the next free block of the same size.
	freeSmall [smallSizes]uint32
	freeLarge map[uint32]uint32
	// freeWords counts words sitting on free lists; wasteWords counts slab
	// tails skipped because a block did not fit.
	freeWords, wasteWords uint64
}

// Word returns the word at offset off. The offset must have been returned by
// Alloc at some point (the block may since have been freed).
func (a *Arena) Word(off uint32) *atomic.Uint32 {
	return &a.dir[off>>SlabShift].Load()[off&slabMask]
}

// Block is a view of one block: the slab that holds it and its index
// there. Blocks never straddle slabs, so every word of a block of n words
// is At(0) .. At(n-1). Resolving the slab once per block saves a directory
// load per word on hot paths.
type Block struct {
	s *slab
	i uint32
}

// Block returns the view of the block at offset off, which must lie in an
// allocated slab (an offset the caller validated).
func (a *Arena) Block(off uint32) Block { return Block{a.dir[off>>SlabShift].Load(), off & slabMask} }

// TryBlock is Block for an offset the caller could not validate (read from
// a word that a writer may have been changing): it reports false when off
// lies in a slab never allocated. Reads through the view stay inside the
// slab whatever k is (At wraps within it), so even a block length read
// along with a bad offset cannot fault; the caller's own protocol must
// reject what it read.
func (a *Arena) TryBlock(off uint32) (Block, bool) {
	s := a.dir[off>>SlabShift].Load()
	return Block{s, off & slabMask}, s != nil
}

// At returns word k of the block (k must be within the block; an index past
// the slab's end wraps to its start rather than leave the slab).
func (b Block) At(k uint32) *atomic.Uint32 { return &b.s[(b.i+k)&slabMask] }

// Words returns words 0..n-1 of the block as a slice, for loops that read
// many words of one block without re-resolving each index. It reports false
// when those words would run past the end of the slab: a real block never
// does, so only a length the caller read along with a torn offset can.
func (b Block) Words(n uint32) ([]atomic.Uint32, bool) {
	if uint64(b.i)+uint64(n) > SlabWords {
		return nil, false
	}
	return b.s[b.i : b.i+n : b.i+n], true
}

// Load returns the value of word k of the block.
func (b Block) Load(k uint32) uint32 { return b.s[(b.i+k)&slabMask].Load() }

// Alloc returns the offset of a block of n words (1 <= n <= MaxBlockWords).
// The block's contents are unspecified: a reused block keeps whatever its
// previous owner wrote, so the caller initializes every word it relies on.
func (a *Arena) Alloc(n uint32) (uint32, error) {
	off, _, err := a.AllocFresh(n)
	return off, err
}

// AllocFresh is Alloc that also reports whether the block is fresh: never
// handed out before, so no reader can hold an offset into it. The writer
// may fill a fresh block with plain (non-atomic) stores as long as it
// publishes the block's offset with an atomic store afterwards; the atomic
// publication orders the plain stores before any reader's loads. A reused
// block may still be read through stale offsets and must be written with
// atomic stores.
func (a *Arena) AllocFresh(n uint32) (off uint32, fresh bool, err error) {
	if n == 0 || n > MaxBlockWords {
		return 0, false, fmt.Errorf("arena: cannot allocate %d words (limit %d)", n, MaxBlockWords)
	}
	if head := a.freeHead(n); head != 0 {
		a.setFreeHead(n, a.Word(head+n-1).Load())
		a.freeWords -= uint64(n)
		return head, false, nil
	}
	if a.slabs == 0 || uint64(a.next)+uint64(n) > uint64(a.slabs)<<SlabShift {
		if err := a.grow(); err != nil {
			return 0, false, err
		}
	}
	off = a.next
	a.next += n
	return off, true, nil
}

// grow starts a new slab, abandoning the current slab's tail.
func (a *Arena) grow() error {
	if a.slabs >= MaxSlabs {
		return ErrFull
	}
	if a.slabs > 0 {
		a.wasteWords += uint64(a.slabs)<<SlabShift - uint64(a.next)
	}
	a.dir[a.slabs].Store(new(slab))
	a.next = a.slabs << SlabShift
	if a.slabs == 0 {
		a.next = FirstOffset
		a.wasteWords += FirstOffset
	}
	a.slabs++
	return nil
}

// Free returns a block of n words to the arena for reuse. The caller must no
// longer publish references to it. Readers holding the offset may still read
// it; see the package comment.
func (a *Arena) Free(off, n uint32) {
	a.Word(off + n - 1).Store(a.freeHead(n))
	a.setFreeHead(n, off)
	a.freeWords += uint64(n)
}

func (a *Arena) freeHead(n uint32) uint32 {
	if n < smallSizes {
		return a.freeSmall[n]
	}
	return a.freeLarge[n]
}

func (a *Arena) setFreeHead(n, off uint32) {
	if n < smallSizes {
		a.freeSmall[n] = off
		return
	}
	if a.freeLarge == nil {
		a.freeLarge = make(map[uint32]uint32)
	}
	a.freeLarge[n] = off
}

// Stats describes the arena's memory.
type Stats struct {
	// SlabBytes is the memory the arena holds from the runtime.
	SlabBytes uint64
	// LiveBytes is the memory in blocks currently allocated.
	LiveBytes uint64
	// FreeBytes sits on free lists; WasteBytes is abandoned slab tails and
	// the reserved head.
	FreeBytes, WasteBytes uint64
}

// Stats reports memory use. Like Alloc, it is for the writer.
func (a *Arena) Stats() Stats {
	total := uint64(a.slabs) * SlabBytes
	var tail uint64
	if a.slabs > 0 {
		tail = (uint64(a.slabs)<<SlabShift - uint64(a.next)) * 4
	}
	s := Stats{SlabBytes: total, FreeBytes: a.freeWords * 4, WasteBytes: a.wasteWords * 4}
	s.LiveBytes = total - tail - s.FreeBytes - s.WasteBytes
	return s
}
