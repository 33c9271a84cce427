package engine

import (
	"encoding/binary"
	"runtime"

	"github.com/inferencecache/inferencecache/arena"
)

// A node is one distinct key (scope, block hash): eight arena words.
//
//	word  field
//	0     seq      sequence lock: odd while the writer changes the node
//	1     gen      bumped each time the node is freed
//	2,3   hash     kind 0: the 8-byte hash as a uint64 (lo, hi);
//	               kind 1: arena offset and length of the hash bytes
//	4     holders  arena offset of the holder block
//	5     meta     count (bits 0-15) | class (16-23) | kind (24-26) | live (31)
//	6     next     successor hint: the node most recently reported right
//	               after this one in a chain (0 = none); readers validate it
//	7     scope    id of the scope (tenant, model, scheme, adapter) it belongs to
//
// A holder is one replica holding the key: five words in the holder block,
// kept sorted by replica id.
//
//	word  field
//	0     rid (bits 0-15) | tier (16-23)
//	1     cumulative token count (int32 bits)
//	2     LFU: tag (bits 24-31) | access count (0-23); see credit
//	3,4   lastSeen µs (lo, hi)
//
// Reader protocol (sequence lock). A reader loads seq; if it is odd it
// waits; it then reads every field it needs with atomic loads, including
// holder words reached through the holders offset, and loads seq again. If
// the two loads differ, the writer touched the node meanwhile and the reader
// retries (a bounded number of times; see readSeq). A reader never trusts
// what it did not validate this way: a table slot or successor hint only
// nominates a node, and the reader checks liveness, scope and hash inside
// the window. A freed node is never returned to the Go heap (the arena
// keeps it addressable) and is reused only for a new key, so a stale offset
// reads a dead or different node and is rejected. Offsets read inside a
// window (holders, hash bytes) may be torn from two lives of the node, so a
// reader follows them only through arena.TryBlock and checks the holder
// count against its class (countFits) before walking holders: a torn view
// never faults, and the closing check rejects it.
//
// Writer protocol. The single writer (engine.mu held) stores seq+1, changes
// fields, then stores seq+2. Holder blocks change only inside such a window,
// so a reader that validated the node also validated the holder words it
// read. The LFU word is the exception: readers bump it with CAS outside the
// window (credit), so the writer moves it with CAS too (moveLFU).
const (
	nSeq       = 0
	nGen       = 1
	nHashLo    = 2
	nHashHi    = 3
	nHolders   = 4
	nMeta      = 5
	nNext      = 6
	nScope     = 7
	nodeWords  = 8
	nodeBytes  = nodeWords * 4
	hRidTier   = 0
	hTokens    = 1
	hLFU       = 2
	hTsLo      = 3
	hTsHi      = 4
	holderWord = 5

	metaCountMask = 0xFFFF
	metaClassSh   = 16
	metaKindSh    = 24
	metaLive      = 1 << 31

	kindU64   = 0
	kindBytes = 1

	lfuCountMask = 1<<24 - 1
	lfuTagShift  = 24
)

// holderCaps are the holder-block capacity classes: growth by about 1.5x
// keeps the slack of a block under a third while moving a holder set
// O(log n) times as it grows.
var holderCaps = func() []uint32 {
	caps := []uint32{1, 2, 3, 4}
	for c := caps[len(caps)-1]; c < MaxReplicasPerModel; {
		c += c / 2
		caps = append(caps, min(c, MaxReplicasPerModel))
	}
	return caps
}()

// classCaps is holderCaps as an array indexed by class&31, zero past the
// last class, so a reader can check a count against its class without a
// bounds check (see countFits).
var classCaps = func() (a [32]uint32) {
	if len(holderCaps) > len(a) {
		panic("BUG: more holder classes than classCaps holds")
	}
	copy(a[:], holderCaps)
	return a
}()

// countFits reports whether meta's holder count fits its block's class. A
// reader checks it before walking holders: a view torn between two lives
// of a node can pair a large count with a small block.
func countFits(meta uint32) bool { return metaCount(meta) <= classCaps[metaClass(meta)&31] }

func classFor(n uint32) uint32 {
	for i, c := range holderCaps {
		if c >= n {
			return uint32(i)
		}
	}
	panic("BUG: holder count beyond the largest class")
}

func metaCount(m uint32) uint32 { return m & metaCountMask }
func metaClass(m uint32) uint32 { return (m >> metaClassSh) & 0xFF }
func metaKind(m uint32) uint32  { return (m >> metaKindSh) & 0x7 }
func makeMeta(count, class, kind uint32) uint32 {
	return count | class<<metaClassSh | kind<<metaKindSh | metaLive
}

// key is a block or prefix hash prepared for the index: its kind, its value
// (kind 0) or bytes (kind 1), and its hash-table hash th, computed on first
// use (a chain walk that follows successor hints never needs it).
type key struct {
	kind  uint32
	hasTh bool
	v     uint64
	b     []byte
	th    uint64
}

// u64TableHash is the table hash of an 8-byte key with value v.
func (e *Engine) u64TableHash(v uint64) uint64 { return mix64(v ^ e.seed) }

// tableHash returns (and caches) k's hash-table hash.
func (e *Engine) tableHash(k *key) uint64 {
	if !k.hasTh {
		if k.kind == kindU64 {
			k.th = e.u64TableHash(k.v)
		} else {
			k.th = hashBytes(k.b, e.seed)
		}
		k.hasTh = true
	}
	return k.th
}

// makeKey prepares h. ok is false for a hash the index never stores (empty
// or longer than MaxHashBytes).
func (e *Engine) makeKey(h []byte) (k key, ok bool) {
	switch {
	case len(h) == 8:
		return key{kind: kindU64, v: binary.BigEndian.Uint64(h)}, true
	case len(h) == 0 || len(h) > MaxHashBytes:
		return key{}, false
	default:
		return key{kind: kindBytes, b: h}, true
	}
}

// mix64 is a 64-bit finalizer (from the splitmix64 family) that spreads
// already-random engine hashes, salted per process against crafted collisions.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// w is shorthand for an arena word.
func (e *Engine) w(off uint32) uint32 { return e.arena.Word(off).Load() }

// Bounds of the reader's waits and retries. A writer keeps a node odd for
// well under a microsecond, but it can be descheduled mid-write; readers
// then give up on the node (treat it as absent, or end a chain walk there)
// rather than wait on it without bound.
const (
	// seqSpins is how often readSeq polls before yielding, and seqYields
	// how often it yields before giving up.
	seqSpins  = 64
	seqYields = 64
	// maxReadRetries bounds the retries of a single-node read (nodeIs,
	// matchExact) whose sequence check keeps failing.
	maxReadRetries = 16
)

// readSeq waits out an active writer and returns an even sequence value,
// or false when the node stayed mid-write through the whole wait.
func (e *Engine) readSeq(off uint32) (uint32, bool) {
	w := e.arena.Word(off + nSeq)
	for i := 0; i < seqSpins+seqYields; i++ {
		if s := w.Load(); s&1 == 0 {
			return s, true
		}
		if i >= seqSpins {
			runtime.Gosched()
		}
	}
	return 0, false
}

// keyMatches reports whether a live node at off holds key k in scope.
// The caller reads inside a sequence-lock window (or is the writer).
func (e *Engine) keyMatches(off, scope uint32, k *key) bool {
	return e.viewMatches(e.arena.Block(off), e.w(off+nMeta), scope, k)
}

// bytesEqual compares the n hash bytes stored at word offset at with b. A
// reader may pass an offset and length torn from two lives of a node (the
// kind it read said "bytes", the words it read next belonged to an 8-byte
// key), so the offset is bounds-checked before it is followed; whatever the
// words then say, the reader's sequence check rejects the view.
func (e *Engine) bytesEqual(at, n uint32, b []byte) bool {
	if int(n) != len(b) {
		return false
	}
	hb, ok := e.arena.TryBlock(at)
	if !ok {
		return false
	}
	for i := 0; i < len(b); i += 4 {
		word := hb.Load(uint32(i / 4))
		for j := 0; j < 4 && i+j < len(b); j++ {
			if byte(word>>(8*j)) != b[i+j] {
				return false
			}
		}
	}
	return true
}

// appendHashBytes appends the hash of node off to dst (writer or validated reader).
func (e *Engine) appendHashBytes(dst []byte, off uint32) []byte {
	meta := e.w(off + nMeta)
	if metaKind(meta) == kindU64 {
		v := uint64(e.w(off+nHashLo)) | uint64(e.w(off+nHashHi))<<32
		return binary.BigEndian.AppendUint64(dst, v)
	}
	at, n := e.w(off+nHashLo), e.w(off+nHashHi)
	for i := uint32(0); i < n; i++ {
		dst = append(dst, byte(e.w(at+i/4)>>(8*(i%4))))
	}
	return dst
}

// hashWords is the size of the block that stores n hash bytes. The arena
// recycles blocks by exact size, and the three kinds of block keep disjoint
// sizes: nodes are nodeWords (8), holder blocks multiples of holderWord (5),
// hash blocks anything else. So a block's memory is only ever reused for a
// block of its own kind:
//   - a reader holding a stale node offset always reads a well-formed node
//     whose sequence word is a real sequence lock;
//   - a credit CAS that validated an LFU word and then lost the race to the
//     writer can only land on a holder record's LFU word, whose tag every
//     move and reuse changes, so the CAS fails; it can never land on hash
//     bytes (which a producer chooses, so it could make one look like the
//     old LFU word and have its key corrupted).
func hashWords(n int) uint32 {
	w := uint32(max((n+3)/4, 1))
	for w == nodeWords || w%holderWord == 0 {
		w++
	}
	return w
}

// storeHashBytes copies b into freshly allocated words.
func (e *Engine) storeHashBytes(b []byte) (uint32, error) {
	at, err := e.arena.Alloc(hashWords(len(b)))
	if err != nil {
		return 0, err
	}
	for i := 0; i < len(b); i += 4 {
		var word uint32
		for j := 0; j < 4 && i+j < len(b); j++ {
			word |= uint32(b[i+j]) << (8 * j)
		}
		e.arena.Word(at + uint32(i/4)).Store(word)
	}
	return at, nil
}

func holderAt(block, i uint32) uint32 { return block + i*holderWord }

// holderTs reads a holder's lastSeen.
func (e *Engine) holderTs(h uint32) int64 {
	return int64(uint64(e.w(h+hTsLo)) | uint64(e.w(h+hTsHi))<<32)
}

// findHolder returns the index of replica rid in the holder block, or the
// insertion point and false. Holders are sorted by rid.
func (e *Engine) findHolder(block, count uint32, rid uint16) (uint32, bool) {
	return findHolderIn(e.arena.Block(block), count, rid)
}

// findHolderIn is findHolder over a block view.
func findHolderIn(hb arena.Block, count uint32, rid uint16) (uint32, bool) {
	lo, hi := uint32(0), count
	for lo < hi {
		mid := (lo + hi) / 2
		r := uint16(hb.Load(mid*holderWord + hRidTier))
		switch {
		case r == rid:
			return mid, true
		case r < rid:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return lo, false
}

// moveLFU moves the access count from word src to word dst, retagging both
// so that a reader's in-flight credit CAS on either fails and retries
// against the node's new layout. src may be 0 to install a fresh count 0.
func (e *Engine) moveLFU(src, dst uint32) {
	var count uint32
	if src != 0 {
		sw := e.arena.Word(src)
		for {
			old := sw.Load()
			if sw.CompareAndSwap(old, (old>>lfuTagShift+1)<<lfuTagShift) {
				count = old & lfuCountMask
				break
			}
		}
	}
	dw := e.arena.Word(dst)
	for {
		old := dw.Load()
		if dw.CompareAndSwap(old, (old>>lfuTagShift+1)<<lfuTagShift|count) {
			return
		}
	}
}

// retireLFU invalidates the LFU word of a holder slot that is going away.
func (e *Engine) retireLFU(w uint32) {
	sw := e.arena.Word(w)
	for {
		old := sw.Load()
		if sw.CompareAndSwap(old, (old>>lfuTagShift+1)<<lfuTagShift) {
			return
		}
	}
}
