package engine

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"math"
	"slices"
	"sort"
	"sync"

	"github.com/inferencecache/inferencecache/policy"
)

// refModel is the reference model of the index: plain maps under one mutex,
// written to read like the contract rather than to be fast. The randomized
// test runs the same operations against it and the engine and requires
// identical results.
type refModel struct {
	mu         sync.Mutex
	policies   Policies
	ranker     RankerConfig
	maxEntries int64
	prefixes   map[refKey]map[string]*refEntry
	stats      map[refStatsKey]*refStats
	// Secondary indexes, kept in step by put and remove, as the seed system
	// kept them (servingByScope, prefixesByTenant, prefixesByTenantModel).
	serving     map[[3]string]map[string]int
	tenantKeys  map[string]int
	modelKeys   map[[2]string]int
	visibleKeys int               // keys outside the reserved tenant
	evictions   map[[2]string]int // (algorithm, reason) -> n
	tenantEv    map[string]int
}

type refKey struct{ tenant, model, scheme, adapter, hash string }

type refEntry struct {
	tokens int32
	ts     int64
	tier   Tier
	lfu    uint32
}

type refStatsKey struct{ tenant, model, replica string }

type refStats struct {
	st                 ReplicaStats
	reported, liveness int64
}

func newRef(p Policies, maxEntries int64) *refModel {
	return &refModel{
		policies: p, ranker: DefaultRanker(), maxEntries: maxEntries,
		prefixes: map[refKey]map[string]*refEntry{}, stats: map[refStatsKey]*refStats{},
		serving: map[[3]string]map[string]int{}, tenantKeys: map[string]int{}, modelKeys: map[[2]string]int{},
		evictions: map[[2]string]int{}, tenantEv: map[string]int{},
	}
}

func validHash(h []byte) bool { return len(h) > 0 && len(h) <= MaxHashBytes }

func (m *refModel) put(k refKey, replica string, tokens int32, tier Tier, ts int64) {
	holders := m.prefixes[k]
	if holders == nil {
		holders = map[string]*refEntry{}
		m.prefixes[k] = holders
		m.countKey(k, 1)
	}
	if e := holders[replica]; e != nil {
		e.tokens, e.tier, e.ts = tokens, tier, ts
		return
	}
	holders[replica] = &refEntry{tokens: tokens, tier: tier, ts: ts}
	sk := [3]string{k.tenant, k.model, k.scheme}
	if m.serving[sk] == nil {
		m.serving[sk] = map[string]int{}
	}
	m.serving[sk][replica]++
}

func (m *refModel) remove(k refKey, replica string) {
	if _, ok := m.prefixes[k][replica]; !ok {
		return
	}
	delete(m.prefixes[k], replica)
	sk := [3]string{k.tenant, k.model, k.scheme}
	if m.serving[sk][replica]--; m.serving[sk][replica] == 0 {
		delete(m.serving[sk], replica)
	}
	if len(m.prefixes[k]) == 0 {
		delete(m.prefixes, k)
		m.countKey(k, -1)
	}
}

func (m *refModel) countKey(k refKey, d int) {
	m.tenantKeys[k.tenant] += d
	m.modelKeys[[2]string{k.tenant, k.model}] += d
	if k.tenant != policy.ReservedTenantID {
		m.visibleKeys += d
	}
}

func (m *refModel) Ingest(u *Update, now int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	snap := m.policies.Load()
	ts := u.TimestampUs
	if ts == 0 {
		ts = now
	}
	if u.ReplicaID != "" && u.HashScheme != "" {
		for _, p := range u.Prefixes {
			adapter := p.AdapterID
			if adapter == "" {
				adapter = u.AdapterID
			}
			tier := TierFromWire(p.Tier)
			key := func(h []byte) refKey { return refKey{u.TenantID, u.ModelID, u.HashScheme, adapter, string(h)} }
			if len(p.BlockHashes) > 0 || len(p.BlockTokenCounts) > 0 {
				if len(p.BlockHashes) != len(p.BlockTokenCounts) || !allValid(p.BlockHashes) {
					continue
				}
				var cum int64
				for j, h := range p.BlockHashes {
					cum += int64(p.BlockTokenCounts[j])
					m.put(key(h), u.ReplicaID, clampInt32(cum), tier, ts)
				}
				if len(p.PrefixHash) > 0 && validHash(p.PrefixHash) {
					m.put(key(p.PrefixHash), u.ReplicaID, p.TokenCount, tier, ts)
				}
				continue
			}
			if validHash(p.PrefixHash) {
				m.put(key(p.PrefixHash), u.ReplicaID, p.TokenCount, tier, ts)
			}
		}
	}
	if u.Stats != nil && u.ReplicaID != "" {
		st := *u.Stats
		st.HitRate, st.Pressure = clampRate(st.HitRate), clampRate(st.Pressure)
		m.stats[refStatsKey{u.TenantID, u.ModelID, u.ReplicaID}] = &refStats{st: st, reported: ts, liveness: ts}
	}
	m.enforceQuota(snap, u.TenantID)
	m.enforceCap(snap)
}

func allValid(hs [][]byte) bool {
	for _, h := range hs {
		if !validHash(h) {
			return false
		}
	}
	return true
}

func (m *refModel) enforceQuota(snap *policy.Snapshot, tenant string) {
	pt := snap.Tenant(tenant)
	if !pt.HasQuota {
		return
	}
	type cand struct {
		k     refKey
		newer int64
	}
	var all []cand
	for k, holders := range m.prefixes {
		if k.tenant != tenant {
			continue
		}
		newest := int64(math.MinInt64)
		for _, e := range holders {
			newest = max(newest, e.ts)
		}
		all = append(all, cand{k, newest})
	}
	if int64(len(all)) <= pt.MaxIndexEntries {
		return
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i], all[j]
		if a.newer != b.newer {
			return a.newer < b.newer
		}
		return cmp.Or(cmp.Compare(a.k.model, b.k.model), cmp.Compare(a.k.scheme, b.k.scheme),
			cmp.Compare(a.k.adapter, b.k.adapter), cmp.Compare(a.k.hash, b.k.hash)) < 0
	})
	excess := int64(len(all)) - pt.MaxIndexEntries
	for _, c := range all[:excess] {
		for r := range m.prefixes[c.k] {
			m.remove(c.k, r)
		}
	}
	m.tenantEv[tenant] += int(excess)
}

func (m *refModel) entries() (n int64) {
	for k, holders := range m.prefixes {
		if k.tenant != policy.ReservedTenantID {
			n += int64(len(holders))
		}
	}
	return n
}

// enforceCap evicts until the entries are within the cap, one entry at a
// time: the first, in the contract's order (effective count, lastSeen,
// key, replica), among the entries of the tenants over their fair share,
// those holding more than maxEntries / active tenants (engine/README.md).
func (m *refModel) enforceCap(snap *policy.Snapshot) {
	if m.maxEntries <= 0 {
		return
	}
	type cand struct {
		k       refKey
		replica string
		count   uint32
		ts      int64
	}
	for m.entries() > m.maxEntries {
		perTenant := map[string]int64{}
		for k, holders := range m.prefixes {
			if k.tenant != policy.ReservedTenantID {
				perTenant[k.tenant] += int64(len(holders))
			}
		}
		active := int64(len(perTenant))
		var all []cand
		for k, holders := range m.prefixes {
			if k.tenant == policy.ReservedTenantID || perTenant[k.tenant]*active <= m.maxEntries {
				continue
			}
			lfu := snap.Tenant(k.tenant).Eviction == policy.LFU
			for r, e := range holders {
				c := cand{k: k, replica: r, ts: e.ts}
				if lfu {
					c.count = e.lfu
				}
				all = append(all, c)
			}
		}
		c := slices.MinFunc(all, func(a, b cand) int {
			return cmp.Or(cmp.Compare(a.count, b.count), cmp.Compare(a.ts, b.ts),
				cmp.Compare(a.k.tenant, b.k.tenant), cmp.Compare(a.k.model, b.k.model),
				cmp.Compare(a.k.scheme, b.k.scheme), cmp.Compare(a.k.adapter, b.k.adapter),
				cmp.Compare(a.k.hash, b.k.hash), cmp.Compare(a.replica, b.replica))
		})
		m.remove(c.k, c.replica)
		m.evictions[[2]string{snap.Tenant(c.k.tenant).Eviction.String(), "cap"}]++
	}
}

func (m *refModel) ApplyEvent(ev *Event, now int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ts := ev.TimestampUs
	if ts == 0 {
		ts = now
	}
	switch ev.Type {
	case EventReplicaUpdated:
		if s := m.stats[refStatsKey{ev.TenantID, ev.ModelID, ev.ReplicaID}]; s != nil {
			s.liveness = ts
		}
	case EventPrefixEvicted:
		for k := range m.prefixes {
			if k.tenant == ev.TenantID && k.model == ev.ModelID && k.hash == string(ev.PrefixHash) &&
				(ev.AdapterID == "" || k.adapter == ev.AdapterID) {
				m.remove(k, ev.ReplicaID)
			}
		}
	case EventAllCleared:
		for k := range m.prefixes {
			if k.tenant == ev.TenantID && k.model == ev.ModelID {
				m.remove(k, ev.ReplicaID)
			}
		}
		delete(m.stats, refStatsKey{ev.TenantID, ev.ModelID, ev.ReplicaID})
	}
}

func (m *refModel) Sweep(now int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	snap := m.policies.Load()
	for k, holders := range m.prefixes {
		pt := snap.Tenant(k.tenant)
		for r, e := range holders {
			if now-e.ts >= pt.TTL.Microseconds() {
				m.remove(k, r)
				if k.tenant != policy.ReservedTenantID {
					m.evictions[[2]string{pt.Eviction.String(), "ttl"}]++
				}
			}
		}
	}
	for k, s := range m.stats {
		if now-s.liveness >= snap.Tenant(k.tenant).TTL.Microseconds() {
			delete(m.stats, k)
		}
	}
}

// liveStructures names what the engine must keep after a sweep: a domain
// per (tenant, model) with a key or stats, a scope per (tenant, model,
// scheme, adapter) with a key, and the tenants and models of those domains.
// (Reclamation changes no answer; this is the one place it is observable.)
func (m *refModel) liveStructures() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]bool{}
	domain := func(tenant, model string) {
		out["domain "+tenant+"/"+model] = true
		out["tenant "+tenant] = true
		out["model "+model] = true
	}
	for k := range m.prefixes {
		domain(k.tenant, k.model)
		out["scope "+k.tenant+"/"+k.model+"/"+k.scheme+"/"+k.adapter] = true
	}
	for k := range m.stats {
		domain(k.tenant, k.model)
	}
	return out
}

// servingSet is servingByScope: replicas holding a key in (tenant, model,
// scheme), sorted.
func (m *refModel) servingSet(tenant, model, scheme string) []string {
	var out []string
	for r := range m.serving[[3]string{tenant, model, scheme}] {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

type refScore struct {
	replica string
	score   float64
	matched int32
	prob    float64
	tier    Tier
	// blocks is the matched run (chain) or -1 (exact); for Credit.
	blocks int
}

type refResult struct {
	strategy Strategy
	scores   []refScore
	lfu      bool
}

func refFresh(now, ts, ttl int64) float64 {
	if ttl <= 0 {
		return 0
	}
	age := now - ts
	if age <= 0 {
		return 1
	}
	if age >= ttl {
		return 0
	}
	return 1 - float64(age)/float64(ttl)
}

func (m *refModel) pressure(tenant, model, replica string, ttl, now int64) float64 {
	p := 0.0
	if s := m.stats[refStatsKey{tenant, model, replica}]; s != nil && refFresh(now, s.reported, ttl) > 0 {
		p = float64(s.st.Pressure)
	}
	return math.Max(0, math.Min(1, 1-m.ranker.PressureWeight*p))
}

func (m *refModel) slo(ttft int32) float64 {
	if m.ranker.SLOTightTTFTMs > 0 && m.ranker.SLOTightBias > 0 && ttft > 0 && ttft < m.ranker.SLOTightTTFTMs {
		return m.ranker.SLOTightBias
	}
	return 0
}

func refDP(matching, total int) float64 {
	if total <= 1 || matching < 0 {
		return 1
	}
	if matching >= total {
		return 0
	}
	return 1 - float64(matching)/float64(total)
}

func (m *refModel) LookupRoute(req *LookupRequest, now int64) refResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	if req.TenantID == "" || req.ModelID == "" || req.HashScheme == "" {
		return refResult{}
	}
	chain := len(req.BlockHashes) > 0 || len(req.BlockTokenCounts) > 0
	if chain && len(req.BlockHashes) != len(req.BlockTokenCounts) {
		return refResult{}
	}
	pt := m.policies.Load().Tenant(req.TenantID)
	ttl := pt.TTL.Microseconds()
	res := refResult{lfu: pt.Eviction == policy.LFU}
	key := func(h []byte) refKey {
		return refKey{req.TenantID, req.ModelID, req.HashScheme, req.AdapterID, string(h)}
	}
	total := len(m.serving[[3]string{req.TenantID, req.ModelID, req.HashScheme}])
	coef := m.slo(req.SLOTTFTMs)
	if chain {
		type run struct {
			matched int64
			oldest  int64
			tier    Tier
			blocks  int
		}
		current := map[string]*run{}
		var done []struct {
			id string
			r  *run
		}
		for i, h := range req.BlockHashes {
			holders := m.prefixes[key(h)]
			if !validHash(h) {
				holders = nil
			}
			if i == 0 {
				for id, e := range holders {
					if refFresh(now, e.ts, ttl) > 0 {
						current[id] = &run{matched: int64(req.BlockTokenCounts[0]), oldest: e.ts, tier: e.tier, blocks: 1}
					}
				}
			} else {
				for id, r := range current {
					e := holders[id]
					if e == nil || refFresh(now, e.ts, ttl) <= 0 {
						done = append(done, struct {
							id string
							r  *run
						}{id, r})
						delete(current, id)
						continue
					}
					r.matched += int64(req.BlockTokenCounts[i])
					r.oldest = min(r.oldest, e.ts)
					r.tier = max(r.tier, e.tier)
					r.blocks++
				}
			}
			if len(current) == 0 {
				break
			}
		}
		for id, r := range current {
			done = append(done, struct {
				id string
				r  *run
			}{id, r})
		}
		for _, d := range done {
			if d.r.matched <= 0 {
				continue
			}
			f := refFresh(now, d.r.oldest, ttl)
			if f <= 0 {
				continue
			}
			raw := float64(d.r.matched) * f * m.pressure(req.TenantID, req.ModelID, d.id, ttl, now) * (1 + f*coef)
			res.scores = append(res.scores, refScore{replica: d.id, score: raw, matched: clampInt32(d.r.matched), prob: f, tier: d.r.tier, blocks: d.r.blocks})
		}
		for i := range res.scores {
			matching := 0
			for _, o := range res.scores {
				if o.matched >= res.scores[i].matched {
					matching++
				}
			}
			res.scores[i].score *= refDP(matching, total)
		}
	} else {
		holders := m.prefixes[key(req.PrefixHash)]
		if !validHash(req.PrefixHash) {
			holders = nil
		}
		for id, e := range holders {
			f := refFresh(now, e.ts, ttl)
			if f <= 0 {
				continue
			}
			raw := float64(e.tokens) * f * m.pressure(req.TenantID, req.ModelID, id, ttl, now) * (1 + f*coef)
			res.scores = append(res.scores, refScore{replica: id, score: raw, matched: e.tokens, prob: f, tier: e.tier, blocks: -1})
		}
		for i := range res.scores {
			res.scores[i].score *= refDP(len(res.scores), total)
		}
	}
	if len(res.scores) > 0 {
		res.strategy = StrategyPrefixMatch
		refSort(res.scores)
		return res
	}
	if !chain && m.ranker.TenantHotMaxAge > 0 {
		maxAge := m.ranker.TenantHotMaxAge.Microseconds()
		serving := m.serving[[3]string{req.TenantID, req.ModelID, req.HashScheme}]
		for k, s := range m.stats {
			if k.tenant != req.TenantID || k.model != req.ModelID {
				continue
			}
			if now-s.reported >= maxAge || float64(s.st.HitRate) < m.ranker.TenantHotMinHitRate || serving[k.replica] == 0 {
				continue
			}
			rec := refFresh(now, s.reported, maxAge)
			pf := math.Max(0, math.Min(1, 1-m.ranker.PressureWeight*float64(s.st.Pressure)))
			res.scores = append(res.scores, refScore{replica: k.replica, score: float64(s.st.HitRate) * rec * pf * (1 + rec*coef), prob: float64(s.st.HitRate)})
		}
		if len(res.scores) > 0 {
			res.strategy = StrategyTenantHot
			refSort(res.scores)
			return res
		}
	}
	res.strategy = m.classify(req)
	return res
}

func refSort(s []refScore) {
	slices.SortFunc(s, func(a, b refScore) int {
		// Ties compare at float32 precision, as the wire does.
		if float32(a.score) != float32(b.score) {
			return cmp.Compare(float32(b.score), float32(a.score))
		}
		return cmp.Compare(a.replica, b.replica)
	})
}

func (m *refModel) classify(req *LookupRequest) Strategy {
	switch {
	case m.visibleKeys == 0:
		return StrategyNone
	case m.tenantKeys[req.TenantID] == 0:
		return StrategyUnknownTenant
	case m.modelKeys[[2]string{req.TenantID, req.ModelID}] == 0:
		return StrategyUnknownModel
	case len(m.serving[[3]string{req.TenantID, req.ModelID, req.HashScheme}]) == 0:
		return StrategyUnknownHashScheme
	}
	return StrategyNone
}

// Credit mirrors Engine.Credit for the scores kept.
func (m *refModel) Credit(req *LookupRequest, res refResult, kept []refScore) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !res.lfu || res.strategy != StrategyPrefixMatch {
		return
	}
	bump := func(h []byte, replica string) {
		if e := m.prefixes[refKey{req.TenantID, req.ModelID, req.HashScheme, req.AdapterID, string(h)}][replica]; e != nil && e.lfu < lfuCountMask {
			e.lfu++
		}
	}
	for _, s := range kept {
		if s.blocks < 0 {
			if s.matched > 0 {
				bump(req.PrefixHash, s.replica)
			}
			continue
		}
		for i := 0; i < s.blocks; i++ {
			bump(req.BlockHashes[i], s.replica)
		}
	}
}

func (m *refModel) AffinityHint(tenant, model, scheme string, seed []byte) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(seed) == 0 || scheme == "" {
		return "", false
	}
	set := m.servingSet(tenant, model, scheme)
	if len(set) == 0 {
		return "", false
	}
	sum := sha256.Sum256(seed)
	return set[binary.BigEndian.Uint64(sum[:8])%uint64(len(set))], true
}

// dumpEntry is one storage entry in a canonical form.
type dumpEntry struct {
	key     refKey
	replica string
	tokens  int32
	ts      int64
	tier    Tier
	lfu     uint32
}

func (m *refModel) dump() []dumpEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []dumpEntry
	for k, holders := range m.prefixes {
		for r, e := range holders {
			out = append(out, dumpEntry{k, r, e.tokens, e.ts, e.tier, e.lfu})
		}
	}
	sortDump(out)
	return out
}

func sortDump(d []dumpEntry) {
	slices.SortFunc(d, func(a, b dumpEntry) int {
		return cmp.Or(cmp.Compare(a.key.tenant, b.key.tenant), cmp.Compare(a.key.model, b.key.model),
			cmp.Compare(a.key.scheme, b.key.scheme), cmp.Compare(a.key.adapter, b.key.adapter),
			cmp.Compare(a.key.hash, b.key.hash), cmp.Compare(a.replica, b.replica))
	})
}

// dump lists the engine's storage entries in the same canonical form.
func (e *Engine) dump() []dumpEntry {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []dumpEntry
	for _, sc := range e.scopes[1:] {
		if sc == nil {
			continue
		}
		slots := sc.d.replicaSlots()
		e.forEachNodeLocked(sc, func(off uint32) {
			k := refKey{sc.d.tenant, sc.d.model, sc.sch.name, sc.adapter, string(e.appendHashBytes(nil, off))}
			meta := e.w(off + nMeta)
			block := e.w(off + nHolders)
			for i := uint32(0); i < metaCount(meta); i++ {
				h := holderAt(block, i)
				rt := e.w(h + hRidTier)
				out = append(out, dumpEntry{k, slots[uint16(rt)].name, int32(e.w(h + hTokens)), e.holderTs(h), Tier(rt >> 16), e.w(h+hLFU) & lfuCountMask})
			}
		})
	}
	sortDump(out)
	return out
}
