package engine

import "github.com/inferencecache/inferencecache/policy"

// sweepChunk is how many table slots the sweep examines per lock hold, so a
// sweep over millions of keys never stalls ingest for long.
const sweepChunk = 4096

// sweepHook, when a test sets it, runs between two lock holds of Sweep,
// standing in for the writes that may land there.
var sweepHook func()

// Sweep runs the TTL sweep (contract §3.2): it removes every storage entry
// whose age (now - lastSeen) reached its tenant's TTL and drops stats whose
// liveness did. Lookups already ignore such entries; the sweep reclaims
// them. It holds the writer lock for about sweepChunk table slots at a time
// and returns the number of entries removed.
//
// One sweep removes every entry that was in the index when it started and
// has age >= TTL at now (unless a write refreshed it meanwhile). Between two
// lock holds the writer may rebuild a scope's table (grow it on ingest,
// shrink it after the sweep's own deletes), which moves keys to other
// slots; a cursor into "the current table" would then skip keys. So each
// scope is swept over the table it had when the sweep reached it: once
// replaced, a table is never written again, and while it is current a
// live key never leaves its slot, so every key that was live when the
// sweep reached the scope and still is sits in that table. A slot may by
// now name a freed or reused node; each is checked under the lock.
func (e *Engine) Sweep(now int64) int {
	removed := 0
	var (
		sc   *scope
		t    *table // the table sc had when the sweep reached it
		pos  int    // next slot of t
		next = 1    // next scope slot to visit
	)
	for done := false; !done; {
		snap := e.lockWriter()
		e.changeReason = ReasonTTL
		for budget := sweepChunk; budget > 0; {
			if sc != nil && sc.dead { // reclaimed by a concurrent Sweep
				sc, t = nil, nil
			}
			if sc == nil {
				if next >= len(e.scopes) {
					done = true
					break
				}
				sc = e.scopes[next]
				next++
				if sc == nil {
					budget--
					continue
				}
				t, pos = sc.table.Load(), 0
			}
			end := min(pos+budget, len(t.slots))
			removed += e.sweepSlotsLocked(snap, sc, t, pos, end, now)
			budget -= end - pos
			if pos = end; pos == len(t.slots) {
				if sc.table.Load().used == 0 {
					e.reclaimScopeLocked(sc, now)
				}
				sc, t = nil, nil
			}
		}
		e.changeReason = ""
		e.unlockAndReport()
		if sweepHook != nil && !done {
			sweepHook()
		}
	}
	e.sweepStats(now)
	return removed
}

// sweepSlotsLocked removes the expired holders of the nodes named by slots
// [from, to) of t, a table scope sc has or had, and returns how many it
// removed.
func (e *Engine) sweepSlotsLocked(snap *policy.Snapshot, sc *scope, t *table, from, to int, now int64) int {
	pt := snap.Tenant(sc.d.tenant)
	ttl := pt.TTL.Microseconds()
	removed := 0
	for i := from; i < to; i++ {
		s := t.slots[i].Load()
		if s == 0 || s == slotTomb {
			continue
		}
		off := uint32(s)
		// In a replaced table the node may since have been freed, or
		// reused for another key of this or another scope.
		if e.w(off+nMeta)&metaLive == 0 || e.w(off+nScope) != sc.id {
			continue
		}
		// From the highest index down, so indices stay valid; the node is
		// freed with its last holder.
		for j := int(metaCount(e.w(off+nMeta))) - 1; j >= 0; j-- {
			meta := e.w(off + nMeta)
			if meta&metaLive == 0 || uint32(j) >= metaCount(meta) {
				break
			}
			if now-e.holderTs(holderAt(e.w(off+nHolders), uint32(j))) >= ttl {
				e.removeHolderLocked(sc, off, uint32(j), now)
				removed++
				if !sc.d.reserved {
					e.pending.addIndex(pt.Eviction, reasonTTL, 1)
				}
			}
		}
	}
	return removed
}

// sweepStats drops stats payloads whose liveness is older than the TTL,
// releases the replica ids left with neither keys nor stats, and reclaims
// the domains left with nothing. It visits the domains that existed when it
// started, about sweepChunk replicas per lock hold (a domain is never
// split: at most MaxReplicasPerModel replicas).
func (e *Engine) sweepStats(now int64) {
	var domains []*domain
	e.domains.Range(func(_ domainKey, d *domain) bool {
		domains = append(domains, d)
		return true
	})
	var freed []*replica
	for i := 0; i < len(domains); {
		snap := e.lockWriter()
		e.changeReason = ReasonExpired
		for budget := sweepChunk; budget > 0 && i < len(domains); i++ {
			d := domains[i]
			if d.dead { // reclaimed by a concurrent Sweep
				continue
			}
			slots := d.replicaSlots()
			budget -= 1 + len(slots)
			ttl := snap.Tenant(d.tenant).TTL.Microseconds()
			freed = freed[:0]
			for _, r := range slots {
				if r == nil || r.stats.Load() == nil {
					continue
				}
				if now-r.liveness.Load() >= ttl {
					r.stats.Store(nil)
					r.load.report.Store(nil)
					freed = append(freed, r)
				}
			}
			e.freeReplicasLocked(d, freed, now)
			e.maybeReclaimDomainLocked(d)
		}
		e.changeReason = ""
		e.unlockAndReport()
		if sweepHook != nil && i < len(domains) {
			sweepHook()
		}
	}
	clear(freed)
}
