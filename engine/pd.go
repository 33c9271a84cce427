package engine

import (
	"math"
	"strings"

	"github.com/inferencecache/inferencecache/policy"
)

// Disaggregated prefill/decode (docs/pd.md). Replicas report their role,
// pool, node and zone with their updates (Update.Placement); PickPD chooses,
// for one request and one PDTopology, a prefill replica and a decode
// replica, or the decode replica alone when the prefill hop is not worth
// it:
//
//   - prefill: the cheapest prefill-pool replica by the load-aware cost,
//     queue + PDPrefillWeight × (prompt tokens − cached tokens there),
//     where cached = matched × freshness from the index; overloaded
//     replicas are skipped unless all are (the bound of docs/routing.md
//     over the pool).
//   - decode: the least-loaded decode-pool replica by requests in flight
//     (decode is batch-bound), among those not overloaded, preferring the
//     prefill replica's node (KVLocality Node, then its zone) or zone
//     (Zone); ties go to the one caching more of the prompt, then by name.
//   - skip: the decode replica computes the prompt itself when what it
//     would compute (prompt − cached there) is below the topology's
//     SkipBelow, or when the prefill pool is backlogged: the chosen
//     prefill replica's queue alone exceeds the decode replica's queue
//     plus that work, so waiting for the prefill pool cannot beat
//     computing locally.
//
// A replica without a fresh load report counts as the pool's mean. PickPD
// reads without locks and allocates nothing once res is warm.

// PDPrefillWeight is how many queued prefill tokens one uncached prompt
// token is worth when choosing the prefill replica: the request's own TTFT
// is queue + uncached (1), and its prefill delays whoever queues behind it
// there, about one request at the loads a prefill pool is sized for (so
// 2). LookupRoute's --load-prefill-weight (16) also prices the eviction a
// recomputed prefix causes on an aggregated replica; a prefill pool's
// caches are its own. The P/D simulator's sweep: 2 beats 16 on TTFT on
// the synthetic workloads (chat: mean 141 ms against 175 ms) and is within
// 1.2 % of it on the Mooncake trace (bench/results/README.md).
const PDPrefillWeight = 2.0

// Role is a replica's part in disaggregated serving.
type Role uint8

const (
	// RoleUnknown: never reported (the replica is no P/D candidate).
	RoleUnknown Role = iota
	// RoleBoth serves both phases.
	RoleBoth
	// RolePrefill computes prompts and hands their KV cache on.
	RolePrefill
	// RoleDecode generates from a transferred or local KV cache.
	RoleDecode
)

// String is the role's lower-case name.
func (r Role) String() string {
	switch r {
	case RoleBoth:
		return "both"
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return "unknown"
}

func (r Role) prefills() bool { return r == RoleBoth || r == RolePrefill }
func (r Role) decodes() bool  { return r == RoleBoth || r == RoleDecode }

// Placement is where a replica runs: its role, its PDTopology pool (empty:
// it matches any pool of its role's side) and its node and zone.
// Immutable once stored.
type Placement struct {
	Role             Role
	Pool, Node, Zone string
}

// setPlacementLocked stores p unless it equals what r has; a RoleUnknown
// keeps r's role. Called under mu.
func (r *replica) setPlacementLocked(p *Placement) {
	cur := r.placement.Load()
	next := *p
	if next.Role == RoleUnknown && cur != nil {
		next.Role = cur.Role
	}
	if cur != nil && *cur == next {
		return
	}
	r.placement.Store(&next)
}

// PlacementOf returns the placement the index knows of a replica of
// (tenant, model), false when it knows none.
func (e *Engine) PlacementOf(tenant, model, replicaID string) (Placement, bool) {
	d := e.lookupDomain(tenant, model)
	if d == nil {
		return Placement{}, false
	}
	r := d.table().find(replicaID)
	if r == nil {
		return Placement{}, false
	}
	p := r.placement.Load()
	if p == nil {
		return Placement{}, false
	}
	return *p, true
}

// PDOutcome is what PickPD decided.
type PDOutcome uint8

const (
	// PDNoPrefillPool: no live replica of a prefill pool (Decode may
	// still be set: the request can run there alone).
	PDNoPrefillPool PDOutcome = iota
	// PDNoDecodePool: no live replica of a decode pool.
	PDNoDecodePool
	// PDDisaggregated: Prefill computes the prompt, Decode generates.
	PDDisaggregated
	// PDPrefillSkipped: Decode does both (the uncached part is small, or
	// the prefill pool is backlogged).
	PDPrefillSkipped
)

// PDRequest is one LookupPDRoute after input resolution.
type PDRequest struct {
	// Lookup names the prompt's prefix for the cached-prefix credit; its
	// TenantID and ModelID are the domain whose replicas are candidates.
	Lookup LookupRequest
	// Tokens is the prompt's length in tokens.
	Tokens int64
	// Topology is the resolved PDTopology. Required.
	Topology *policy.Topology
}

// PDResult is PickPD's answer and its reusable scratch. Reuse one per
// goroutine; it must not be used by two picks at once.
type PDResult struct {
	Outcome         PDOutcome
	Prefill, Decode string
	// PrefillMatched and DecodeMatched are the prompt tokens each holds.
	PrefillMatched, DecodeMatched int32
	// Uncached is what the replica that prefills computes.
	Uncached int64

	lookup LookupResult
	cands  []pdCand
}

// pdCand is one candidate replica of a pick.
type pdCand struct {
	r                *replica
	p                *Placement
	known            bool
	queue, inflight  float64
	cached           float64
	matched          int32
	prefill, decode  bool
	overP, overD     bool
	sameNode, sameZn bool
}

// PickPD answers req into res (see the comment at the top of pd.go).
func (e *Engine) PickPD(req *PDRequest, now int64, res *PDResult) {
	res.Outcome, res.Prefill, res.Decode = PDNoDecodePool, "", ""
	res.PrefillMatched, res.DecodeMatched, res.Uncached = 0, 0, 0
	res.cands = res.cands[:0]
	top := req.Topology
	d := e.lookupDomain(req.Lookup.TenantID, req.Lookup.ModelID)
	if d == nil || top == nil {
		return
	}
	// The cached-prefix credit of every holder (contract ranking, no
	// floors: a short match still saves its tokens).
	if req.Lookup.HashScheme != "" {
		e.LookupRoute(&req.Lookup, now, &res.lookup)
	} else {
		res.lookup.reset()
	}
	slots := d.replicaSlots()
	per := meanRequestTokens(slots)
	maxAge := e.load.MaxAge.Microseconds()
	if maxAge <= 0 {
		maxAge = DefaultLoadMaxAge.Microseconds()
	}
	var sumQP, sumNP, sumQD, sumND float64
	var knownP, knownD int
	for _, r := range slots {
		if r == nil {
			continue
		}
		p := r.placement.Load()
		if p == nil || p.Role == RoleUnknown {
			continue
		}
		c := pdCand{r: r, p: p,
			prefill: p.Role.prefills() && (p.Pool == "" || top.HasPrefillPool(p.Pool)),
			decode:  p.Role.decodes() && (p.Pool == "" || top.HasDecodePool(p.Pool)),
		}
		if !c.prefill && !c.decode {
			continue
		}
		if rec := r.load.report.Load(); rec != nil && now-rec.at < maxAge {
			c.known = true
			c.queue = rec.estimate(r, per)
			c.inflight = r.load.inFlight(rec)
		}
		for i := range res.lookup.Scores {
			if s := &res.lookup.Scores[i]; s.rid == r.id && s.MatchedTokens > 0 {
				c.matched = s.MatchedTokens
				c.cached = float64(s.MatchedTokens) * float64(s.Prob)
				break
			}
		}
		if c.prefill {
			if c.known {
				knownP++
				sumQP += c.queue
				sumNP += c.inflight
			}
		}
		if c.decode {
			if c.known {
				knownD++
				sumQD += c.queue
				sumND += c.inflight
			}
		}
		res.cands = append(res.cands, c)
	}
	w := PDPrefillWeight
	bound := func(meanN float64) float64 {
		b := e.load.Bound
		if !(b >= 1) {
			b = DefaultLoadBound
		}
		mq := e.load.MinQueue
		if mq < 1 {
			mq = DefaultLoadMinQueue
		}
		return max(b*meanN+2*math.Sqrt(meanN), float64(mq))
	}
	// Unknown loads count as the side's mean; then the overload flags.
	meanQP, meanNP, meanQD, meanND := 0.0, 0.0, 0.0, 0.0
	if knownP > 0 {
		meanQP, meanNP = sumQP/float64(knownP), sumNP/float64(knownP)
	}
	if knownD > 0 {
		meanQD, meanND = sumQD/float64(knownD), sumND/float64(knownD)
	}
	boundP, boundD := bound(meanNP), bound(meanND)
	t := float64(max(req.Tokens, 0))
	best := -1
	var bestCost float64
	for pass := 0; pass < 2 && best < 0; pass++ {
		for i := range res.cands {
			c := &res.cands[i]
			if !c.prefill {
				continue
			}
			q, n := c.queue, c.inflight
			if !c.known {
				q, n = meanQP, meanNP
			}
			c.overP = n > boundP
			if pass == 0 && c.overP {
				continue // everyone overloaded: the second pass takes the cheapest
			}
			cost := q + w*max(t-c.cached, 0)
			if best < 0 || cost < bestCost || (cost == bestCost && c.r.name < res.cands[best].r.name) {
				best, bestCost = i, cost
			}
		}
	}
	var pc *pdCand
	if best >= 0 {
		pc = &res.cands[best]
		for i := range res.cands {
			c := &res.cands[i]
			c.sameNode = pc.p.Node != "" && c.p.Node == pc.p.Node
			c.sameZn = pc.p.Zone != "" && c.p.Zone == pc.p.Zone
		}
	}
	dc := e.pickDecode(res, top, pc, meanND, boundD)
	if dc == nil {
		return // PDNoDecodePool
	}
	res.Decode, res.DecodeMatched = dc.r.name, dc.matched
	local := max(t-dc.cached, 0)
	if pc == nil {
		res.Outcome, res.Uncached = PDNoPrefillPool, int64(local)
		return
	}
	pq, dq := pc.queue, dc.queue
	if !pc.known {
		pq = meanQP
	}
	if !dc.known {
		dq = meanQD
	}
	if pc.r == dc.r || local < float64(top.SkipBelow) || pq > dq+local {
		res.Outcome, res.Uncached = PDPrefillSkipped, int64(local)
		return
	}
	res.Outcome, res.Prefill, res.PrefillMatched = PDDisaggregated, pc.r.name, pc.matched
	res.Uncached = int64(max(t-pc.cached, 0))
}

// NotePDRouted records a delivered pick for load-aware routing, as
// NoteRouted does for LookupRoute: one request on each replica named, and
// the uncached tokens on the one that prefills (the prefill replica, or the
// decode replica when the hop is skipped). Only replicas with a fresh load
// report keep counts, and only while load-aware routing is enabled.
// Lock-free; res must be the result of the PickPD call being delivered.
func (e *Engine) NotePDRouted(res *PDResult, now int64) {
	if !e.load.Enabled {
		return
	}
	var prefill, decode *replica
	for i := range res.cands {
		c := &res.cands[i]
		if c.r.name == res.Prefill && res.Prefill != "" {
			prefill = c.r
		}
		if c.r.name == res.Decode && res.Decode != "" {
			decode = c.r
		}
	}
	switch {
	case prefill != nil:
		e.noteRoutedReplica(prefill, res.Uncached, now)
		if decode != nil && decode != prefill {
			e.noteRoutedReplica(decode, 0, now)
		}
	case decode != nil:
		e.noteRoutedReplica(decode, res.Uncached, now)
	}
}

// noteRoutedReplica counts one routed request of uncached tokens on r, as
// NoteRouted does for its pick.
func (e *Engine) noteRoutedReplica(r *replica, uncached, now int64) {
	if rec := r.load.report.Load(); rec == nil || now-rec.at >= e.load.MaxAge.Microseconds() {
		return
	}
	u := min(max(uncached, 0), maxRoutedTokens)
	r.load.noteRouted(u)
	if u > 0 {
		r.load.price.observe(float64(u))
	}
}

// pickDecode returns the decode candidate (see the top of pd.go), nil when
// there is none.
func (e *Engine) pickDecode(res *PDResult, top *policy.Topology, pc *pdCand, meanN, bnd float64) *pdCand {
	tier := func(c *pdCand) int {
		if pc == nil {
			return 0
		}
		switch top.Locality {
		case policy.LocalityNode:
			if c.sameNode {
				return 0
			}
			if c.sameZn {
				return 1
			}
			return 2
		case policy.LocalityZone:
			if c.sameZn || c.sameNode {
				return 0
			}
			return 1
		}
		return 0
	}
	var best *pdCand
	var bestTier int
	var bestN float64
	for pass := 0; pass < 2 && best == nil; pass++ {
		for i := range res.cands {
			c := &res.cands[i]
			if !c.decode {
				continue
			}
			n := c.inflight
			if !c.known {
				n = meanN
			}
			c.overD = n > bnd
			if pass == 0 && c.overD {
				continue
			}
			tr := tier(c)
			better := best == nil || tr < bestTier ||
				(tr == bestTier && (n < bestN ||
					(n == bestN && (c.cached > best.cached ||
						(c.cached == best.cached && strings.Compare(c.r.name, best.r.name) < 0)))))
			if better {
				best, bestTier, bestN = c, tr, n
			}
		}
	}
	return best
}
