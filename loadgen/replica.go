package loadgen

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// The feedback loop. Each emulated engine replica owns:
//
//   - an LRU of block keys (its KV cache, in blocks);
//   - a heap of prefills in flight: a lookup routed to the replica schedules
//     one, due after the modeled prefill time;
//   - one ReportCacheState stream, fed by the replica's goroutine: every
//     FlushInterval it completes the due prefills (touching their chains in
//     the LRU, first block first) and sends one CacheStateUpdate with a
//     chain-form PrefixEntry per completed request that stored blocks, plus
//     the replica's stats;
//   - an eviction sender: a block the LRU evicts becomes a PublishEvent
//     PREFIX_EVICTED, paced at EvictionRate/Replicas per second through a
//     bounded queue.
//
// The contract has no batched eviction: one unary call per block. Under
// chat-like churn a replica evicts tens of blocks per request, far more
// calls than lookups. Two things keep that affordable on one small machine:
//
//   - By default only evictions that can change routing are published: a
//     chain's first block, or a block whose parent is still cached. A block
//     whose parent went first (an orphan) is unreachable for this replica
//     in the server's chain walk, which stops at the parent, so publishing
//     it changes no decision; it only occupies the index until the TTL or
//     the entry cap removes it. Under sustained churn the index therefore
//     fills up to the server's entry cap (MaxIndexEntries, 1M by default),
//     whose oldest-first victims are mostly these orphans: the replicas
//     evicted them as their least recent blocks. EvictOrphans publishes
//     every eviction, as a plain engine subscriber would.
//   - A full queue does what a real subscriber does after losing events:
//     the replica is marked dirty and, at most once per ResyncInterval,
//     clears itself on the server (ALL_CLEARED, awaited) and re-reports its
//     whole cache, so the index again holds what the replica holds.
//
// The report counts published, orphaned and dropped evictions and resyncs.
//
// Known imprecision, shared with any real subscriber: stream updates and
// unary events travel on different HTTP/2 streams, so the server may apply
// an eviction before an earlier report of the same block.

// pending is one prefill in flight.
type pending struct {
	due   time.Time
	epoch uint64
	req   *workload.Request
}

type pendingHeap []pending

func (h pendingHeap) Len() int           { return len(h) }
func (h pendingHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h pendingHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *pendingHeap) Push(x any)        { *h = append(*h, x.(pending)) }
func (h *pendingHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = pending{}
	*h = old[:len(old)-1]
	return x
}

// replica is one emulated engine replica.
type replica struct {
	id  string
	idx int
	c   *cluster

	// mu guards cache, queue and the hit counters; lookup workers take it
	// to schedule a prefill, the replica's goroutine to complete them, the
	// clear loop to empty the cache.
	mu        sync.Mutex
	cache     *lru
	queue     pendingHeap
	hitBlocks int64 // leading-run blocks the cache held when a prefill was scheduled
	allBlocks int64 // blocks of every scheduled prefill

	// inflight is the number of prefills scheduled and not yet completed;
	// written under mu, read without it by the least-loaded fallback and
	// the stats.
	inflight atomic.Int64
	// clearReq asks the replica's goroutine to clear its cache and send
	// ALL_CLEARED (set by the clear loop, swapped off by the goroutine).
	clearReq atomic.Bool
	// dirty says an eviction was lost (queue full): the replica's
	// goroutine resyncs it. Set by whoever queues evictions, cleared by
	// resync.
	dirty atomic.Bool

	// evictCh feeds the eviction sender.
	evictCh chan uint64

	// The fields below belong to the replica's goroutine (and to populate,
	// which runs before it starts).
	stream     pb.InferenceCache_ReportCacheStateClient
	evicted    []uint64
	lastSent   time.Time
	lastResync time.Time
}

// cluster is the set of emulated replicas plus the shared counters of the
// feedback loop.
type cluster struct {
	cfg      *Config
	client   pb.InferenceCacheClient
	src      *source
	replicas []*replica
	byID     map[string]int // replica id -> index; read-only after newCluster
	// blockBytes is the KV memory of one cached block.
	blockBytes int64

	// rr spreads ties of the least-loaded fallback.
	rr atomic.Uint64
	// lastErr is the last report, event or stream error counted, for the
	// report; any goroutine of the loop may store it.
	lastErr atomic.Pointer[string]
	// streamCtx scopes the report streams (the populate phase's, then the
	// run's, which outlives the replica goroutines so the final half-close
	// can wait for the server's Ack). Set by Run before each phase, while no
	// replica goroutine runs.
	streamCtx context.Context

	// Counters, updated with atomics by whoever does the work.
	reports          atomic.Int64 // CacheStateUpdate messages sent
	reportedBlocks   atomic.Int64 // block hashes in those messages
	reportErrors     atomic.Int64 // failed sends and stream restarts
	evictions        atomic.Int64 // PREFIX_EVICTED events acknowledged
	evictionsDropped atomic.Int64 // evictions not sent: queue full, superseded by a resync, or run over
	evictionErrors   atomic.Int64 // PREFIX_EVICTED calls that failed
	orphans          atomic.Int64 // evicted orphans not published (EvictOrphans off)
	resyncs          atomic.Int64 // ALL_CLEARED + full re-report after lost evictions
	resyncBlocks     atomic.Int64 // blocks re-reported by resyncs
	clears           atomic.Int64 // ALL_CLEARED events acknowledged
	clearErrors      atomic.Int64 // ALL_CLEARED calls that failed (restarts and resyncs)
	routedHint       atomic.Int64 // lookups routed to the first score
	routedFallback   atomic.Int64 // lookups routed by the fallback pick
	hitBlocks        atomic.Int64 // modeled leading-run hits of routed lookups
	routedBlocks     atomic.Int64 // blocks of routed lookups
	hintHitBlocks    atomic.Int64 // the same, for hint-routed lookups only
	hintRoutedBlocks atomic.Int64 // blocks of hint-routed lookups
}

// failed counts err in counter and keeps it as the last error, unless ctx
// has ended (a call cut off by the end of the run is no failure). It
// reports whether it counted.
func (c *cluster) failed(ctx context.Context, counter *atomic.Int64, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	counter.Add(1)
	msg := err.Error()
	c.lastErr.Store(&msg)
	return true
}

func newCluster(cfg *Config, client pb.InferenceCacheClient, src *source) *cluster {
	c := &cluster{cfg: cfg, client: client, src: src, byID: make(map[string]int, cfg.Replicas),
		blockBytes: cfg.BytesPerToken * int64(src.reqs[0].BlockSize)}
	for i := 0; i < cfg.Replicas; i++ {
		r := &replica{
			id: fmt.Sprintf("%s-%02d", cfg.ReplicaPrefix, i), idx: i, c: c,
			cache:   newLRU(cfg.ReplicaCacheBlocks, cfg.EvictOrphans),
			evictCh: make(chan uint64, cfg.EvictionQueue),
		}
		c.replicas = append(c.replicas, r)
		c.byID[r.id] = i
	}
	return c
}

// openStreams opens one ReportCacheState stream per replica, under ctx.
func (c *cluster) openStreams(ctx context.Context) error {
	for _, r := range c.replicas {
		s, err := c.client.ReportCacheState(ctx)
		if err != nil {
			return fmt.Errorf("cannot open the report stream of %s: %w", r.id, err)
		}
		r.stream = s
	}
	return nil
}

// closeStreams half-closes every stream and waits (at most until ctx ends)
// for the server's Ack, which it sends after applying every update: a
// barrier that makes all reports visible to later lookups.
func (c *cluster) closeStreams(ctx context.Context) error {
	var errs []error
	for _, r := range c.replicas {
		if r.stream == nil {
			continue
		}
		done := make(chan error, 1)
		go func(s pb.InferenceCache_ReportCacheStateClient) {
			_, err := s.CloseAndRecv()
			done <- err
		}(r.stream)
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, io.EOF) {
				errs = append(errs, fmt.Errorf("cannot close the report stream of %s: %w", r.id, err))
			}
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("cannot close the report stream of %s: %w", r.id, ctx.Err()))
		}
		r.stream = nil
	}
	return errors.Join(errs...)
}

// route picks the replica a lookup's request goes to: the first score when
// it names one of ours, else the least-loaded replica (fewest prefills in
// flight; ties broken round-robin). It then schedules the prefill there.
func (c *cluster) route(resp *pb.LookupRouteResponse, req *workload.Request, epoch uint64, keys []uint64, now time.Time) (hits int) {
	idx, hinted := -1, false
	if s := resp.GetReplicaScores(); len(s) > 0 {
		if i, ok := c.byID[s[0].GetReplicaId()]; ok {
			idx, hinted = i, true
		}
	}
	if idx < 0 {
		idx = c.leastLoaded()
		c.routedFallback.Add(1)
	} else {
		c.routedHint.Add(1)
	}
	hits = c.replicas[idx].schedule(req, epoch, keys, now)
	c.hitBlocks.Add(int64(hits))
	c.routedBlocks.Add(int64(len(keys)))
	if hinted {
		c.hintHitBlocks.Add(int64(hits))
		c.hintRoutedBlocks.Add(int64(len(keys)))
	}
	return hits
}

func (c *cluster) leastLoaded() int {
	n := len(c.replicas)
	start := int(c.rr.Add(1) % uint64(n))
	best, bestLoad := start, c.replicas[start].inflight.Load()
	for k := 1; k < n; k++ {
		i := (start + k) % n
		if l := c.replicas[i].inflight.Load(); l < bestLoad {
			best, bestLoad = i, l
		}
	}
	return best
}

// prefillDelay models prefill time: a fixed overhead plus a cost per
// uncached token, capped.
func (c *cluster) prefillDelay(uncachedTokens int) time.Duration {
	d := c.cfg.PrefillBase + time.Duration(uncachedTokens)*c.cfg.PrefillPerToken
	return min(d, c.cfg.PrefillMax)
}

// schedule records the modeled hits of a request routed here and queues its
// prefill. It returns the leading-run hits in blocks.
func (r *replica) schedule(req *workload.Request, epoch uint64, keys []uint64, now time.Time) int {
	r.mu.Lock()
	hits := r.cache.leadingRun(keys)
	r.hitBlocks += int64(hits)
	r.allBlocks += int64(len(keys))
	uncached := req.InputTokens - hits*req.BlockSize
	heap.Push(&r.queue, pending{due: now.Add(r.c.prefillDelay(uncached)), epoch: epoch, req: req})
	r.inflight.Add(1)
	r.mu.Unlock()
	return hits
}

// completeLocked touches the chain of one finished prefill in the cache
// (first block first, as an engine allocates them) and returns the
// PrefixEntry that reports what it stored, or nil when the cache held
// every block already. Evicted keys are appended to r.evicted. r.mu must be
// held.
//
// Like an engine's BlockStored event, the entry carries only the blocks
// from the first newly stored one to the end of the chain. The server
// turns a chain entry into per-block keys with cumulative token counts
// summed from the entry's first count, so the first count is the
// cumulative count through that block: the stored counts are then exactly
// those of the whole chain, and a long conversation's already-cached
// history is not re-sent on every turn.
func (r *replica) completeLocked(req *workload.Request, epoch uint64, buf *chainBuf) *pb.PrefixEntry {
	_, _, keys := buf.build(r.c.src, req, epoch)
	first := -1
	orphans := 0
	for j, k := range keys {
		var parent uint64
		if j > 0 {
			parent = keys[j-1]
		}
		ins, ev, o := r.cache.touch(k, parent, j == 0, int32((j+1)*req.BlockSize), r.evicted)
		r.evicted, orphans = ev, orphans+o
		if ins && first < 0 {
			first = j
		}
	}
	r.c.orphans.Add(int64(orphans))
	if first < 0 {
		return nil // every block was cached already: an engine stores nothing
	}
	hashes, counts := wireChain(keys[first:], req.BlockSize)
	counts[0] = int32((first + 1) * req.BlockSize)
	return &pb.PrefixEntry{BlockHashes: hashes, BlockTokenCounts: counts, Tier: pb.CacheTier_CACHE_TIER_T1}
}

// statsLocked returns the replica's stats: its modeled hit rate and its
// pressure (prefills in flight over ReplicaSlots, capped at 1). r.mu must be
// held.
func (r *replica) statsLocked() *pb.ReplicaStats {
	hit := float32(0)
	if r.allBlocks > 0 {
		hit = float32(float64(r.hitBlocks) / float64(r.allBlocks))
	}
	p := float32(float64(r.inflight.Load()) / float64(r.c.cfg.ReplicaSlots))
	return &pb.ReplicaStats{
		ReplicaId:        r.id,
		CacheMemoryBytes: int64(r.cache.len()) * r.c.blockBytes,
		HitRate:          hit,
		Pressure:         min(p, 1),
		ClientVersion:    "loadgen",
	}
}

// update wraps prefixes into a CacheStateUpdate for this replica.
func (r *replica) update(prefixes []*pb.PrefixEntry, stats *pb.ReplicaStats) *pb.CacheStateUpdate {
	cfg := r.c.cfg
	return &pb.CacheStateUpdate{
		ReplicaId: r.id, ModelId: cfg.ModelID, TenantId: cfg.TenantID, HashScheme: cfg.HashScheme,
		Prefixes: prefixes, Stats: stats,
	}
}

// send sends one update on the replica's stream, reopening the stream once
// if it broke.
func (r *replica) send(ctx context.Context, u *pb.CacheStateUpdate) {
	for attempt := 0; attempt < 2; attempt++ {
		if r.stream == nil {
			s, err := r.c.client.ReportCacheState(r.c.streamCtx)
			if err != nil {
				r.c.failed(ctx, &r.c.reportErrors, err)
				return
			}
			r.stream = s
		}
		err := r.stream.Send(u)
		if err == nil {
			r.lastSent = time.Now()
			r.c.reports.Add(1)
			for _, p := range u.GetPrefixes() {
				r.c.reportedBlocks.Add(int64(len(p.GetBlockHashes())))
			}
			return
		}
		if _, rerr := r.stream.CloseAndRecv(); rerr != nil && !errors.Is(rerr, io.EOF) {
			err = rerr // the stream's real error; it is dead either way
		}
		r.stream = nil
		if !r.c.failed(ctx, &r.c.reportErrors, err) {
			return // the run is over
		}
	}
}

// queueEvictions hands r.evicted to the eviction sender without blocking;
// a full queue marks the replica dirty.
func (r *replica) queueEvictions() {
	for _, k := range r.evicted {
		select {
		case r.evictCh <- k:
		default:
			r.c.evictionsDropped.Add(1)
			r.dirty.Store(true)
		}
	}
	r.evicted = r.evicted[:0]
}

// resyncBatch is the most prefixes one resync update carries.
const resyncBatch = 4096

// resync replaces the replica's state on the server by its cache: it drops
// the queued evictions (the resync covers them), publishes ALL_CLEARED and
// waits for it, then re-reports every cached block as a one-block chain
// entry with its cumulative token count.
func (r *replica) resync(ctx context.Context) {
	r.mu.Lock()
	r.dirty.Store(false)
	keys, tokens := r.cache.appendAll(nil, nil)
	stats := r.statsLocked()
	r.mu.Unlock()
	for drained := false; !drained; {
		select {
		case <-r.evictCh:
			r.c.evictionsDropped.Add(1)
		default:
			drained = true
		}
	}
	r.lastResync = time.Now()
	if !r.publishClear(ctx) {
		r.dirty.Store(true) // try again next interval
		return
	}
	r.c.resyncs.Add(1)
	for len(keys) > 0 || stats != nil {
		n := min(len(keys), resyncBatch)
		raw := make([]byte, 0, n*fingerprint.WireSize)
		entries := make([]pb.PrefixEntry, n)
		prefixes := make([]*pb.PrefixEntry, n)
		for j := 0; j < n; j++ {
			raw = fingerprint.AppendWire(raw, keys[j])
			entries[j] = pb.PrefixEntry{
				BlockHashes:      [][]byte{raw[j*fingerprint.WireSize : (j+1)*fingerprint.WireSize : (j+1)*fingerprint.WireSize]},
				BlockTokenCounts: []int32{tokens[j]},
				Tier:             pb.CacheTier_CACHE_TIER_T1,
			}
			prefixes[j] = &entries[j]
		}
		r.send(ctx, r.update(prefixes, stats))
		r.c.resyncBlocks.Add(int64(n))
		keys, tokens, stats = keys[n:], tokens[n:], nil
	}
}

// flush completes every prefill due by now and reports it. It sends a
// stats-only update when nothing was reported for StatsInterval.
func (r *replica) flush(ctx context.Context, now time.Time, buf *chainBuf) {
	var prefixes []*pb.PrefixEntry
	r.mu.Lock()
	for len(r.queue) > 0 && !r.queue[0].due.After(now) {
		p := heap.Pop(&r.queue).(pending)
		r.inflight.Add(-1)
		if e := r.completeLocked(p.req, p.epoch, buf); e != nil {
			prefixes = append(prefixes, e)
		}
	}
	var stats *pb.ReplicaStats
	if len(prefixes) > 0 || now.Sub(r.lastSent) >= r.c.cfg.StatsInterval {
		stats = r.statsLocked()
	}
	r.mu.Unlock()
	if stats != nil {
		r.send(ctx, r.update(prefixes, stats))
	}
	r.queueEvictions()
}

// clear empties the cache and publishes ALL_CLEARED, as an engine restart
// would. Prefills in flight still complete (and report) afterwards.
func (r *replica) clear(ctx context.Context) {
	r.mu.Lock()
	r.cache.reset()
	r.mu.Unlock()
	if r.publishClear(ctx) {
		r.c.clears.Add(1)
	}
}

// publishClear publishes ALL_CLEARED for the replica and waits for it; a
// failure is counted in clearErrors. It reports whether the server
// acknowledged it.
func (r *replica) publishClear(ctx context.Context) bool {
	cfg := r.c.cfg
	cctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
	defer cancel()
	_, err := r.c.client.PublishEvent(cctx, &pb.CacheEvent{
		Type: pb.CacheEvent_ALL_CLEARED, ReplicaId: r.id, ModelId: cfg.ModelID, TenantId: cfg.TenantID,
		TimestampUs: time.Now().UnixMicro(),
	})
	if err != nil {
		r.c.failed(ctx, &r.c.clearErrors, err)
		return false
	}
	return true
}

// loop is the replica's goroutine: every FlushInterval it carries out a
// requested clear, flushes the prefills due and resyncs a dirty replica,
// until ctx ends. Prefills still queued then are never reported.
func (r *replica) loop(ctx context.Context) {
	t := time.NewTicker(r.c.cfg.FlushInterval)
	defer t.Stop()
	var buf chainBuf
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if r.clearReq.Swap(false) {
				r.clear(ctx)
			}
			r.flush(ctx, now, &buf)
			if r.dirty.Load() && now.Sub(r.lastResync) >= r.c.cfg.ResyncInterval {
				r.resync(ctx)
			}
		}
	}
}

// evictLoop sends PREFIX_EVICTED for every key queued until ctx ends,
// at most EvictionRate/Replicas a second (no pacing when EvictionRate is
// 0); keys still queued at the end count as dropped.
func (r *replica) evictLoop(ctx context.Context) {
	cfg := r.c.cfg
	ev := &pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, ReplicaId: r.id, ModelId: cfg.ModelID, TenantId: cfg.TenantID}
	var raw [fingerprint.WireSize]byte
	var gap time.Duration
	if cfg.EvictionRate > 0 {
		gap = time.Duration(float64(time.Second) * float64(cfg.Replicas) / cfg.EvictionRate)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var next time.Time
	for {
		select {
		case <-ctx.Done():
			r.c.evictionsDropped.Add(int64(len(r.evictCh)))
			return
		case k := <-r.evictCh:
			if gap > 0 {
				now := time.Now()
				if next = next.Add(gap); next.Before(now) {
					next = now // an idle sender earns no burst credit
				}
				if wait := next.Sub(now); wait > 0 {
					timer.Reset(wait)
					select {
					case <-timer.C:
					case <-ctx.Done():
						r.c.evictionsDropped.Add(int64(len(r.evictCh)) + 1)
						return
					}
				}
			}
			ev.PrefixHash = fingerprint.AppendWire(raw[:0], k)
			ev.TimestampUs = time.Now().UnixMicro()
			cctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
			_, err := r.c.client.PublishEvent(cctx, ev)
			cancel()
			switch {
			case err == nil:
				r.c.evictions.Add(1)
			case !r.c.failed(ctx, &r.c.evictionErrors, err):
				r.c.evictionsDropped.Add(1) // cut off by the end of the run
			}
		}
	}
}

// populate reports the first n requests of the stream before the run, each
// on replica i mod Replicas, in updates of at most batch prefixes, and
// returns the number of blocks reported. Streams must be open and the
// replica goroutines not yet running.
func (c *cluster) populate(ctx context.Context, n, batch int) int64 {
	var buf chainBuf
	pendingBy := make([][]*pb.PrefixEntry, len(c.replicas))
	var blocks int64
	flush := func(r *replica) {
		r.mu.Lock()
		stats := r.statsLocked()
		r.mu.Unlock()
		r.send(ctx, r.update(pendingBy[r.idx], stats))
		pendingBy[r.idx] = nil
		r.queueEvictions()
	}
	for i := 0; i < n; i++ {
		req, epoch := c.src.at(uint64(i))
		r := c.replicas[i%len(c.replicas)]
		r.mu.Lock()
		p := r.completeLocked(req, epoch, &buf)
		r.mu.Unlock()
		if p == nil {
			continue
		}
		blocks += int64(len(p.BlockHashes))
		pendingBy[r.idx] = append(pendingBy[r.idx], p)
		if len(pendingBy[r.idx]) >= batch {
			flush(r)
		}
	}
	for _, r := range c.replicas {
		if len(pendingBy[r.idx]) > 0 {
			flush(r)
		}
	}
	return blocks
}
