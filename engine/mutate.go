package engine

import (
	"slices"
	"sort"
	"unsafe"

	"github.com/inferencecache/inferencecache/policy"
)

// This file holds the writer's primitives. Every function here requires
// e.mu to be held.

func (e *Engine) beginWrite(off uint32) uint32 {
	w := e.arena.Word(off + nSeq)
	s := w.Load()
	w.Store(s + 1)
	return s
}

func (e *Engine) endWrite(off, s uint32) { e.arena.Word(off + nSeq).Store(s + 2) }

func (e *Engine) setWord(off, v uint32) { e.arena.Word(off).Store(v) }

// tenantLocked returns the tenant's state, creating it.
func (e *Engine) tenantLocked(id string) *tenantState {
	if t, ok := e.tenants.Load(id); ok {
		return t
	}
	t := &tenantState{id: id, reserved: id == policy.ReservedTenantID, hidx: -1, sidx: -1}
	t.capq.init(capLess, &e.capAcct)
	if e.snap != nil {
		t.lfu = e.snap.Tenant(id).Eviction == policy.LFU
	}
	t.quota = e.quotas[id]
	e.tenants.Store(id, t)
	return t
}

// domainLocked returns the (tenant, model) domain, creating it.
func (e *Engine) domainLocked(tenant, model string) *domain {
	if d, ok := e.domains.Load(domainKey{tenant, model}); ok {
		return d
	}
	ts := e.tenantLocked(tenant)
	d := &domain{tenant: tenant, model: model, reserved: ts.reserved, ts: ts, byName: map[string]uint16{}}
	if d.mc = e.modelKeys[model]; d.mc == nil {
		d.mc = &modelCount{model: model}
		e.modelKeys[model] = d.mc
	}
	d.mc.domains++
	ts.models = append(ts.models, d)
	e.domains.Store(domainKey{tenant, model}, d)
	return d
}

// schemeLocked returns the domain's scheme, creating it.
func (e *Engine) schemeLocked(d *domain, name string) *scheme {
	if s := d.findScheme(name); s != nil {
		return s
	}
	var list []*scheme
	if p := d.schemes.Load(); p != nil {
		list = *p
	}
	// The smallest index no live scheme uses: a reclaimed scheme's index
	// is free again (every replica's count for it is 0 by then).
	index := 0
	for i := 0; i < len(list); i++ {
		if list[i].index == index {
			index, i = index+1, -1
		}
	}
	s := &scheme{name: name, index: index, d: d, expectSeed: expectSchemeSeed(d.tenant, d.model, name)}
	s.serving.Store(&servingSet{})
	next := append(slices.Clip(list), s)
	d.schemes.Store(&next)
	return s
}

// scopeLocked returns the scheme's scope for adapter, creating it. It
// returns nil when every scope slot is taken or quarantined.
func (e *Engine) scopeLocked(d *domain, s *scheme, adapter string, now int64) *scope {
	if sc := s.findScope(adapter); sc != nil {
		return sc
	}
	id, ok := e.newScopeIDLocked(now)
	if !ok {
		return nil
	}
	sc := &scope{id: id, d: d, sch: s, adapter: adapter}
	t := newTable(0)
	sc.table.Store(t)
	e.tableBytes += t.bytes()
	e.scopes[scopeSlot(id)] = sc
	var list []*scope
	if p := s.scopes.Load(); p != nil {
		list = *p
	}
	next := append(slices.Clip(list), sc)
	s.scopes.Store(&next)
	return sc
}

// replicaLocked returns the domain's replica named name, creating it. It
// returns nil when the domain has no free replica id.
func (e *Engine) replicaLocked(d *domain, name string, now int64) *replica {
	if d.dead {
		panic("BUG: writing into a reclaimed domain")
	}
	if id, ok := d.byName[name]; ok {
		return d.replicaSlots()[id]
	}
	slots := d.replicaSlots()
	id := -1
	if len(d.freeIDs) > 0 && d.freeIDs[0].after <= now {
		id = int(d.freeIDs[0].id)
		d.freeIDs = d.freeIDs[1:]
	} else if len(slots) < MaxReplicasPerModel {
		id = len(slots)
	} else {
		return nil
	}
	r := &replica{id: uint16(id), name: name}
	next := slices.Clone(slots)
	if id == len(next) {
		next = append(next, r)
	} else {
		next[id] = r
	}
	d.replicas.Store(newReplicaTable(next))
	d.byName[name] = r.id
	return r
}

// maybeFreeReplicaLocked releases a replica id that holds no keys and no
// stats, after a quarantine (see replicaQuarantineUs).
func (e *Engine) maybeFreeReplicaLocked(d *domain, r *replica, now int64) {
	if !e.unregisterLocked(d, r, now) {
		return
	}
	next := slices.Clone(d.replicaSlots())
	next[r.id] = nil
	d.replicas.Store(newReplicaTable(next))
}

// freeReplicasLocked is maybeFreeReplicaLocked for several replicas of d,
// publishing one replica table for all of them.
func (e *Engine) freeReplicasLocked(d *domain, rs []*replica, now int64) {
	var next []*replica
	for _, r := range rs {
		if !e.unregisterLocked(d, r, now) {
			continue
		}
		if next == nil {
			next = slices.Clone(d.replicaSlots())
		}
		next[r.id] = nil
	}
	if next != nil {
		d.replicas.Store(newReplicaTable(next))
	}
}

// unregisterLocked drops the name of a replica that holds no keys and no
// stats and queues its id for reuse after the quarantine. The caller
// removes it from the replica table.
func (e *Engine) unregisterLocked(d *domain, r *replica, now int64) bool {
	if r.keys.Load() != 0 || r.stats.Load() != nil {
		return false
	}
	if cur, ok := d.byName[r.name]; !ok || cur != r.id {
		return false
	}
	if e.subs != nil && r.announced {
		e.recordReplicaLocked(EventReplicaRemoved, e.changeReason, d, r, now)
	}
	delete(d.byName, r.name)
	d.freeIDs = append(d.freeIDs, freeID{id: r.id, after: now + replicaQuarantineUs})
	return true
}

// setServingLocked rebuilds a scheme's serving set after replica r's key
// count in it moved between 0 and non-zero.
func (e *Engine) setServingLocked(s *scheme, r *replica, serving bool) {
	old := s.serving.Load()
	ns := &servingSet{}
	for i, id := range old.ids {
		if id != r.id {
			ns.ids = append(ns.ids, id)
			_ = i
		}
	}
	if serving {
		ns.ids = append(ns.ids, r.id)
		slices.Sort(ns.ids)
	}
	slots := s.d.replicaSlots()
	for _, id := range ns.ids {
		name := r.name
		if id != r.id {
			name = slots[id].name
		}
		ns.names = append(ns.names, name)
		ns.byName = append(ns.byName, id)
	}
	sort.Sort(servingByName{ns})
	s.serving.Store(ns)
}

// countKeyLocked adjusts the distinct-key counters for a node created
// (delta 1) or freed (delta -1) in scope sc.
func (e *Engine) countKeyLocked(sc *scope, delta int64) {
	d := sc.d
	d.keys.Add(delta)
	d.ts.keys.Add(delta)
	if d.reserved {
		return
	}
	e.totalKeys.Add(delta)
	d.mc.n += delta
	if !d.mc.dirty {
		d.mc.dirty = true
		e.dirtyModels = append(e.dirtyModels, d.mc)
	}
}

// countHolderLocked adjusts the storage-entry counters when replica r
// starts (delta 1) or stops (delta -1) holding a key of scope sc.
func (e *Engine) countHolderLocked(sc *scope, r *replica, delta int64) {
	if sc.d.reserved {
		e.reservedEntries.Add(delta)
	} else {
		e.totalEntries.Add(delta)
		t := sc.d.ts
		switch t.entries += delta; {
		case t.entries == delta && delta > 0:
			e.activeTenants++
		case t.entries == 0:
			e.activeTenants--
		}
		if t.sidx >= 0 {
			e.sparedFixLocked(t)
		}
	}
	if r.keys.Add(delta) == 0 {
		r.newest.Store(0)
	}
	if delta > 0 {
		r.load.newHolders++
		r.announced = true
	}
	for len(r.schemeKeys) <= sc.sch.index {
		r.schemeKeys = append(r.schemeKeys, 0)
	}
	r.schemeKeys[sc.sch.index] += int32(delta)
	switch n := r.schemeKeys[sc.sch.index]; {
	case n == 1 && delta > 0:
		e.setServingLocked(sc.sch, r, true)
	case n == 0:
		e.setServingLocked(sc.sch, r, false)
	}
}

// newKeyLocked creates the node for a new key k in scope sc with replica r
// as its only holder, and publishes it in the table. It returns 0 when the
// arena is full. Blocks that are fresh from the arena (never handed out, so
// unreachable by any reader) are filled with plain stores; the table slot's
// atomic store publishes them. Reused blocks are written atomically inside
// a sequence-lock window, since stale readers may still be looking at them.
func (e *Engine) newKeyLocked(sc *scope, r *replica, k *key, slot uint64, hw holderWrite) uint32 {
	off, nodeFresh, err := e.arena.AllocFresh(nodeWords)
	if err != nil {
		return 0
	}
	block, blockFresh, err := e.arena.AllocFresh(holderCaps[0] * holderWord)
	if err != nil {
		e.arena.Free(off, nodeWords)
		return 0
	}
	lo, hi := uint32(k.v), uint32(k.v>>32)
	if k.kind == kindBytes {
		at, err := e.storeHashBytes(k.b)
		if err != nil {
			e.arena.Free(block, holderCaps[0]*holderWord)
			e.arena.Free(off, nodeWords)
			return 0
		}
		lo, hi = at, uint32(len(k.b))
	}
	// The holder first: the node points at it.
	e.initWord(block+hRidTier, uint32(hw.rid)|uint32(hw.tier)<<16, blockFresh)
	e.initWord(block+hTokens, uint32(hw.tokens), blockFresh)
	if blockFresh {
		e.initWord(block+hLFU, 0, true)
	} else {
		e.moveLFU(0, block+hLFU)
	}
	e.initWord(block+hTsLo, uint32(hw.ts), blockFresh)
	e.initWord(block+hTsHi, uint32(uint64(hw.ts)>>32), blockFresh)
	var s uint32
	if !nodeFresh {
		s = e.beginWrite(off)
	}
	e.initWord(off+nHashLo, lo, nodeFresh)
	e.initWord(off+nHashHi, hi, nodeFresh)
	e.initWord(off+nHolders, block, nodeFresh)
	e.initWord(off+nMeta, makeMeta(1, 0, k.kind), nodeFresh)
	e.initWord(off+nNext, 0, nodeFresh)
	e.initWord(off+nScope, sc.id, nodeFresh)
	if !nodeFresh {
		e.endWrite(off, s)
	}
	e.insertLocked(sc, k, off, slot)
	e.countKeyLocked(sc, 1)
	e.countHolderLocked(sc, r, 1)
	e.fileCapLocked(sc, off, block, hw.rid, hw.ts)
	return off
}

// initWord writes a word of a block being initialized: a plain store when
// the block is fresh, an atomic store otherwise (see newKeyLocked).
func (e *Engine) initWord(off, v uint32, fresh bool) {
	w := e.arena.Word(off)
	if fresh {
		// Safety: fresh arena memory has never been published, so no other
		// goroutine can access this word until an atomic store publishes it.
		*(*uint32)(unsafe.Pointer(w)) = v
		return
	}
	w.Store(v)
}

// freeNodeLocked unlinks an empty node from its table and returns its memory.
func (e *Engine) freeNodeLocked(sc *scope, off uint32) {
	meta := e.w(off + nMeta)
	var k key
	if metaKind(meta) == kindU64 {
		k.kind = kindU64
		k.v = uint64(e.w(off+nHashLo)) | uint64(e.w(off+nHashHi))<<32
	} else {
		var buf [MaxHashBytes]byte
		k.kind = kindBytes
		k.b = e.appendHashBytes(buf[:0], off)
	}
	e.deleteLocked(sc, &k, off)
	block := e.w(off + nHolders)
	class := metaClass(meta)
	gen := e.w(off+nGen) + 1
	s := e.beginWrite(off)
	e.setWord(off+nMeta, 0)
	e.setWord(off+nGen, gen)
	e.endWrite(off, s)
	e.arena.Free(block, holderCaps[class]*holderWord)
	if metaKind(meta) == kindBytes {
		e.arena.Free(e.w(off+nHashLo), hashWords(int(e.w(off+nHashHi))))
	}
	if gen&capGenMask == 0 {
		// Parked until the cap queue forgets this node's records (capRec).
		e.wrapped = append(e.wrapped, off)
	} else {
		e.arena.Free(off, nodeWords)
	}
	e.countKeyLocked(sc, -1)
}

// holderWrite describes one replica reporting one key.
type holderWrite struct {
	rid    uint16
	tokens int32
	tier   Tier
	ts     int64
}

// upsertLocked records that replica r holds key k in scope sc. It returns the
// node offset, or 0 when the arena is full.
func (e *Engine) upsertLocked(sc *scope, r *replica, k *key, hw holderWrite) uint32 {
	t := sc.table.Load()
	off, slot := e.findLocked(t, sc.id, k)
	if off == 0 {
		if off = e.newKeyLocked(sc, r, k, slot, hw); off == 0 {
			return 0
		}
		if e.subs != nil {
			e.recordAddedLocked(sc, r, k, hw)
		}
		if hw.ts > r.newest.Load() {
			r.newest.Store(hw.ts)
		}
		if q := sc.d.ts.quota; q != nil {
			q.push(e, off, hw.ts)
		}
		return off
	}
	meta := e.w(off + nMeta)
	block, count := e.w(off+nHolders), metaCount(meta)
	idx, found := e.findHolder(block, count, hw.rid)
	oldMax := int64(0)
	q := sc.d.ts.quota
	if q != nil {
		oldMax = e.nodeMaxTsLocked(off)
	}
	if found {
		h := holderAt(block, idx)
		oldTs := e.holderTs(h)
		if e.subs != nil && Tier(e.w(h+hRidTier)>>16) != hw.tier {
			e.recordAddedLocked(sc, r, k, hw) // a tier change
		}
		s := e.beginWrite(off)
		e.setWord(h+hRidTier, uint32(hw.rid)|uint32(hw.tier)<<16)
		e.setWord(h+hTokens, uint32(hw.tokens))
		e.setWord(h+hTsLo, uint32(hw.ts))
		e.setWord(h+hTsHi, uint32(uint64(hw.ts)>>32))
		e.endWrite(off, s)
		if oldTs != hw.ts {
			e.fileCapLocked(sc, off, h, hw.rid, hw.ts)
		}
	} else {
		if !e.insertHolderLocked(off, meta, idx, hw) {
			if count == 0 {
				e.freeNodeLocked(sc, off)
			}
			return 0
		}
		e.countHolderLocked(sc, r, 1)
		h := holderAt(e.w(off+nHolders), idx)
		e.fileCapLocked(sc, off, h, hw.rid, hw.ts)
		if e.subs != nil {
			e.recordAddedLocked(sc, r, k, hw)
		}
	}
	if hw.ts > r.newest.Load() {
		r.newest.Store(hw.ts)
	}
	if q != nil {
		if m := e.nodeMaxTsLocked(off); m != oldMax {
			q.push(e, off, m)
		}
	}
	return off
}

// insertHolderLocked inserts a holder at index idx of node off, growing the
// holder block when it is full. It reports false when the arena is full.
func (e *Engine) insertHolderLocked(off, meta, idx uint32, hw holderWrite) bool {
	block, count, class := e.w(off+nHolders), metaCount(meta), metaClass(meta)
	dst, dstClass := block, class
	if count == holderCaps[class] {
		dstClass = classFor(count + 1)
		nb, err := e.arena.Alloc(holderCaps[dstClass] * holderWord)
		if err != nil {
			return false
		}
		dst = nb
	}
	s := e.beginWrite(off)
	// Move holders at and after idx up by one, last first; when growing into
	// a new block, copy the ones before idx too.
	for i := count; i > idx; i-- {
		e.copyHolder(holderAt(block, i-1), holderAt(dst, i))
	}
	if dst != block {
		for i := uint32(0); i < idx; i++ {
			e.copyHolder(holderAt(block, i), holderAt(dst, i))
		}
	}
	h := holderAt(dst, idx)
	e.setWord(h+hRidTier, uint32(hw.rid)|uint32(hw.tier)<<16)
	e.setWord(h+hTokens, uint32(hw.tokens))
	e.moveLFU(0, h+hLFU)
	e.setWord(h+hTsLo, uint32(hw.ts))
	e.setWord(h+hTsHi, uint32(uint64(hw.ts)>>32))
	e.setWord(off+nHolders, dst)
	e.setWord(off+nMeta, makeMeta(count+1, dstClass, metaKind(meta)))
	e.endWrite(off, s)
	if dst != block {
		e.arena.Free(block, holderCaps[class]*holderWord)
	}
	return true
}

// copyHolder copies one holder record, moving its LFU count.
func (e *Engine) copyHolder(src, dst uint32) {
	e.setWord(dst+hRidTier, e.w(src+hRidTier))
	e.setWord(dst+hTokens, e.w(src+hTokens))
	e.moveLFU(src+hLFU, dst+hLFU)
	e.setWord(dst+hTsLo, e.w(src+hTsLo))
	e.setWord(dst+hTsHi, e.w(src+hTsHi))
}

// removeHolderLocked removes holder idx from node off of scope sc, freeing
// the node when it was the last holder. It returns the removed holder's rid.
func (e *Engine) removeHolderLocked(sc *scope, off, idx uint32, now int64) uint16 {
	meta := e.w(off + nMeta)
	block, count := e.w(off+nHolders), metaCount(meta)
	rid := uint16(e.w(holderAt(block, idx) + hRidTier))
	if e.subs != nil && !e.clearing {
		e.recordKeyChangeLocked(EventPrefixEvicted, sc, sc.d.replicaSlots()[rid], off, 0, 0, now)
	}
	oldMax := int64(0)
	q := sc.d.ts.quota
	if q != nil {
		oldMax = e.nodeMaxTsLocked(off)
	}
	s := e.beginWrite(off)
	for i := idx; i+1 < count; i++ {
		e.copyHolder(holderAt(block, i+1), holderAt(block, i))
	}
	e.retireLFU(holderAt(block, count-1) + hLFU)
	e.setWord(off+nMeta, makeMeta(count-1, metaClass(meta), metaKind(meta)))
	e.endWrite(off, s)
	r := sc.d.replicaSlots()[rid]
	e.countHolderLocked(sc, r, -1)
	if count == 1 {
		e.freeNodeLocked(sc, off)
	} else if q != nil {
		if m := e.nodeMaxTsLocked(off); m != oldMax {
			q.push(e, off, m)
		}
	}
	e.maybeFreeReplicaLocked(sc.d, r, now)
	return rid
}

// nodeMaxTsLocked returns the newest lastSeen among a node's holders.
func (e *Engine) nodeMaxTsLocked(off uint32) int64 {
	meta := e.w(off + nMeta)
	block, count := e.w(off+nHolders), metaCount(meta)
	m := int64(-1 << 63)
	for i := uint32(0); i < count; i++ {
		m = max(m, e.holderTs(holderAt(block, i)))
	}
	return m
}
