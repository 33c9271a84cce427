package kvevents

import (
	"bytes"
	"math"
	"sync"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/kvevents/wire"
)

// Tier mirrors the wire CacheTier values the subscriber emits.
type Tier uint8

const (
	// TierT1 is engine KV memory (HBM).
	TierT1 Tier = 1
	// TierT2 is an external offload tier (LMCache, CPU offload).
	TierT2 Tier = 2
)

// Prefix is one block as the server will index it: our fingerprint key,
// the cumulative token count up to and including the block, its tier and
// its LoRA partition ("" = default).
type Prefix struct {
	Key     uint64
	Tokens  int32
	Tier    Tier
	Adapter string
}

// Event-level drop reasons (the events_dropped counter's label).
const (
	DropUnmappedLoRA  = "unmapped_lora"  // lora_id with no --lora-adapter-names entry
	DropBlockCount    = "block_count"    // full blocks of token_ids != len(block_hashes)
	DropBlockSize     = "block_size"     // no usable block size
	DropUnknownParent = "unknown_parent" // parent hash not in the positional index
	DropTokenCount    = "token_count"    // cumulative tokens overflow int32
	DropUnknownType   = "unknown_type"   // event tag this decoder does not know
	DropLongAdapter   = "long_adapter"   // lora_name longer than MaxIDBytes
)

// MaxIDBytes is the longest id the server accepts (rpc.MaxIDBytes): a
// longer adapter name would make the server refuse the whole update, so
// its events are dropped here, counted.
const MaxIDBytes = 1024

// DefaultMaxIndexBlocks bounds the positional index (engine hashes kept per
// replica). At about 100 bytes per entry it is ~100 MiB; engines hold far
// fewer GPU blocks than this.
const DefaultMaxIndexBlocks = 1 << 20

// maxInternedNames bounds the lora_name intern table.
const maxInternedNames = 4096

// media bits of a positional entry.
const (
	mediaGPU   uint8 = 1 << iota // nil medium or "GPU"
	mediaOther                   // any other medium (CPU, disk, LMCache, ...)
)

func mediumBit(m []byte) uint8 {
	if len(m) == 0 || bytes.EqualFold(m, []byte("GPU")) {
		return mediaGPU
	}
	return mediaOther
}

func tierOf(media uint8) Tier {
	if media&mediaGPU != 0 {
		return TierT1
	}
	return TierT2
}

// posNode is one engine block in the positional index. Nodes live in a slab
// and are linked into a recency list by slab position, so the index holds
// no per-entry pointers beyond the adapter string.
type posNode struct {
	engine     uint64 // engine block hash (the map key)
	key        uint64 // our fingerprint key
	tokens     int32  // cumulative tokens up to and including this block
	media      uint8  // mediaGPU | mediaOther bits still holding the block
	adapter    string
	prev, next int32 // recency list; -1 ends it. Free nodes chain through next.
}

// Index is the positional index of one replica: engine block hash →
// {our key, cumulative tokens, adapter, media}. It resolves a BlockStored's
// parent so our chain keys continue from it, and maps BlockRemoved hashes
// back to our keys.
//
// Its size is bounded by MaxBlocks: beyond it the least recently stored or
// chained-from engine hash is forgotten without telling the server (the
// engine still holds the block; the server's TTL ages the key out, and a
// later BlockRemoved for it is skipped as unknown, a BlockStored naming it
// as parent is dropped as unknown_parent).
//
// Index is safe for concurrent use: the processor goroutine mutates it, the
// forwarder's resync snapshots it and its periodic refresh reads it in
// chunks.
type Index struct {
	defaultBlockSize int              // immutable
	maxBlocks        int              // immutable
	adapters         map[int64]string // lora_id → adapter name; immutable

	// mu guards every field below. Held for one event by Store/Remove, for
	// a full copy by AppendSnapshot, for one chunk by AppendHeld.
	mu       sync.Mutex
	byEngine map[uint64]int32 // engine hash → slab slot
	nodes    []posNode        // slab
	free     int32            // head of the free-slot list, -1 if none
	head     int32            // most recently used, -1 if empty
	tail     int32            // least recently used, -1 if empty
	names    map[string]string
	keys     []uint64 // scratch for fingerprint.AppendChain
	evicted  uint64   // entries forgotten because of maxBlocks
}

// NewIndex returns an empty positional index. defaultBlockSize applies to
// events without a block size; adapters maps lora_id to adapter names
// (it is retained, not copied); maxBlocks <= 0 means DefaultMaxIndexBlocks.
func NewIndex(defaultBlockSize, maxBlocks int, adapters map[int64]string) *Index {
	if maxBlocks <= 0 {
		maxBlocks = DefaultMaxIndexBlocks
	}
	x := &Index{defaultBlockSize: defaultBlockSize, maxBlocks: maxBlocks, adapters: adapters}
	x.resetLocked()
	return x
}

func (x *Index) resetLocked() {
	x.byEngine = make(map[uint64]int32)
	x.nodes = x.nodes[:0]
	x.free, x.head, x.tail = -1, -1, -1
}

// Len returns the number of engine blocks indexed.
func (x *Index) Len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.byEngine)
}

// CapEvictions returns how many entries were forgotten because of the size
// bound since the index was made.
func (x *Index) CapEvictions() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.evicted
}

// Clear forgets every block (AllBlocksCleared, or a gap that replay could
// not repair).
func (x *Index) Clear() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.resetLocked()
}

// adapterLocked resolves the LoRA partition of a BlockStored: lora_name
// when present, else lora_id through the configured map (unmapped → !ok),
// else the default partition "". x.mu must be held (it interns names).
func (x *Index) adapterLocked(ev *wire.Event) (string, bool) {
	if len(ev.LoRAName) > 0 {
		if s, ok := x.names[string(ev.LoRAName)]; ok {
			return s, true // no allocation for a known name
		}
		return x.internLocked(string(ev.LoRAName)), true
	}
	if ev.HasLoRAID {
		s, ok := x.adapters[ev.LoRAID]
		return s, ok
	}
	return "", true
}

// Store applies a BlockStored event and appends the resulting prefixes (one
// per block, in chain order) to dst. When the event is dropped it returns
// dst unchanged and the drop reason.
func (x *Index) Store(ev *wire.Event, dst []Prefix) ([]Prefix, string) {
	x.mu.Lock()
	defer x.mu.Unlock()

	if len(ev.LoRAName) > MaxIDBytes {
		return dst, DropLongAdapter
	}
	adapter, ok := x.adapterLocked(ev)
	if !ok {
		return dst, DropUnmappedLoRA
	}
	bs := ev.BlockSize
	if bs <= 0 {
		bs = x.defaultBlockSize
	}
	if bs <= 0 {
		return dst, DropBlockSize
	}
	n := fingerprint.Blocks(len(ev.TokenIDs), bs)
	if n != len(ev.BlockHashes) {
		return dst, DropBlockCount
	}
	var parentKey uint64
	var parentTokens int64
	if ev.HasParent {
		slot, ok := x.byEngine[ev.ParentHash]
		if !ok {
			return dst, DropUnknownParent
		}
		p := &x.nodes[slot]
		parentKey, parentTokens = p.key, int64(p.tokens)
		x.touchLocked(slot)
	}
	if parentTokens+int64(n)*int64(bs) > math.MaxInt32 {
		return dst, DropTokenCount
	}
	x.keys = fingerprint.AppendChain(x.keys[:0], ev.TokenIDs[:n*bs], bs, parentKey, ev.HasParent)
	bit := mediumBit(ev.Medium)
	for i, engine := range ev.BlockHashes {
		tokens := int32(parentTokens + int64(i+1)*int64(bs))
		slot, ok := x.byEngine[engine]
		if !ok {
			slot = x.allocLocked()
			x.byEngine[engine] = slot
			x.nodes[slot] = posNode{engine: engine, prev: -1, next: -1}
			x.pushFrontLocked(slot)
		} else {
			x.touchLocked(slot)
		}
		nd := &x.nodes[slot]
		nd.key, nd.tokens, nd.adapter = x.keys[i], tokens, adapter
		nd.media |= bit
		dst = append(dst, Prefix{Key: nd.key, Tokens: tokens, Tier: tierOf(nd.media), Adapter: adapter})
	}
	for len(x.byEngine) > x.maxBlocks {
		x.evictTailLocked()
	}
	return dst, ""
}

// Remove applies a BlockRemoved event. A block that leaves its last medium is
// forgotten and appended to evicted, or, with l2 (an offload tier holds what
// the engine evicts), to demoted at TierT2. A block that leaves the GPU but
// stays on another medium the engine reported is appended to demoted.
// Unknown hashes are skipped; unknown counts them.
func (x *Index) Remove(ev *wire.Event, l2 bool, evicted, demoted []Prefix) (_, _ []Prefix, unknown int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	bit := mediumBit(ev.Medium)
	for _, engine := range ev.BlockHashes {
		slot, ok := x.byEngine[engine]
		if !ok {
			unknown++
			continue
		}
		nd := &x.nodes[slot]
		before := nd.media
		nd.media &^= bit
		p := Prefix{Key: nd.key, Tokens: nd.tokens, Tier: TierT2, Adapter: nd.adapter}
		switch {
		case nd.media == before:
			// Not on that medium: nothing changes.
		case nd.media != 0:
			// Left the GPU, still on a medium the engine told us about.
			if tierOf(before) != tierOf(nd.media) {
				demoted = append(demoted, p)
			}
		default:
			x.removeLocked(slot)
			if l2 {
				demoted = append(demoted, p)
			} else {
				evicted = append(evicted, p)
			}
		}
	}
	return evicted, demoted, unknown
}

// AppendSnapshot appends every indexed block, most recently used first, to
// dst. The forwarder re-reports it after a clear-and-resync.
func (x *Index) AppendSnapshot(dst []Prefix) []Prefix {
	x.mu.Lock()
	defer x.mu.Unlock()
	for s := x.head; s >= 0; s = x.nodes[s].next {
		nd := &x.nodes[s]
		dst = append(dst, Prefix{Key: nd.key, Tokens: nd.tokens, Tier: tierOf(nd.media), Adapter: nd.adapter})
	}
	return dst
}

// AppendState appends every indexed block with its engine hash and media,
// most recently used first, to dst (the state file's content).
func (x *Index) AppendState(dst []StateEntry) []StateEntry {
	x.mu.Lock()
	defer x.mu.Unlock()
	for s := x.head; s >= 0; s = x.nodes[s].next {
		nd := &x.nodes[s]
		dst = append(dst, StateEntry{Engine: nd.engine, Key: nd.key, Tokens: nd.tokens, Media: nd.media, Adapter: nd.adapter})
	}
	return dst
}

// Restore replaces the index's content with entries, most recently used
// first (AppendState's order), keeping at most MaxBlocks of them (the most
// recent) and skipping repeated engine hashes and entries without a medium.
// It returns how many it kept.
func (x *Index) Restore(entries []StateEntry) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.resetLocked()
	for i := range entries {
		e := &entries[i]
		if len(x.byEngine) >= x.maxBlocks {
			break
		}
		if _, dup := x.byEngine[e.Engine]; dup || e.Media&(mediaGPU|mediaOther) == 0 {
			continue
		}
		slot := x.allocLocked()
		x.byEngine[e.Engine] = slot
		x.nodes[slot] = posNode{engine: e.Engine, key: e.Key, tokens: e.Tokens, media: e.Media & (mediaGPU | mediaOther),
			adapter: x.internLocked(e.Adapter), prev: -1, next: -1}
		x.pushBackLocked(slot)
	}
	return len(x.byEngine)
}

// Adopt replaces x's content with o's and leaves o empty. Both must have
// been made with the same configuration; o must not be in use by anyone
// else (a replay rebuilds into a private index, then the subscriber adopts
// it).
func (x *Index) Adopt(o *Index) {
	x.mu.Lock()
	defer x.mu.Unlock()
	o.mu.Lock()
	defer o.mu.Unlock()
	x.byEngine, x.nodes, x.free, x.head, x.tail = o.byEngine, o.nodes, o.free, o.head, o.tail
	x.evicted += o.evicted
	o.nodes = nil
	o.resetLocked()
}

// internLocked returns the interned copy of name (bounded by
// maxInternedNames; beyond it name itself).
func (x *Index) internLocked(name string) string {
	if name == "" {
		return ""
	}
	if s, ok := x.names[name]; ok {
		return s
	}
	if x.names == nil {
		x.names = make(map[string]string)
	}
	if len(x.names) < maxInternedNames {
		x.names[name] = name
	}
	return name
}

// refreshScanFactor bounds the slab slots one AppendHeld call visits, as a
// multiple of the entries it may return, so a slab left sparse by mass
// removals cannot make one call hold the lock for long.
const refreshScanFactor = 8

// AppendHeld appends to dst at most n blocks the index holds, visiting slab
// positions from pos on (at most refreshScanFactor×n of them), and returns
// the position to continue from and whether the end of the slab was
// reached. The periodic refresh walks the whole index this way in chunks,
// taking the lock once per chunk.
//
// Slab positions are stable: a block held for the whole walk is returned
// exactly once. A block removed meanwhile is skipped; a block stored
// meanwhile may land in a position already visited and be missed, which is
// harmless because it was just reported with a fresh timestamp.
func (x *Index) AppendHeld(dst []Prefix, pos, n int) (_ []Prefix, next int, done bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	pos = max(pos, 0)
	limit := pos + refreshScanFactor*max(n, 1)
	taken := 0
	for ; pos < len(x.nodes) && pos < limit && taken < n; pos++ {
		nd := &x.nodes[pos]
		if nd.media == 0 {
			continue // a free slot
		}
		dst = append(dst, Prefix{Key: nd.key, Tokens: nd.tokens, Tier: tierOf(nd.media), Adapter: nd.adapter})
		taken++
	}
	return dst, pos, pos >= len(x.nodes)
}

func (x *Index) allocLocked() int32 {
	if x.free >= 0 {
		s := x.free
		x.free = x.nodes[s].next
		return s
	}
	x.nodes = append(x.nodes, posNode{})
	return int32(len(x.nodes) - 1)
}

func (x *Index) pushFrontLocked(s int32) {
	nd := &x.nodes[s]
	nd.prev, nd.next = -1, x.head
	if x.head >= 0 {
		x.nodes[x.head].prev = s
	}
	x.head = s
	if x.tail < 0 {
		x.tail = s
	}
}

// pushBackLocked links s as the least recently used node.
func (x *Index) pushBackLocked(s int32) {
	nd := &x.nodes[s]
	nd.prev, nd.next = x.tail, -1
	if x.tail >= 0 {
		x.nodes[x.tail].next = s
	}
	x.tail = s
	if x.head < 0 {
		x.head = s
	}
}

func (x *Index) unlinkLocked(s int32) {
	nd := &x.nodes[s]
	if nd.prev >= 0 {
		x.nodes[nd.prev].next = nd.next
	} else {
		x.head = nd.next
	}
	if nd.next >= 0 {
		x.nodes[nd.next].prev = nd.prev
	} else {
		x.tail = nd.prev
	}
	nd.prev, nd.next = -1, -1
}

func (x *Index) touchLocked(s int32) {
	if x.head == s {
		return
	}
	x.unlinkLocked(s)
	x.pushFrontLocked(s)
}

func (x *Index) removeLocked(s int32) {
	x.unlinkLocked(s)
	nd := &x.nodes[s]
	delete(x.byEngine, nd.engine)
	*nd = posNode{prev: -1, next: x.free}
	x.free = s
}

func (x *Index) evictTailLocked() {
	if x.tail < 0 {
		return
	}
	x.removeLocked(x.tail)
	x.evicted++
}
