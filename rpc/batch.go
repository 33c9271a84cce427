package rpc

import (
	"sync"
	"sync/atomic"

	"github.com/inferencecache/inferencecache/engine"
)

// batchIndex is implemented by an index that can apply several updates
// under one hold of its writer lock (*engine.Engine). A wrapped Index
// (server.Config.WrapIndex) does not promote it, so wrappers keep seeing
// every update through Ingest.
type batchIndex interface {
	IngestBatch(items []engine.BatchItem)
	// KnowsDomain reports, without a lock, whether (tenant, model) is
	// indexed; an event for an unknown pair is a no-op and is not queued.
	KnowsDomain(tenant, model string) bool
}

// ingestBatcher combines the updates of concurrent ReportCacheState streams
// (flat combining): a stream queues its update; if no stream is applying, it
// becomes the applier, takes everything queued and applies it with one
// IngestBatch, then hands the role to the oldest stream that queued in the
// meantime (or drops it when none did). Every other stream waits for its own
// update's result, so each stream still applies its updates in order and
// reuses its message only after the index is done with it. An applier serves
// one batch and passes on, so no stream waits behind an unbounded run of
// other streams' batches.
type ingestBatcher struct {
	idx batchIndex

	// mu guards queue and busy. busy is true while some stream is the
	// applier (between taking the role and passing it on or dropping it).
	mu    sync.Mutex
	queue []*ingestReq
	busy  bool

	// spare, items are the applier's scratch; only the applier touches
	// them (the role is handed over under mu, which orders the accesses).
	spare []*ingestReq
	items []engine.BatchItem

	// batches and updates count IngestBatch calls and the updates they
	// applied (the mean batch size is updates/batches).
	batches, updates atomic.Int64
}

// ingestReq is one stream's pending update. A stream owns one for its life.
type ingestReq struct {
	// u or ev is the write (exactly one set), now its arrival time.
	u   *engine.Update
	ev  *engine.Event
	now int64
	res engine.IngestResult
	// lead is set (under mu) when the applier hands the role over to this
	// stream; failed when the batch holding this update panicked.
	lead, failed bool
	// done receives one signal per wait: the update was applied, or the
	// stream is the applier now.
	done chan struct{}
}

func newIngestReq() *ingestReq { return &ingestReq{done: make(chan struct{}, 1)} }

// eventReqs pools the ingestReqs of PublishEvent calls.
var eventReqs = sync.Pool{New: func() any { return newIngestReq() }}

// ingest applies r.u or r.ev (at r.now) and sets r.res. It panics if the batch that
// held r.u panicked (the index's bug), as a direct Ingest would.
func (b *ingestBatcher) ingest(r *ingestReq) {
	r.lead, r.failed = false, false
	b.mu.Lock()
	b.queue = append(b.queue, r)
	if b.busy {
		b.mu.Unlock()
		<-r.done
		if !r.lead {
			if r.failed {
				panic("BUG: a batched ingest panicked (see the applier's stream)")
			}
			return
		}
		// Handed the role: r is the oldest queued update, still queued.
		b.mu.Lock()
	}
	b.busy = true
	batch := b.queue
	b.queue = b.spare[:0]
	b.mu.Unlock()
	b.apply(batch, r)
}

// apply applies batch (which holds self, the applier's own update) with one
// IngestBatch, wakes every other stream of it, and passes the applier role
// on. If IngestBatch panics, the others are woken as failed and the role is
// passed on before the panic continues.
func (b *ingestBatcher) apply(batch []*ingestReq, self *ingestReq) {
	applied := false
	defer func() {
		for _, q := range batch {
			if q != self {
				q.failed = !applied
				q.done <- struct{}{}
			}
		}
		clear(batch)
		b.mu.Lock()
		b.spare = batch[:0]
		if len(b.queue) > 0 {
			next := b.queue[0]
			next.lead = true
			next.done <- struct{}{}
		} else {
			b.busy = false
		}
		b.mu.Unlock()
	}()
	items := b.items[:0]
	for _, q := range batch {
		items = append(items, engine.BatchItem{Update: q.u, Event: q.ev, Now: q.now})
	}
	b.items = items
	b.idx.IngestBatch(items)
	for i, q := range batch {
		q.res = items[i].Result
	}
	clear(items) // drop the updates' references
	b.batches.Add(1)
	b.updates.Add(int64(len(batch)))
	applied = true
}
