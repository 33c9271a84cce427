package modeldir

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/inferencecache/inferencecache/tokenizer"
)

// prefixCache remembers recent renderings of a model with their ids and
// cuts, so that the next turn of a conversation tokenizes only what
// follows the last cut it shares with an earlier rendering (the rule is in
// docs/tokenizers.md; tokenizer.EncodeFrom checks the cut).
//
// Entries are found by the hash of a rendering's prefix up to one of its
// cuts: every entry registers the hashes of its prefixes at its last cut
// and at the first cut of every anchorEvery bytes, and a lookup hashes the
// new rendering's prefixes at its own cuts (the same positions, since the
// cuts of a shared prefix are the same), last first. A hit is confirmed
// by comparing the bytes, so a hash collision costs only a miss.
//
// Memory is bounded in bytes (text, ids, cuts and index keys of every
// entry); the least recently used entries go first. An entry that a newer
// rendering extends past its last cut is dropped at once: the newer one
// covers every prefix it could serve.
type prefixCache struct {
	seed     maphash.Seed
	maxBytes int64

	// mu protects everything below; lookups and inserts hold it for map
	// operations only (hashing, comparing and encoding happen outside).
	mu    sync.Mutex
	index map[uint64]*cacheEntry
	// lru is a circular list through entries; head.next is the most
	// recent.
	head  cacheEntry
	bytes int64

	// hits counts lookups that found a prefix (tests, benchmarks).
	hits atomic.Int64
}

// anchorEvery spaces the prefixes an entry registers.
const anchorEvery = 4 << 10

type cacheEntry struct {
	text string
	ids  []uint32
	cuts []tokenizer.Cut
	keys []uint64
	size int64

	prev, next *cacheEntry
}

func newPrefixCache(maxBytes int64) *prefixCache {
	c := &prefixCache{seed: maphash.MakeSeed(), maxBytes: maxBytes, index: map[uint64]*cacheEntry{}}
	c.head.prev, c.head.next = &c.head, &c.head
	return c
}

// prefixHashes returns the hash of text[:off] for each offset.
func (c *prefixCache) prefixHashes(text string, offsets []int, dst []uint64) []uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	last := 0
	for _, off := range offsets {
		h.WriteString(text[last:off])
		last = off
		dst = append(dst, h.Sum64())
	}
	return dst
}

// anchors picks the cuts an entry registers: the first of every
// anchorEvery bytes and the last.
func anchors(cuts []tokenizer.Cut) []int {
	var out []int
	block := -1
	for i, cut := range cuts {
		if b := cut.Offset / anchorEvery; b != block || i == len(cuts)-1 {
			block = b
			out = append(out, i)
		}
	}
	return out
}

// lookup finds the longest remembered prefix of text ending at one of
// cuts (the offsets of text's own cuts, from the added-token scan; hashes
// are prefixHashes of them). It
// returns the entry and the index of the cut in its cuts, or ok false.
// The entry's text, ids and cuts are read-only.
func (c *prefixCache) lookup(text string, cuts []int, hashes []uint64) (at int, prev *cacheEntry, ok bool) {
	if len(cuts) == 0 {
		return 0, nil, false
	}
	for i := len(hashes) - 1; i >= 0; i-- {
		c.mu.Lock()
		e := c.index[hashes[i]]
		if e != nil {
			c.touchLocked(e)
		}
		c.mu.Unlock()
		if e == nil {
			continue
		}
		// Confirm, then go as far as the two texts agree: the entry's
		// last cut within their common prefix.
		n := commonPrefix(e.text, text)
		best := -1
		for j, cut := range e.cuts {
			if cut.Offset > n {
				break
			}
			best = j
		}
		if best < 0 || e.cuts[best].Offset < cuts[i] {
			continue // a collision
		}
		c.hits.Add(1)
		return best, e, true
	}
	return 0, nil, false
}

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	// 8 bytes at a time would need unsafe; strings compare fast enough
	// in halves.
	for n-i > 64 {
		h := (n - i) / 2
		if a[i:i+h] == b[i:i+h] {
			i += h
		} else {
			n = i + h
		}
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// insert remembers text with its ids and cuts (owned by the cache from
// now on). prev, if not nil, is the entry the text was tokenized from; it
// is dropped when text extends it past its last cut.
//
// all are the prefix hashes at every cut (the ones lookup used).
func (c *prefixCache) insert(text string, ids []uint32, cuts []tokenizer.Cut, all []uint64, prev *cacheEntry, extendsPrev bool) {
	if len(cuts) == 0 || len(all) != len(cuts) {
		return
	}
	e := &cacheEntry{text: text, ids: ids, cuts: cuts}
	for _, i := range anchors(cuts) {
		e.keys = append(e.keys, all[i])
	}
	e.size = int64(len(text)) + 4*int64(cap(ids)) + 24*int64(cap(cuts)) + 48*int64(len(e.keys)) + 128
	if e.size > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev != nil && extendsPrev && prev.next != nil {
		c.removeLocked(prev)
	}
	for _, k := range e.keys {
		if old := c.index[k]; old != nil && old != e {
			// The newer entry serves this prefix.
			old.dropKeyLocked(k)
		}
		c.index[k] = e
	}
	e.next, e.prev = c.head.next, &c.head
	c.head.next.prev = e
	c.head.next = e
	c.bytes += e.size
	for c.bytes > c.maxBytes && c.head.prev != &c.head {
		c.removeLocked(c.head.prev)
	}
}

func (e *cacheEntry) dropKeyLocked(k uint64) {
	for i, x := range e.keys {
		if x == k {
			e.keys[i] = e.keys[len(e.keys)-1]
			e.keys = e.keys[:len(e.keys)-1]
			return
		}
	}
}

func (c *prefixCache) touchLocked(e *cacheEntry) {
	if e.next == nil {
		return // removed meanwhile
	}
	e.prev.next, e.next.prev = e.next, e.prev
	e.next, e.prev = c.head.next, &c.head
	c.head.next.prev = e
	c.head.next = e
}

func (c *prefixCache) removeLocked(e *cacheEntry) {
	if e.next == nil {
		return
	}
	for _, k := range e.keys {
		if c.index[k] == e {
			delete(c.index, k)
		}
	}
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
	c.bytes -= e.size
}

// stats reports the entries and bytes held (tests).
func (c *prefixCache) stats() (entries int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for e := c.head.next; e != &c.head; e = e.next {
		entries++
	}
	return entries, c.bytes
}
