package engine

import (
	"github.com/inferencecache/inferencecache/policy"
)

// Quota eviction (contract §5.2, Fairness): when a tenant holds more
// distinct keys than its CacheTenant budget, whole keys go, oldest first by
// the newest lastSeen among the key's holders, ties broken by (model,
// scheme, adapter, hash). A quota queue exists only for tenants that have a
// quota. Each key is filed in a bucket keyed by its newest lastSeen whenever
// that value changes; a record is current while the node is live, not
// reused, and its newest lastSeen still equals the bucket key.

type quotaQueue struct {
	tenant string
	bucketQueue[int64]
}

func quotaRec(gen, off uint32) uint64 { return uint64(gen)<<32 | uint64(off) }

func (q *quotaQueue) push(e *Engine, off uint32, maxTs int64) {
	q.bucketQueue.push(maxTs, quotaRec(e.w(off+nGen), off))
	if q.records > 2*int(e.tenantKeys(q.tenant))+1024 {
		q.compact(func(k int64, rec uint64) bool {
			_, ok := e.quotaRecState(rec, k)
			return ok
		})
	}
}

func (e *Engine) tenantKeys(tenant string) int64 {
	if t, ok := e.tenants.Load(tenant); ok {
		return t.keys.Load()
	}
	return 0
}

// quotaRecState validates a quota record for bucket key maxTs.
func (e *Engine) quotaRecState(rec uint64, maxTs int64) (sc *scope, ok bool) {
	gen, off := uint32(rec>>32), uint32(rec)
	meta := e.w(off + nMeta)
	if meta&metaLive == 0 || e.w(off+nGen) != gen || e.nodeMaxTsLocked(off) != maxTs {
		return nil, false
	}
	return e.scopeByID(e.w(off + nScope)), true
}

// buildQuotaLocked creates the quota queue of a tenant from its current keys.
func (e *Engine) buildQuotaLocked(tenant string) *quotaQueue {
	q := &quotaQueue{tenant: tenant}
	q.init(func(a, b int64) bool { return a < b }, nil)
	if t, ok := e.tenants.Load(tenant); ok {
		for _, d := range t.models {
			for _, sc := range e.scopesOf(d) {
				e.forEachNodeLocked(sc, func(off uint32) {
					q.bucketQueue.push(e.nodeMaxTsLocked(off), quotaRec(e.w(off+nGen), off))
				})
			}
		}
	}
	return q
}

// scopesOf lists a domain's scopes.
func (e *Engine) scopesOf(d *domain) []*scope {
	var out []*scope
	if p := d.schemes.Load(); p != nil {
		for _, s := range *p {
			if sp := s.scopes.Load(); sp != nil {
				out = append(out, *sp...)
			}
		}
	}
	return out
}

// enforceQuotaLocked evicts a tenant's oldest keys until it is within budget.
func (e *Engine) enforceQuotaLocked(snap *policy.Snapshot, tenant string, now int64) {
	pt := snap.Tenant(tenant)
	q := e.quotas[tenant]
	if !pt.HasQuota || q == nil {
		return
	}
	evicted := 0
	for e.tenantKeys(tenant) > pt.MaxIndexEntries {
		b := q.min()
		if b == nil {
			break
		}
		if !b.sorted {
			e.prepareQuotaBucketLocked(q, b)
		}
		if b.head == len(b.recs) {
			q.drop(b)
			continue
		}
		r := b.recs[b.head]
		b.head++
		q.count(-1, 0, 0)
		sc, ok := e.quotaRecState(r, b.key)
		if !ok {
			continue
		}
		e.removeKeyLocked(sc, uint32(r), now)
		evicted++
	}
	if evicted > 0 {
		e.pending.addTenant(tenant, evicted)
	}
}

// prepareQuotaBucketLocked drops stale records of b and sorts the rest by key.
func (e *Engine) prepareQuotaBucketLocked(q *quotaQueue, b *bucket[int64]) {
	recs, hb := e.sortScratch[:0], e.sortHashes[:0]
	for _, r := range b.recs[b.head:] {
		sc, ok := e.quotaRecState(r, b.key)
		if !ok {
			continue
		}
		var h []byte
		h, hb = e.sortHash(hb, uint32(r))
		recs = append(recs, sortRec{rec: r, sc: sc, hk: hashKey(h), hash: h})
	}
	sortRecs(recs, false)
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

// removeKeyLocked removes every holder of node off.
func (e *Engine) removeKeyLocked(sc *scope, off uint32, now int64) {
	for {
		meta := e.w(off + nMeta)
		if meta&metaLive == 0 || metaCount(meta) == 0 {
			return
		}
		count := metaCount(meta)
		e.removeHolderLocked(sc, off, count-1, now)
		if count == 1 {
			return
		}
	}
}

// syncPolicyLocked adopts the policy snapshot a write runs under: quota
// queues appear and disappear with quotas, tenants' LFU flags follow their
// policy, and the cap queue is refiled when a tenant left LFU (which lowers
// its entries' eviction keys).
func (e *Engine) syncPolicyLocked(snap *policy.Snapshot) {
	if snap == e.snap {
		return
	}
	e.snap = snap
	want := map[string]bool{}
	for _, id := range snap.QuotaTenants() {
		want[id] = true
		if e.quotas[id] == nil {
			e.quotas[id] = e.buildQuotaLocked(id)
		}
	}
	for id := range e.quotas {
		if !want[id] {
			delete(e.quotas, id)
		}
	}
	lost := false
	e.tenants.Range(func(id string, t *tenantState) bool {
		lfu := snap.Tenant(id).Eviction == policy.LFU
		if t.lfu && !lfu {
			lost = true
		}
		t.lfu = lfu
		t.quota = e.quotas[id]
		return true
	})
	if lost && e.capOn {
		e.rebuildCapLocked()
	}
}
