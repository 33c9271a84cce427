package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"
)

// Load-aware routing (docs/routing.md). The contract ranks replicas by what
// they cache; gateways send the request to the first one, so a replica
// that holds a prefix but has a long queue is still first. The engine keeps
// a live load signal per (tenant, model, replica) and, when loads are
// material, gives a second opinion on the contract's answer:
//
//   - Signal: the engine-reported waiting and running requests (and queued
//     prefill tokens, when an engine exports them) from the kvevent
//     subscriber's metrics scrape (ReplicaStats fields 8-10), plus what
//     this server routed to the replica since that report, minus the
//     prompt tokens KV events show it stored since.
//   - Activation: per (tenant, model), with hysteresis on the reported
//     in-flight requests (waiting + running): on when some replica reports
//     at least MinQueue, off when every fresh report is below half of it.
//     An idle fleet, or one that reports no load at all, gets the
//     contract's answers exactly.
//   - Overload (the herding guard; consistent hashing with bounded loads):
//     a replica is overloaded when its in-flight requests exceed
//     max(Bound × mean + 2√mean, MinQueue).
//   - Cost: an estimate of time to first token in prefill-token units,
//     queue + PrefillWeight × prompt tokens to compute. The contract's pick
//     stands unless it is overloaded, or another option is both cheaper
//     and less loaded; a cached prefix counts in that decision only if it
//     covers MinMatch of the prompt (Preble's exploit rule). The explore
//     walk then takes the cheapest replica counting every cached token.
//   - Weights: PrefillWeight on a replica whose cache is as full as the
//     fullest, less by EvictionShare on one with room (the copy evicts
//     nothing there); cached tokens at their tier's credit; tokens a
//     followed answer sent to a replica and its KV events have not stored
//     yet (routing-time entries, expect.go) at ExpectedCredit.

// Load-aware routing defaults (docs/routing.md).
const (
	DefaultLoadBound         = 1.5
	DefaultLoadMinQueue      = 4
	DefaultLoadPrefillWeight = 16.0
	DefaultLoadMinMatch      = 0.5
	DefaultLoadMaxAge        = 5 * time.Second
	DefaultEvictionShare     = 0.75
)

// LoadConfig configures load-aware routing. The zero value disables it.
type LoadConfig struct {
	// Enabled turns the load-aware second opinion on; off, every answer is
	// the contract's.
	Enabled bool
	// Bound is c of bounded loads: a replica whose in-flight requests
	// exceed max(Bound × the mean, MinQueue) is overloaded.
	Bound float64
	// MinQueue is the in-flight request count at which load starts to
	// matter: the activation threshold (with hysteresis down to half of
	// it) and the floor of the overload bound.
	MinQueue int
	// PrefillWeight is how many queued prefill tokens one uncached prompt
	// token is worth in the cost (>= 1): recomputing a prefix delays this
	// request and everything queued behind it, and evicts other prefixes.
	PrefillWeight float64
	// MinMatch is the share of the prompt a cached prefix must cover to
	// count in the cost (Preble's exploit rule at 0.5: follow a prefix only
	// when it is at least the part still to compute). A shorter match
	// counts as none, so such a request goes where it is cheapest to
	// compute from scratch instead of piling onto whoever holds a small
	// popular piece of it.
	MinMatch float64
	// MaxAge is how long a load report counts; an older one is unknown.
	MaxAge time.Duration
	// ExpectedBytes is the memory of the routing-time entries (expect.go),
	// counted in the index's byte budget; 0 means DefaultExpectedBytes,
	// negative none. With a byte budget (Config.MaxBytes) it is at most an
	// eighth of it.
	ExpectedBytes int64
	// ExpectedTTL is the least time an unconfirmed routing-time entry
	// lives; 0 means DefaultExpectedTTL.
	ExpectedTTL time.Duration
	// ExpectedCredit is what an expected token counts for against a stored
	// one, in (0, 1]; 0 means DefaultExpectedCredit.
	ExpectedCredit float64
	// EvictionShare is the part of PrefillWeight that prices the copy's
	// eviction of other prefixes, in [0, 1): on a replica with fraction f
	// of the largest key count in its domain, one uncached token weighs
	// PrefillWeight × (1 − EvictionShare × (1 − f)), so a replica with room
	// in its cache is a cheaper place to keep new blocks. 0 weighs every
	// replica the same.
	EvictionShare float64
}

// DefaultLoadConfig returns load-aware routing on, with the defaults.
func DefaultLoadConfig() LoadConfig {
	return LoadConfig{Enabled: true, Bound: DefaultLoadBound, MinQueue: DefaultLoadMinQueue,
		PrefillWeight: DefaultLoadPrefillWeight, MinMatch: DefaultLoadMinMatch, MaxAge: DefaultLoadMaxAge,
		ExpectedBytes: DefaultExpectedBytes, ExpectedTTL: DefaultExpectedTTL, ExpectedCredit: DefaultExpectedCredit,
		EvictionShare: DefaultEvictionShare}
}

func (c *LoadConfig) normalize() {
	if !(c.Bound >= 1) || math.IsInf(c.Bound, 0) {
		c.Bound = DefaultLoadBound
	}
	if c.MinQueue < 1 {
		c.MinQueue = DefaultLoadMinQueue
	}
	if !(c.PrefillWeight >= 1) || math.IsInf(c.PrefillWeight, 0) {
		c.PrefillWeight = DefaultLoadPrefillWeight
	}
	if !(c.MinMatch >= 0 && c.MinMatch <= 1) {
		c.MinMatch = DefaultLoadMinMatch
	}
	if c.MaxAge <= 0 {
		c.MaxAge = DefaultLoadMaxAge
	}
	if c.ExpectedBytes == 0 {
		c.ExpectedBytes = DefaultExpectedBytes
	}
	if c.ExpectedTTL <= 0 {
		c.ExpectedTTL = DefaultExpectedTTL
	}
	if !(c.ExpectedCredit > 0 && c.ExpectedCredit <= 1) {
		c.ExpectedCredit = DefaultExpectedCredit
	}
	if !(c.EvictionShare >= 0 && c.EvictionShare < 1) {
		c.EvictionShare = DefaultEvictionShare
	}
}

// LoadStats is the load part of a stats report. A report carries load when
// Reported is set (the producer sent waiting or running requests).
type LoadStats struct {
	Reported bool
	Waiting  int32
	Running  int32
	// QueuedTokens is the prefill work the engine still has queued, in
	// tokens; negative means unknown (estimated from Waiting).
	QueuedTokens int64
}

// loadRecord is an immutable load report.
type loadRecord struct {
	LoadStats
	// at is the server time the report arrived (µs).
	at int64
	// unstored (counts-only reports) is what this server routed to the
	// replica and has not seen stored yet, carried across reports while
	// the engine has requests in flight, up to carriedPerRequest mean
	// requests per request in flight, or of its largest recent request
	// (peak) per request in flight when that is more.
	unstored float64
	// peak (counts-only reports) is the largest request this server routed
	// to the replica while it stayed busy, decaying by peakRoutedDecay per
	// report: in-flight work can be a heavy-tailed prompt several times
	// the mean, and must not be cut to the mean's bound mid-prefill.
	peak float64
	// scheme is the hash scheme the report came with: a replica that
	// reports load for a scheme is a place to compute that scheme's
	// prompts even before it holds any key of it.
	scheme string
}

// ewma is a lock-free exponentially weighted mean (float64 bits; 0 = none).
type ewma struct{ w atomic.Uint64 }

func (m *ewma) load() float64 { return math.Float64frombits(m.w.Load()) }

// observe folds x in. Under contention it gives up after a few attempts: a
// lost sample only delays the mean slightly.
func (m *ewma) observe(x, weight float64) {
	for range 4 {
		w := m.w.Load()
		old := math.Float64frombits(w)
		next := x
		if old > 0 {
			next = old + weight*(x-old)
		}
		if m.w.CompareAndSwap(w, math.Float64bits(next)) {
			return
		}
	}
}

// requestPrice is a replica's estimate of the uncached prompt tokens of
// one request routed to it: what a waiting request costs when its engine
// reports counts only (docs/routing.md, "The price of a waiting
// request"). Its samples are gateways' claims (NoteRouted), and a lookup
// is not a request: retries, hedges and probes are never sent, and a
// prompt can be asked about and never sent. So the estimate is robust:
//
//   - bounded influence: a sample counts at most priceOutlier × the
//     current price (winsorized), so one claim moves it at most
//     (priceOutlier−1) × priceWeight = 15 %;
//   - paid for by KV evidence: every sample spends its size from a token
//     budget that the blocks KV events show the replica newly storing fill
//     (priceRefill tokens per stored token, the budget held to at most
//     priceBudgetPrices current prices); a sample that finds the budget
//     empty is dropped. Requests that are sent get prefilled and store
//     about what they claimed, so their samples find budget (the 8× covers
//     claims that exceed what their prefill stores: the unhashed partial
//     last block, blocks the index did not know the replica held, and a
//     conversation's next turn asked about while its previous turn still
//     waits in the same replica's queue, which claims the whole history);
//     lookups that are never sent store nothing, so however many there
//     are, between two stores their samples spend at most the budget. The
//     first sample, with no price yet, counts at most the budget: 8× what
//     the replica was seen storing.
//
// Dropping a sample depends only on the budget's sign, never on the
// sample's size, so real traffic that outruns the budget for a moment
// (a burst routed before any of it is prefilled) loses samples without
// biasing the price.
type requestPrice struct {
	// mean is the price in tokens (lock-free; 0 = none yet).
	mean ewma
	// budget is the tokens samples may still spend: filled under
	// Engine.mu by stored blocks, spent by lookups (CAS). It may exceed
	// priceBudgetPrices prices while there is no price yet or after the
	// price fell; spending reads it clamped.
	budget atomic.Int64
}

// Price estimator knobs (requestPrice).
const (
	priceWeight       = 0.05
	priceOutlier      = 4
	priceRefill       = 8
	priceBudgetPrices = 16
	// maxPriceBudget keeps the budget far from overflow.
	maxPriceBudget = 1 << 50
)

func (p *requestPrice) load() float64 { return p.mean.load() }

// observe spends x (winsorized) from the budget and folds it into the
// price, or drops it when the budget is empty. Lock-free.
func (p *requestPrice) observe(x float64) {
	for range 4 {
		have := p.budget.Load()
		m := p.mean.load()
		b := have
		if m > 0 {
			b = min(b, int64(priceBudgetPrices*m))
		}
		if b <= 0 {
			return
		}
		s := min(x, float64(b))
		if m > 0 {
			s = min(x, priceOutlier*m)
		}
		if p.budget.CompareAndSwap(have, b-int64(math.Ceil(s))) {
			p.mean.observe(s, priceWeight)
			return
		}
	}
}

// refillLocked adds the evidence of tokens newly stored on the replica.
// Called under Engine.mu; lookups spend concurrently, so it adds rather
// than stores, and the cap applies when a sample spends.
func (p *requestPrice) refillLocked(tokens int64) {
	if tokens > 0 && p.budget.Load() < maxPriceBudget {
		p.budget.Add(priceRefill * tokens)
	}
}

// replicaLoad is a replica's load-routing state; it is embedded in replica.
type replicaLoad struct {
	// report is the last load report, nil when the replica never reported
	// load (or its stats were cleared). Replaced, never mutated, under
	// Engine.mu.
	report atomic.Pointer[loadRecord]
	// routedReqs and routedTokens count what this server routed to the
	// replica since its last report (requests, and their uncached prompt
	// tokens): lookups add, the next report resets them. Lock-free.
	routedReqs, routedTokens atomic.Int64
	// routedPeak is the largest single request (uncached tokens) routed
	// there since its last report: what lets the report carry a prompt
	// many times the mean across its prefill. Lock-free (a lost race
	// keeps a smaller peak, never a wrong count).
	routedPeak atomic.Int64
	// price is the mean uncached prompt tokens of a request routed to the
	// replica; it prices waiting requests when the engine does not report
	// queued tokens. Lookups sample it, stored blocks pay for the samples.
	price requestPrice
	// stored counts the prompt tokens of blocks the replica newly stored
	// since its last report: KV events arrive as each prefill completes,
	// so they drain the reported queue between reports. Written under
	// Engine.mu, read by lookups.
	stored atomic.Int64
	// What an endpoint picker in this process saw (RequestStarted,
	// RequestFinished): live is how many of its requests are in flight on
	// the replica now (never negative once read through liveNow); started
	// and finished count its starts and ends since the replica's last load
	// report, which resets them. Lock-free; the report's reset and its
	// reconciliation of live run under Engine.mu.
	live, started, finished atomic.Int64

	// peakKeys is the replica's recent high-water mark of keys held in the
	// domain, taken at each load report and decaying by peakKeysDecay per
	// report: how full its cache runs. The live key count dips while a
	// prefill is in progress (the engine evicted for it, and stores its
	// blocks only when it completes), which is not room. Written under
	// Engine.mu, read by lookups.
	peakKeys atomic.Int64

	// speed is the replica's prefill speed as its KV events show it (tokens
	// newly stored per µs between two load reports while it had requests
	// in flight): how fast its queue drains. Written under Engine.mu, read
	// by lookups.
	speed ewma

	// Writer state (Engine.mu): newHolders counts keys the replica newly
	// came to hold, and blockTokens is its last seen block size, which
	// prices a new legacy entry whose predecessor is not in the update.
	newHolders  int64
	blockTokens int32
}

// peakKeysDecay is how much of a replica's key high-water mark one load
// report keeps: a dip of a few seconds' prefills is not room, a cleared
// cache is room again within minutes.
const peakKeysDecay = 0.995

// speedWeight is the weight of one report interval in the prefill speed.
const speedWeight = 0.1

// maxRoutedTokens caps what one routed request adds to a replica's queue
// estimate (the longest prompt a lookup resolves, rpc.MaxLookupTokens).
const (
	maxRoutedTokens = 1 << 20
	// carriedPerRequest bounds the routed-but-unstored work a counts-only
	// report carries, in mean requests per request in flight.
	carriedPerRequest = 8
	// peakRoutedDecay is how much of its largest routed request a busy
	// replica's carried work may still hold after one report: a real
	// prefill of the largest prompt (seconds) stays covered, work that
	// never arrived fades within a minute or two.
	peakRoutedDecay = 0.95
)

// applyLoadLocked stores a load report for r (of domain d). Called by
// Ingest under mu.
func (e *Engine) applyLoadLocked(d *domain, r *replica, ls LoadStats, scheme string, now int64) {
	rec := &loadRecord{LoadStats: ls, at: now, scheme: scheme}
	rec.Waiting, rec.Running = max(rec.Waiting, 0), max(rec.Running, 0)
	prev := r.load.report.Load()
	// What was routed, and stored, before the engine's scrape is in its
	// counts now.
	routed := r.load.routedTokens.Swap(0)
	r.load.routedReqs.Store(0)
	routedPeak := r.load.routedPeak.Swap(0)
	stored := r.load.stored.Swap(0)
	if prev != nil && now > prev.at && (prev.Waiting > 0 || prev.Running > 0) && stored > 0 {
		// The replica was busy since its previous report: what it stored
		// meanwhile is what it prefilled.
		r.load.speed.observe(float64(stored)/float64(now-prev.at), speedWeight)
	}
	keys := r.keys.Load()
	r.load.peakKeys.Store(max(keys, int64(float64(r.load.peakKeys.Load())*peakKeysDecay)))
	// So is every request a picker here started and ended before it.
	started := r.load.started.Swap(0)
	r.load.finished.Store(0)
	// The picker's live count cannot exceed what the engine reports in
	// flight plus what started since the last report (which the scrape
	// may have missed): a lost RequestFinished makes a replica look busy
	// until its next report at most.
	if bound := int64(rec.Waiting) + int64(rec.Running) + started; r.load.live.Load() > bound {
		for range 4 { // pickers move it concurrently; a lost race waits for the next report
			if l := r.load.live.Load(); l <= bound || r.load.live.CompareAndSwap(l, bound) {
				break
			}
		}
	}
	if rec.QueuedTokens < 0 && prev != nil && (rec.Waiting > 0 || rec.Running > 0) {
		// Counts only: keep what this server routed there and has not yet
		// seen stored (a prefill in progress is "running", not waiting),
		// but never more than carriedPerRequest mean requests per request
		// in flight: routed work can vanish without new keys (the gateway
		// sent it elsewhere, it hit blocks the index did not know, it was
		// cancelled), while prompt sizes are heavy-tailed enough that one
		// request in prefill can be several times the mean.
		rec.peak = max(float64(routedPeak), prev.peak*peakRoutedDecay)
		per := max(carriedPerRequest*meanRequestTokens(d.replicaSlots()), rec.peak)
		limit := (float64(rec.Waiting) + float64(rec.Running)) * per
		rec.unstored = min(max(prev.unstored+float64(routed-stored), 0), limit)
	}
	r.load.report.Store(rec)
}

// meanRequestTokens is the mean uncached size of the requests routed to a
// domain's replicas (the mean of their means): one price for a waiting
// request across the domain, so equal engine figures give equal queues.
func meanRequestTokens(slots []*replica) float64 {
	var sum float64
	n := 0
	for _, r := range slots {
		if r == nil {
			continue
		}
		if m := r.load.price.load(); m > 0 {
			sum += m
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// updateActivationLocked applies the hysteresis: on when some fresh report
// has at least MinQueue requests in flight, off when all are below half.
func (e *Engine) updateActivationLocked(d *domain, now int64) {
	cfg := &e.load
	maxAge := cfg.MaxAge.Microseconds()
	peak := int64(0)
	for _, r := range d.replicaSlots() {
		if r == nil {
			continue
		}
		if rec := r.load.report.Load(); rec != nil && now-rec.at < maxAge {
			peak = max(peak, int64(rec.Waiting)+int64(rec.Running))
		}
	}
	switch on := d.loadActive.Load(); {
	case !on && peak >= int64(cfg.MinQueue):
		d.loadActive.Store(true)
	case on && 2*peak < int64(cfg.MinQueue):
		d.loadActive.Store(false)
	}
}

// loadEntry is one serving replica's load as a lookup sees it.
type loadEntry struct {
	// r is the replica (its slot may be freed after the view is taken;
	// the view keeps what it read).
	r   *replica
	rid uint16
	// known is false when the replica has no fresh load report; serving
	// is false for a replica that reports load for the scheme but holds
	// none of its keys (it is not on the affinity ring).
	known, serving bool
	overloaded     bool
	// queue is the estimated prefill work ahead (tokens); inflight the
	// requests in flight, both including what was routed since the report.
	queue, inflight float64
	// alpha is the weight of one uncached token there (PrefillWeight,
	// less the eviction share its cache's room saves), for at most room
	// tokens (the keys its cache holds fewer than the fullest one's, at
	// the request's block size; +Inf without a share, or with some room
	// when the lookup names no chain): past those, its blocks evict there
	// too.
	alpha, room float64
	// cached is the request's expected cached tokens there (matched, not
	// weighed by freshness; 0 when the replica holds none of its prefix),
	// set by AdviseByLoad for the explore walk, tier credits and expected
	// tokens included.
	cached float64
	// expected is set when cached includes a routing-time entry.
	expected bool
}

// loadView is a lookup's picture of a scheme's serving replicas' loads, in
// LookupResult scratch. pos maps a replica id to its entry (+1; 0 = none).
type loadView struct {
	active  bool
	entries []loadEntry
	pos     []uint16
	// qref is the least queue among known, not overloaded replicas: the
	// queue of the best replica to send a cold request to.
	qref float64
	// tokens is the request's prompt tokens (AdviseByLoad), for the explore
	// walk's costs.
	tokens float64
	// weight is the prefill weight, what a token past an entry's room
	// costs (evaluateLoad).
	weight float64
	// expRid is the replica of a LoadExpected decision (hasExp).
	expRid uint16
	hasExp bool
}

// exploreCost is entry en's cost in the explore walk: queue plus the
// weighted prompt tokens it would compute, every expected cached token
// counted (Preble's explore step: the least loaded, counting what little
// each replica caches).
func (v *loadView) exploreCost(en *loadEntry) float64 {
	return en.queue + v.compute(en, max(v.tokens-en.cached, 0))
}

// compute is the weighted cost of computing u prompt tokens on en's
// replica: alpha each for the first room tokens, the full prefill weight
// past them (a prompt larger than a cache's room evicts there as well).
func (v *loadView) compute(en *loadEntry, u float64) float64 {
	free := min(u, en.room)
	return en.alpha*free + v.weight*(u-free)
}

// inflightOf is replica rid's requests in flight, 0 when it has no entry.
func (v *loadView) inflightOf(rid uint16) float64 {
	if en := v.entry(rid); en != nil {
		return en.inflight
	}
	return 0
}

func (v *loadView) entry(rid uint16) *loadEntry {
	if int(rid) < len(v.pos) && v.pos[rid] != 0 {
		return &v.entries[v.pos[rid]-1]
	}
	return nil
}

// evaluateLoad fills res.lv for the serving replicas of the lookup's
// scheme. It reports whether load-awareness is active for the lookup: on
// for the domain, and at least one serving replica has a fresh load report.
func (e *Engine) evaluateLoad(sch *scheme, now int64, res *LookupResult) bool {
	lv := &res.lv
	lv.active, lv.hasExp = false, false
	lv.entries = lv.entries[:0]
	d := res.d
	if !e.load.Enabled || d == nil || sch == nil || !d.loadActive.Load() {
		return false
	}
	slots := d.replicaSlots()
	if cap(lv.pos) < len(slots) {
		lv.pos = make([]uint16, len(slots))
	}
	lv.pos = lv.pos[:len(slots)]
	clear(lv.pos)
	maxAge := e.load.MaxAge.Microseconds()
	per := meanRequestTokens(slots)
	var sumQ, sumN float64
	known := 0
	add := func(r *replica, serving bool) {
		en := loadEntry{r: r, rid: r.id, serving: serving}
		if rec := r.load.report.Load(); rec != nil && now-rec.at < maxAge {
			en.known = true
			en.queue = rec.estimate(r, per)
			en.inflight = r.load.inFlight(rec)
			sumQ += en.queue
			sumN += en.inflight
			known++
		}
		lv.entries = append(lv.entries, en)
		lv.pos[r.id] = uint16(len(lv.entries))
	}
	for _, id := range sch.serving.Load().ids {
		if int(id) < len(slots) && slots[id] != nil {
			add(slots[id], true)
		}
	}
	for _, r := range slots {
		if r == nil || lv.pos[r.id] != 0 {
			continue
		}
		if rec := r.load.report.Load(); rec != nil && now-rec.at < maxAge && rec.scheme == sch.name {
			add(r, false)
		}
	}
	if known == 0 {
		return false
	}
	// A replica without a fresh report counts as average: it is neither
	// preferred nor avoided.
	meanQ, meanN := sumQ/float64(known), sumN/float64(known)
	bound := max(e.load.Bound*meanN+2*math.Sqrt(meanN), float64(e.load.MinQueue))
	lv.qref, lv.weight = math.Inf(1), e.load.PrefillWeight
	var maxKeys int64
	for i := range lv.entries {
		maxKeys = max(maxKeys, lv.entries[i].r.occupancy())
	}
	for i := range lv.entries {
		en := &lv.entries[i]
		if !en.known {
			en.queue, en.inflight = meanQ, meanN
		}
		en.alpha, en.room = e.load.PrefillWeight, math.Inf(1)
		if s := e.load.EvictionShare; s > 0 && maxKeys > 0 {
			occ := min(en.r.occupancy(), maxKeys)
			f := float64(occ) / float64(maxKeys)
			en.alpha *= 1 - s*(1-f)
			en.room = float64(maxKeys - occ) // in blocks until AdviseByLoad
		}
		en.overloaded = en.inflight > bound
		if !en.overloaded {
			lv.qref = min(lv.qref, en.queue)
		}
	}
	if math.IsInf(lv.qref, 1) { // everyone overloaded: compare against the least queue
		for i := range lv.entries {
			lv.qref = min(lv.qref, lv.entries[i].queue)
		}
	}
	lv.active = true
	return true
}

// LoadDecision is what load-aware routing makes of the contract's answer.
type LoadDecision uint8

const (
	// LoadKeep: the contract's answer stands.
	LoadKeep LoadDecision = iota
	// LoadRerank: res.Scores now hold the load-aware PREFIX_MATCH ranking
	// (best first; the caller applies the routing floor to it).
	LoadRerank
	// LoadExplore: no holder is worth its queue; the request should go
	// where it is cheapest to compute cold (AffinityPick in AffinityExplore mode).
	LoadExplore
	// LoadExpected: the replica a routing-time entry expects the prompt on
	// should get it (ExpectedPick); the answer is AFFINITY_HINT-shaped.
	LoadExpected
)

// ContractPick is the first replica of the contract's answer: the top
// PREFIX_MATCH score, or the AFFINITY_HINT pin.
type ContractPick struct {
	Has bool
	rid uint16
}

// PickOfScore returns the contract pick of a ranked score.
func PickOfScore(s *Score) ContractPick { return ContractPick{Has: true, rid: s.rid} }

// AdviseByLoad is load-aware routing's second opinion on a lookup's
// contract answer (docs/routing.md). res is the result of LookupRoute for
// req, with res.Scores the PREFIX_MATCH candidates left after the
// matched-tokens floor (possibly none); pick is the contract's first
// replica; tokens are the request's prompt tokens. It keeps the contract's
// answer unless load-awareness is active and the pick is overloaded, or
// another option has both a shorter queue and a lower cost (queue +
// PrefillWeight × uncached tokens), or one as cheap with no longer a queue
// has at least one request fewer in flight. A replica the request's chain is
// expected on (routing-time entries, expect.go) counts its expected tokens
// at ExpectedCredit, and stands in for the pick when it expects more of
// the prompt than the pick holds. It allocates nothing.
func (e *Engine) AdviseByLoad(req *LookupRequest, now int64, res *LookupResult, pick ContractPick, tokens int64) LoadDecision {
	if !pick.Has || res.d == nil {
		return LoadKeep
	}
	if !e.evaluateLoad(res.sch, now, res) {
		return LoadKeep
	}
	lv := &res.lv
	cp := lv.entry(pick.rid)
	if cp == nil {
		return LoadKeep
	}
	t := float64(tokens)
	lv.tokens = t
	// The caches' room in tokens, at the request's own block size (keys
	// are blocks of its scheme); any room is unbounded when the lookup
	// names no chain (no block size to convert with).
	perBlock := math.Inf(1)
	if n := len(req.BlockHashes); n > 0 {
		perBlock = t / float64(n)
	}
	for i := range lv.entries {
		if en := &lv.entries[i]; en.room > 0 && !math.IsInf(en.room, 1) {
			en.room *= perBlock
		}
	}
	maxRun := 0
	for i := range res.Scores {
		s := &res.Scores[i]
		if en := lv.entry(s.rid); en != nil {
			// Not × freshness (s.Prob): engines report no event when a
			// block hits, so the hottest prefix ages like a cold one, and
			// between replicas that all hold it, age would outweigh their
			// loads. An entry still indexed is held until its eviction
			// event or TTL.
			en.cached = float64(s.MatchedTokens) * tierCredit(s.Tier)
		}
		maxRun = max(maxRun, int(s.run))
	}
	// The routing-time entry: the replica the chain was last sent to, if
	// it expects more of the prompt than it stores.
	var xp *loadEntry
	if rid, blocks, ok := e.expectedMatch(res.sch, req.BlockHashes, maxRun, now); ok {
		if en := lv.entry(rid); en != nil {
			exp := float64(chainTokens64(req.BlockTokenCounts[:min(blocks, len(req.BlockTokenCounts))]))
			if exp > en.cached {
				en.cached += e.load.ExpectedCredit * (exp - en.cached)
				en.expected = true
				xp = en
			}
		}
	}
	// The pick the decision defends: the contract's, or the replica that
	// expects more of the prompt than the contract's pick holds.
	vp := cp
	if xp != nil && xp.cached > cp.cached {
		vp = xp
	}
	pickCost := lv.cost(&e.load, vp)
	// The options: every holder that is not overloaded, the expected
	// replica, and computing the prompt cold on the least-loaded replica.
	// The pick stands unless it is overloaded or some option, not only the
	// cheapest, is both cheaper and has a shorter queue, or as cheap, with
	// no longer a queue and fewer requests in flight.
	// Computing cold: the cheapest replica that is not overloaded.
	exploreCost := math.Inf(1)
	for i := range lv.entries {
		if en := &lv.entries[i]; !en.overloaded {
			exploreCost = min(exploreCost, en.queue+lv.compute(en, t))
		}
	}
	if math.IsInf(exploreCost, 1) {
		exploreCost = lv.qref + e.load.PrefillWeight*t
	}
	yield := vp.overloaded || (exploreCost < pickCost && lv.qref < vp.queue)
	var best *loadEntry
	bestCost := 0.0
	consider := func(en *loadEntry) {
		if en == nil || en.overloaded {
			return
		}
		c := lv.cost(&e.load, en)
		if c < pickCost && en.queue < vp.queue {
			yield = true
		}
		// As cheap, no longer a queue, and at least one request fewer in
		// flight: the same prefill runs beside fewer decodes.
		if c <= pickCost && en.queue <= vp.queue && en.inflight+1 <= vp.inflight {
			yield = true
		}
		if best == nil || c < bestCost || (c == bestCost && en.inflight < best.inflight) {
			best, bestCost = en, c
		}
	}
	for i := range res.Scores {
		consider(lv.entry(res.Scores[i].rid))
	}
	if xp != nil && !xp.holder(res) {
		consider(xp)
	}
	if !yield {
		if vp != cp {
			lv.expRid, lv.hasExp = vp.rid, true
			return LoadExpected
		}
		return LoadKeep
	}
	// The answer is then the cheapest option: the re-ranked holders when
	// the best of them beats computing cold, else the explore walk (which
	// finds the expected replica when it is the cheapest).
	if best == nil || bestCost >= exploreCost || !best.holder(res) {
		return LoadExplore
	}
	e.rerankByLoad(res, t, exploreCost, vp.rid)
	return LoadRerank
}

// tierCredit is what a token held in tier counts for (Dynamo's 1.0, 0.75
// and 0.25 for device, host and remote memory): a block held only in
// offload memory must be loaded back before it saves prefill.
func tierCredit(t Tier) float64 {
	switch t {
	case TierT2:
		return 0.75
	case TierT3, tierUnknown, tierInvalid:
		return 0.25
	}
	return 1
}

// chainTokens64 sums a chain's token counts in 64 bits.
func chainTokens64(counts []int32) int64 {
	var n int64
	for _, c := range counts {
		n += int64(max(c, 0))
	}
	return n
}

// cost is en's cost in the decision: queue + PrefillWeight × the prompt
// tokens it would compute, its expected cached tokens counted only when
// they cover MinMatch of the prompt.
func (v *loadView) cost(c *LoadConfig, en *loadEntry) float64 {
	m := en.cached
	if m < c.MinMatch*v.tokens {
		m = 0
	}
	return en.queue + v.compute(en, max(v.tokens-m, 0))
}

// holder reports whether en is among res.Scores (it stores part of the
// prompt).
func (en *loadEntry) holder(res *LookupResult) bool {
	for i := range res.Scores {
		if res.Scores[i].rid == en.rid {
			return true
		}
	}
	return false
}

// ExpectedPick returns the replica AdviseByLoad chose for its routing-time
// entry (LoadExpected): its name and pick.
func (e *Engine) ExpectedPick(res *LookupResult) (string, ContractPick, bool) {
	lv := &res.lv
	if !lv.active || !lv.hasExp {
		return "", ContractPick{}, false
	}
	en := lv.entry(lv.expRid)
	if en == nil {
		return "", ContractPick{}, false
	}
	return en.r.name, ContractPick{Has: true, rid: en.rid}, true
}

// rerankByLoad rescores res.Scores by their advantage over the explore
// option: how many prefill-token equivalents sending the request there
// saves compared with computing it cold on the least-loaded replica
// (exploreCost − cost), clamped at 0; overloaded replicas score 0. Unlike
// the decision, the advantage counts every expected cached token, MinMatch
// or not: a short match does not justify a longer queue, but among
// replicas about as loaded it still saves prefill. Equal scores go to
// fewer requests in flight, then in name order starting at from (the pick
// the decision defended), so equal options spread the way the contract's
// pins do rather than all going to the first name; scores stay monotone in
// the returned order.
func (e *Engine) rerankByLoad(res *LookupResult, tokens, exploreCost float64, from uint16) {
	lv := &res.lv
	rt := res.d.table()
	n, start := len(rt.rank), int(rt.rank[from])
	ring := func(rid uint16) int { return (int(rt.rank[rid]) - start + n) % n } // distance from the pick
	keys := res.keys[:0]
	for i := range res.Scores {
		s := &res.Scores[i]
		adv := 0.0
		if en := lv.entry(s.rid); en != nil && !en.overloaded {
			adv = exploreCost - (en.queue + lv.compute(en, max(tokens-en.cached, 0)))
		}
		s.Score = float32(max(adv, 0))
		keys = append(keys, uint64(descFloat32(s.Score))<<32|uint64(ring(s.rid))<<16|uint64(i))
	}
	slices.Sort(keys)
	res.keys = keys
	sorted := res.sorted[:0]
	for _, k := range keys {
		sorted = append(sorted, res.Scores[uint16(k)])
	}
	res.sorted = sorted
	copy(res.Scores, sorted)
	// Within a run of equal scores (already in ring order), fewer requests
	// in flight first: a stable insertion sort, as such runs are short.
	for i := 1; i < len(res.Scores); i++ {
		if res.Scores[i].Score != res.Scores[i-1].Score {
			continue // the common case: no tie, no lookups
		}
		x := res.Scores[i]
		nx := lv.inflightOf(x.rid)
		j := i
		for ; j > 0 && res.Scores[j-1].Score == x.Score && lv.inflightOf(res.Scores[j-1].rid) > nx; j-- {
			res.Scores[j] = res.Scores[j-1]
		}
		res.Scores[j] = x
	}
}

// AffinityMode selects how AffinityPick chooses on the affinity ring.
type AffinityMode uint8

const (
	// AffinityContract is the contract's pick (§3.8).
	AffinityContract AffinityMode = iota
	// AffinityExplore walks the ring from the contract's pick to the first
	// replica that is not overloaded and has the least explore cost (queue
	// + PrefillWeight × the prompt tokens it would compute, every expected
	// cached token counted; Preble's explore step), using the loads
	// AdviseByLoad evaluated into res. Ties go to fewer requests in flight,
	// then keep ring order, so with equal loads and nothing cached the pick
	// is the contract's, and an overloaded replica's keys move to the next
	// replica in ring order.
	AffinityExplore
	// AffinityExpected is the replica AdviseByLoad chose for a routing-time
	// entry (it returned LoadExpected), else the contract's pick.
	AffinityExpected
)

// AffinityPick is AffinityHint with load awareness: it returns the chosen
// replica and its pick. In AffinityExplore mode it needs res to hold the
// load view of the same lookup (AdviseByLoad returned LoadExplore);
// otherwise it falls back to the contract's pick.
func (e *Engine) AffinityPick(res *LookupResult, tenant, model, scheme string, seed []byte, mode AffinityMode) (string, ContractPick, bool) {
	if len(seed) == 0 || scheme == "" {
		return "", ContractPick{}, false
	}
	d, sch := e.affinityScope(res, tenant, model, scheme)
	if sch == nil {
		return "", ContractPick{}, false
	}
	ss := sch.serving.Load()
	n := len(ss.names)
	if n == 0 {
		return "", ContractPick{}, false
	}
	if mode == AffinityExpected && res != nil && res.d == d {
		if name, pick, ok := e.ExpectedPick(res); ok {
			return name, pick, true
		}
	}
	sum := sha256.Sum256(seed)
	start := int(binary.BigEndian.Uint64(sum[:8]) % uint64(n))
	if mode == AffinityExplore && res != nil && res.lv.active && res.d == d {
		lv := &res.lv
		least, leastN := math.Inf(1), math.Inf(1)
		for i := range lv.entries {
			en := &lv.entries[i]
			if en.overloaded {
				continue
			}
			if c := lv.exploreCost(en); c < least {
				least, leastN = c, en.inflight
			} else if c == least {
				leastN = min(leastN, en.inflight)
			}
		}
		for k := range n {
			i := (start + k) % n
			en := lv.entry(ss.byName[i])
			if en == nil || (!en.overloaded && lv.exploreCost(en) <= least && en.inflight <= leastN) {
				return ss.names[i], ContractPick{Has: true, rid: ss.byName[i]}, true
			}
		}
		// The least cost is off the ring: a replica that reports load for
		// the scheme but holds none of its keys yet. Take the first of
		// those by name.
		best := -1
		for i := range lv.entries {
			en := &lv.entries[i]
			if en.serving || en.overloaded || lv.exploreCost(en) > least || en.inflight > leastN {
				continue
			}
			if best < 0 || en.r.name < lv.entries[best].r.name {
				best = i
			}
		}
		if best >= 0 {
			en := &lv.entries[best]
			return en.r.name, ContractPick{Has: true, rid: en.rid}, true
		}
	}
	return ss.names[start], ContractPick{Has: true, rid: ss.byName[start]}, true
}

// affinityScope finds (tenant, model, scheme), reusing what res's lookup
// already found when it was for the same scope.
func (e *Engine) affinityScope(res *LookupResult, tenant, model, scheme string) (*domain, *scheme) {
	if res != nil && res.sch != nil && res.d.tenant == tenant && res.d.model == model && res.sch.name == scheme {
		return res.d, res.sch
	}
	d := e.lookupDomain(tenant, model)
	if d == nil {
		return nil, nil
	}
	return d, d.findScheme(scheme)
}

// NoteRouted records that the request res answered was routed to pick
// (the first replica of the delivered answer), with uncached prompt tokens
// still to prefill there. Only replicas that report load keep the count,
// and only while load-aware routing is enabled. Lock-free.
func (e *Engine) NoteRouted(res *LookupResult, pick ContractPick, uncached int64, now int64) {
	if !e.load.Enabled || !pick.Has || res.d == nil {
		return
	}
	slots := res.d.replicaSlots()
	if int(pick.rid) >= len(slots) || slots[pick.rid] == nil {
		return
	}
	r := slots[pick.rid]
	if rec := r.load.report.Load(); rec == nil || now-rec.at >= e.load.MaxAge.Microseconds() {
		return // no fresh report to count against
	}
	// The gateway's token counts are its own claim: one request adds at
	// most maxRoutedTokens, so no client can make a replica look busy for
	// longer than its next report.
	u := min(max(uncached, 0), maxRoutedTokens)
	r.load.noteRouted(u)
	r.load.price.observe(float64(u))
}

// noteRouted counts one routed request of u uncached tokens.
func (l *replicaLoad) noteRouted(u int64) {
	l.routedReqs.Add(1)
	l.routedTokens.Add(u)
	for range 4 { // concurrent lookups race; a lost race keeps a smaller peak
		if p := l.routedPeak.Load(); u <= p || l.routedPeak.CompareAndSwap(p, u) {
			break
		}
	}
}

// RequestStarted records that an endpoint picker in this process sent a
// request of (tenant, model) to replica replicaID; RequestFinished, that
// the request ended (its response completed, failed or was cancelled).
// They make the replica's requests in flight exact between load reports
// (docs/routing.md, "What a picker sees"). The picker calls them once per
// request, off the lookup path: both are lock-free and allocate nothing.
// An unknown tenant, model or replica (one the index has no record of) is
// a no-op, so ids taken from requests cannot grow memory; so is everything
// while load-aware routing is off. now is the call's time (µs), as on
// every engine entry point; the counts are exact and need no clock.
func (e *Engine) RequestStarted(tenant, model, replicaID string, now int64) {
	r := e.pickedReplica(tenant, model, replicaID)
	if r == nil {
		return
	}
	r.load.live.Add(1)
	r.load.started.Add(1)
	// The lookup that chose the replica counted this request as routed
	// (NoteRouted); now that it is known to be sent it counts as started,
	// once: take one out of the routed count, if there is one (a lookup
	// whose request is never sent keeps counting until the next report).
	// The tokens it routed stay in the queue estimate.
	for range 4 {
		n := r.load.routedReqs.Load()
		if n <= 0 || r.load.routedReqs.CompareAndSwap(n, n-1) {
			break
		}
	}
}

// RequestFinished: see RequestStarted. A finish without a start this
// process counted (the replica was unknown then, or its record was
// recreated) leaves the live count at zero, never below.
func (e *Engine) RequestFinished(tenant, model, replicaID string, now int64) {
	r := e.pickedReplica(tenant, model, replicaID)
	if r == nil {
		return
	}
	if r.load.live.Add(-1) < 0 {
		// Undo rather than loop: readers clamp at zero meanwhile.
		r.load.live.Add(1)
	}
	r.load.finished.Add(1)
}

// pickedReplica finds the replica a picker's call names, without locks.
func (e *Engine) pickedReplica(tenant, model, replicaID string) *replica {
	if !e.load.Enabled {
		return nil
	}
	d := e.lookupDomain(tenant, model)
	if d == nil {
		return nil
	}
	return d.table().find(replicaID)
}

// occupancy is how full the replica's cache runs, in keys: the live count
// or the recent high-water mark, whichever is larger.
func (r *replica) occupancy() int64 { return max(r.keys.Load(), r.load.peakKeys.Load()) }

// liveNow is the picker's live count, never negative.
func (l *replicaLoad) liveNow() int64 { return max(l.live.Load(), 0) }

// inFlight is the replica's requests in flight as routing sees them: what
// the engine reported, plus what this server routed and a picker here
// started since, minus what the picker saw end since; and never fewer than
// the picker's own live requests (every pod's picker sees only its own
// requests, and all of them see the engine's reports).
func (l *replicaLoad) inFlight(rec *loadRecord) float64 {
	n := int64(rec.Waiting) + int64(rec.Running) + l.routedReqs.Load() + l.started.Load() - l.finished.Load()
	return float64(max(n, l.liveNow(), 0))
}

// RoutedCachedAt is how much of req's prompt pick will not compute when the
// request reaches it: the tokens it stores (res), or, when req's chain is
// expected there (a routing-time entry: an earlier turn was sent there and
// is not stored yet), the tokens of the expected run, which the request
// queues behind. Counting those as uncached would count the earlier
// turn's prefill twice in the queue estimate (NoteRouted). Call it before
// NoteFollowed records req's own chain. Lock-free, no allocation.
func (e *Engine) RoutedCachedAt(req *LookupRequest, res *LookupResult, pick ContractPick, now int64) int64 {
	var cached int64
	run := 0
	for i := range res.Scores {
		if s := &res.Scores[i]; s.rid == pick.rid {
			cached, run = int64(s.MatchedTokens), int(s.run)
			break
		}
	}
	if e.load.Enabled && pick.Has && res.sch != nil {
		if rid, blocks, ok := e.expectedMatch(res.sch, req.BlockHashes, run, now); ok && rid == pick.rid {
			cached = max(cached, chainTokens64(req.BlockTokenCounts[:min(blocks, len(req.BlockTokenCounts))]))
		}
	}
	return cached
}

// noteStoredLocked adds to r's stored tokens what one ingested entry newly
// stored, blockTokens per newly held key (0 when unknown: nothing is
// counted). Called under mu after the entry was written, with the
// replica's newHolders from before.
func (r *replica) noteStoredLocked(before int64, blockTokens int32) {
	if blockTokens > 0 {
		r.load.blockTokens = blockTokens
	}
	if r.load.newHolders == before || blockTokens <= 0 {
		return
	}
	t := int64(blockTokens) * (r.load.newHolders - before)
	r.load.price.refillLocked(t)
	if r.load.report.Load() != nil {
		r.load.stored.Add(t)
	}
}

// LoadView is one replica's load as /snapshot and the metrics show it.
type LoadView struct {
	Tenant, Model, Replica string
	Waiting, Running       int32
	// QueuedTokens is the engine's figure; negative when it sent none.
	QueuedTokens int64
	// RoutedSinceReport counts requests routed there since the report
	// and not (yet) known to have started.
	RoutedSinceReport int64
	// StartedSinceReport and FinishedSinceReport count the requests a
	// picker in this process started and saw end there since the report;
	// Live is how many of its requests are in flight there now.
	StartedSinceReport, FinishedSinceReport, Live int64
	// InFlight is the requests in flight as load-aware routing sees them.
	InFlight float64
	// QueueTokens is the current estimate of prefill work ahead (tokens).
	QueueTokens float64
	// ReportedAt is the server time of the report (µs); Fresh is false
	// once it is older than LoadConfig.MaxAge.
	ReportedAt int64
	Fresh      bool
}

// Loads calls fn for every replica (reserved tenant excluded) that
// reported load, with the figures a lookup at now would use. It reads
// without locks.
func (e *Engine) Loads(now int64, fn func(LoadView)) {
	maxAge := e.load.MaxAge.Microseconds()
	if maxAge <= 0 {
		maxAge = DefaultLoadMaxAge.Microseconds()
	}
	e.domains.Range(func(_ domainKey, d *domain) bool {
		if d.reserved {
			return true
		}
		slots := d.replicaSlots()
		per := meanRequestTokens(slots)
		for _, r := range slots {
			if r == nil {
				continue
			}
			rec := r.load.report.Load()
			if rec == nil {
				continue
			}
			fn(LoadView{
				Tenant: d.tenant, Model: d.model, Replica: r.name,
				Waiting: rec.Waiting, Running: rec.Running, QueuedTokens: rec.QueuedTokens,
				RoutedSinceReport:   r.load.routedReqs.Load(),
				StartedSinceReport:  r.load.started.Load(),
				FinishedSinceReport: r.load.finished.Load(),
				Live:                r.load.liveNow(),
				InFlight:            r.load.inFlight(rec),
				QueueTokens:         rec.estimate(r, per),
				ReportedAt:          rec.at,
				Fresh:               now-rec.at < maxAge,
			})
		}
		return true
	})
}

// estimate is the prefill work ahead of a new request on r now: the
// reported queue (QueuedTokens, or for counts-only reports the waiting
// requests at per tokens each, or what was routed and not yet stored if
// more), plus what was routed since the report, minus the prefills KV
// events say completed since.
func (rec *loadRecord) estimate(r *replica, per float64) float64 {
	q := float64(rec.QueuedTokens)
	if rec.QueuedTokens < 0 {
		q = max(float64(rec.Waiting)*per, rec.unstored)
	}
	return max(q+float64(r.load.routedTokens.Load()-r.load.stored.Load()), 0)
}

// Validate reports the first knob out of range (cmd/server rejects it
// rather than running with a default the operator did not ask for).
func (c *LoadConfig) Validate() error {
	switch {
	case !c.Enabled:
		return nil
	case !(c.Bound >= 1) || math.IsInf(c.Bound, 0):
		return fmt.Errorf("load bound %v: want a finite number >= 1", c.Bound)
	case c.MinQueue < 1:
		return fmt.Errorf("load min queue %d: want >= 1", c.MinQueue)
	case !(c.PrefillWeight >= 1) || math.IsInf(c.PrefillWeight, 0):
		return fmt.Errorf("load prefill weight %v: want a finite number >= 1", c.PrefillWeight)
	case !(c.MinMatch >= 0 && c.MinMatch <= 1):
		return fmt.Errorf("load min match %v: want 0..1", c.MinMatch)
	case c.MaxAge <= 0:
		return fmt.Errorf("load max age %v: want > 0", c.MaxAge)
	case c.ExpectedTTL < 0:
		return fmt.Errorf("expected-entry TTL %v: want >= 0", c.ExpectedTTL)
	case !(c.ExpectedCredit >= 0 && c.ExpectedCredit <= 1):
		return fmt.Errorf("expected-entry credit %v: want 0..1", c.ExpectedCredit)
	case !(c.EvictionShare >= 0 && c.EvictionShare < 1):
		return fmt.Errorf("eviction share %v: want [0, 1)", c.EvictionShare)
	}
	return nil
}

// ScratchBytes is about how much memory res's scratch holds, so a pool can
// drop a result that a huge request or domain grew.
func (res *LookupResult) ScratchBytes() int {
	return 8*(cap(res.nodes)+cap(res.matched)+cap(res.prefix)+cap(res.keys)) +
		int(unsafe.Sizeof(runner{}))*(cap(res.run)+cap(res.fin)+cap(res.undo)) +
		int(unsafe.Sizeof(candidate{}))*cap(res.cand) +
		int(unsafe.Sizeof(Score{}))*(cap(res.Scores)+cap(res.sorted)) +
		int(unsafe.Sizeof(loadEntry{}))*cap(res.lv.entries) + 2*cap(res.lv.pos)
}
