package engine

import "testing"

// checkInvariants recounts the index from its nodes and compares every
// maintained counter with the recount.
func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	var entries, reserved, keys int64
	tenantKeys := map[string]int64{}
	modelKeys := map[string]int64{}
	for _, sc := range e.scopes[1:] {
		d := sc.d
		var scopeKeys int
		e.forEachNodeLocked(sc, func(off uint32) {
			scopeKeys++
			meta := e.w(off + nMeta)
			if meta&metaLive == 0 || e.w(off+nScope) != sc.id {
				t.Fatalf("table of scope %d indexes a dead or foreign node %d", sc.id, off)
			}
			n := int64(metaCount(meta))
			if n == 0 {
				t.Fatalf("live node %d without holders", off)
			}
			block := e.w(off + nHolders)
			prev := -1
			for i := uint32(0); i < metaCount(meta); i++ {
				rid := int(uint16(e.w(holderAt(block, i) + hRidTier)))
				if rid <= prev {
					t.Fatalf("holders of node %d not sorted", off)
				}
				prev = rid
				if d.replicaSlots()[rid] == nil {
					t.Fatalf("holder references freed replica id %d", rid)
				}
			}
			if d.reserved {
				reserved += n
			} else {
				entries += n
				keys++
				modelKeys[d.model]++
			}
			tenantKeys[d.tenant]++
		})
		if got := sc.table.Load().used; got != scopeKeys {
			t.Fatalf("scope %d table used=%d, holds %d", sc.id, got, scopeKeys)
		}
	}
	if e.totalEntries.Load() != entries || e.reservedEntries.Load() != reserved || e.totalKeys.Load() != keys {
		t.Fatalf("counters entries=%d reserved=%d keys=%d, recount %d %d %d",
			e.totalEntries.Load(), e.reservedEntries.Load(), e.totalKeys.Load(), entries, reserved, keys)
	}
	e.tenants.Range(func(id string, ts *tenantState) bool {
		if ts.keys.Load() != tenantKeys[id] {
			t.Fatalf("tenant %q keys=%d, recount %d", id, ts.keys.Load(), tenantKeys[id])
		}
		return true
	})
	for m, n := range e.modelKeys {
		if n.n != modelKeys[m] {
			t.Fatalf("model %q keys=%d, recount %d", m, n.n, modelKeys[m])
		}
	}
	// Per-replica key counts and serving sets.
	e.domains.Range(func(_ domainKey, d *domain) bool {
		counts := map[uint16]int64{}
		perScheme := map[string]map[uint16]bool{}
		for _, sc := range e.scopesOf(d) {
			if perScheme[sc.sch.name] == nil {
				perScheme[sc.sch.name] = map[uint16]bool{}
			}
			e.forEachNodeLocked(sc, func(off uint32) {
				meta := e.w(off + nMeta)
				block := e.w(off + nHolders)
				for i := uint32(0); i < metaCount(meta); i++ {
					rid := uint16(e.w(holderAt(block, i) + hRidTier))
					counts[rid]++
					perScheme[sc.sch.name][rid] = true
				}
			})
		}
		for _, r := range d.replicaSlots() {
			if r != nil && r.keys.Load() != counts[r.id] {
				t.Fatalf("replica %q keys=%d, recount %d", r.name, r.keys.Load(), counts[r.id])
			}
		}
		if p := d.schemes.Load(); p != nil {
			for _, s := range *p {
				ss := s.serving.Load()
				if len(ss.ids) != len(perScheme[s.name]) {
					t.Fatalf("scheme %q serving %v, recount %v", s.name, ss.ids, perScheme[s.name])
				}
				for _, id := range ss.ids {
					if !perScheme[s.name][id] {
						t.Fatalf("scheme %q serving lists %d", s.name, id)
					}
				}
			}
		}
		return true
	})
}

func TestInvariantsEmpty(t *testing.T) { checkInvariants(t, New(Config{})) }
