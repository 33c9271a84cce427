package engine

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"slices"
	"unsafe"

	"github.com/inferencecache/inferencecache/engine/internal/prefetch"
	"github.com/inferencecache/inferencecache/policy"
)

// Cap eviction order (contract §6): the entry with the lowest effective
// access count (its LFU count in an LFU tenant, 0 in an LRU tenant) goes
// first, then the oldest lastSeen, then the smallest key (tenant, model,
// scheme, adapter, hash bytes), then the smallest replica id string.
//
// Fair share (a choice beyond the contract, engine/README.md): that order
// is applied among the entries of the tenants over their fair share, so a
// tenant that floods the index pays for its own flood instead of evicting
// every other tenant. At the entry cap a tenant is over its share when it
// holds more than MaxEntries / active tenants (tenants with at least one
// entry, the reserved tenant excluded); under the byte budget, with fewer
// entries than the cap, when it holds at least the average (entries /
// active). Some tenant always is (the entries exceed the cap, or some
// tenant holds at least the average), so there is always a victim.
//
// The seed system sorted the whole index under its lock to find victims.
// Here every storage entry is filed, when it is written, in a bucket keyed
// by (effective count, lastSeen); a binary heap orders the distinct bucket
// keys. Filing is O(1) (an append) plus O(log B) when a write creates a new
// bucket, B being the number of distinct (count, lastSeen) pairs, which one
// update's entries share. Victims come from the minimum bucket, which is
// sorted by (key, replica) once when it reaches the top.
//
// Two things can make a filed record stale, and both are resolved lazily
// when the record reaches the top: the entry was rewritten, removed or its
// node reused (the record no longer validates and is dropped), or lookups
// credited it (LFU counts only grow, so its filed count is a lower bound:
// it is refiled under its real count). Because every bucket key is a lower
// bound of its records' true keys, the first record that validates at its
// filed key in the minimum bucket is the exact global minimum. The one
// change that lowers a true key, a tenant switching from LFU to LRU, refiles
// the whole queue (syncPolicyLocked). Dropped records are garbage that
// compaction removes once it outnumbers live entries, so the queue stays
// O(entries) and every operation is amortized O(1) per entry apart from the
// heap and the within-bucket sort.

// capRec packs gen (16 bits) | node offset (32) | replica id (16).
//
// A record names its node by offset and the low 16 bits of its gen, so
// after 65,536 reuses the node would carry the record's bits again and a
// stale record (and the place it was sorted to in its bucket) could pass
// for a later entry. A node whose gen's low 16 bits wrap on a free is
// therefore parked instead of returned to the arena (wrapped) until a
// compaction or rebuild of the queue has dropped every record of a node
// that is not live, the parked node's old records among them. Any later
// life of a node is separated from its earlier lives' records by such a
// wrap, so no record ever validates against a life it was not filed for.
func capRec(gen, off uint32, rid uint16) uint64 {
	return uint64(gen&capGenMask)<<48 | uint64(off)<<16 | uint64(rid)
}

const (
	capGenMask = 0xFFFF
	// maxWrapped bounds the nodes parked by a gen wrap before a write
	// compacts the cap queue to release them (see capRec).
	maxWrapped = 1024
)

func capRecParts(r uint64) (gen16, off uint32, rid uint16) {
	return uint32(r >> 48), uint32(r >> 16), uint16(r)
}

type capKey struct {
	count uint32
	ts    int64
}

func capLess(a, b capKey) bool {
	if a.count != b.count {
		return a.count < b.count
	}
	return a.ts < b.ts
}

// bucket is a run of records under one key. recs[:head] are consumed.
type bucket[K comparable] struct {
	key    K
	recs   []uint64
	head   int
	sorted bool
	hidx   int
}

// bucketQueue is a min-heap of buckets keyed by K with a map for filing.
// It is owned by the writer.
type bucketQueue[K comparable] struct {
	byKey map[K]*bucket[K] // made by the first push
	heap  []*bucket[K]
	less  func(a, b K) bool
	// records counts the records filed and not yet consumed, garbage
	// included; recCap sums cap(recs), for memory accounting. Every change
	// goes through count, which also adds it to shared when set (the
	// tenants' cap queues share the engine's totals).
	records, recCap int
	shared          *queueAcct
	// last is the bucket of the last push (nil after it is dropped).
	last *bucket[K]
}

// queueAcct totals the records, record capacity and buckets of several
// bucket queues (writer only).
type queueAcct struct {
	records, recCap, buckets int
}

// bytes is the memory the queues hold (records plus bucket overhead).
func (a *queueAcct) bytes() int64 {
	const perBucket = 64 + 48 + 8 // struct, map entry, heap slot
	return int64(a.recCap)*8 + int64(a.buckets)*perBucket
}

func (q *bucketQueue[K]) init(less func(a, b K) bool, shared *queueAcct) {
	q.less = less
	q.shared = shared
}

// count adds to the queue's record, capacity and bucket counts.
func (q *bucketQueue[K]) count(records, recCap, buckets int) {
	q.records += records
	q.recCap += recCap
	if q.shared != nil {
		q.shared.records += records
		q.shared.recCap += recCap
		q.shared.buckets += buckets
	}
}

// push files rec under k. It reports whether k became the queue's minimum
// bucket (a new bucket at the top of the heap).
func (q *bucketQueue[K]) push(k K, rec uint64) (newMin bool) {
	// The entries of one update share a key: reuse the last bucket without
	// a map lookup.
	b := q.last
	if b == nil || b.key != k {
		b = q.byKey[k]
		q.last = b
	}
	buckets := 0
	if b == nil {
		if q.byKey == nil {
			q.byKey = map[K]*bucket[K]{}
		}
		b = &bucket[K]{key: k}
		q.byKey[k] = b
		q.last = b
		b.hidx = len(q.heap)
		q.heap = append(q.heap, b)
		q.up(b.hidx)
		newMin = b.hidx == 0
		buckets = 1
	}
	c := cap(b.recs)
	b.recs = append(b.recs, rec)
	b.sorted = false
	q.count(1, cap(b.recs)-c, buckets)
	return newMin
}

// min returns the minimum bucket or nil.
func (q *bucketQueue[K]) min() *bucket[K] {
	if len(q.heap) == 0 {
		return nil
	}
	return q.heap[0]
}

// drop removes bucket b (normally the minimum).
func (q *bucketQueue[K]) drop(b *bucket[K]) {
	if q.last == b {
		q.last = nil
	}
	q.count(-(len(b.recs) - b.head), -cap(b.recs), -1)
	delete(q.byKey, b.key)
	i := b.hidx
	last := len(q.heap) - 1
	q.swap(i, last)
	q.heap[last] = nil
	q.heap = q.heap[:last]
	if i < last {
		q.down(i)
		q.up(i)
	}
}

func (q *bucketQueue[K]) swap(i, j int) {
	q.heap[i], q.heap[j] = q.heap[j], q.heap[i]
	q.heap[i].hidx, q.heap[j].hidx = i, j
}

func (q *bucketQueue[K]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(q.heap[i].key, q.heap[p].key) {
			return
		}
		q.swap(i, p)
		i = p
	}
}

func (q *bucketQueue[K]) down(i int) {
	n := len(q.heap)
	for {
		l, m := 2*i+1, i
		if l < n && q.less(q.heap[l].key, q.heap[m].key) {
			m = l
		}
		if r := l + 1; r < n && q.less(q.heap[r].key, q.heap[m].key) {
			m = r
		}
		if m == i {
			return
		}
		q.swap(i, m)
		i = m
	}
}

// compact rewrites every bucket keeping only the records keep approves,
// and drops empty buckets.
func (q *bucketQueue[K]) compact(keep func(k K, rec uint64) bool) {
	for _, b := range slices.Clone(q.heap) {
		out := b.recs[:0]
		for _, r := range b.recs[b.head:] {
			if keep(b.key, r) {
				out = append(out, r)
			}
		}
		q.count(-(len(b.recs) - b.head - len(out)), 0, 0)
		// Release memory of buckets that shrank a lot.
		if cap(out) > 64 && len(out) < cap(out)/4 {
			c := cap(out)
			out = slices.Clone(out)
			q.count(0, cap(out)-c, 0)
		}
		clear(b.recs[len(out):])
		b.recs, b.head, b.sorted = out, 0, false
		if len(out) == 0 {
			q.drop(b)
		}
	}
}

// bytes is the queue's memory (records plus bucket overhead).
func (q *bucketQueue[K]) bytes() int64 {
	a := queueAcct{recCap: q.recCap, buckets: len(q.byKey)}
	return a.bytes()
}

// capQueue is one tenant's part of the cap-eviction queue: its storage
// entries, by (effective count, lastSeen). The engine's totals are in
// Engine.capAcct.
type capQueue struct {
	bucketQueue[capKey]
}

// fileCapLocked files holder h (replica rid of node off) under its current
// effective count and lastSeen ts, in its tenant's cap queue.
func (e *Engine) fileCapLocked(sc *scope, off, h uint32, rid uint16, ts int64) {
	if !e.capOn || sc.d.reserved {
		return
	}
	t := sc.d.ts
	var count uint32
	if t.lfu {
		count = e.w(h+hLFU) & lfuCountMask
	}
	newMin := t.capq.push(capKey{count, ts}, capRec(e.w(off+nGen), off, rid))
	switch {
	case t.hidx < 0 && t.sidx < 0:
		e.capHeapPushLocked(t) // its queue was empty
	case newMin && t.hidx >= 0:
		e.capHeapUpLocked(t.hidx)
	}
	e.maybeCompactCapLocked()
}

// capRecState validates a cap record against the index: it returns the
// node's scope and the holder index, and the holder's current effective
// count, or ok=false when the record is stale for lastSeen ts.
func (e *Engine) capRecState(rec uint64, ts int64) (sc *scope, idx, count uint32, ok bool) {
	gen, off, rid := capRecParts(rec)
	meta := e.w(off + nMeta)
	if meta&metaLive == 0 || e.w(off+nGen)&capGenMask != gen {
		return nil, 0, 0, false
	}
	block := e.w(off + nHolders)
	idx, found := e.findHolder(block, metaCount(meta), rid)
	if !found {
		return nil, 0, 0, false
	}
	h := holderAt(block, idx)
	if e.holderTs(h) != ts {
		return nil, 0, 0, false
	}
	sc = e.scopeByID(e.w(off + nScope))
	if sc.d.ts.lfu {
		count = e.w(h+hLFU) & lfuCountMask
	}
	return sc, idx, count, true
}

// maybeCompactCapLocked drops stale records once they outnumber live ones.
func (e *Engine) maybeCompactCapLocked() {
	live := int(e.totalEntries.Load())
	if e.capAcct.records < 2*live+4096 {
		return
	}
	e.compactCapLocked()
}

// compactCapLocked drops every stale cap record from every tenant's queue,
// then releases the nodes parked by a gen wrap: no record of a node that is
// not live survives it. The tenant heaps are rebuilt (every tenant with
// records back in capHeap: sparing is redone lazily).
func (e *Engine) compactCapLocked() {
	keep := func(k capKey, rec uint64) bool {
		_, _, _, ok := e.capRecState(rec, k.ts)
		return ok
	}
	ts := e.capTenantsLocked()
	for _, t := range ts {
		t.capq.compact(keep)
	}
	e.rebuildCapHeapLocked(ts)
	e.releaseWrappedLocked()
}

// capTenantsLocked lists the tenants whose cap queue holds buckets (those
// in capHeap or spared), and empties both heaps.
func (e *Engine) capTenantsLocked() []*tenantState {
	ts := make([]*tenantState, 0, len(e.capHeap)+len(e.spared))
	ts = append(append(ts, e.capHeap...), e.spared...)
	for _, t := range ts {
		t.hidx, t.sidx = -1, -1
	}
	clear(e.capHeap)
	clear(e.spared)
	e.capHeap, e.spared = e.capHeap[:0], e.spared[:0]
	return ts
}

// rebuildCapHeapLocked puts the tenants of ts whose cap queue holds buckets
// in capHeap, in heap order (the heaps are empty).
func (e *Engine) rebuildCapHeapLocked(ts []*tenantState) {
	for _, t := range ts {
		if t.capq.min() != nil {
			t.hidx = len(e.capHeap)
			e.capHeap = append(e.capHeap, t)
		}
	}
	for i := len(e.capHeap)/2 - 1; i >= 0; i-- {
		e.capHeapDownLocked(i)
	}
}

// discardCapQueueLocked drops a tenant's cap queue (its state is being
// reclaimed: it holds no entry) and takes it off the heaps.
func (e *Engine) discardCapQueueLocked(t *tenantState) {
	for len(t.capq.heap) > 0 {
		t.capq.drop(t.capq.heap[len(t.capq.heap)-1])
	}
	if t.hidx >= 0 {
		e.capHeapRemoveLocked(t.hidx)
	}
	if t.sidx >= 0 {
		e.sparedRemoveLocked(t.sidx)
	}
}

// releaseWrappedLocked returns the parked nodes to the arena (only right
// after the cap queue lost every record of a node that is not live).
func (e *Engine) releaseWrappedLocked() {
	for _, off := range e.wrapped {
		e.arena.Free(off, nodeWords)
	}
	e.wrapped = e.wrapped[:0]
}

// rebuildCapLocked refiles every live storage entry at its true key, in
// its tenant's cap queue. It runs when the queue is first kept, and when
// some tenant stopped using LFU, which lowers its entries' keys.
func (e *Engine) rebuildCapLocked() {
	e.capTenantsLocked()
	e.capAcct = queueAcct{}
	var ts []*tenantState
	e.tenants.Range(func(_ string, t *tenantState) bool {
		t.capq = capQueue{}
		t.capq.init(capLess, &e.capAcct)
		if !t.reserved {
			ts = append(ts, t)
		}
		return true
	})
	e.releaseWrappedLocked()
	for _, sc := range e.scopes[1:] {
		if sc == nil || sc.d.reserved {
			continue
		}
		t := sc.d.ts
		e.forEachNodeLocked(sc, func(off uint32) {
			meta := e.w(off + nMeta)
			block := e.w(off + nHolders)
			for i := uint32(0); i < metaCount(meta); i++ {
				h := holderAt(block, i)
				var count uint32
				if t.lfu {
					count = e.w(h+hLFU) & lfuCountMask
				}
				t.capq.push(capKey{count, e.holderTs(h)}, capRec(e.w(off+nGen), off, uint16(e.w(h+hRidTier))))
			}
		})
	}
	e.rebuildCapHeapLocked(ts)
}

// forEachNodeLocked calls fn for every live node of a scope, in table order.
// fn must not change the scope's table.
func (e *Engine) forEachNodeLocked(sc *scope, fn func(off uint32)) {
	t := sc.table.Load()
	for i := range t.slots {
		s := t.slots[i].Load()
		if s != 0 && s != slotTomb {
			fn(uint32(s))
		}
	}
}

// sortRec is a record with its sort key resolved.
type sortRec struct {
	rec uint64
	sc  *scope
	// hk is hash's first 8 bytes, big-endian, zero-padded (hashKey): two
	// records whose hk differ order as their hashes do, so the sort
	// compares whole hashes only on a tie.
	hk      uint64
	hash    []byte
	replica string
}

// hashKey is the sort prefix of a hash (sortRec.hk).
func hashKey(h []byte) uint64 {
	if len(h) >= 8 {
		return binary.BigEndian.Uint64(h)
	}
	var b [8]byte
	copy(b[:], h)
	return binary.BigEndian.Uint64(b[:])
}

func compareScopes(a, b *scope) int {
	if a == b {
		return 0
	}
	return cmp.Or(
		cmp.Compare(a.d.tenant, b.d.tenant),
		cmp.Compare(a.d.model, b.d.model),
		cmp.Compare(a.sch.name, b.sch.name),
		cmp.Compare(a.adapter, b.adapter),
	)
}

// prepareCapBucketLocked validates the unconsumed records of b (a bucket of
// q), refiles those whose count grew, and sorts the rest by (key, replica),
// dropping duplicates of one holder.
func (e *Engine) prepareCapBucketLocked(q *capQueue, b *bucket[capKey]) {
	recs, hb := e.sortScratch[:0], e.sortHashes[:0]
	for _, r := range b.recs[b.head:] {
		sc, _, count, ok := e.capRecState(r, b.key.ts)
		if !ok {
			continue
		}
		if count > b.key.count {
			q.push(capKey{count, b.key.ts}, r)
			continue
		}
		_, off, rid := capRecParts(r)
		var h []byte
		h, hb = e.sortHash(hb, off)
		recs = append(recs, sortRec{rec: r, sc: sc, hk: hashKey(h), hash: h, replica: sc.d.replicaSlots()[rid].name})
	}
	sortRecs(recs, true)
	consumed := len(b.recs) - b.head
	out := b.recs[:0]
	for i, r := range recs {
		if i > 0 && recs[i-1].rec == r.rec {
			continue
		}
		out = append(out, r.rec)
	}
	q.count(len(out)-consumed, 0, 0)
	b.recs, b.head, b.sorted = out, 0, true
	clear(recs)
	e.sortScratch = recs[:0]
	e.keepSortHashes(hb)
}

// sortHash appends node off's hash to hb and returns it as a full-capacity
// window of hb (which may have moved: earlier windows keep the old array).
func (e *Engine) sortHash(hb []byte, off uint32) (h, grown []byte) {
	start := len(hb)
	hb = e.appendHashBytes(hb, off)
	return hb[start:len(hb):len(hb)], hb
}

// keepSortHashes keeps hb for the next sort unless it grew past what the
// writer should pin (a huge bucket of long hashes).
func (e *Engine) keepSortHashes(hb []byte) {
	if cap(hb) <= 1<<20 {
		e.sortHashes = hb[:0]
	} else {
		e.sortHashes = nil
	}
}

// sortRecs orders records by (scope, hash, replica name); withReplica=false
// orders keys only (the quota queue).
func sortRecs(recs []sortRec, withReplica bool) {
	slices.SortFunc(recs, func(x, y sortRec) int {
		if c := compareScopes(x.sc, y.sc); c != 0 {
			return c
		}
		if x.hk != y.hk {
			return cmp.Compare(x.hk, y.hk)
		}
		if c := bytes.Compare(x.hash, y.hash); c != 0 {
			return c
		}
		if withReplica {
			if c := cmp.Compare(x.replica, y.replica); c != 0 {
				return c
			}
		}
		return cmp.Compare(x.rec, y.rec)
	})
}

// capDueLocked reports whether the index has reached a quarter of its entry
// cap or byte budget (the point from which the cap queue is kept).
func (e *Engine) capDueLocked() bool {
	if m := e.cfg.MaxEntries; m > 0 && e.totalEntries.Load() >= m/4 {
		return true
	}
	return e.cfg.MaxBytes > 0 && e.indexBytesLocked() >= e.cfg.MaxBytes/4
}

// overShareLocked reports whether tenant t is over its fair share: at the
// entry cap (more entries than MaxEntries), when it holds more than
// MaxEntries / active tenants; otherwise (the byte budget), when it holds at
// least the average, entries / active. Monotone in t.entries.
func (e *Engine) overShareLocked(t *tenantState) bool {
	total, active := e.totalEntries.Load(), int64(e.activeTenants)
	if m := e.cfg.MaxEntries; m > 0 && total > m {
		return t.entries*active > m
	}
	return t.entries*active >= total
}

// evictCapOneLocked evicts the single minimum storage entry, in the
// contract's order, of the tenants over their fair share. It reports false
// when nothing is left to evict.
//
// The tenants with cap records are in capHeap, ordered by their queue's
// minimum bucket key and then tenant id, or spared: a tenant found at the
// top of capHeap while not over its share is spared (a max-heap by
// entries), and goes back to capHeap as soon as it is over again (its
// entries grew, or the share shrank as tenants arrived or, under the byte
// budget, as the index shrank): spared tenants at the top of their heap are
// checked before every eviction, so a spared tenant is never over its
// share when a victim is chosen. Every bucket key is a lower bound of its
// records' true keys, so the first record that validates at its filed key
// in the minimum bucket of the top tenant over its share is the exact
// minimum among those tenants' entries (tenant ids break ties between
// equal bucket keys, as the contract's key order does).
func (e *Engine) evictCapOneLocked(snap *policy.Snapshot, now int64) bool {
	for {
		for len(e.spared) > 0 && e.overShareLocked(e.spared[0]) {
			t := e.spared[0]
			e.sparedRemoveLocked(0)
			e.capHeapPushLocked(t)
		}
		if len(e.capHeap) == 0 {
			return false
		}
		t := e.capHeap[0]
		if !e.overShareLocked(t) {
			e.capHeapRemoveLocked(0)
			e.sparedPushLocked(t)
			continue
		}
		q := &t.capq
		b := q.min()
		if !b.sorted {
			e.prepareCapBucketLocked(q, b)
		}
		for b.head < len(b.recs) {
			r := b.recs[b.head]
			sc, idx, count, ok := e.capRecState(r, b.key.ts)
			if !ok {
				b.head++
				q.count(-1, 0, 0)
				continue
			}
			if count > b.key.count {
				b.head++
				q.count(-1, 0, 0)
				q.push(capKey{count, b.key.ts}, r)
				continue
			}
			b.head++
			q.count(-1, 0, 0)
			if b.head < len(b.recs) {
				e.prefetchVictim(b.recs[b.head])
			}
			_, off, _ := capRecParts(r)
			e.removeHolderLocked(sc, off, idx, now)
			e.pending.addIndex(snap.Tenant(sc.d.tenant).Eviction, reasonCap, 1)
			return true
		}
		q.drop(b)
		if q.min() == nil {
			e.capHeapRemoveLocked(0)
		} else {
			e.capHeapDownLocked(0) // its minimum key rose
		}
	}
}

// capBefore orders capHeap: by the tenants' minimum bucket keys, then ids.
func capBefore(a, b *tenantState) bool {
	ka, kb := a.capq.min().key, b.capq.min().key
	if ka != kb {
		return capLess(ka, kb)
	}
	return a.id < b.id
}

func (e *Engine) capHeapSwapLocked(i, j int) {
	h := e.capHeap
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = i, j
}

func (e *Engine) capHeapUpLocked(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !capBefore(e.capHeap[i], e.capHeap[p]) {
			return
		}
		e.capHeapSwapLocked(i, p)
		i = p
	}
}

func (e *Engine) capHeapDownLocked(i int) {
	n := len(e.capHeap)
	for {
		l, m := 2*i+1, i
		if l < n && capBefore(e.capHeap[l], e.capHeap[m]) {
			m = l
		}
		if r := l + 1; r < n && capBefore(e.capHeap[r], e.capHeap[m]) {
			m = r
		}
		if m == i {
			return
		}
		e.capHeapSwapLocked(i, m)
		i = m
	}
}

// capHeapPushLocked adds t (its cap queue holds buckets) to capHeap.
func (e *Engine) capHeapPushLocked(t *tenantState) {
	t.hidx = len(e.capHeap)
	e.capHeap = append(e.capHeap, t)
	e.capHeapUpLocked(t.hidx)
}

// capHeapRemoveLocked takes the tenant at index i off capHeap.
func (e *Engine) capHeapRemoveLocked(i int) {
	t := e.capHeap[i]
	last := len(e.capHeap) - 1
	e.capHeapSwapLocked(i, last)
	e.capHeap[last] = nil
	e.capHeap = e.capHeap[:last]
	t.hidx = -1
	if i < last {
		e.capHeapDownLocked(i)
		e.capHeapUpLocked(i)
	}
}

// sparedBefore orders the spared heap: the most entries first.
func sparedBefore(a, b *tenantState) bool { return a.entries > b.entries }

func (e *Engine) sparedSwapLocked(i, j int) {
	p := e.spared
	p[i], p[j] = p[j], p[i]
	p[i].sidx, p[j].sidx = i, j
}

func (e *Engine) sparedUpLocked(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !sparedBefore(e.spared[i], e.spared[p]) {
			return
		}
		e.sparedSwapLocked(i, p)
		i = p
	}
}

func (e *Engine) sparedDownLocked(i int) {
	n := len(e.spared)
	for {
		l, m := 2*i+1, i
		if l < n && sparedBefore(e.spared[l], e.spared[m]) {
			m = l
		}
		if r := l + 1; r < n && sparedBefore(e.spared[r], e.spared[m]) {
			m = r
		}
		if m == i {
			return
		}
		e.sparedSwapLocked(i, m)
		i = m
	}
}

func (e *Engine) sparedPushLocked(t *tenantState) {
	t.sidx = len(e.spared)
	e.spared = append(e.spared, t)
	e.sparedUpLocked(t.sidx)
}

func (e *Engine) sparedRemoveLocked(i int) {
	t := e.spared[i]
	last := len(e.spared) - 1
	e.sparedSwapLocked(i, last)
	e.spared[last] = nil
	e.spared = e.spared[:last]
	t.sidx = -1
	if i < last {
		e.sparedDownLocked(i)
		e.sparedUpLocked(i)
	}
}

// sparedFixLocked restores the spared heap after t's entries changed.
func (e *Engine) sparedFixLocked(t *tenantState) {
	e.sparedDownLocked(t.sidx)
	e.sparedUpLocked(t.sidx)
}

// prefetchVictim prefetches the memory that evicting record rec (most
// likely the next victim) touches and its bucket's sort did not: the node's
// holder block and, for an 8-byte key, its table slot. A record gone stale
// since the sort only costs a useless prefetch.
func (e *Engine) prefetchVictim(rec uint64) {
	_, off, _ := capRecParts(rec)
	meta := e.w(off + nMeta)
	if meta&metaLive == 0 {
		return
	}
	prefetch.Line(unsafe.Pointer(e.arena.Word(e.w(off + nHolders))))
	if metaKind(meta) != kindU64 {
		return
	}
	t := e.scopeByID(e.w(off + nScope)).table.Load()
	th := e.u64TableHash(uint64(e.w(off+nHashLo)) | uint64(e.w(off+nHashHi))<<32)
	prefetch.Line(unsafe.Pointer(&t.slots[t.home(slotTag(th))]))
}

// enforceCapLocked evicts until the entry cap and the byte budget hold.
//
// The cap queue (8 bytes a record, about a sixth of an entry's memory) is
// kept only from the point where the entries or index bytes first reach a
// quarter of the cap or budget: before that nothing is filed, and on
// reaching it the queue is built from the index in one pass
// (rebuildCapLocked: one lock hold of about 140 ns an entry here, some
// 35 ms at the server's default cap of 1M; a quarter rather than a half
// keeps it short) and kept from then on. The victim
// order does not depend on when entries were filed (every record's key is
// a lower bound of its entry's, validated when it reaches the top), so a
// queue built late evicts exactly as one filed from the start.
func (e *Engine) enforceCapLocked(snap *policy.Snapshot, now int64) {
	if !e.capOn && e.capDueLocked() {
		e.capOn = true
		e.rebuildCapLocked()
	}
	if m := e.cfg.MaxEntries; m > 0 {
		for e.totalEntries.Load() > m && e.evictCapOneLocked(snap, now) {
		}
	}
	if m := e.cfg.MaxBytes; m > 0 {
		for e.indexBytesLocked() > m && e.evictCapOneLocked(snap, now) {
		}
	}
}
