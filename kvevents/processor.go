package kvevents

import (
	"log/slog"
	"math"

	"github.com/inferencecache/inferencecache/kvevents/wire"
)

// output receives what applying events changes on the server's side: the
// Forwarder while following the live stream, a collector while a replay
// rebuilds the index (see Subscriber.sync).
type output interface {
	Add(ps []Prefix, tsUS int64)
	Removed(evicted, demoted []Prefix, tsUS int64)
	AllCleared(tsUS int64)
}

// Processor applies decoded batches to a replica's positional index and
// hands the results to its forwarder. It is not safe for concurrent use:
// one goroutine (the subscriber's) owns it.
type Processor struct {
	idx     *Index
	out     output
	l2      bool // BlockRemoved re-reports at T2 instead of evicting
	log     *slog.Logger
	metrics *Metrics

	// scratch reused across events; their content is copied by the
	// output before the next event.
	added, evicted, demoted []Prefix
}

// NewProcessor returns a Processor. l2 says an offload tier (LMCache) keeps
// what the engine evicts (--ignore-block-removed).
func NewProcessor(idx *Index, fwd *Forwarder, l2 bool, log *slog.Logger, m *Metrics) *Processor {
	return newProcessor(idx, fwd, l2, log, m)
}

func newProcessor(idx *Index, out output, l2 bool, log *slog.Logger, m *Metrics) *Processor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Processor{idx: idx, out: out, l2: l2, log: log, metrics: m}
}

// TimestampUS converts an engine batch timestamp (seconds) to µs; values
// that are not finite or not positive give 0 ("now" on the server).
func TimestampUS(ts float64) int64 {
	us := ts * 1e6
	if math.IsNaN(us) || us <= 0 || us >= math.MaxInt64 {
		return 0
	}
	return int64(us)
}

// Apply applies every event of b in order.
func (p *Processor) Apply(b *wire.Batch) { p.applyFrom(b, 0, false) }

// applyFrom applies b's events from index i on and returns len(b.Events).
// With stopOnUnknownParent it stops instead at a BlockStored whose parent
// the index does not know, before counting or applying it, and returns that
// event's index, so the caller can try to recover the parent first and then
// resume there (with stopOnUnknownParent false, which drops and counts it).
func (p *Processor) applyFrom(b *wire.Batch, i int, stopOnUnknownParent bool) int {
	ts := TimestampUS(b.TS)
	for ; i < len(b.Events); i++ {
		ev := &b.Events[i]
		switch ev.Kind {
		case wire.KindBlockStored:
			var reason string
			p.added, reason = p.idx.Store(ev, p.added[:0])
			if reason == DropUnknownParent && stopOnUnknownParent {
				p.metrics.setIndexBlocks(p.idx.Len())
				return i
			}
			p.metrics.eventDecoded(ev.Kind)
			if reason != "" {
				p.metrics.eventDropped(reason)
				p.log.Debug("BlockStored dropped", "reason", reason, "blocks", len(ev.BlockHashes))
				continue
			}
			p.out.Add(p.added, ts)
		case wire.KindBlockRemoved:
			p.metrics.eventDecoded(ev.Kind)
			var unknown int
			p.evicted, p.demoted, unknown = p.idx.Remove(ev, p.l2, p.evicted[:0], p.demoted[:0])
			p.metrics.removedUnknown(unknown)
			p.out.Removed(p.evicted, p.demoted, ts)
		case wire.KindAllBlocksCleared:
			p.metrics.eventDecoded(ev.Kind)
			p.idx.Clear()
			p.out.AllCleared(ts)
		default:
			p.metrics.eventDecoded(ev.Kind)
			p.metrics.eventDropped(DropUnknownType)
		}
	}
	p.metrics.setIndexBlocks(p.idx.Len())
	return len(b.Events)
}

// Reset forgets the replica's state: the positional index is cleared and
// ALL_CLEARED is queued (pending adds discarded), so the server keeps
// nothing the subscriber cannot vouch for. tsUS 0 means "now".
func (p *Processor) Reset(tsUS int64) {
	p.idx.Clear()
	p.out.AllCleared(tsUS)
	p.metrics.setIndexBlocks(0)
}

// collector is the output of a replay that rebuilds the positional index:
// instead of forwarding every event it remembers what the server may still
// hold that the rebuilt index no longer does (evictions and T2 demotions
// of forgotten blocks) and whether the engine cleared everything; the
// subscriber then sends that once, followed by the whole index (finishSync).
// Adds are not kept: the index itself is re-reported.
type collector struct {
	cleared          bool
	evicted, demoted []Prefix
}

var _ output = (*collector)(nil)

func (c *collector) Add([]Prefix, int64) {}

func (c *collector) Removed(evicted, demoted []Prefix, _ int64) {
	c.evicted = append(c.evicted, evicted...)
	c.demoted = append(c.demoted, demoted...)
}

func (c *collector) AllCleared(int64) {
	c.cleared = true
	c.evicted, c.demoted = c.evicted[:0], c.demoted[:0]
}

type prefixID struct {
	key     uint64
	adapter string
}

// result returns the collected evictions and demotions of blocks not in
// held (the rebuilt index, which is re-reported anyway), each block once.
func (c *collector) result(held []Prefix) (evicted, demoted []Prefix) {
	in := make(map[prefixID]bool, len(held))
	for _, p := range held {
		in[prefixID{p.Key, p.Adapter}] = true
	}
	keep := func(ps []Prefix) []Prefix {
		var out []Prefix
		for _, p := range ps {
			id := prefixID{p.Key, p.Adapter}
			if !in[id] {
				in[id] = true
				out = append(out, p)
			}
		}
		return out
	}
	// A block both demoted and later evicted was last evicted: evictions
	// are taken first, so its demotion is skipped.
	evicted = keep(c.evicted)
	demoted = keep(c.demoted)
	return evicted, demoted
}
