package engine

import (
	"encoding/binary"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/inferencecache/inferencecache/arena"
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
	d   *domain
	lfu bool
	// sch is the lookup's hash scheme in d (nil when it has none), for the
	// load-aware step and the affinity pick of the same request.
	sch   *scheme
	nodes []uint64

	// Scratch of the chain walk: the running set (run), finished runners
	// (fin), the running set before the current step of the last,
	// non-strict pass (undo) and sorted matched counts.
	run, fin, undo []runner
	matched        []int64
	prefix         []int64
	// cand and keys are the ranking scratch (emitRanked); sorted is the
	// load-aware reranking's (rerankByLoad).
	cand   []candidate
	keys   []uint64
	sorted []Score
	// lv is the lookup's load view (AdviseByLoad).
	lv loadView
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
	r.d, r.sch, r.lfu = nil, nil, false
	r.nodes = r.nodes[:0]
	r.run, r.fin, r.cand = r.run[:0], r.fin[:0], r.cand[:0]
	r.lv.active = false
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
	pt := req.Policy
	if pt == nil {
		pt = e.policies.Load().Tenant(req.TenantID)
	}
	ttl := pt.TTL.Microseconds()
	d := e.lookupDomain(req.TenantID, req.ModelID)
	var sch *scheme
	var sc *scope
	if d != nil {
		if sch = d.findScheme(req.HashScheme); sch != nil {
			sc = sch.findScope(req.AdapterID)
		}
	}
	res.d, res.sch = d, sch
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
// or hold it stale, folding lastSeen by min and tier by coldest. Block i+1
// is looked for first at block i's successor hint (almost always right for
// a chain reported in one piece, and adjacent in memory), then in the table.
//
// Each step updates the running set in place and validates the node's
// sequence lock afterwards; if a writer changed the node meanwhile, the walk
// starts over from block 0 (rare, and cheaper on average than keeping undo
// state for every step). After maxWalkRestarts the last pass keeps undo
// state instead, and a race ends the walk at the raced block: every runner
// still running there is reported with the blocks before it, never with a
// block it was not seen to hold.
func (e *Engine) walkChain(sc *scope, req *LookupRequest, ttl, now int64, res *LookupResult) {
	t := sc.table.Load()
	stop := 0
	for restarts := 0; ; restarts++ {
		res.run, res.fin, res.nodes = res.run[:0], res.fin[:0], res.nodes[:0]
		var ok bool
		if stop, ok = e.walkOnce(t, sc, req, ttl, now, res, restarts < maxWalkRestarts); ok {
			break
		}
	}
	// Survivors matched every block up to where the walk stopped.
	for i := range res.run {
		res.run[i].blocks = int32(stop)
	}
	res.fin = append(res.fin, res.run...)
	e.scoreRuns(sc, req.SLOTTFTMs, req.BlockTokenCounts, ttl, now, res)
}

const maxWalkRestarts = 16

// walkOnce walks the chain once. It returns the index of the first block the
// running set did not match (len(chain) when it matched all), and false when
// a step raced a writer and strict is set. Not strict, a raced step ends the
// walk at its block, with the running set and finished runners restored to
// what they were before the step.
func (e *Engine) walkOnce(t *table, sc *scope, req *LookupRequest, ttl, now int64, res *LookupResult, strict bool) (int, bool) {
	var hint uint32
	var k key
	for i, h := range req.BlockHashes {
		// makeKey, inline: a 64-block walk prepares 64 keys.
		switch {
		case len(h) == 8:
			k = key{kind: kindU64, v: binary.BigEndian.Uint64(h)}
		case len(h) == 0 || len(h) > MaxHashBytes:
			return i, true
		default:
			k = key{kind: kindBytes, b: h}
		}
		fin := len(res.fin)
		if !strict {
			res.undo = append(res.undo[:0], res.run...)
		}
		st := stepMissing
		var next uint32
		if hint != 0 {
			next, st = e.step(hint, sc.id, &k, int32(i), ttl, now, res)
		}
		if st == stepMissing {
			if next, st = e.stepTable(t, sc.id, &k, int32(i), ttl, now, res); st == stepMissing {
				return i, true // every running replica lacks this block
			}
		}
		if st == stepRaced {
			if strict {
				return i, false
			}
			res.run = append(res.run[:0], res.undo...)
			res.fin = res.fin[:fin]
			return i, true
		}
		hint = next
		if len(res.run) == 0 {
			return i + 1, true
		}
	}
	return len(req.BlockHashes), true
}

// Outcomes of step.
const (
	stepOK = iota
	stepMissing
	stepRaced
)

// step advances the running set through node off, if off is a live node
// for key k in scope sc (stepMissing otherwise, with nothing changed). At
// block 0 it seeds the running set from the node's fresh holders; after
// that it keeps the runners that hold this block fresh and moves the others
// to res.fin, recording how many blocks they matched. It returns the node's successor hint, and stepRaced
// when the node's sequence lock shows a concurrent write during the step.
func (e *Engine) step(off, sc uint32, k *key, block int32, ttl, now int64, res *LookupResult) (uint32, int) {
	// A nominated offset is always a node offset (node memory is only ever
	// reused for nodes), so its words lie in one slab; resolving them once
	// as a slice saves the per-word slab arithmetic of Block.Load.
	nw, ok := e.arena.Block(off).Words(nodeWords)
	if !ok {
		return 0, stepRaced
	}
	nw = nw[:nodeWords]
	s1 := nw[nSeq].Load()
	if s1&1 != 0 {
		if s1, ok = e.readSeq(off); !ok {
			return 0, stepRaced
		}
	}
	meta := nw[nMeta].Load()
	var match bool
	if k.kind == kindU64 {
		match = meta&metaLive != 0 && metaKind(meta) == kindU64 && nw[nScope].Load() == sc &&
			nw[nHashLo].Load() == uint32(k.v) && nw[nHashHi].Load() == uint32(k.v>>32)
	} else {
		match = e.viewMatches(e.arena.Block(off), meta, sc, k)
	}
	if !match {
		if nw[nSeq].Load() != s1 {
			return 0, stepRaced
		}
		return 0, stepMissing
	}
	// The holders are read before the window is validated: only from an
	// allocated slab, no more than the block's class holds and never past
	// the slab's end (a real block never crosses it), and the final check
	// rejects whatever a torn view read there.
	hb, ok := e.arena.TryBlock(nw[nHolders].Load())
	if !ok || !countFits(meta) {
		return 0, stepRaced
	}
	hs, ok := hb.Words(metaCount(meta) * holderWord)
	if !ok {
		return 0, stepRaced
	}
	fresh := func(ts int64) bool { return ttl > 0 && now-ts < ttl }
	if block == 0 {
		for j := 0; j+holderWord <= len(hs); j += holderWord {
			h := hs[j : j+holderWord : j+holderWord]
			ts := int64(uint64(h[hTsLo].Load()) | uint64(h[hTsHi].Load())<<32)
			if !fresh(ts) {
				continue
			}
			rt := h[hRidTier].Load()
			r := nextOf(&res.run)
			r.rid, r.tier, r.blocks, r.matched, r.oldest = uint16(rt), Tier(rt>>16), 0, 0, ts
		}
	} else {
		run := res.run
		w, j, n := 0, 0, len(hs)
		// Lockstep: while the node's holders are the running set, runner
		// i is holder i (both are sorted by replica id), as on every block
		// of a prefix that the same replicas hold. It leaves off at the
		// first runner that is not, or whose entry is stale, and the merge
		// below goes on from there: up to that point it would have kept
		// every runner and consumed one holder per runner, exactly as here.
		if n == len(run)*holderWord {
			for ; w < len(run); w++ {
				h := hs[j : j+holderWord : j+holderWord]
				rt := h[hRidTier].Load()
				ts := int64(uint64(h[hTsLo].Load()) | uint64(h[hTsHi].Load())<<32)
				r := &run[w]
				if uint16(rt) != r.rid || !fresh(ts) {
					break
				}
				r.oldest = min(r.oldest, ts)
				r.tier = coldest(r.tier, Tier(rt>>16))
				j += holderWord
			}
		}
		// Both lists are sorted by replica id: a merge that loads each
		// holder's id once.
		for i := w; i < len(run); i++ {
			r := &run[i]
			rid := r.rid
			var rt uint32
			for ; j < n; j += holderWord {
				if rt = hs[j].Load(); uint16(rt) >= rid {
					break
				}
			}
			if j+holderWord <= n && uint16(rt) == rid {
				h := hs[j : j+holderWord : j+holderWord]
				j += holderWord
				if ts := int64(uint64(h[hTsLo].Load()) | uint64(h[hTsHi].Load())<<32); fresh(ts) {
					r.oldest = min(r.oldest, ts)
					r.tier = coldest(r.tier, Tier(rt>>16))
					if w != i {
						run[w] = *r
					}
					w++
					continue
				}
			}
			f := nextOf(&res.fin)
			f.rid, f.tier, f.blocks, f.matched, f.oldest = r.rid, r.tier, block, r.matched, r.oldest
		}
		res.run = run[:w]
	}
	hint, gen := nw[nNext].Load(), nw[nGen].Load()
	if nw[nSeq].Load() != s1 {
		return 0, stepRaced
	}
	if res.lfu {
		res.nodes = append(res.nodes, uint64(gen)<<32|uint64(off))
	}
	return hint, stepOK
}

// stepTable is step for block k found through the scope's table: it steps
// through the first node the table nominates that holds k (find, with
// step's own check in place of nodeIs, so the node is validated once).
func (e *Engine) stepTable(t *table, sc uint32, k *key, block int32, ttl, now int64, res *LookupResult) (uint32, int) {
	tag := slotTag(e.tableHash(k))
	i := t.home(tag)
	for n := uint64(0); n <= t.mask; n++ {
		s := t.slots[i].Load()
		if s == 0 {
			return 0, stepMissing
		}
		if s&^0xFFFFFFFF == tag {
			if next, st := e.step(uint32(s), sc, k, block, ttl, now, res); st != stepMissing {
				return next, st
			}
		}
		i = (i + 1) & t.mask
	}
	return 0, stepMissing
}

// viewMatches is keyMatches over a block view.
func (e *Engine) viewMatches(nd arena.Block, meta, sc uint32, k *key) bool {
	if meta&metaLive == 0 || metaKind(meta) != k.kind || nd.Load(nScope) != sc {
		return false
	}
	if k.kind == kindU64 {
		return nd.Load(nHashLo) == uint32(k.v) && nd.Load(nHashHi) == uint32(k.v>>32)
	}
	return e.bytesEqual(nd.Load(nHashLo), nd.Load(nHashHi), k.b)
}

// scoreRuns turns the finished runners in res.fin into ranked scores.
func (e *Engine) scoreRuns(sc *scope, slo int32, counts []int32, ttl, now int64, res *LookupResult) {
	// A runner's matched tokens are the request's counts over the blocks it
	// matched: prefix sums, computed once.
	ps := append(res.prefix[:0], 0)
	var sum int64
	for _, c := range counts {
		sum += int64(c)
		ps = append(ps, sum)
	}
	res.prefix = ps
	for i := range res.fin {
		res.fin[i].matched = ps[res.fin[i].blocks]
	}
	// Distinguishing power per replica: matching = the scored replicas whose
	// matched tokens reach this replica's. Sorting the matched values lets
	// each replica count them with one binary search. (Every runner's
	// entries were fresh when read, so only non-positive counts drop out.)
	ms := res.matched[:0]
	for i := range res.fin {
		if m := res.fin[i].matched; m > 0 {
			ms = append(ms, m)
		}
	}
	sortSmall(ms)
	res.matched = ms
	total := len(sc.sch.serving.Load().ids)
	rt := sc.d.table()
	slots := rt.slots
	coef := e.sloCoefficient(slo)
	invTTL := 1 / float64(ttl)
	loOf, lo := int64(0), 0 // matched > 0 here, so loOf starts unset
	for i := range res.fin {
		r := &res.fin[i]
		if r.matched <= 0 || int(r.rid) >= len(slots) || slots[r.rid] == nil {
			continue
		}
		fresh := 1.0
		if age := now - r.oldest; age > 0 {
			fresh = 1 - float64(age)*invTTL
		}
		if fresh <= 0 {
			continue
		}
		rep := slots[r.rid]
		// lower bound of r.matched in ms; runners that finished at the
		// same block (most of them, in groups) share it.
		if r.matched != loOf {
			loOf, lo = r.matched, 0
			for hi := len(ms); lo < hi; {
				if m := (lo + hi) >> 1; ms[m] < r.matched {
					lo = m + 1
				} else {
					hi = m
				}
			}
		}
		raw := float64(r.matched) * fresh * e.pressureFactor(rep, ttl, now) * (1 + fresh*coef)
		c := nextOf(&res.cand)
		c.score = float32(raw * distinguishingPower(len(ms)-lo, total))
		c.matched = clampInt32(r.matched)
		c.prob = float32(fresh)
		c.tier = r.tier
		c.rid = r.rid
		c.run = r.blocks
	}
	emitRanked(res, rt)
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
	nd := e.arena.Block(off)
	// A node that keeps changing through maxReadRetries attempts counts as
	// absent: no torn view is ever ranked.
	for attempt := 0; ; attempt++ {
		res.fin = res.fin[:0]
		if attempt == maxReadRetries {
			return
		}
		s1, ok := e.readSeq(off)
		if !ok {
			return
		}
		meta := nd.Load(nMeta)
		if !e.viewMatches(nd, meta, sc.id, &k) {
			if nd.Load(nSeq) == s1 {
				return
			}
			continue
		}
		count := metaCount(meta)
		hb, ok := e.arena.TryBlock(nd.Load(nHolders))
		if !ok || !countFits(meta) {
			continue
		}
		for j := uint32(0); j < count; j++ {
			h := j * holderWord
			ts := int64(uint64(hb.Load(h+hTsLo)) | uint64(hb.Load(h+hTsHi))<<32)
			if ttl <= 0 || now-ts >= ttl {
				continue
			}
			rt := hb.Load(h + hRidTier)
			res.fin = append(res.fin, runner{rid: uint16(rt), tier: Tier(rt >> 16), blocks: -1, matched: int64(int32(hb.Load(h + hTokens))), oldest: ts})
		}
		gen := nd.Load(nGen)
		if nd.Load(nSeq) == s1 {
			res.nodes = append(res.nodes[:0], uint64(gen)<<32|uint64(off))
			break
		}
	}
	rt := sc.d.table()
	slots := rt.slots
	coef := e.sloCoefficient(req.SLOTTFTMs)
	valid := 0
	for _, r := range res.fin {
		if int(r.rid) < len(slots) && slots[r.rid] != nil {
			valid++
		}
	}
	dp := distinguishingPower(valid, len(sc.sch.serving.Load().ids))
	for _, r := range res.fin {
		if int(r.rid) >= len(slots) || slots[r.rid] == nil {
			continue
		}
		rep := slots[r.rid]
		fresh := freshness(now, r.oldest, ttl)
		res.cand = append(res.cand, candidate{
			score:   float32(float64(r.matched) * fresh * e.pressureFactor(rep, ttl, now) * (1 + fresh*coef) * dp),
			matched: int32(r.matched),
			prob:    float32(fresh),
			tier:    r.tier,
			rid:     r.rid,
			run:     -1,
		})
	}
	emitRanked(res, rt)
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
	rt := d.table()
	for _, rep := range rt.slots {
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
		res.cand = append(res.cand, candidate{score: float32(score), prob: st.HitRate, rid: rep.id})
	}
	emitRanked(res, rt)
}

// candidate is a score before ranking, kept free of pointers so that
// ranking moves plain words only.
type candidate struct {
	score   float32
	matched int32
	prob    float32
	run     int32
	rid     uint16
	tier    Tier
}

// emitRanked ranks res.cand by score descending, then replica id ascending,
// and appends the result to res.Scores. It sorts packed integer keys (score
// bits, name rank, position) and writes each Score once.
func emitRanked(res *LookupResult, rt *replicaTable) {
	c := res.cand
	keys := res.keys[:0]
	for i := range c {
		keys = append(keys, uint64(descFloat32(c[i].score))<<32|uint64(rt.rank[c[i].rid])<<16|uint64(i))
	}
	sortSmall(keys)
	res.keys = keys
	for _, k := range keys {
		x := &c[uint16(k)]
		s := nextOf(&res.Scores)
		s.ReplicaID = rt.slots[x.rid].name
		s.Score = x.score
		s.MatchedTokens = x.matched
		s.Prob = x.prob
		s.Tier = x.tier
		s.rid = x.rid
		s.run = x.run
	}
}

// nextOf extends *s by one element and returns it for the caller to fill
// in, every field. Appending a composite literal instead builds it on the
// stack and copies it with wide loads that stall on the narrow stores just
// made (store forwarding), several times the cost on the ranking path.
func nextOf[T any](s *[]T) *T {
	n := len(*s)
	if n == cap(*s) {
		*s = slices.Grow(*s, 1)
	}
	*s = (*s)[:n+1]
	return &(*s)[n]
}

// sortSmall sorts s ascending: by insertion for the few dozen values of a
// typical lookup (often nearly sorted already: candidates come in replica
// order), where it beats the general sort severalfold; by slices.Sort
// beyond.
func sortSmall[T int64 | uint64](s []T) {
	if len(s) > 64 {
		slices.Sort(s)
		return
	}
	for i := 1; i < len(s); i++ {
		x, j := s[i], i
		for ; j > 0 && s[j-1] > x; j-- {
			s[j] = s[j-1]
		}
		s[j] = x
	}
}

// descFloat32 maps a float32 to a uint32 that sorts ascending as the float
// sorts descending (NaN does not occur: every factor is finite).
func descFloat32(f float32) uint32 {
	b := math.Float32bits(f)
	if b&(1<<31) != 0 {
		b = ^b
	} else {
		b |= 1 << 31
	}
	return ^b
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
//
// It validates the node's window before following the holders offset, so
// the holder count and block it searches belong together and the LFU word
// lies inside that block. A late CAS (the writer freed the block after the
// validation) can only meet a holder record: blocks of holder size are only
// ever reused as holder blocks (see hashWords), and every reuse retags.
func (e *Engine) credit(ref uint64, rid uint16) {
	off, gen := uint32(ref), uint32(ref>>32)
	nd := e.arena.Block(off)
	for attempt := 0; attempt < 8; attempt++ {
		s1, ok := e.readSeq(off)
		if !ok {
			return
		}
		meta, g, block := nd.Load(nMeta), nd.Load(nGen), nd.Load(nHolders)
		if nd.Load(nSeq) != s1 {
			continue
		}
		if meta&metaLive == 0 || g != gen {
			return
		}
		hb, ok := e.arena.TryBlock(block)
		if !ok || !countFits(meta) {
			return
		}
		idx, found := findHolderIn(hb, metaCount(meta), rid)
		var lfu *atomic.Uint32
		var old uint32
		if found {
			lfu = hb.At(idx*holderWord + hLFU)
			old = lfu.Load()
		}
		if nd.Load(nSeq) != s1 {
			continue
		}
		if !found || old&lfuCountMask == lfuCountMask {
			return
		}
		if lfu.CompareAndSwap(old, old+1) {
			return
		}
	}
}

// AffinityHint picks a stable replica for seed among the replicas serving
// (tenant, model, scheme) (contract §3.8): the serving names sorted
// ascending, indexed by the first 8 bytes of SHA-256(seed), big-endian,
// modulo their number. It reports false for an empty seed or scope.
func (e *Engine) AffinityHint(tenant, model, scheme string, seed []byte) (string, bool) {
	name, _, ok := e.AffinityPick(nil, tenant, model, scheme, seed, AffinityContract)
	return name, ok
}

// Micros converts a time to the µs clock the engine uses.
func Micros(t time.Time) int64 { return t.UnixMicro() }
