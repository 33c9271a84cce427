package engine

import "slices"

// Reclamation. Domains, schemes, scopes, tenant states and model counters
// are created by writes and would otherwise live forever, so a client
// cycling through tenant, model, scheme or adapter ids could grow the index
// without bound. The sweep, which visits every scope and domain anyway,
// unlinks the ones that are empty: a scope with no key, a scheme with no
// scope, a domain with no scheme and no replica (no keys, no stats), a
// tenant state with no domain, a model counter with no domain. Nothing is
// reclaimed on the write path, so a key that comes and goes costs no
// allocation churn; an empty structure lives until the next sweep.
//
// Readers may hold any of these pointers (they take no lock). What makes
// that safe: an unlinked structure is empty and stays valid Go memory; a
// writer never writes into it again (writers find domains and scopes under
// mu, and the dead flags guard the sweep's own cursors); a later write to
// the same (tenant, model) or (scheme, adapter) builds new structures; and
// scope ids, the only identity a reader checks nodes against, are not
// reused while such a reader could still be running (see "Scope ids" in
// engine.go).

// newScopeIDLocked returns an id for a new scope: the oldest released
// slot whose quarantine has passed, else a new slot. It reports false when
// all 2^22 slots are live or quarantined.
func (e *Engine) newScopeIDLocked(now int64) (uint32, bool) {
	if len(e.freeSlots) > 0 && e.freeSlots[0].after <= now {
		f := e.freeSlots[0]
		e.freeSlots = e.freeSlots[1:]
		return f.slot | f.gen<<scopeSlotBits, true
	}
	if len(e.scopes) > scopeSlotMask {
		return 0, false
	}
	e.scopes = append(e.scopes, nil)
	return uint32(len(e.scopes) - 1), true
}

// scopeByID returns the live scope with id (the scope of a live node).
func (e *Engine) scopeByID(id uint32) *scope {
	sc := e.scopes[scopeSlot(id)]
	if sc == nil || sc.id != id {
		panic("BUG: a live node names a reclaimed scope")
	}
	return sc
}

// reclaimScopeLocked unlinks an empty scope from its scheme, and the scheme
// from its domain when it was the scheme's last scope, and releases the
// scope's slot to the quarantine.
func (e *Engine) reclaimScopeLocked(sc *scope, now int64) {
	t := sc.table.Load()
	if t.used != 0 {
		panic("BUG: reclaiming a scope that holds keys")
	}
	sc.dead = true
	e.tableBytes -= t.bytes()
	slot := scopeSlot(sc.id)
	e.scopes[slot] = nil
	e.freeSlots = append(e.freeSlots, freeSlot{slot: slot, gen: (sc.id>>scopeSlotBits + 1) & scopeGenMask, after: now + scopeQuarantineUs})
	s := sc.sch
	scopes := slices.DeleteFunc(slices.Clone(*s.scopes.Load()), func(x *scope) bool { return x == sc })
	s.scopes.Store(&scopes)
	if len(scopes) > 0 {
		return
	}
	d := s.d
	schemes := slices.DeleteFunc(slices.Clone(*d.schemes.Load()), func(x *scheme) bool { return x == s })
	d.schemes.Store(&schemes)
}

// maybeReclaimDomainLocked unlinks a domain left with no scheme and no
// replica, then its tenant state and model counter if it was their last
// domain. It reports whether it did.
func (e *Engine) maybeReclaimDomainLocked(d *domain) bool {
	if d.dead {
		return false
	}
	if p := d.schemes.Load(); p != nil && len(*p) > 0 {
		return false
	}
	for _, r := range d.replicaSlots() {
		if r != nil {
			return false
		}
	}
	if d.keys.Load() != 0 {
		panic("BUG: a domain without schemes counts keys")
	}
	d.dead = true
	e.domains.Delete(domainKey{d.tenant, d.model})
	ts := d.ts
	ts.models = slices.DeleteFunc(ts.models, func(x *domain) bool { return x == d })
	if len(ts.models) == 0 {
		ts.models = nil
		e.tenants.Delete(ts.id)
		e.discardCapQueueLocked(ts)
	}
	if d.mc.domains--; d.mc.domains == 0 {
		delete(e.modelKeys, d.mc.model)
	}
	return true
}
