package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
)

// ErrConfig is wrapped by every error that reports an invalid simulator
// configuration.
var ErrConfig = errors.New("bench: invalid config")

// CostModel turns work into simulated time. It is deliberately simple and
// not calibrated to any GPU: prefill time is linear in uncached prompt
// tokens, decode time linear in output tokens.
type CostModel struct {
	// Overhead is added to every request's prefill (scheduling, the first
	// forward pass), cached or not.
	Overhead time.Duration
	// PrefillPerToken is the prefill time per uncached prompt token.
	PrefillPerToken time.Duration
	// DecodePerToken is the decode time per output token of one request.
	DecodePerToken time.Duration
}

// DefaultCostModel returns 10 ms overhead, 125 µs per prefill token (8k
// tokens/s per replica) and 20 ms per output token (50 tokens/s per
// stream).
func DefaultCostModel() CostModel {
	return CostModel{Overhead: 10 * time.Millisecond, PrefillPerToken: 125 * time.Microsecond, DecodePerToken: 20 * time.Millisecond}
}

// SimModel says how closely a simulated replica follows a real engine
// (vLLM, SGLang) beyond the cost model. The zero value is the legacy model
// of the first releases (LegacySimModel): LRU refreshed in chain order at
// prefill start, every block cacheable, prefill unaffected by decodes.
// EngineSimModel is the default of Run and cmd/bench.
type SimModel struct {
	// FullBlocksOnly: the partial last block of a prompt is never cached
	// (engines hash full blocks only), so it never hits and is never
	// stored; it still counts in the denominator of the hit ratios.
	FullBlocksOnly bool
	// TailFirstFree: when a request finishes, its blocks are released
	// tail first, so the head of its chain (the part the next turn or
	// another request shares) is the last of them to be evicted. Modeled
	// by refreshing the chain last block first at decode end; vLLM's free
	// block queue and SGLang's radix-tree LRU both evict that way.
	TailFirstFree bool
	// DecodeInterference is the slowdown of a prefill per request decoding
	// on the replica when it starts (chunked prefill: running decodes take
	// part of every step): prefill time × (1 + DecodeInterference ×
	// decodes). 0 = none.
	DecodeInterference float64
}

// LegacySimModel returns the zero SimModel: the model the results before
// this release were computed with (cmd/bench -sim-model legacy).
func LegacySimModel() SimModel { return SimModel{} }

// DefaultDecodeInterference is EngineSimModel's prefill slowdown per
// running decode: 32 decodes make a prefill 1.64× slower.
const DefaultDecodeInterference = 0.02

// EngineSimModel returns the default model: full blocks only, tail-first
// freeing and DefaultDecodeInterference.
func EngineSimModel() SimModel {
	return SimModel{FullBlocksOnly: true, TailFirstFree: true, DecodeInterference: DefaultDecodeInterference}
}

// String names the model in reports.
func (m SimModel) String() string {
	switch m {
	case LegacySimModel():
		return "legacy"
	case EngineSimModel():
		return "engine"
	}
	return fmt.Sprintf("custom(full-blocks-only=%v, tail-first-free=%v, decode-interference=%g)", m.FullBlocksOnly, m.TailFirstFree, m.DecodeInterference)
}

// ParseSimModel parses a model name: "engine" or "legacy".
func ParseSimModel(s string) (SimModel, error) {
	switch s {
	case "engine":
		return EngineSimModel(), nil
	case "legacy":
		return LegacySimModel(), nil
	}
	return SimModel{}, fmt.Errorf("%w: unknown simulator model %q (want engine or legacy)", ErrConfig, s)
}

// cacheable is the part of req's chain a replica can cache under m.
func (m *SimModel) cacheable(req *workload.Request) []uint64 {
	if m.FullBlocksOnly && req.BlockTokens(len(req.Blocks)-1) < req.BlockSize {
		return req.Blocks[:len(req.Blocks)-1]
	}
	return req.Blocks
}

// Clear makes replica Replica drop its whole cache at time At, which emits
// an AllCleared event.
type Clear struct {
	Replica int
	At      time.Duration
}

// SimConfig configures one simulation.
//
// Each replica serves its FIFO queue with one prefill at a time (prefill
// is compute-bound) and up to Slots requests in service at once: a request
// starts prefill when it is at the head of the queue, no prefill is
// running, and fewer than Slots requests are in service; it then decodes
// while holding its slot. Slots = 1 serves one request at a time end to
// end. TTFT is queue wait plus prefill.
type SimConfig struct {
	Replicas    int           // 1..MaxReplicas
	CacheBlocks int           // per replica; 0 = unbounded
	Lag         time.Duration // KV-event delivery delay
	Slots       int           // requests in service per replica, >= 1
	Cost        CostModel
	Window      time.Duration // load-imbalance window, > 0
	Clears      []Clear
	Model       SimModel
}

func (c *SimConfig) validate() error {
	switch {
	case c.Replicas < 1 || c.Replicas > MaxReplicas:
		return fmt.Errorf("%w: replicas %d not in 1..%d", ErrConfig, c.Replicas, MaxReplicas)
	case c.CacheBlocks < 0:
		return fmt.Errorf("%w: negative cache size %d", ErrConfig, c.CacheBlocks)
	case c.Lag < 0:
		return fmt.Errorf("%w: negative lag %v", ErrConfig, c.Lag)
	case c.Slots < 1:
		return fmt.Errorf("%w: slots %d < 1", ErrConfig, c.Slots)
	case c.Cost.Overhead < 0 || c.Cost.PrefillPerToken < 0 || c.Cost.DecodePerToken < 0:
		return fmt.Errorf("%w: negative cost model term", ErrConfig)
	case !(c.Model.DecodeInterference >= 0) || math.IsInf(c.Model.DecodeInterference, 0):
		return fmt.Errorf("%w: decode interference %v is not a finite number >= 0", ErrConfig, c.Model.DecodeInterference)
	case c.Window <= 0:
		return fmt.Errorf("%w: window %v is not positive", ErrConfig, c.Window)
	}
	for _, cl := range c.Clears {
		if cl.Replica < 0 || cl.Replica >= c.Replicas || cl.At < 0 {
			return fmt.Errorf("%w: clear of replica %d at %v out of range", ErrConfig, cl.Replica, cl.At)
		}
	}
	return nil
}

// Hits counts prompt blocks and tokens and how many of them were served
// from cache (the leading run of each chain that was cached).
type Hits struct {
	Requests  int
	Blocks    int64
	HitBlocks int64
	Tokens    int64
	HitTokens int64
}

func (h *Hits) add(req *workload.Request, hitBlocks int) {
	h.Requests++
	h.Blocks += int64(len(req.Blocks))
	h.HitBlocks += int64(hitBlocks)
	h.Tokens += int64(req.InputTokens)
	h.HitTokens += int64(req.PrefixTokens(hitBlocks))
}

// BlockHitRatio returns HitBlocks/Blocks (0 when empty).
func (h Hits) BlockHitRatio() float64 { return ratio(h.HitBlocks, h.Blocks) }

// TokenHitRatio returns HitTokens/Tokens (0 when empty).
func (h Hits) TokenHitRatio() float64 { return ratio(h.HitTokens, h.Tokens) }

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Result is the outcome of simulating one policy.
type Result struct {
	Policy string
	Hits
	// ImbalanceMean and ImbalanceMax summarize, over every window in
	// which some prefill work (uncached prompt tokens) started, max/mean
	// of the prefill tokens each replica started in that window (1 =
	// perfectly even, Replicas = all on one replica). Windows are aligned
	// to time 0; windows that start after the last arrival (the queues'
	// drain) are left out.
	ImbalanceMean float64
	ImbalanceMax  float64
	// TTFTP50 and TTFTP99 are nearest-rank percentiles of queue wait plus
	// prefill.
	TTFTP50 time.Duration
	TTFTP99 time.Duration
	// RequestsPerReplica counts routed requests by replica.
	RequestsPerReplica []int
	// Events counts KV events delivered to the router.
	Events int64
}

// PooledHits replays reqs in order against one LRU of capacity blocks
// (0 = unbounded), with the accounting documented on LRU. With the
// cluster's total capacity it is the hit-ratio reference ("pooled bound")
// that no router can reach by placement alone, short of LRU anomalies.
func PooledHits(reqs []workload.Request, capacity int) Hits {
	return PooledHitsModel(reqs, capacity, LegacySimModel())
}

// PooledHitsModel is PooledHits under model m: with FullBlocksOnly the
// partial last block of each prompt is neither cached nor hit. (The pooled
// cache has no requests in flight, so TailFirstFree and DecodeInterference
// do not apply.)
func PooledHitsModel(reqs []workload.Request, capacity int, m SimModel) Hits {
	c := NewLRU(capacity)
	var h Hits
	var ins []int
	var ev []uint64
	for i := range reqs {
		chain := m.cacheable(&reqs[i])
		h.add(&reqs[i], c.LeadingRun(chain))
		ins, ev = c.Access(chain, ins[:0], ev[:0])
	}
	return h
}

// Simulation-event kinds, in the order they are processed at equal times:
// completions free capacity first, cache clears and KV-event deliveries
// then update the router, and arrivals (not kept in the heap) come last.
const (
	evDecodeDone uint8 = iota
	evPrefillDone
	evClear
	evTick
	evDeliver
)

type simEvent struct {
	at   time.Duration
	kind uint8
	seq  uint64
	job  int32 // evDecodeDone, evPrefillDone
	arg  int32 // evDeliver: index into sim.events; evClear: replica
}

func (a *simEvent) less(b *simEvent) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.seq < b.seq
}

type job struct {
	req      *workload.Request
	replica  int
	uncached int
	inserted []int // chain positions stored when prefill completes
	epoch    int   // replica clear epoch at prefill start
}

type replica struct {
	cache       *LRU
	queue       []int32 // FIFO of job indexes; queue[head:] is pending
	head        int
	prefillBusy bool
	inService   int
	epoch       int // bumped by every clear
	load        ReplicaLoad
}

type sim struct {
	cfg     SimConfig
	router  Router
	reqs    []workload.Request
	jobs    []job
	reps    []replica
	heap    []simEvent
	seq     uint64
	events  []Event // delivery arena; freeEv lists reusable slots
	freeEv  []int32
	view    View
	res     Result
	ttft    []time.Duration
	windows [][]int64 // windows[w][r] = prefill tokens replica r started in window w
	evicted []uint64  // scratch
	// finisher is the router's Finisher side, nil when it has none.
	finisher Finisher
}

// Simulate routes reqs (sorted by arrival, see workload.ValidateStream)
// through router on a cluster described by cfg and returns the policy's
// metrics. It is deterministic: the same inputs give the same Result. It
// does not modify reqs and runs on the calling goroutine; distinct calls
// may run concurrently as long as they do not share a Router.
func Simulate(reqs []workload.Request, cfg SimConfig, router Router) (Result, error) {
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	if err := workload.ValidateStream(reqs); err != nil {
		return Result{}, fmt.Errorf("cannot simulate: %w", err)
	}
	s := &sim{cfg: cfg, router: router, reqs: reqs}
	s.res.Policy = router.Name()
	s.res.RequestsPerReplica = make([]int, cfg.Replicas)
	s.reps = make([]replica, cfg.Replicas)
	for i := range s.reps {
		s.reps[i].cache = NewLRU(cfg.CacheBlocks)
	}
	s.view.Replicas = make([]ReplicaLoad, cfg.Replicas)
	s.jobs = make([]job, len(reqs))
	s.ttft = make([]time.Duration, 0, len(reqs))
	for _, cl := range cfg.Clears {
		s.push(simEvent{at: cl.At, kind: evClear, arg: int32(cl.Replica)})
	}
	var last time.Duration
	if len(reqs) > 0 {
		last = reqs[len(reqs)-1].Arrival
	}
	ticker, _ := router.(Ticker)
	s.finisher, _ = router.(Finisher)
	var tickEvery time.Duration
	if ticker != nil {
		tickEvery = ticker.TickInterval()
	}
	ticks := 0
	if tickEvery > 0 && tickEvery <= last {
		ticks = int(last / tickEvery)
		s.push(simEvent{at: tickEvery, kind: evTick})
	}

	// Every request causes one arrival, one prefill end, one decode end,
	// one removal delivery and at most len(Blocks) stored deliveries; each
	// clear one clear and one delivery. The loop cannot take more steps.
	budget := 2*len(cfg.Clears) + ticks
	for i := range reqs {
		budget += 4 + len(reqs[i].Blocks)
	}
	next := 0
	for steps := 0; next < len(reqs) || len(s.heap) > 0; steps++ {
		if steps > budget {
			panic("BUG: bench: simulation exceeded its step budget")
		}
		if next < len(reqs) && (len(s.heap) == 0 || reqs[next].Arrival < s.heap[0].at) {
			if err := s.arrive(next); err != nil {
				return Result{}, err
			}
			next++
			continue
		}
		e := s.pop()
		switch e.kind {
		case evDecodeDone:
			s.decodeDone(e)
		case evPrefillDone:
			s.prefillDone(e)
		case evClear:
			s.clearReplica(e)
		case evTick:
			s.fillView(e.at)
			ticker.Tick(&s.view)
			if next := e.at + tickEvery; next <= last {
				s.push(simEvent{at: next, kind: evTick})
			}
		case evDeliver:
			s.router.Observe(&s.events[e.arg])
			s.events[e.arg] = Event{}
			s.freeEv = append(s.freeEv, e.arg)
			s.res.Events++
		}
	}
	s.finish()
	return s.res, nil
}

func (s *sim) arrive(i int) error {
	req := &s.reqs[i]
	s.fillView(req.Arrival)
	r := s.router.Route(req, &s.view)
	if r < 0 || r >= len(s.reps) {
		return fmt.Errorf("bench: router %q returned replica %d for request %d, want 0..%d", s.router.Name(), r, req.ID, len(s.reps)-1)
	}
	s.jobs[i] = job{req: req, replica: r}
	rep := &s.reps[r]
	rep.queue = append(rep.queue, int32(i))
	rep.load.Waiting++
	rep.load.PendingPrefillTokens += req.InputTokens
	rep.load.ActiveBlocks += len(req.Blocks)
	s.res.RequestsPerReplica[r]++
	s.tryStart(r, req.Arrival)
	return nil
}

// fillView sets the router's view to the replicas' loads at now.
func (s *sim) fillView(now time.Duration) {
	for r := range s.reps {
		s.view.Replicas[r] = s.reps[r].load
	}
	s.view.Now = now
}

// tryStart starts the next queued prefill on replica r if it can.
func (s *sim) tryStart(r int, now time.Duration) {
	rep := &s.reps[r]
	if rep.prefillBusy || rep.inService >= s.cfg.Slots || rep.head == len(rep.queue) {
		return
	}
	ji := rep.queue[rep.head]
	rep.head++
	if rep.head == len(rep.queue) { // reuse the queue's memory when it drains
		rep.queue, rep.head = rep.queue[:0], 0
	}
	j := &s.jobs[ji]
	req := j.req
	chain := s.cfg.Model.cacheable(req)
	hit := rep.cache.LeadingRun(chain)
	j.inserted, s.evicted = rep.cache.Access(chain, nil, s.evicted[:0])
	j.epoch = rep.epoch
	s.res.add(req, hit)
	hitTokens := req.PrefixTokens(hit)
	j.uncached = req.InputTokens - hitTokens

	rep.prefillBusy = true
	rep.inService++
	rep.load.Waiting--
	rep.load.Running++
	rep.load.PendingPrefillTokens -= hitTokens

	w := int(now / s.cfg.Window)
	for len(s.windows) <= w {
		s.windows = append(s.windows, make([]int64, len(s.reps)))
	}
	s.windows[w][r] += int64(j.uncached)

	if len(s.evicted) > 0 {
		s.emit(Event{Kind: BlockRemoved, Replica: r, EmittedAt: now, Blocks: slices.Clone(s.evicted)})
	}
	compute := time.Duration(j.uncached) * s.cfg.Cost.PrefillPerToken
	if f := s.cfg.Model.DecodeInterference; f > 0 {
		// Requests in service besides this one are decoding (prefill runs
		// one at a time).
		compute = time.Duration(float64(compute) * (1 + f*float64(rep.inService-1)))
	}
	dur := s.cfg.Cost.Overhead + compute
	s.ttft = append(s.ttft, now+dur-req.Arrival)
	s.push(simEvent{at: now + dur, kind: evPrefillDone, job: ji})
}

func (s *sim) prefillDone(e simEvent) {
	j := &s.jobs[e.job]
	rep := &s.reps[j.replica]
	rep.prefillBusy = false
	rep.load.PendingPrefillTokens -= j.uncached
	rep.load.PrefilledTokens += int64(j.uncached)
	if j.epoch == rep.epoch { // a clear during prefill already dropped these blocks
		s.emitStored(j, e.at)
	}
	j.inserted = nil
	s.push(simEvent{at: e.at + time.Duration(j.req.OutputTokens)*s.cfg.Cost.DecodePerToken, kind: evDecodeDone, job: e.job})
	s.tryStart(j.replica, e.at)
}

// emitStored emits one BlockStored event per contiguous run of the chain
// positions the job inserted.
func (s *sim) emitStored(j *job, now time.Duration) {
	req := j.req
	pos := j.inserted
	for a := 0; a < len(pos); {
		b := a + 1
		for b < len(pos) && pos[b] == pos[b-1]+1 {
			b++
		}
		first, last := pos[a], pos[b-1]
		ev := Event{
			Kind: BlockStored, Replica: j.replica, EmittedAt: now,
			Blocks:       req.Blocks[first : last+1 : last+1],
			BlockSize:    req.BlockSize,
			TokensBefore: req.PrefixTokens(first),
		}
		ev.LastBlockTokens = req.BlockTokens(last)
		if first > 0 {
			ev.Parent, ev.HasParent = req.Blocks[first-1], true
		}
		s.emit(ev)
		a = b
	}
}

func (s *sim) decodeDone(e simEvent) {
	j := &s.jobs[e.job]
	rep := &s.reps[j.replica]
	rep.inService--
	rep.load.Running--
	rep.load.ActiveBlocks -= len(j.req.Blocks)
	if s.cfg.Model.TailFirstFree && j.epoch == rep.epoch {
		rep.cache.RefreshReverse(s.cfg.Model.cacheable(j.req))
	}
	if s.finisher != nil {
		s.finisher.Finished(j.req, j.replica, e.at)
	}
	s.tryStart(j.replica, e.at)
}

func (s *sim) clearReplica(e simEvent) {
	r := int(e.arg)
	s.reps[r].cache.Clear()
	s.reps[r].epoch++
	s.emit(Event{Kind: AllCleared, Replica: r, EmittedAt: e.at})
}

// emit schedules ev for delivery after the configured lag.
func (s *sim) emit(ev Event) {
	ev.DeliveredAt = ev.EmittedAt + s.cfg.Lag
	var idx int32
	if n := len(s.freeEv); n > 0 {
		idx = s.freeEv[n-1]
		s.freeEv = s.freeEv[:n-1]
		s.events[idx] = ev
	} else {
		idx = int32(len(s.events))
		s.events = append(s.events, ev)
	}
	s.push(simEvent{at: ev.DeliveredAt, kind: evDeliver, arg: idx})
}

func (s *sim) finish() {
	slices.Sort(s.ttft)
	s.res.TTFTP50 = percentile(s.ttft, 50)
	s.res.TTFTP99 = percentile(s.ttft, 99)
	var sum float64
	var n int
	// Windows that start after the last arrival only hold the drain of
	// queues, often on one replica; they say nothing about routing.
	var last time.Duration
	if len(s.reqs) > 0 {
		last = s.reqs[len(s.reqs)-1].Arrival
	}
	for wi, w := range s.windows {
		if time.Duration(wi)*s.cfg.Window > last {
			break
		}
		var total, peak int64
		for _, t := range w {
			total += t
			peak = max(peak, t)
		}
		if total == 0 {
			continue
		}
		imb := float64(peak) * float64(len(w)) / float64(total)
		sum += imb
		n++
		s.res.ImbalanceMax = max(s.res.ImbalanceMax, imb)
	}
	if n > 0 {
		s.res.ImbalanceMean = sum / float64(n)
	}
}

// percentile returns the nearest-rank p-th percentile of sorted d.
func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	k := (p*len(d) + 99) / 100 // ceil(p/100 × n)
	return d[max(k, 1)-1]
}

func (s *sim) push(e simEvent) {
	e.seq = s.seq
	s.seq++
	s.heap = append(s.heap, e)
	for i := len(s.heap) - 1; i > 0; { // sift up: at most log2(n) steps
		p := (i - 1) / 2
		if !s.heap[i].less(&s.heap[p]) {
			break
		}
		s.heap[i], s.heap[p] = s.heap[p], s.heap[i]
		i = p
	}
}

func (s *sim) pop() simEvent {
	top := s.heap[0]
	n := len(s.heap) - 1
	s.heap[0] = s.heap[n]
	s.heap = s.heap[:n]
	for i := 0; ; { // sift down: at most log2(n) steps
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && s.heap[r].less(&s.heap[l]) {
			m = r
		}
		if !s.heap[m].less(&s.heap[i]) {
			break
		}
		s.heap[i], s.heap[m] = s.heap[m], s.heap[i]
		i = m
	}
	return top
}
