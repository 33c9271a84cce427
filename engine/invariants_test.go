package engine

import (
	"slices"
	"testing"
)

// checkInvariants recounts the index from its nodes and compares every
// maintained counter with the recount, and checks the structure.
func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	checkStructure(t, e)
	e.mu.Lock()
	defer e.mu.Unlock()
	var entries, reserved, keys int64
	tenantKeys, tenantEntries := map[string]int64{}, map[string]int64{}
	modelKeys := map[string]int64{}
	for _, sc := range e.scopes[1:] {
		if sc == nil {
			continue
		}
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
				tenantEntries[d.tenant] += n
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
	checkCapState(t, e, tenantEntries)
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

// checkStructure checks that the Go-side structures link up: every live
// scope sits in its slot, its scheme and domain list it, its domain is the
// one the domain map holds; every domain is listed by its tenant state and
// counted by its model counter; no structure reachable from the maps is
// dead; released scope slots are empty; scheme indexes are distinct.
func checkStructure(t *testing.T, e *Engine) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, sc := range e.scopes {
		if sc == nil {
			continue
		}
		if i == 0 || scopeSlot(sc.id) != uint32(i) || sc.dead || sc.d.dead {
			t.Fatalf("slot %d holds scope id %#x (dead %v, domain dead %v)", i, sc.id, sc.dead, sc.d.dead)
		}
		if sc.sch.findScope(sc.adapter) != sc || sc.d.findScheme(sc.sch.name) != sc.sch {
			t.Fatalf("scope %#x is not linked from its scheme and domain", sc.id)
		}
		if d, _ := e.domains.Load(domainKey{sc.d.tenant, sc.d.model}); d != sc.d {
			t.Fatalf("scope %#x belongs to a domain the map does not hold", sc.id)
		}
	}
	for _, f := range e.freeSlots {
		if e.scopes[f.slot] != nil {
			t.Fatalf("released slot %d holds a scope", f.slot)
		}
	}
	perModel := map[string]int{}
	e.domains.Range(func(k domainKey, d *domain) bool {
		if d.dead || d.tenant != k.tenant || d.model != k.model {
			t.Fatalf("domain map holds %v at %v (dead %v)", d.tenant+"/"+d.model, k, d.dead)
		}
		if ts, _ := e.tenants.Load(d.tenant); ts != d.ts || !slices.Contains(ts.models, d) {
			t.Fatalf("domain %v is not listed by its tenant state", k)
		}
		if e.modelKeys[d.model] != d.mc {
			t.Fatalf("domain %v has a model counter the engine does not hold", k)
		}
		perModel[d.model]++
		indexes := map[int]bool{}
		for _, sc := range e.scopesOf(d) {
			if e.scopes[scopeSlot(sc.id)] != sc {
				t.Fatalf("domain %v lists scope %#x that is not in its slot", k, sc.id)
			}
		}
		if p := d.schemes.Load(); p != nil {
			for _, s := range *p {
				if indexes[s.index] {
					t.Fatalf("domain %v: two schemes share index %d", k, s.index)
				}
				indexes[s.index] = true
			}
		}
		return true
	})
	e.tenants.Range(func(id string, ts *tenantState) bool {
		if len(ts.models) == 0 {
			t.Fatalf("tenant state %q without domains", id)
		}
		return true
	})
	for m, mc := range e.modelKeys {
		if mc.domains != perModel[m] || mc.domains == 0 {
			t.Fatalf("model %q counts %d domains, the map holds %d", m, mc.domains, perModel[m])
		}
	}
}

func TestInvariantsEmpty(t *testing.T) { checkInvariants(t, New(Config{})) }

// checkCapState checks the cap eviction bookkeeping (under e.mu): each
// tenant's entry count and the active tenant count against the recount,
// the two tenant heaps (order, positions, membership: exactly the tenants
// whose cap queue holds buckets, each in one of them) and the shared queue
// totals. Whether a spared tenant is at or under its share is checked only
// when a victim is chosen (sparing is lazy), so it is not checked here.
func checkCapState(t *testing.T, e *Engine, tenantEntries map[string]int64) {
	t.Helper()
	active := 0
	var acct queueAcct
	e.tenants.Range(func(id string, ts *tenantState) bool {
		if ts.entries != tenantEntries[id] {
			t.Fatalf("tenant %q entries=%d, recount %d", id, ts.entries, tenantEntries[id])
		}
		if ts.entries > 0 {
			active++
		}
		acct.records += ts.capq.records
		acct.recCap += ts.capq.recCap
		acct.buckets += len(ts.capq.byKey)
		inHeap := ts.hidx >= 0 && ts.hidx < len(e.capHeap) && e.capHeap[ts.hidx] == ts
		inSpared := ts.sidx >= 0 && ts.sidx < len(e.spared) && e.spared[ts.sidx] == ts
		if (ts.hidx >= 0) != inHeap || (ts.sidx >= 0) != inSpared {
			t.Fatalf("tenant %q heap positions %d/%d do not match the heaps", id, ts.hidx, ts.sidx)
		}
		has := ts.capq.min() != nil
		if has != (inHeap || inSpared) || (inHeap && inSpared) {
			t.Fatalf("tenant %q: queue holds buckets %v, in capHeap %v, spared %v", id, has, inHeap, inSpared)
		}
		if !e.capOn && (ts.capq.records != 0 || has) {
			t.Fatalf("tenant %q has cap records before the queue is kept", id)
		}
		return true
	})
	if active != e.activeTenants {
		t.Fatalf("active tenants %d, recount %d", e.activeTenants, active)
	}
	if acct != e.capAcct {
		t.Fatalf("cap queue totals %+v, the tenants' queues sum to %+v", e.capAcct, acct)
	}
	if n := len(e.capHeap) + len(e.spared); n > 0 && !e.capOn {
		t.Fatalf("%d tenants in the cap heaps before the queue is kept", n)
	}
	for i := 1; i < len(e.capHeap); i++ {
		if capBefore(e.capHeap[i], e.capHeap[(i-1)/2]) {
			t.Fatalf("capHeap out of order at %d", i)
		}
	}
	for i := 1; i < len(e.spared); i++ {
		if sparedBefore(e.spared[i], e.spared[(i-1)/2]) {
			t.Fatalf("spared heap out of order at %d", i)
		}
	}
}
