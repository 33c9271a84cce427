package engine

import (
	"math/bits"
	"sync/atomic"
	"time"
	"unsafe"
)

// Routing-time entries (docs/routing.md, "Routing-time entries"). When a
// caller follows a lookup's answer (the endpoint picker, or a gRPC caller
// that sets follows_answer), the chain it sends is *expected* on the routed
// replica: the replica will compute and store it when the request's
// prefill runs, but no KV event says so until then. Under load that is
// seconds to minutes, and a conversation's next turn arrives before its
// previous turn was prefilled: an index fed only by events has no idea
// where its history is going to be. The expected table remembers, per
// block hash, the replica the chain was last routed to, until the
// replica's KV events store that block (confirm) or the entry expires.
//
// The table is one fixed array of slots allocated with the engine, so its
// memory is bounded in bytes and counted in MemoryStats.IndexBytes (the
// --max-index-bytes budget). Readers and writers are lock-free: a slot is
// two words, a key and a value that repeats part of the key, written key
// first; a reader that sees a key with a value of another key (a race with
// an overwrite) treats the slot as empty. Entries are advice, never the
// contract's answer: only load-aware routing reads them, and only while
// it is active, so lookups under light load, and every lookup when no
// caller follows answers, are exactly the contract's.

// Routing-time entry defaults.
const (
	// DefaultExpectedBytes is the expected table's size: 2^16 slots of 16
	// bytes, room for the new blocks of about 6,000 routed requests of ten
	// new blocks each.
	DefaultExpectedBytes = 1 << 20
	// DefaultExpectedTTL is the least time an entry lives unconfirmed; a
	// replica with a queue adds its estimated drain time (expectTTL).
	DefaultExpectedTTL = 10 * time.Second
	// DefaultExpectedCredit is what an expected token counts for against a
	// stored one (1): the request routed there may still be cancelled,
	// sent elsewhere, or its blocks evicted before the next one runs.
	DefaultExpectedCredit = 0.75
	// maxExpectedDrain caps the drain time added to an entry's TTL.
	maxExpectedDrain = 10 * time.Minute
	// expectProbe is the probe window: a key lives in one of expectProbe
	// consecutive slots from its home.
	expectProbe     = 4
	expectSlotBytes = int64(unsafe.Sizeof(expectSlot{}))
)

// expectSlot is one entry. key is the folded block key (0 = empty); val
// packs the replica id (bits 0-15), the expiry in seconds of server time
// (bits 16-47) and the key's top 16 bits (48-63), so a reader can tell a
// value written for another key.
type expectSlot struct {
	key atomic.Uint64
	val atomic.Uint64
}

// expectTable is the engine's routing-time entries. Its slots never change
// after New; every slot word is atomic.
type expectTable struct {
	slots []expectSlot
	mask  uint64
	// used is set on the first insert: until a caller follows an answer,
	// lookups and ingest skip the table entirely.
	used atomic.Bool
}

func newExpectTable(bytes int64) expectTable {
	n := bytes / expectSlotBytes
	if n < expectProbe {
		return expectTable{}
	}
	size := uint64(1) << (63 - bits.LeadingZeros64(uint64(n))) // a power of two <= n
	return expectTable{slots: make([]expectSlot, size), mask: size - 1}
}

// bytes is the table's memory.
func (t *expectTable) bytes() int64 { return int64(len(t.slots)) * expectSlotBytes }

// expectSchemeSeed keys a scheme's routing-time entries. Unlike the index
// tables it is not salted per process: which entries survive a full probe
// window decides answers under load, and a replay (the simulator, a test)
// must decide the same way every run. Entries are advice, so a client that
// aims block hashes at one window can only cost others' entries there,
// never an index entry or a contract answer.
func expectSchemeSeed(tenant, model, scheme string) uint64 {
	return hashBytes([]byte(tenant+"\x00"+model+"\x00"+scheme), expectSalt)
}

// expectSalt is expectSchemeSeed's fixed salt.
const expectSalt = 0x6578706563746564 // "expected"

// expectKey folds a block hash of a scheme into a non-zero table key.
func expectKey(seed uint64, hash []byte) uint64 {
	k := hashBytes(hash, seed)
	if k == 0 {
		k = 1
	}
	return k
}

func packExpect(key uint64, rid uint16, expiry int64) uint64 {
	return uint64(rid) | uint64(uint32(expiry))<<16 | key&0xffff000000000000
}

// insert records key as expected on rid until expiry (µs). It overwrites
// the key's own slot, else the first empty or expired slot of its window,
// else the one that expires first.
func (t *expectTable) insert(key uint64, rid uint16, expiry, now int64) {
	if len(t.slots) == 0 {
		return
	}
	if !t.used.Load() {
		t.used.Store(true)
	}
	nowS := uint32(now / 1e6)
	home := key & t.mask
	victim, victimExp := -1, uint32(0)
	for i := range uint64(expectProbe) {
		s := &t.slots[(home+i)&t.mask]
		k := s.key.Load()
		if k == key {
			s.val.Store(packExpect(key, rid, expiry/1e6))
			return
		}
		exp := uint32(s.val.Load() >> 16)
		if k == 0 || exp <= nowS {
			victim = int((home + i) & t.mask)
			break
		}
		if victim < 0 || exp < victimExp {
			victim, victimExp = int((home+i)&t.mask), exp
		}
	}
	s := &t.slots[victim]
	s.key.Store(key)
	s.val.Store(packExpect(key, rid, expiry/1e6))
}

// find returns the replica key is expected on, if an unexpired entry says
// so at now (µs).
func (t *expectTable) find(key uint64, now int64) (uint16, bool) {
	home := key & t.mask
	for i := range uint64(expectProbe) {
		s := &t.slots[(home+i)&t.mask]
		if s.key.Load() != key {
			continue
		}
		v := s.val.Load()
		if v&0xffff000000000000 != key&0xffff000000000000 || s.key.Load() != key {
			return 0, false // torn by a concurrent overwrite
		}
		if uint32(v>>16) <= uint32(now/1e6) {
			return 0, false
		}
		return uint16(v), true
	}
	return 0, false
}

// confirm drops key's entry when it names rid: the replica's KV events
// stored the block, so the index now knows it for certain.
func (t *expectTable) confirm(key uint64, rid uint16) {
	home := key & t.mask
	for i := range uint64(expectProbe) {
		s := &t.slots[(home+i)&t.mask]
		if s.key.Load() != key {
			continue
		}
		if v := s.val.Load(); uint16(v) == rid && s.key.CompareAndSwap(key, 0) {
			s.val.Store(0)
		}
		return
	}
}

// confirmStoredLocked drops the expected entry of a block replica r of
// scheme sch just stored. Called by ingest under mu; a no-op until some
// caller followed an answer.
func (e *Engine) confirmStoredLocked(sch *scheme, r *replica, hash []byte) {
	if !e.expect.used.Load() || sch == nil || len(hash) == 0 {
		return
	}
	e.expect.confirm(expectKey(sch.expectSeed, hash), r.id)
}

// expectedMatch is the deepest block of req's chain, at or after block
// from, that some caller routed (an unexpired entry): the replica it went
// to and how many leading blocks that covers. A routed chain writes all
// of its blocks beyond what its replica already stored, and confirmations
// remove them front to back, so past the stored part "expected somewhere"
// holds for a leading run of blocks: a binary search finds its end in
// O(log n) probes. It reads without locks and allocates nothing.
func (e *Engine) expectedMatch(sch *scheme, hashes [][]byte, from int, now int64) (uint16, int, bool) {
	t := &e.expect
	if !t.used.Load() || sch == nil || from >= len(hashes) {
		return 0, 0, false
	}
	seed := sch.expectSeed
	lo, hi := max(from, 0), len(hashes) // the run's end is in [lo, hi]
	var rid uint16
	found := false
	for lo < hi {
		mid := lo + (hi-lo)/2
		if id, ok := t.find(expectKey(seed, hashes[mid]), now); ok {
			rid, found, lo = id, true, mid+1
		} else {
			hi = mid
		}
	}
	if !found {
		return 0, 0, false
	}
	if id, ok := t.find(expectKey(seed, hashes[lo-1]), now); ok {
		rid = id
	}
	return rid, lo, true
}

// NoteFollowed records that the caller sent the request res answered to
// pick, the first replica of the answer (the endpoint picker; a gRPC
// caller with follows_answer): every block of req's chain beyond what
// pick stores is expected there until the replica stores it or the entry
// expires. Only while load-aware routing is enabled; lock-free, no
// allocation.
func (e *Engine) NoteFollowed(req *LookupRequest, res *LookupResult, pick ContractPick, now int64) {
	if !e.load.Enabled || !pick.Has || res.sch == nil || len(e.expect.slots) == 0 || len(req.BlockHashes) == 0 {
		return
	}
	stored := 0
	for i := range res.Scores {
		if res.Scores[i].rid == pick.rid {
			stored = int(res.Scores[i].run)
			break
		}
	}
	expiry := now + e.expectTTL(res, pick, now)
	seed := res.sch.expectSeed
	for k := min(max(stored, 0), len(req.BlockHashes)); k < len(req.BlockHashes); k++ {
		e.expect.insert(expectKey(seed, req.BlockHashes[k]), pick.rid, expiry, now)
	}
}

// expectTTL is how long an entry on pick waits for its confirmation (µs):
// DefaultExpectedTTL (LoadConfig.ExpectedTTL), plus the time the
// replica's queue takes to drain at the prefill speed its KV events show
// (when both are known), at most maxExpectedDrain.
func (e *Engine) expectTTL(res *LookupResult, pick ContractPick, now int64) int64 {
	ttl := e.load.ExpectedTTL.Microseconds()
	slots := res.d.replicaSlots()
	if int(pick.rid) >= len(slots) || slots[pick.rid] == nil {
		return ttl
	}
	r := slots[pick.rid]
	rec := r.load.report.Load()
	speed := r.load.speed.load() // tokens per µs
	if rec == nil || speed <= 0 || now-rec.at >= e.load.MaxAge.Microseconds() {
		return ttl
	}
	drain := rec.estimate(r, meanRequestTokens(slots)) / speed
	return ttl + int64(min(drain, float64(maxExpectedDrain.Microseconds())))
}
