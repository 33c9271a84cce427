package kvevents

import (
	"log/slog"
	"math"
)

// Processor applies decoded batches to a replica's positional index and
// hands the results to its forwarder. It is not safe for concurrent use:
// one goroutine (the subscriber's) owns it.
type Processor struct {
	idx     *Index
	fwd     *Forwarder
	l2      bool // BlockRemoved re-reports at T2 instead of evicting
	log     *slog.Logger
	metrics *Metrics

	// scratch reused across events; their content is copied by the
	// forwarder before the next event.
	added, evicted, demoted []Prefix
}

// NewProcessor returns a Processor. l2 says an offload tier (LMCache) keeps
// what the engine evicts (--ignore-block-removed).
func NewProcessor(idx *Index, fwd *Forwarder, l2 bool, log *slog.Logger, m *Metrics) *Processor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Processor{idx: idx, fwd: fwd, l2: l2, log: log, metrics: m}
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
func (p *Processor) Apply(b *Batch) {
	ts := TimestampUS(b.TS)
	for i := range b.Events {
		ev := &b.Events[i]
		p.metrics.eventDecoded(ev.Kind)
		switch ev.Kind {
		case KindBlockStored:
			var reason string
			p.added, reason = p.idx.Store(ev, p.added[:0])
			if reason != "" {
				p.metrics.eventDropped(reason)
				p.log.Debug("BlockStored dropped", "reason", reason, "blocks", len(ev.BlockHashes))
				continue
			}
			p.fwd.Add(p.added, ts)
		case KindBlockRemoved:
			var unknown int
			p.evicted, p.demoted, unknown = p.idx.Remove(ev, p.l2, p.evicted[:0], p.demoted[:0])
			p.metrics.removedUnknown(unknown)
			p.fwd.Removed(p.evicted, p.demoted, ts)
		case KindAllBlocksCleared:
			p.idx.Clear()
			p.fwd.AllCleared(ts)
		default:
			p.metrics.eventDropped(DropUnknownType)
		}
	}
	p.metrics.setIndexBlocks(p.idx.Len())
}

// Reset forgets the replica's state: the positional index is cleared and
// ALL_CLEARED is queued (pending adds discarded), so the server keeps
// nothing the subscriber cannot vouch for. tsUS 0 means "now".
func (p *Processor) Reset(tsUS int64) {
	p.idx.Clear()
	p.fwd.AllCleared(tsUS)
	p.metrics.setIndexBlocks(0)
}
