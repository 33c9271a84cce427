package engine

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"time"

	"github.com/inferencecache/inferencecache/policy"
)

// LookupResult is the answer of LookupRoute and the scratch space that
// produced it. Reuse one per goroutine (or from a sync.Pool): with warm
// scratch, LookupRoute allocates nothing. A LookupResult must not be used by
// two lookups at once.
type LookupResult struct {
	Strategy Strategy
	// Scores are ranked best first: score descending, replica id ascending.
	// The caller may filter them in place (keeping relative order) before
	// Credit; Credit then credits only what is left.
	Scores []Score

	// What Credit needs: the domain, whether the tenant is LFU, the nodes of
	// the walked chain (gen<<32|offset per block) or of the exact match.
	d     *domain
	lfu   bool
	nodes []uint64

	run, next []runner
}

// runner is one replica during a chain walk.
type runner struct {
	rid     uint16
	tier    Tier
	blocks  int32
	matched int64
	oldest  int64
}

func (r *LookupResult) reset() {
	r.Strategy = StrategyNone
	r.Scores = r.Scores[:0]
	r.d, r.lfu = nil, false
	r.nodes = r.nodes[:0]
	r.run, r.next = r.run[:0], r.next[:0]
}

// LookupRoute ranks the replicas that hold the request's prefix (contract
// §2.2 step 8 and §3): the chain walk for a chain request, the exact match
// otherwise, then TENANT_HOT for exact requests, then the miss classifier.
// It reads the index without locks and writes only into res. now is µs.
func (e *Engine) LookupRoute(req *LookupRequest, now int64, res *LookupResult) {
	res.reset()
	if req.TenantID == "" || req.ModelID == "" || req.HashScheme == "" {
		return
	}
	chain := len(req.BlockHashes) > 0 || len(req.BlockTokenCounts) > 0
	if chain && len(req.BlockHashes) != len(req.BlockTokenCounts) {
		return
	}
	pt := e.policies.Load().Tenant(req.TenantID)
	ttl := pt.TTL.Microseconds()
	d := e.lookupDomain(req.TenantID, req.ModelID)
	var sch *scheme
	var sc *scope
	if d != nil {
		if sch = d.findScheme(req.HashScheme); sch != nil {
			sc = sch.findScope(req.AdapterID)
		}
	}
	res.d = d
	res.lfu = pt.Eviction == policy.LFU
	if sc != nil {
		if chain {
			e.walkChain(sc, req, ttl, now, res)
		} else {
			e.matchExact(sc, req, ttl, now, res)
		}
		if len(res.Scores) > 0 {
			res.Strategy = StrategyPrefixMatch
			return
		}
	}
	if !chain && d != nil && sch != nil {
		e.tenantHot(d, sch, req.SLOTTFTMs, now, res)
		if len(res.Scores) > 0 {
			res.Strategy = StrategyTenantHot
			return
		}
	}
	res.Strategy = e.classifyMiss(req.TenantID, d, sch)
}

// classifyMiss names the outermost contract key that matches nothing.
func (e *Engine) classifyMiss(tenant string, d *domain, sch *scheme) Strategy {
	if e.totalKeys.Load() == 0 {
		return StrategyNone // cold start: nothing indexed yet anywhere
	}
	if t, ok := e.tenants.Load(tenant); !ok || t.keys.Load() == 0 {
		return StrategyUnknownTenant
	}
	if d == nil || d.keys.Load() == 0 {
		return StrategyUnknownModel
	}
	if sch == nil || len(sch.serving.Load().ids) == 0 {
		return StrategyUnknownHashScheme
	}
	return StrategyNone
}

// walkChain is the chain matcher: seed the running set from the fresh
// holders of block 0, then at each block finalize the replicas that lack it
// or hold it stale, folding lastSeen by min and tier by coldest.
func (e *Engine) walkChain(sc *scope, req *LookupRequest, ttl, now int64, res *LookupResult) {
	t := sc.table.Load()
	var hint uint32
	for i, h := range req.BlockHashes {
		k, ok := e.makeKey(h)
		off := uint32(0)
		if ok {
			if hint != 0 && e.nodeIs(hint, sc.id, &k) {
				off = hint
			} else {
				off = e.find(t, sc.id, &k)
			}
		}
		if off == 0 {
			break // every running replica lacks this block
		}
		if i == 0 {
			hint = e.seedRun(off, ttl, now, int64(req.BlockTokenCounts[0]), res)
		} else {
			hint = e.stepRun(off, ttl, now, int64(req.BlockTokenCounts[i]), res)
		}
		if len(res.run) == 0 {
			break
		}
	}
	// Survivors matched every block they were asked about.
	res.next = append(res.next[:0], res.run...)
	e.scoreRuns(sc, req.SLOTTFTMs, ttl, now, res)
}

// seedRun fills the running set from node off (block 0) and returns the
// node's successor hint.
func (e *Engine) seedRun(off uint32, ttl, now, tokens int64, res *LookupResult) uint32 {
	for {
		s1 := e.readSeq(off)
		res.run = res.run[:0]
		res.nodes = append(res.nodes[:0], 0)
		meta := e.w(off + nMeta)
		block, count := e.w(off+nHolders), metaCount(meta)
		for j := uint32(0); j < count; j++ {
			h := holderAt(block, j)
			ts := e.holderTs(h)
			if ttl <= 0 || now-ts >= ttl {
				continue
			}
			rt := e.w(h + hRidTier)
			res.run = append(res.run, runner{rid: uint16(rt), tier: Tier(rt >> 16), blocks: 1, matched: tokens, oldest: ts})
		}
		next := e.w(off + nNext)
		if e.w(off+nSeq) == s1 {
			res.nodes[0] = uint64(e.w(off+nGen))<<32 | uint64(off)
			res.Scores = res.Scores[:0]
			return next
		}
	}
}

// stepRun advances the running set through node off and returns the node's
// successor hint. Replicas that drop out are appended to res.Scores as
// finished runners (converted to scores by scoreRuns).
func (e *Engine) stepRun(off uint32, ttl, now, tokens int64, res *LookupResult) uint32 {
	for {
		s1 := e.readSeq(off)
		meta := e.w(off + nMeta)
		block, count := e.w(off+nHolders), metaCount(meta)
		nextRun := res.next[:0]
		mark := len(res.Scores)
		j := uint32(0)
		for _, r := range res.run {
			for j < count && uint16(e.w(holderAt(block, j)+hRidTier)) < r.rid {
				j++
			}
			if j < count {
				h := holderAt(block, j)
				rt := e.w(h + hRidTier)
				if uint16(rt) == r.rid {
					ts := e.holderTs(h)
					if ttl > 0 && now-ts < ttl {
						r.blocks++
						r.matched += tokens
						r.oldest = min(r.oldest, ts)
						r.tier = coldest(r.tier, Tier(rt>>16))
						nextRun = append(nextRun, r)
						continue
					}
				}
			}
			res.Scores = append(res.Scores, Score{rid: r.rid, run: r.blocks, MatchedTokens: clampInt32(r.matched), Tier: r.tier, Prob: float32(r.oldest), Score: 0})
			res.Scores[len(res.Scores)-1].stash(r)
		}
		hint := e.w(off + nNext)
		gen := e.w(off + nGen)
		if e.w(off+nSeq) == s1 {
			res.next = res.run
			res.run = nextRun
			res.nodes = append(res.nodes, uint64(gen)<<32|uint64(off))
			return hint
		}
		res.Scores = res.Scores[:mark]
	}
}

// stash keeps a finished runner's fields in the Score until scoreRuns.
func (s *Score) stash(r runner) {
	s.rid, s.run, s.Tier = r.rid, r.blocks, r.tier
	s.stashMatched, s.stashOldest = r.matched, r.oldest
}

// scoreRuns turns finished runners (in res.Scores) and survivors (res.next)
// into ranked scores.
func (e *Engine) scoreRuns(sc *scope, slo int32, ttl, now int64, res *LookupResult) {
	for _, r := range res.next {
		res.Scores = append(res.Scores, Score{})
		res.Scores[len(res.Scores)-1].stash(r)
	}
	slots := sc.d.replicaSlots()
	coef := e.sloCoefficient(slo)
	out := res.Scores[:0]
	for _, s := range res.Scores {
		if s.stashMatched <= 0 || int(s.rid) >= len(slots) || slots[s.rid] == nil {
			continue
		}
		fresh := freshness(now, s.stashOldest, ttl)
		if fresh <= 0 {
			continue
		}
		rep := slots[s.rid]
		s.ReplicaID = rep.name
		s.MatchedTokens = clampInt32(s.stashMatched)
		s.Prob = float32(fresh)
		s.raw = fresh * e.pressureFactor(rep, ttl, now) * (1 + fresh*coef) * float64(s.stashMatched)
		out = append(out, s)
	}
	res.Scores = out
	// Distinguishing power per replica: matching = replicas whose matched
	// tokens reach this replica's.
	total := len(sc.sch.serving.Load().ids)
	slices.SortFunc(res.Scores, func(a, b Score) int { return cmp.Compare(b.stashMatched, a.stashMatched) })
	for i := 0; i < len(res.Scores); {
		j := i
		for j < len(res.Scores) && res.Scores[j].stashMatched == res.Scores[i].stashMatched {
			j++
		}
		dp := distinguishingPower(j, total)
		for k := i; k < j; k++ {
			res.Scores[k].Score = float32(res.Scores[k].raw * dp)
		}
		i = j
	}
	sortScores(res.Scores)
}

// matchExact is the legacy exact-prefix path.
func (e *Engine) matchExact(sc *scope, req *LookupRequest, ttl, now int64, res *LookupResult) {
	k, ok := e.makeKey(req.PrefixHash)
	if !ok {
		return
	}
	off := e.find(sc.table.Load(), sc.id, &k)
	if off == 0 {
		return
	}
	for {
		s1 := e.readSeq(off)
		res.Scores = res.Scores[:0]
		meta := e.w(off + nMeta)
		block, count := e.w(off+nHolders), metaCount(meta)
		for j := uint32(0); j < count; j++ {
			h := holderAt(block, j)
			ts := e.holderTs(h)
			if ttl <= 0 || now-ts >= ttl {
				continue
			}
			rt := e.w(h + hRidTier)
			tokens := int32(e.w(h + hTokens))
			res.Scores = append(res.Scores, Score{rid: uint16(rt), Tier: Tier(rt >> 16), MatchedTokens: tokens, run: -1, stashOldest: ts, stashMatched: int64(tokens)})
		}
		gen := e.w(off + nGen)
		if e.w(off+nSeq) == s1 {
			res.nodes = append(res.nodes[:0], uint64(gen)<<32|uint64(off))
			break
		}
	}
	slots := sc.d.replicaSlots()
	coef := e.sloCoefficient(req.SLOTTFTMs)
	out := res.Scores[:0]
	for _, s := range res.Scores {
		if int(s.rid) >= len(slots) || slots[s.rid] == nil {
			continue
		}
		rep := slots[s.rid]
		fresh := freshness(now, s.stashOldest, ttl)
		s.ReplicaID = rep.name
		s.Prob = float32(fresh)
		s.raw = float64(s.MatchedTokens) * fresh * e.pressureFactor(rep, ttl, now) * (1 + fresh*coef)
		out = append(out, s)
	}
	res.Scores = out
	dp := distinguishingPower(len(res.Scores), len(sc.sch.serving.Load().ids))
	for i := range res.Scores {
		res.Scores[i].Score = float32(res.Scores[i].raw * dp)
	}
	sortScores(res.Scores)
}

// tenantHot is the TENANT_HOT fallback (contract §3.7).
func (e *Engine) tenantHot(d *domain, sch *scheme, slo int32, now int64, res *LookupResult) {
	maxAge := e.ranker.TenantHotMaxAge.Microseconds()
	if maxAge <= 0 {
		return
	}
	serving := sch.serving.Load()
	if len(serving.ids) == 0 {
		return
	}
	coef := e.sloCoefficient(slo)
	res.Scores = res.Scores[:0]
	for _, rep := range d.replicaSlots() {
		if rep == nil {
			continue
		}
		st := rep.stats.Load()
		if st == nil || now-st.reported >= maxAge || float64(st.HitRate) < e.ranker.TenantHotMinHitRate {
			continue
		}
		if !serving.has(rep.id) {
			continue
		}
		recency := freshness(now, st.reported, maxAge)
		pf := clamp01(1 - e.ranker.PressureWeight*float64(st.Pressure))
		score := float64(st.HitRate) * recency * pf * (1 + recency*coef)
		res.Scores = append(res.Scores, Score{ReplicaID: rep.name, Score: float32(score), Prob: st.HitRate, rid: rep.id})
	}
	sortScores(res.Scores)
}

// sortScores orders by score descending, then replica id ascending.
func sortScores(s []Score) {
	slices.SortFunc(s, func(a, b Score) int {
		if a.Score != b.Score {
			return cmp.Compare(b.Score, a.Score)
		}
		return cmp.Compare(a.ReplicaID, b.ReplicaID)
	})
}

// freshness is the linear decay of contract §3.2: 1 at age <= 0, 0 at age
// >= ttl, and 0 for a non-positive ttl.
func freshness(now, lastSeen, ttl int64) float64 {
	if ttl <= 0 {
		return 0
	}
	age := now - lastSeen
	switch {
	case age <= 0:
		return 1
	case age >= ttl:
		return 0
	}
	return 1 - float64(age)/float64(ttl)
}

func clamp01(v float64) float64 { return max(0, min(1, v)) }

// pressureFactor reads a replica's pressure when its stats payload is fresh
// under the tenant TTL (contract §3.3).
func (e *Engine) pressureFactor(rep *replica, ttl, now int64) float64 {
	var p float64
	if st := rep.stats.Load(); st != nil && freshness(now, st.reported, ttl) > 0 {
		p = float64(st.Pressure)
	}
	return clamp01(1 - e.ranker.PressureWeight*p)
}

// sloCoefficient is the SLO bias coefficient of contract §3.4.
func (e *Engine) sloCoefficient(ttftMs int32) float64 {
	r := e.ranker
	if r.SLOTightTTFTMs > 0 && r.SLOTightBias > 0 && ttftMs > 0 && ttftMs < r.SLOTightTTFTMs {
		return r.SLOTightBias
	}
	return 0
}

// distinguishingPower is 1 - matching/total (contract §3.5).
func distinguishingPower(matching, total int) float64 {
	switch {
	case total <= 1 || matching < 0:
		return 1
	case matching >= total:
		return 0
	}
	return 1 - float64(matching)/float64(total)
}

// Credit bumps the LFU access count of every entry behind the scores left in
// res, when the tenant evicts by LFU. Call it only for a response that is
// actually delivered, after any filtering of res.Scores. It is lock-free.
func (e *Engine) Credit(res *LookupResult) {
	if !res.lfu || res.d == nil || res.Strategy != StrategyPrefixMatch {
		return
	}
	for _, s := range res.Scores {
		switch {
		case s.run < 0:
			if s.MatchedTokens > 0 && len(res.nodes) > 0 {
				e.credit(res.nodes[0], s.rid)
			}
		default:
			for i := int32(0); i < s.run && int(i) < len(res.nodes); i++ {
				e.credit(res.nodes[i], s.rid)
			}
		}
	}
}

// credit adds one access to replica rid's holder in node ref (gen<<32|off).
// The increment is a CAS on the holder's LFU word, validated by the word's
// tag: if the writer moved the holder meanwhile, the tag changed, the CAS
// fails, and credit relocates the holder. It gives up after a few attempts
// under heavy write contention (a lost credit only ages an entry slightly).
func (e *Engine) credit(ref uint64, rid uint16) {
	off, gen := uint32(ref), uint32(ref>>32)
	for attempt := 0; attempt < 8; attempt++ {
		s1 := e.readSeq(off)
		meta := e.w(off + nMeta)
		if meta&metaLive == 0 || e.w(off+nGen) != gen {
			return
		}
		block := e.w(off + nHolders)
		idx, found := e.findHolder(block, metaCount(meta), rid)
		var word, old uint32
		if found {
			word = holderAt(block, idx) + hLFU
			old = e.w(word)
		}
		if e.w(off+nSeq) != s1 {
			continue
		}
		if !found || old&lfuCountMask == lfuCountMask {
			return
		}
		if e.arena.Word(word).CompareAndSwap(old, old+1) {
			return
		}
	}
}

// AffinityHint picks a stable replica for seed among the replicas serving
// (tenant, model, scheme) (contract §3.8): the serving names sorted
// ascending, indexed by the first 8 bytes of SHA-256(seed), big-endian,
// modulo their number. It reports false for an empty seed or scope.
func (e *Engine) AffinityHint(tenant, model, scheme string, seed []byte) (string, bool) {
	if len(seed) == 0 || scheme == "" {
		return "", false
	}
	d := e.lookupDomain(tenant, model)
	if d == nil {
		return "", false
	}
	sch := d.findScheme(scheme)
	if sch == nil {
		return "", false
	}
	names := sch.serving.Load().names
	if len(names) == 0 {
		return "", false
	}
	sum := sha256.Sum256(seed)
	return names[binary.BigEndian.Uint64(sum[:8])%uint64(len(names))], true
}

// Micros converts a time to the µs clock the engine uses.
func Micros(t time.Time) int64 { return t.UnixMicro() }
