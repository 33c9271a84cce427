package engine

// sweepChunk is how many table slots the sweep examines per lock hold, so a
// sweep over millions of keys never stalls ingest for long.
const sweepChunk = 4096

// Sweep runs the TTL sweep (contract §3.2): it removes every storage entry
// whose age (now - lastSeen) reached its tenant's TTL and drops stats whose
// liveness did. Lookups already ignore such entries; the sweep reclaims
// them. It holds the writer lock for at most sweepChunk table slots at a
// time and returns the number of entries removed.
func (e *Engine) Sweep(now int64) int {
	removed := 0
	for id, pos := 1, 0; ; {
		snap := e.lockWriter()
		if id >= len(e.scopes) {
			e.unlockAndReport()
			break
		}
		sc := e.scopes[id]
		pt := snap.Tenant(sc.d.tenant)
		ttl := pt.TTL.Microseconds()
		t := sc.table.Load()
		end := min(pos+sweepChunk, len(t.slots))
		var stale []uint32
		for i := pos; i < end; i++ {
			s := t.slots[i].Load()
			if s == 0 || s == slotTomb {
				continue
			}
			off := uint32(s)
			meta := e.w(off + nMeta)
			block := e.w(off + nHolders)
			for j := uint32(0); j < metaCount(meta); j++ {
				if now-e.holderTs(holderAt(block, j)) >= ttl {
					stale = append(stale, off)
					break
				}
			}
		}
		for _, off := range stale {
			// Remove from the highest index down so indices stay valid; the
			// node may be freed when its last holder goes.
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
		if end >= len(t.slots) {
			id, pos = id+1, 0
		} else {
			pos = end
		}
		e.unlockAndReport()
	}
	e.sweepStats(now)
	return removed
}

// sweepStats drops stats payloads whose liveness is older than the TTL.
func (e *Engine) sweepStats(now int64) {
	snap := e.lockWriter()
	defer e.unlockAndReport()
	e.domains.Range(func(_ domainKey, d *domain) bool {
		ttl := snap.Tenant(d.tenant).TTL.Microseconds()
		for _, r := range d.replicaSlots() {
			if r == nil || r.stats.Load() == nil {
				continue
			}
			if now-r.liveness.Load() >= ttl {
				r.stats.Store(nil)
				r.load.report.Store(nil)
				e.maybeFreeReplicaLocked(d, r, now)
			}
		}
		return true
	})
}
