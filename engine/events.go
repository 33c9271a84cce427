package engine

import (
	"encoding/binary"
	"slices"
	"sync"
)

// The change stream (StreamCacheEvents, docs/wire.md): every change of the
// index, as it is written, to the subscribers that ask for it.
//
// Cost. With no subscriber, a write tests one field the writer lock
// guards (Engine.subs == nil) at each change site and does nothing else;
// lookups never look at any of it. With subscribers, each change is
// appended to the write's pending tally under the writer lock (strings are
// the index's own, the hash is copied into one reused buffer) and fanned out
// after the lock is released, in write order (under reportMu, like the
// metric reports), into each subscriber's bounded ring. A subscriber whose
// ring is full is marked overflowed and gets nothing more: a slow reader
// never stalls a writer; it is ended (StreamCacheEvents answers
// RESOURCE_EXHAUSTED) and may subscribe again.

// Reasons of a removal (IndexChange.Reason).
const (
	// ReasonEngine: the producer reported it (PREFIX_EVICTED, ALL_CLEARED).
	ReasonEngine = "engine"
	// ReasonCap: the entry cap or the byte budget evicted it.
	ReasonCap = reasonCap
	// ReasonTTL: the freshness sweep removed it.
	ReasonTTL = reasonTTL
	// ReasonQuota: the tenant's CacheTenant quota evicted it.
	ReasonQuota = "quota"
	// ReasonExpired: a replica's stats outlived the TTL without a report.
	ReasonExpired = "expired"
)

// DefaultChangeBuffer is a subscription's ring size when the caller gives
// none; MaxChangeBuffer bounds what a caller may ask for.
const (
	DefaultChangeBuffer = 4096
	MaxChangeBuffer     = 1 << 16
)

// IndexChange is one change of the index. Type is EventPrefixAdded (a
// replica came to hold a key, or a key it holds changed tier),
// EventPrefixEvicted (a replica no longer holds a key), EventAllCleared (a
// producer cleared a replica: one change, not one per key) or
// EventReplicaRemoved (the index forgot a replica that held keys or
// stats).
type IndexChange struct {
	Type                                                EventType
	Reason                                              string // removals only: ReasonEngine, ReasonCap, ...
	TenantID, ModelID, HashScheme, AdapterID, ReplicaID string
	// Hash is the key (key changes only). In a slice Next returned, it is
	// valid until the next call of Next with that slice.
	Hash []byte
	// Tokens and Tier: PREFIX_ADDED only.
	Tokens int32
	Tier   Tier
	// At is µs: the entry's timestamp for PREFIX_ADDED, the server time of
	// the write otherwise.
	At int64
}

// ChangeFilter selects changes: empty TenantID and ModelID match any, and
// Types is a bit set of (1 << EventType), 0 for every type.
type ChangeFilter struct {
	TenantID, ModelID string
	Types             uint32
}

func (f *ChangeFilter) match(c *IndexChange) bool {
	return (f.Types == 0 || f.Types&(1<<uint(c.Type)) != 0) &&
		(f.TenantID == "" || f.TenantID == c.TenantID) &&
		(f.ModelID == "" || f.ModelID == c.ModelID)
}

// Subscription receives the index changes its filter selects, from the
// moment SubscribeChanges returned. Its methods are safe for concurrent use.
type Subscription struct {
	e      *Engine
	filter ChangeFilter // immutable
	// ready has room for one token; the fan-out puts one there (without
	// blocking) after it added changes, or when the ring overflows.
	ready chan struct{}

	// mu guards the ring and the flags; the fan-out and Next take it, one
	// ring operation at a time.
	mu sync.Mutex
	// ring holds n changes from head; each slot keeps its Hash buffer.
	ring    []IndexChange
	head, n int
	// overflowed is set when a change found the ring full; nothing is
	// added afterwards.
	overflowed bool
	closed     bool
}

// SubscribeChanges starts a subscription with a ring of buffer changes
// (0 means DefaultChangeBuffer; at most MaxChangeBuffer). Every change
// written after it returns and matching f reaches it until it overflows or
// is closed. Changes of the reserved tenant are never delivered. The
// caller must Close it.
func (e *Engine) SubscribeChanges(f ChangeFilter, buffer int) *Subscription {
	if buffer <= 0 {
		buffer = DefaultChangeBuffer
	}
	buffer = min(buffer, MaxChangeBuffer)
	s := &Subscription{e: e, filter: f, ready: make(chan struct{}, 1), ring: make([]IndexChange, buffer)}
	e.mu.Lock()
	// Copy-on-write: a write's tally keeps the list it was recorded under.
	e.subs = append(slices.Clip(e.subs), s)
	e.mu.Unlock()
	return s
}

// Ready is signaled when changes arrived or the subscription overflowed.
func (s *Subscription) Ready() <-chan struct{} { return s.ready }

// Next appends the buffered changes to dst[:0], reusing its elements' Hash
// buffers, and empties the ring. overflowed is true once the ring has
// overflowed (the changes before it are still returned, once).
func (s *Subscription) Next(dst []IndexChange) (out []IndexChange, overflowed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out = dst[:0]
	for i := 0; i < s.n; i++ {
		src := &s.ring[(s.head+i)%len(s.ring)]
		out = slices.Grow(out, 1)[:len(out)+1]
		d := &out[len(out)-1]
		h := d.Hash
		*d = *src
		d.Hash = append(h[:0], src.Hash...)
	}
	s.head, s.n = 0, 0
	return out, s.overflowed
}

// Close ends the subscription; nothing is delivered after it returns.
func (s *Subscription) Close() {
	s.e.mu.Lock()
	if i := slices.Index(s.e.subs, s); i >= 0 {
		next := slices.Delete(slices.Clone(s.e.subs), i, i+1)
		if len(next) == 0 {
			next = nil
		}
		s.e.subs = next
	}
	s.e.mu.Unlock()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// Subscriptions returns how many subscriptions are open.
func (e *Engine) Subscriptions() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.subs)
}

// deliver adds c to the ring; it never blocks.
func (s *Subscription) deliver(c *IndexChange) {
	if !s.filter.match(c) {
		return
	}
	s.mu.Lock()
	if s.closed || s.overflowed {
		s.mu.Unlock()
		return
	}
	if s.n == len(s.ring) {
		s.overflowed = true
	} else {
		d := &s.ring[(s.head+s.n)%len(s.ring)]
		h := d.Hash
		*d = *c
		d.Hash = append(h[:0], c.Hash...)
		s.n++
	}
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// pendingChange is a recorded change whose hash lives in the tally's
// buffer (offsets, because the buffer may grow while the write records).
type pendingChange struct {
	IndexChange
	hashOff, hashLen int32
}

// recordChangeLocked appends a change to the current write's tally. The
// caller checked e.subs != nil; mu is held.
func (e *Engine) recordChangeLocked(c IndexChange, hash []byte) {
	p := &e.pending
	off := len(p.changeHashes)
	p.changeHashes = append(p.changeHashes, hash...)
	p.changes = append(p.changes, pendingChange{IndexChange: c, hashOff: int32(off), hashLen: int32(len(hash))})
}

// recordKeyChangeLocked records a change of key (node off of scope sc)
// held by replica r. mu is held; the node is live.
func (e *Engine) recordKeyChangeLocked(typ EventType, sc *scope, r *replica, off uint32, tokens int32, tier Tier, at int64) {
	if sc.d.reserved {
		return
	}
	var buf [MaxHashBytes]byte
	h := e.appendHashBytes(buf[:0], off)
	e.recordChangeLocked(IndexChange{
		Type: typ, Reason: e.changeReason, TenantID: sc.d.tenant, ModelID: sc.d.model,
		HashScheme: sc.sch.name, AdapterID: sc.adapter, ReplicaID: r.name,
		Tokens: tokens, Tier: tier, At: at,
	}, h)
}

// recordAddedLocked records PREFIX_ADDED for key k, which replica r holds
// at hw in scope sc.
func (e *Engine) recordAddedLocked(sc *scope, r *replica, k *key, hw holderWrite) {
	if sc.d.reserved {
		return
	}
	var b8 [8]byte
	h := k.b
	if k.kind == kindU64 {
		binary.BigEndian.PutUint64(b8[:], k.v)
		h = b8[:]
	}
	e.recordChangeLocked(IndexChange{
		Type: EventPrefixAdded, TenantID: sc.d.tenant, ModelID: sc.d.model,
		HashScheme: sc.sch.name, AdapterID: sc.adapter, ReplicaID: r.name,
		Tokens: hw.tokens, Tier: hw.tier, At: hw.ts,
	}, h)
}

// recordReplicaLocked records a replica-level change (ALL_CLEARED,
// REPLICA_REMOVED) of replica r of domain d.
func (e *Engine) recordReplicaLocked(typ EventType, reason string, d *domain, r *replica, now int64) {
	if d.reserved {
		return
	}
	e.recordChangeLocked(IndexChange{Type: typ, Reason: reason, TenantID: d.tenant, ModelID: d.model, ReplicaID: r.name, At: now}, nil)
}

// publishChanges fans a reported tally's changes out to the subscriptions
// it was recorded under. Called with reportMu held, mu released.
func (p *pendingMetrics) publishChanges() {
	if len(p.changes) == 0 {
		return
	}
	for i := range p.changes {
		c := &p.changes[i]
		c.Hash = nil
		if c.hashLen > 0 {
			c.Hash = p.changeHashes[c.hashOff : c.hashOff+c.hashLen : c.hashOff+c.hashLen]
		}
		for _, s := range p.changeSubs {
			s.deliver(&c.IndexChange)
		}
	}
}

// resetChanges empties the tally's changes, keeping the buffers.
func (p *pendingMetrics) resetChanges() {
	clear(p.changes)
	p.changes = p.changes[:0]
	p.changeHashes = p.changeHashes[:0]
	// changeSubs aliases a list of Engine.subs (copy-on-write): dropped,
	// never cleared.
	p.changeSubs = nil
}
