package bench

import (
	"container/heap"
	"fmt"
	"slices"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
)

// The P/D mode: a prefill pool and a decode pool (docs/pd.md).
//
//   - A prefill replica serves its FIFO queue one prefill at a time, like
//     a replica of Simulate: Overhead + uncached tokens × PrefillPerToken,
//     against its own LRU. When the prefill ends, the decode replica pulls
//     the KV cache of every prompt token it does not hold already
//     (TransferPerToken each; transfers run in parallel), then stores the
//     prompt's blocks in its LRU and decodes.
//   - A decode replica admits requests FIFO into Slots slots. A request
//     whose prefill hop was skipped is prefilled there, one local prefill
//     at a time, against the decode replica's LRU; while a local prefill
//     runs, every request decoding on that replica is held back by
//     Interference × its duration (the decode batch shares the GPU:
//     chunked prefill slows it, 1 stops it). Decode then takes
//     OutputTokens × DecodePerToken plus what local prefills held it back.
//   - TTFT: arrival to the first decode step's start: prefill queue wait,
//     prefill, transfer and slot wait; or slot wait, local queue wait and
//     local prefill. TPOT: decode time per output token, holds included.
//   - Every cache change is a KV event of the replica (prefill replicas
//     0..Prefill-1, decode replicas Prefill..Prefill+Decode-1) delivered
//     Lag later, as in Simulate.
//
// Deterministic: one goroutine, events ordered by (time, kind, sequence).

// PDConfig configures one P/D simulation.
type PDConfig struct {
	Prefill, Decode int
	// CacheBlocks is each replica's LRU capacity (both pools).
	CacheBlocks int
	// Slots is each decode replica's concurrent requests.
	Slots int
	Cost  CostModel
	// TransferPerToken is the KV transfer time of one prompt token from a
	// prefill replica to a decode replica.
	TransferPerToken time.Duration
	// Interference is the share of a local prefill's duration by which it
	// holds back the requests decoding on the same replica, in [0, 1].
	Interference float64
	// Lag delays every KV event on its way to the router.
	Lag time.Duration
}

// DefaultPDConfig: 4 prefill and 4 decode replicas of 1,000 blocks, 32
// decode slots, the default cost model, 5 µs per transferred token (about
// 128 KiB of KV per token of an 8B model over a 25 GB/s link), decodes held
// back by half of a local prefill (chunked prefill), 50 ms event lag.
func DefaultPDConfig() PDConfig {
	return PDConfig{Prefill: 4, Decode: 4, CacheBlocks: 1000, Slots: 32, Cost: DefaultCostModel(),
		TransferPerToken: 5 * time.Microsecond, Interference: 0.5, Lag: 50 * time.Millisecond}
}

func (c *PDConfig) validate() error {
	switch {
	case c.Prefill < 1 || c.Decode < 1 || c.Prefill+c.Decode > MaxReplicas:
		return fmt.Errorf("%w: %d prefill and %d decode replicas", ErrConfig, c.Prefill, c.Decode)
	case c.CacheBlocks < 0 || c.Slots < 1:
		return fmt.Errorf("%w: cache %d blocks, %d slots", ErrConfig, c.CacheBlocks, c.Slots)
	case c.Cost.Overhead < 0 || c.Cost.PrefillPerToken < 0 || c.Cost.DecodePerToken < 0 || c.TransferPerToken < 0 || c.Lag < 0:
		return fmt.Errorf("%w: negative cost", ErrConfig)
	case !(c.Interference >= 0 && c.Interference <= 1):
		return fmt.Errorf("%w: interference %v not in [0, 1]", ErrConfig, c.Interference)
	}
	return nil
}

// PDRoute is a P/D router's decision: the decode replica (0..Decode-1)
// and the prefill replica (0..Prefill-1), or Prefill = -1 to skip the
// prefill hop.
type PDRoute struct{ Prefill, Decode int }

// PDView is the router's picture at a routing decision: exact loads, as in
// View. Prefill loads count queued and running prefills and their pending
// uncached tokens; decode loads count admitted and queued requests
// (Running: holding a slot; Waiting: queued for one) and the pending work
// of local prefills.
type PDView struct {
	Now             time.Duration
	Prefill, Decode []ReplicaLoad
}

// PDRouter is a P/D policy under test; the simulator calls it from one
// goroutine, as Router. Observe gets the events of both pools (replica
// index as documented on the P/D mode).
type PDRouter interface {
	Name() string
	Observe(ev *Event)
	Route(req *workload.Request, v *PDView) PDRoute
}

// PDTicker is a PDRouter that wants the exact loads every TickInterval
// (the subscribers' metrics scrapes).
type PDTicker interface {
	TickInterval() time.Duration
	Tick(v *PDView)
}

// PDPolicy names a PDRouter constructor.
type PDPolicy struct {
	Name string
	New  func(cfg PDConfig) PDRouter
}

// PDResult is one policy's outcome.
type PDResult struct {
	Policy   string
	Requests int
	// TTFT percentiles and mean.
	TTFTP50, TTFTP90, TTFTP99, TTFTMean time.Duration
	// TPOT (decode time per output token) mean and 99th percentile.
	TPOTMean, TPOTP99 time.Duration
	// Disaggregated counts requests that took the prefill hop.
	Disaggregated int
	// ComputedTokens is the prompt tokens prefilled anywhere (uncached);
	// TransferredTokens the tokens moved prefill -> decode.
	ComputedTokens, TransferredTokens int64
	// PromptTokens is the workload's prompt tokens.
	PromptTokens int64
	// HeldBack is the decode time local prefills added, summed.
	HeldBack time.Duration
}

// DisaggregatedShare is Disaggregated over Requests.
func (r *PDResult) DisaggregatedShare() float64 {
	return ratio(int64(r.Disaggregated), int64(r.Requests))
}

// Event kinds of the P/D simulation, in processing order at equal times.
const (
	pdDecodeDone uint8 = iota
	pdLocalDone
	pdPrefillDone
	pdTransferDone
	pdTick
	pdDeliver
)

type pdEvent struct {
	at   time.Duration
	kind uint8
	seq  uint64
	job  int32
}

type pdHeap []pdEvent

func (h pdHeap) Len() int { return len(h) }
func (h pdHeap) Less(i, j int) bool {
	a, b := &h[i], &h[j]
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.seq < b.seq
}
func (h pdHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pdHeap) Push(x any)   { *h = append(*h, x.(pdEvent)) }
func (h *pdHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

type pdJob struct {
	req             *workload.Request
	prefill, decode int // prefill -1: skipped
	uncached        int
	decodeStart     time.Duration
	decodeEnd       time.Duration // moves later with holds
	decodeDur       time.Duration
	ttft            time.Duration
}

type pdPrefillRep struct {
	cache *LRU
	queue []int32
	busy  bool
	load  ReplicaLoad
}

type pdDecodeRep struct {
	cache    *LRU
	admit    []int32 // waiting for a slot
	local    []int32 // admitted, waiting for the local prefill engine
	inUse    int
	busy     bool    // a local prefill runs
	decoding []int32 // requests decoding now
	load     ReplicaLoad
}

type pdSim struct {
	cfg     PDConfig
	router  PDRouter
	ticker  PDTicker
	reqs    []workload.Request
	jobs    []pdJob
	pre     []pdPrefillRep
	dec     []pdDecodeRep
	h       pdHeap
	seq     uint64
	events  []Event
	view    PDView
	res     PDResult
	ttft    []time.Duration
	tpot    []time.Duration
	evicted []uint64
}

// SimulatePD routes reqs through router on the cluster cfg describes.
func SimulatePD(reqs []workload.Request, cfg PDConfig, router PDRouter) (PDResult, error) {
	if err := cfg.validate(); err != nil {
		return PDResult{}, err
	}
	if err := workload.ValidateStream(reqs); err != nil {
		return PDResult{}, err
	}
	s := &pdSim{cfg: cfg, router: router, reqs: reqs, jobs: make([]pdJob, len(reqs)),
		pre: make([]pdPrefillRep, cfg.Prefill), dec: make([]pdDecodeRep, cfg.Decode),
		view: PDView{Prefill: make([]ReplicaLoad, cfg.Prefill), Decode: make([]ReplicaLoad, cfg.Decode)}}
	for i := range s.pre {
		s.pre[i].cache = NewLRU(cfg.CacheBlocks)
	}
	for i := range s.dec {
		s.dec[i].cache = NewLRU(cfg.CacheBlocks)
	}
	s.res.Policy = router.Name()
	if t, ok := router.(PDTicker); ok && t.TickInterval() > 0 {
		s.ticker = t
		s.push(pdEvent{at: 0, kind: pdTick})
	}
	next := 0
	for next < len(reqs) || len(s.h) > 0 {
		if next < len(reqs) && (len(s.h) == 0 || reqs[next].Arrival < s.h[0].at) {
			if err := s.arrive(next); err != nil {
				return PDResult{}, err
			}
			next++
			continue
		}
		e := heap.Pop(&s.h).(pdEvent)
		switch e.kind {
		case pdDecodeDone:
			s.decodeDone(e)
		case pdLocalDone:
			s.localDone(e)
		case pdPrefillDone:
			s.prefillDone(e)
		case pdTransferDone:
			s.transferDone(e)
		case pdTick:
			if next < len(reqs) || s.busy() {
				s.fillView(e.at)
				s.ticker.Tick(&s.view)
				s.push(pdEvent{at: e.at + s.ticker.TickInterval(), kind: pdTick})
			}
		case pdDeliver:
			ev := s.events[e.job]
			s.router.Observe(&ev)
			s.events[e.job] = Event{}
		}
	}
	s.finish()
	return s.res, nil
}

func (s *pdSim) busy() bool {
	for i := range s.pre {
		if s.pre[i].busy || len(s.pre[i].queue) > 0 {
			return true
		}
	}
	for i := range s.dec {
		if s.dec[i].inUse > 0 || len(s.dec[i].admit) > 0 {
			return true
		}
	}
	return false
}

func (s *pdSim) push(e pdEvent) {
	e.seq = s.seq
	s.seq++
	heap.Push(&s.h, e)
}

func (s *pdSim) fillView(now time.Duration) {
	s.view.Now = now
	for i := range s.pre {
		s.view.Prefill[i] = s.pre[i].load
	}
	for i := range s.dec {
		s.view.Decode[i] = s.dec[i].load
	}
}

func (s *pdSim) arrive(i int) error {
	req := &s.reqs[i]
	s.fillView(req.Arrival)
	rt := s.router.Route(req, &s.view)
	if rt.Decode < 0 || rt.Decode >= s.cfg.Decode || rt.Prefill < -1 || rt.Prefill >= s.cfg.Prefill {
		return fmt.Errorf("bench: router %q returned %+v for request %d", s.router.Name(), rt, req.ID)
	}
	s.jobs[i] = pdJob{req: req, prefill: rt.Prefill, decode: rt.Decode}
	s.res.Requests++
	s.res.PromptTokens += int64(req.InputTokens)
	if rt.Prefill < 0 {
		s.enqueueDecode(int32(i), req.Arrival)
		return nil
	}
	s.res.Disaggregated++
	p := &s.pre[rt.Prefill]
	p.queue = append(p.queue, int32(i))
	p.load.Waiting++
	p.load.PendingPrefillTokens += req.InputTokens
	p.load.ActiveBlocks += len(req.Blocks)
	s.startPrefill(rt.Prefill, req.Arrival)
	// The decode replica counts it from now on: it will hold a slot.
	d := &s.dec[rt.Decode]
	d.load.Waiting++
	d.load.ActiveBlocks += len(req.Blocks)
	return nil
}

func (s *pdSim) startPrefill(r int, now time.Duration) {
	p := &s.pre[r]
	if p.busy || len(p.queue) == 0 {
		return
	}
	ji := p.queue[0]
	p.queue = p.queue[1:]
	j := &s.jobs[ji]
	hit := p.cache.LeadingRun(j.req.Blocks)
	var inserted []int
	inserted, s.evicted = p.cache.Access(j.req.Blocks, nil, s.evicted[:0])
	s.emitRemoved(r, now)
	hitTokens := j.req.PrefixTokens(hit)
	j.uncached = j.req.InputTokens - hitTokens
	p.busy = true
	p.load.Waiting--
	p.load.Running++
	p.load.PendingPrefillTokens -= hitTokens
	s.res.ComputedTokens += int64(j.uncached)
	dur := s.cfg.Cost.Overhead + time.Duration(j.uncached)*s.cfg.Cost.PrefillPerToken
	s.emitStored(r, j.req, inserted, now+dur)
	s.push(pdEvent{at: now + dur, kind: pdPrefillDone, job: ji})
}

func (s *pdSim) prefillDone(e pdEvent) {
	j := &s.jobs[e.job]
	p := &s.pre[j.prefill]
	p.busy = false
	p.load.Running--
	p.load.PendingPrefillTokens -= j.uncached
	p.load.ActiveBlocks -= len(j.req.Blocks)
	p.load.PrefilledTokens += int64(j.uncached)
	// The decode replica pulls what it does not hold.
	d := &s.dec[j.decode]
	moved := j.req.InputTokens - j.req.PrefixTokens(d.cache.LeadingRun(j.req.Blocks))
	s.res.TransferredTokens += int64(moved)
	s.push(pdEvent{at: e.at + time.Duration(moved)*s.cfg.TransferPerToken, kind: pdTransferDone, job: e.job})
	s.startPrefill(j.prefill, e.at)
}

func (s *pdSim) transferDone(e pdEvent) {
	j := &s.jobs[e.job]
	d := &s.dec[j.decode]
	var inserted []int
	inserted, s.evicted = d.cache.Access(j.req.Blocks, nil, s.evicted[:0])
	s.emitRemoved(s.cfg.Prefill+j.decode, e.at)
	s.emitStored(s.cfg.Prefill+j.decode, j.req, inserted, e.at)
	d.load.Waiting-- // counted at arrival; queued for a slot now
	s.enqueueDecode(e.job, e.at)
}

// enqueueDecode queues job ji for a slot of its decode replica.
func (s *pdSim) enqueueDecode(ji int32, now time.Duration) {
	j := &s.jobs[ji]
	d := &s.dec[j.decode]
	d.admit = append(d.admit, ji)
	d.load.Waiting++
	if j.prefill < 0 {
		d.load.PendingPrefillTokens += j.req.InputTokens
		d.load.ActiveBlocks += len(j.req.Blocks)
	}
	s.admit(j.decode, now)
}

// admit fills free slots of decode replica r, then starts a local prefill.
func (s *pdSim) admit(r int, now time.Duration) {
	d := &s.dec[r]
	for d.inUse < s.cfg.Slots && len(d.admit) > 0 {
		ji := d.admit[0]
		d.admit = d.admit[1:]
		d.inUse++
		d.load.Waiting--
		d.load.Running++
		j := &s.jobs[ji]
		if j.prefill < 0 {
			d.local = append(d.local, ji)
			continue
		}
		s.startDecode(r, ji, now)
	}
	s.startLocal(r, now)
}

func (s *pdSim) startLocal(r int, now time.Duration) {
	d := &s.dec[r]
	if d.busy || len(d.local) == 0 {
		return
	}
	ji := d.local[0]
	d.local = d.local[1:]
	j := &s.jobs[ji]
	hit := d.cache.LeadingRun(j.req.Blocks)
	var inserted []int
	inserted, s.evicted = d.cache.Access(j.req.Blocks, nil, s.evicted[:0])
	s.emitRemoved(s.cfg.Prefill+r, now)
	hitTokens := j.req.PrefixTokens(hit)
	j.uncached = j.req.InputTokens - hitTokens
	d.load.PendingPrefillTokens -= hitTokens
	s.res.ComputedTokens += int64(j.uncached)
	d.busy = true
	dur := s.cfg.Cost.Overhead + time.Duration(j.uncached)*s.cfg.Cost.PrefillPerToken
	// The batch decoding here is held back for part of it.
	if hold := time.Duration(s.cfg.Interference * float64(dur)); hold > 0 {
		for _, k := range d.decoding {
			s.jobs[k].decodeEnd += hold
			s.res.HeldBack += hold
		}
	}
	s.emitStored(s.cfg.Prefill+r, j.req, inserted, now+dur)
	s.push(pdEvent{at: now + dur, kind: pdLocalDone, job: ji})
}

func (s *pdSim) localDone(e pdEvent) {
	j := &s.jobs[e.job]
	d := &s.dec[j.decode]
	d.busy = false
	d.load.PendingPrefillTokens -= j.uncached
	d.load.PrefilledTokens += int64(j.uncached)
	s.startDecode(j.decode, e.job, e.at)
	s.startLocal(j.decode, e.at)
}

func (s *pdSim) startDecode(r int, ji int32, now time.Duration) {
	j := &s.jobs[ji]
	d := &s.dec[r]
	j.ttft = now - j.req.Arrival
	j.decodeStart = now
	j.decodeDur = time.Duration(j.req.OutputTokens) * s.cfg.Cost.DecodePerToken
	j.decodeEnd = now + j.decodeDur
	d.decoding = append(d.decoding, ji)
	s.push(pdEvent{at: j.decodeEnd, kind: pdDecodeDone, job: ji})
}

func (s *pdSim) decodeDone(e pdEvent) {
	j := &s.jobs[e.job]
	if j.decodeEnd > e.at { // held back meanwhile: not done yet
		s.push(pdEvent{at: j.decodeEnd, kind: pdDecodeDone, job: e.job})
		return
	}
	d := &s.dec[j.decode]
	if i := slices.Index(d.decoding, e.job); i >= 0 {
		d.decoding = slices.Delete(d.decoding, i, i+1)
	}
	d.inUse--
	d.load.Running--
	d.load.ActiveBlocks -= len(j.req.Blocks)
	s.ttft = append(s.ttft, j.ttft)
	if n := j.req.OutputTokens; n > 0 {
		s.tpot = append(s.tpot, (e.at-j.decodeStart)/time.Duration(n))
	}
	s.admit(j.decode, e.at)
}

// emitStored emits one BlockStored per contiguous run of inserted chain
// positions of req, at at (when the KV exists).
func (s *pdSim) emitStored(replica int, req *workload.Request, pos []int, at time.Duration) {
	for a := 0; a < len(pos); {
		b := a + 1
		for b < len(pos) && pos[b] == pos[b-1]+1 {
			b++
		}
		first, last := pos[a], pos[b-1]
		ev := Event{Kind: BlockStored, Replica: replica, EmittedAt: at,
			Blocks: req.Blocks[first : last+1 : last+1], BlockSize: req.BlockSize, TokensBefore: req.PrefixTokens(first),
			LastBlockTokens: req.BlockTokens(last)}
		if first > 0 {
			ev.Parent, ev.HasParent = req.Blocks[first-1], true
		}
		s.emit(ev)
		a = b
	}
}

func (s *pdSim) emitRemoved(replica int, at time.Duration) {
	if len(s.evicted) > 0 {
		s.emit(Event{Kind: BlockRemoved, Replica: replica, EmittedAt: at, Blocks: slices.Clone(s.evicted)})
	}
}

func (s *pdSim) emit(ev Event) {
	ev.DeliveredAt = ev.EmittedAt + s.cfg.Lag
	s.events = append(s.events, ev)
	s.push(pdEvent{at: ev.DeliveredAt, kind: pdDeliver, job: int32(len(s.events) - 1)})
}

func (s *pdSim) finish() {
	slices.Sort(s.ttft)
	slices.Sort(s.tpot)
	s.res.TTFTP50, s.res.TTFTP90, s.res.TTFTP99 = percentile(s.ttft, 50), percentile(s.ttft, 90), percentile(s.ttft, 99)
	s.res.TPOTP99 = percentile(s.tpot, 99)
	var sum, tsum time.Duration
	for _, d := range s.ttft {
		sum += d
	}
	for _, d := range s.tpot {
		tsum += d
	}
	if n := len(s.ttft); n > 0 {
		s.res.TTFTMean = sum / time.Duration(n)
	}
	if n := len(s.tpot); n > 0 {
		s.res.TPOTMean = tsum / time.Duration(n)
	}
}
