package kvevents

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Sink is where the forwarder delivers updates: the InferenceCache service
// in production (GRPCSink), a recorder in tests. Calls come from one
// goroutine at a time, in order; an error means "not delivered, retry",
// except InvalidArgument: the server refused the content, and the update
// is dropped.
type Sink interface {
	// ReportCacheState sends one update on its own ReportCacheState stream
	// and waits for the Ack.
	ReportCacheState(ctx context.Context, u *icv1.CacheStateUpdate) error
	// PublishEvent sends one lifecycle event.
	PublishEvent(ctx context.Context, e *icv1.CacheEvent) error
}

// ServerWatcher is implemented by sinks that can tell when the server may
// have lost what they delivered (GRPCSink): ServerEpoch changes when the
// server's instance id changed (it restarted, empty) or a call succeeded
// after the connection to it was lost, and reason says which. After every
// successful call the forwarder compares the epoch with the one it saw
// last and, on a change, re-reports the whole positional index.
type ServerWatcher interface {
	ServerEpoch() (epoch uint64, reason string)
}

// LossReporter is implemented by sinks that acknowledge asynchronously
// (NATSSink): a call returns once the sink has the message, and the sink
// learns later whether it was stored. TakeLost returns how many accepted
// deliveries were not stored since the last call (and resets the count).
// On a loss the forwarder drops its queue and clears and resyncs the
// replica, as after a buffer overflow: the server may miss any of what was
// in flight, in any position.
type LossReporter interface {
	TakeLost() uint64
}

// Re-report reasons (the rereports counter's label).
const (
	RereportSync            = "sync"             // a replay rebuilt or verified the index (start, engine reconnect)
	RereportServerRestart   = "server_restart"   // the server's instance id changed
	RereportServerReconnect = "server_reconnect" // a call succeeded after the server was unreachable
)

// Forwarder defaults (contract §6).
const (
	DefaultWindow      = 100 * time.Millisecond
	DefaultMaxPending  = 4096
	DefaultMaxBuffered = 1 << 16
	DefaultRPCTimeout  = 5 * time.Second
	DefaultMinBackoff  = 100 * time.Millisecond
	DefaultMaxBackoff  = 10 * time.Second
	// DefaultRefreshInterval is how often the blocks the engine still holds
	// are re-reported (see ForwarderConfig.RefreshInterval).
	DefaultRefreshInterval = 5 * time.Minute
	// DefaultHeartbeat is how long an idle subscriber goes without a call
	// to the server before it sends a heartbeat (Config.Heartbeat).
	DefaultHeartbeat = 2 * time.Second
)

// ForwarderConfig configures a Forwarder. Zero durations and sizes take the
// defaults above.
type ForwarderConfig struct {
	ReplicaID, ModelID, TenantID, HashScheme string

	// Window is how often pending adds are flushed.
	Window time.Duration
	// MaxPending flushes adds early once this many are pending; it is also
	// the largest update sent.
	MaxPending int
	// MaxBuffered bounds the entries (pending adds, queued prefixes and
	// events) held while the server is slow or down. Beyond it the buffer is
	// dropped and the replica is resynced (see README.md).
	MaxBuffered int
	// RPCTimeout bounds one sink call.
	RPCTimeout time.Duration
	// MinBackoff and MaxBackoff bound the exponential retry delay.
	MinBackoff, MaxBackoff time.Duration
	// RefreshInterval is how often every block the positional index holds
	// is re-reported at its current tier, stamped now, so blocks the engine
	// keeps serving from its prefix cache (which publishes no event for a
	// hit) do not age out of the server's index (freshness decays to 0 at
	// the TTL, 30 min by default). Zero means DefaultRefreshInterval; a
	// negative value disables the refresh. See README.md.
	RefreshInterval time.Duration
	// ResyncOnStart starts the forwarder in the resync state: its first
	// delivery is ALL_CLEARED for the replica followed by the positional
	// index's content. The subscriber does not use it: a restarted
	// subscriber must not wipe what the server holds for its engine.
	ResyncOnStart bool
	// Heartbeat, when positive, is how long the forwarder may go without a
	// call to the server before it sends one PublishEvent REPLICA_UPDATED
	// (a liveness refresh, contract §1.2): through a ServerWatcher sink its
	// answer reveals a server restart even while the engine is idle. While
	// calls fail, it is retried every Heartbeat/4. 0 disables it.
	Heartbeat time.Duration
	// Placement is sent with every update (docs/pd.md): the replica's
	// role, PDTopology pool, node and zone; the zero value sends none.
	Placement Placement

	Logger  *slog.Logger
	Metrics *Metrics
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (c *ForwarderConfig) setDefaults() {
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.MaxPending <= 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.MaxBuffered <= 0 {
		c.MaxBuffered = DefaultMaxBuffered
	}
	if c.MaxBuffered < c.MaxPending {
		c.MaxBuffered = c.MaxPending
	}
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = DefaultRPCTimeout
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff < c.MinBackoff {
		c.MaxBackoff = max(DefaultMaxBackoff, c.MinBackoff)
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Snapshotter gives the forwarder the blocks to re-report after a resync
// (AppendSnapshot) and, chunk by chunk, on every refresh (AppendHeld).
// *Index implements it.
type Snapshotter interface {
	AppendSnapshot(dst []Prefix) []Prefix
	AppendHeld(dst []Prefix, pos, n int) (_ []Prefix, next int, done bool)
}

type opKind uint8

const (
	opReport opKind = iota // ReportCacheState with prefixes
	opEvict                // one PREFIX_EVICTED per prefix
	opClear                // ALL_CLEARED
	opStats                // stats-only ReportCacheState
)

// op is one queued delivery. Its slices are owned by the op once queued.
type op struct {
	kind     opKind
	prefixes []Prefix
	tsUS     int64
	stats    *icv1.ReplicaStats
	// done counts the evictions already delivered (opEvict progress).
	done int
	// snapshot ops carry (a chunk of) a whole-index re-report: a resync's,
	// a re-report's or a sync's. Each new one supersedes the chunks of the
	// previous one still queued (supersedeSnapshotsLocked), so together
	// they hold at most one copy of the index and are not counted against
	// MaxBuffered.
	snapshot bool
	// skip marks an op superseded while it may be in flight (queue[0]):
	// it is dropped, not delivered, when it is next at the front.
	skip bool
}

func (o *op) size() int {
	if o.snapshot || o.skip {
		return 0
	}
	if len(o.prefixes) > 0 {
		return len(o.prefixes) - o.done
	}
	return 1
}

// Forwarder turns index results into sink calls, in order: adds are
// batched into one update per Window (or per MaxPending), a removal or a
// clear first flushes the adds before it. One goroutine runs Run; Add,
// Removed, AllCleared and Stats may be called from any goroutine.
type Forwarder struct {
	cfg  ForwarderConfig // immutable after NewForwarder
	sink Sink            // called only from the Run goroutine
	snap Snapshotter     // immutable
	// wake has room for one token; a send that finds it full is dropped
	// because the Run goroutine will look at the queue anyway.
	wake chan struct{}

	// mu guards the fields below; it is never held across a sink call.
	mu sync.Mutex
	// pending are adds not yet sealed into an op; pendingTS is the latest
	// batch timestamp among them.
	pending   []Prefix
	pendingTS int64
	// queue holds sealed ops in delivery order; queue[0] may be in flight.
	queue []op
	// buffered is pending plus the size of every queued op.
	buffered int
	// resync is true from an overflow (or start) until ALL_CLEARED for the
	// replica was delivered; meanwhile new work is dropped, because the
	// snapshot sent after the clear covers it.
	resync bool
	// gen changes whenever queue is dropped, so the Run goroutine knows an
	// op it delivered is no longer queue[0].
	gen uint64
	// pushed counts the ops ever appended at the back of queue; statsAt
	// is pushed's value before the opStats still queued (hasStats) was
	// appended, so that op sits at len(queue)-(pushed-statsAt): appends at
	// the back move it away from the end, nothing else does (pops and
	// re-reports work at the front). Stats replaces its content instead of
	// queueing another snapshot of the engine's load.
	pushed, statsAt uint64
	hasStats        bool
	// idle is closed and replaced when queue and pending become empty;
	// Flush waits on it.
	idle chan struct{}

	// rereport asks the Run goroutine to re-report the whole positional
	// index ahead of the queue (Rereport); rereportWhy is its reason.
	rereport    bool
	rereportWhy string

	// ref is the periodic refresh's progress; only the Run goroutine
	// (Run, deliverOne, doResync, refreshStep) reads or writes it.
	ref refreshState
	// Owned by the Run goroutine (call, heartbeat): when the last call was
	// attempted and whether it succeeded, and the ServerWatcher epoch seen
	// last (epochKnown once one was seen).
	lastCall   time.Time
	lastCallOK bool
	epoch      uint64
	epochKnown bool
}

// refreshState tracks one walk of the positional index (see refreshStep).
type refreshState struct {
	due     time.Time // when the next walk starts; zero: not scheduled yet
	active  bool      // a walk is in progress
	started time.Time // when the walk in progress started
	pos     int       // next slab position to read
	entries int       // entries re-reported by the walk in progress
	buf     []Prefix  // chunk scratch
}

// NewForwarder returns a Forwarder delivering to sink. snap is read by a
// clear-and-resync and by the periodic refresh; nil (tests) makes a resync
// re-report nothing and turns the refresh off.
func NewForwarder(cfg ForwarderConfig, sink Sink, snap Snapshotter) *Forwarder {
	cfg.setDefaults()
	return &Forwarder{
		cfg:    cfg,
		sink:   sink,
		snap:   snap,
		wake:   make(chan struct{}, 1),
		resync: cfg.ResyncOnStart,
		idle:   make(chan struct{}),
	}
}

func (f *Forwarder) kick() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Add queues added prefixes stamped with tsUS (µs); the slice is copied.
func (f *Forwarder) Add(ps []Prefix, tsUS int64) {
	if len(ps) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.resync {
		return
	}
	for len(ps) > 0 {
		room := f.cfg.MaxPending - len(f.pending)
		n := min(room, len(ps))
		if f.pending == nil {
			f.pending = make([]Prefix, 0, min(f.cfg.MaxPending, max(len(ps), 64)))
		}
		f.pending = append(f.pending, ps[:n]...)
		f.pendingTS = max(f.pendingTS, tsUS)
		f.buffered += n
		ps = ps[n:]
		if len(f.pending) >= f.cfg.MaxPending {
			f.sealLocked()
		}
	}
	f.checkOverflowLocked()
}

// Removed queues the outcome of a BlockRemoved: the pending adds are
// flushed first, then demoted is re-reported at T2 and evicted is sent as
// PREFIX_EVICTED, one event per key. Both slices are copied.
func (f *Forwarder) Removed(evicted, demoted []Prefix, tsUS int64) {
	if len(evicted) == 0 && len(demoted) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.resync {
		return
	}
	f.sealLocked()
	for len(demoted) > 0 {
		n := min(len(demoted), f.cfg.MaxPending)
		f.pushLocked(op{kind: opReport, prefixes: clonePrefixes(demoted[:n], TierT2), tsUS: tsUS})
		demoted = demoted[n:]
	}
	if len(evicted) > 0 {
		f.pushLocked(op{kind: opEvict, prefixes: clonePrefixes(evicted, 0), tsUS: tsUS})
	}
	f.checkOverflowLocked()
}

// AllCleared discards the pending adds and queues ALL_CLEARED.
func (f *Forwarder) AllCleared(tsUS int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.resync {
		return
	}
	f.pushClearLocked(tsUS)
	f.checkOverflowLocked()
}

// pushClearLocked discards the pending adds and the stats still queued
// (the server deletes the replica's stats with ALL_CLEARED: the next stats
// go behind it) and queues ALL_CLEARED.
func (f *Forwarder) pushClearLocked(tsUS int64) {
	f.buffered -= len(f.pending)
	f.pending, f.pendingTS = nil, 0
	if i := f.queuedStatsLocked(); i >= 0 {
		f.buffered -= f.queue[i].size()
		f.queue[i].skip = true
		f.hasStats = false
	}
	f.pushLocked(op{kind: opClear, tsUS: tsUS})
}

// Stats queues a stats-only update. Stats are snapshots of the engine's
// load: when one is still queued (the server is slow or down), s replaces
// it in place, so an outage holds one, and the server gets the newest
// rather than a backlog of stale load.
func (f *Forwarder) Stats(s *icv1.ReplicaStats, tsUS int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.resync {
		return
	}
	if i := f.queuedStatsLocked(); i >= 0 {
		f.queue[i].stats, f.queue[i].tsUS = s, tsUS
		return
	}
	f.pushLocked(op{kind: opStats, stats: s, tsUS: tsUS})
	f.statsAt, f.hasStats = f.pushed-1, true
	f.checkOverflowLocked()
}

// queuedStatsLocked returns the index in queue of the opStats still queued,
// or -1.
func (f *Forwarder) queuedStatsLocked() int {
	if !f.hasStats {
		return -1
	}
	i := len(f.queue) - int(f.pushed-f.statsAt)
	if i < 0 || f.queue[i].kind != opStats || f.queue[i].skip {
		f.hasStats = false // delivered (popped) meanwhile
		return -1
	}
	return i
}

// QueueSync queues, behind everything queued so far, the outcome of a
// replay that rebuilt or caught up the positional index: ALL_CLEARED when
// the engine cleared its cache within the replayed batches (pending adds are
// discarded), else the pending adds sealed first; then the T2 demotions and
// the evictions of blocks the index no longer holds; then held, the whole
// index, stamped tsUS. The demotions and evictions count against
// MaxBuffered like live ones (syncs during an outage add up); held
// supersedes every earlier whole-index re-report still queued, so it is
// not counted: the queue holds at most one copy of the index. The caller
// must not change the index between reading held and this call (the
// subscriber's goroutine, the index's only writer, does both). Nothing is
// queued while a resync is pending: its own re-report of the index covers
// it.
func (f *Forwarder) QueueSync(cleared bool, evicted, demoted, held []Prefix, tsUS int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.resync {
		return
	}
	if cleared {
		f.pushClearLocked(tsUS)
	} else {
		f.sealLocked()
	}
	f.pushChunksLocked(demoted, TierT2, tsUS, false)
	if len(evicted) > 0 {
		f.pushLocked(op{kind: opEvict, prefixes: clonePrefixes(evicted, 0), tsUS: tsUS})
	}
	f.supersedeSnapshotsLocked()
	f.pushChunksLocked(held, 0, tsUS, true)
	f.cfg.Metrics.rereport(RereportSync)
	f.checkOverflowLocked()
}

// pushChunksLocked queues ps as report ops of at most MaxPending entries
// (tier overrides each entry's when non-zero); snapshot marks them as a
// whole-index re-report.
func (f *Forwarder) pushChunksLocked(ps []Prefix, tier Tier, tsUS int64, snapshot bool) {
	for len(ps) > 0 {
		n := min(len(ps), f.cfg.MaxPending)
		f.pushLocked(op{kind: opReport, prefixes: clonePrefixes(ps[:n], tier), tsUS: tsUS, snapshot: snapshot})
		ps = ps[n:]
	}
}

// supersedeSnapshotsLocked drops the queued chunks of earlier whole-index
// re-reports: the one about to be queued states every block they state, at
// a newer state. Dropping them is safe wherever the new one goes: a
// change made between the two is queued between them (or is in the new
// one), so the server's last write per block stays the newest. queue[0],
// which may be in flight, is only marked skip; the others are removed.
func (f *Forwarder) supersedeSnapshotsLocked() {
	stats := f.queuedStatsLocked()
	statsOp := -1 // its index after the removal
	kept := f.queue[:0]
	for i := range f.queue {
		o := f.queue[i]
		switch {
		case o.snapshot && i == 0:
			o.skip, o.prefixes = true, nil
		case o.snapshot:
			continue
		}
		if i == stats {
			statsOp = len(kept)
		}
		kept = append(kept, o)
	}
	clear(f.queue[len(kept):]) // let the removed chunks go
	f.queue = kept
	if statsOp >= 0 {
		f.statsAt = f.pushed - uint64(len(kept)-statsOp)
	}
	f.signalIdleLocked()
}

// Rereport asks for the whole positional index to be re-reported, stamped
// now, ahead of anything queued (as a resync does, without ALL_CLEARED):
// the server lost it (it restarted) or may have. Safe from any goroutine.
func (f *Forwarder) Rereport(reason string) {
	f.mu.Lock()
	f.rereport, f.rereportWhy = true, reason
	f.mu.Unlock()
	f.kick()
}

// Buffered returns the entries waiting for delivery.
func (f *Forwarder) Buffered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.buffered
}

// Resyncing reports whether the forwarder waits to deliver ALL_CLEARED
// before anything else.
func (f *Forwarder) Resyncing() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resync
}

func clonePrefixes(ps []Prefix, tier Tier) []Prefix {
	out := make([]Prefix, len(ps))
	copy(out, ps)
	if tier != 0 {
		for i := range out {
			out[i].Tier = tier
		}
	}
	return out
}

func (f *Forwarder) pushLocked(o op) {
	f.queue = append(f.queue, o)
	f.pushed++
	f.buffered += o.size()
	f.kick()
}

// sealLocked turns the pending adds into one report op.
func (f *Forwarder) sealLocked() {
	if len(f.pending) == 0 {
		return
	}
	o := op{kind: opReport, prefixes: f.pending, tsUS: f.pendingTS}
	f.buffered -= len(f.pending)
	f.pending, f.pendingTS = nil, 0
	f.pushLocked(o)
}

// checkOverflowLocked drops everything and enters the resync state when the
// buffer exceeds MaxBuffered.
func (f *Forwarder) checkOverflowLocked() {
	f.cfg.Metrics.setBuffered(f.buffered)
	if f.buffered <= f.cfg.MaxBuffered {
		return
	}
	f.cfg.Logger.Warn("forward buffer overflow: dropping it and resyncing the replica",
		"buffered", f.buffered, "max", f.cfg.MaxBuffered)
	f.cfg.Metrics.overflow()
	f.dropAllLocked()
	f.resync = true
	f.kick()
}

func (f *Forwarder) dropAllLocked() {
	f.pending, f.pendingTS = nil, 0
	f.queue = nil
	f.hasStats = false
	f.buffered = 0
	f.gen++
	f.cfg.Metrics.setBuffered(0)
	f.signalIdleLocked()
}

func (f *Forwarder) signalIdleLocked() {
	if len(f.queue) == 0 && len(f.pending) == 0 {
		close(f.idle)
		f.idle = make(chan struct{})
	}
}

// Run delivers queued work until ctx is done. It returns ctx.Err().
//
// Whenever the queue is empty it also advances the periodic refresh by one
// chunk (refreshStep), so queued live work always goes first and waits for
// at most one refresh update in flight.
func (f *Forwarder) Run(ctx context.Context) error {
	tick := time.NewTicker(f.cfg.Window)
	defer tick.Stop()
	// The first refresh is due one interval from now; a resync (on start
	// or after an overflow) pushes it to one interval after itself.
	f.ref.due = f.cfg.Now().Add(f.cfg.RefreshInterval)
	backoff := f.cfg.MinBackoff
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			f.mu.Lock()
			f.sealLocked()
			f.mu.Unlock()
		case <-f.wake:
		}
		f.checkLoss() // also while idle: a loss must not wait for the next call
		for {
			ok, more := f.deliverOne(ctx)
			if ok && !more {
				ok = f.refreshStep(ctx)
			}
			if ok && !more {
				ok = f.heartbeat(ctx)
			}
			if ok {
				backoff = f.cfg.MinBackoff
			} else {
				if !sleepCtx(ctx, backoff) {
					return ctx.Err()
				}
				backoff = min(2*backoff, f.cfg.MaxBackoff)
				continue
			}
			if !more {
				break
			}
		}
	}
}

// Flush seals the pending adds and waits until nothing is queued (all of
// it delivered, or dropped by an overflow) and no resync is outstanding,
// or ctx is done. Work queued meanwhile is waited for too, so callers stop
// producing first (shutdown) or bound ctx. Run must be running.
func (f *Forwarder) Flush(ctx context.Context) error {
	for {
		f.mu.Lock()
		f.sealLocked()
		if len(f.queue) == 0 && len(f.pending) == 0 && !f.resync {
			f.mu.Unlock()
			return nil
		}
		idle := f.idle
		f.mu.Unlock()
		f.kick()
		// Re-check at least every Window in case a wake-up was missed.
		t := time.NewTimer(f.cfg.Window)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-idle:
		case <-t.C:
		}
		t.Stop()
	}
}

// deliverOne makes one delivery attempt. ok is false when the sink failed
// (the caller backs off); more is true when more work may be queued.
func (f *Forwarder) deliverOne(ctx context.Context) (ok, more bool) {
	f.mu.Lock()
	if f.resync {
		f.mu.Unlock()
		return f.doResync(ctx), true
	}
	if f.rereport {
		why := f.rereportWhy
		f.rereport, f.rereportWhy = false, ""
		f.mu.Unlock()
		f.doRereport(why)
		return true, true
	}
	for len(f.queue) > 0 && f.queue[0].skip {
		f.popLocked()
	}
	if len(f.queue) == 0 {
		f.mu.Unlock()
		return true, false
	}
	o := f.queue[0] // a copy: queue may be reallocated by appends meanwhile
	gen := f.gen
	f.mu.Unlock()

	done, err := f.send(ctx, &o)

	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != gen {
		return err == nil, true // the queue was dropped while we sent
	}
	if err == nil && o.kind == opStats && !f.queue[0].skip && f.queue[0].stats != o.stats {
		return true, true // newer stats replaced these meanwhile: send those too
	}
	if err != nil && !refused(err) {
		if o.kind == opEvict {
			if !o.snapshot { // snapshot ops never counted in buffered
				f.buffered -= done - f.queue[0].done
			}
			f.queue[0].done = done
		}
		return false, true
	}
	if err != nil {
		// The server refused the content itself (an id over its limit):
		// retrying would block the replica behind it forever. Drop the op,
		// counted in forward_errors_total and logged.
		refusedForwardLog.Warn(context.Background(), f.cfg.Logger, "server refused a forwarded update; dropping it", "err", err)
	}
	f.popLocked()
	return true, len(f.queue) > 0
}

// popLocked removes queue[0] (delivered, refused or skipped).
func (f *Forwarder) popLocked() {
	f.buffered -= f.queue[0].size()
	f.queue[0] = op{}
	f.queue = f.queue[1:]
	if len(f.queue) == 0 {
		f.queue = nil // let the backing array go
	}
	f.cfg.Metrics.setBuffered(f.buffered)
	f.signalIdleLocked()
}

// doResync delivers ALL_CLEARED for the replica and then queues the
// positional index's content ahead of anything queued since.
func (f *Forwarder) doResync(ctx context.Context) bool {
	now := f.cfg.Now().UnixMicro()
	if err := f.call(ctx, "PublishEvent", func(ctx context.Context) error {
		return f.sink.PublishEvent(ctx, f.event(icv1.CacheEvent_ALL_CLEARED, nil, now))
	}); err != nil {
		f.cfg.Logger.Warn("resync: cannot clear the replica on the server; will retry", "err", err)
		return false
	}
	// Leave the resync state before reading the index: work queued from
	// now on is delivered after the snapshot, and a block changed between
	// the two is either in the snapshot or in that later work. Both kinds
	// of delivery are idempotent, so the overlap is harmless.
	f.mu.Lock()
	f.resync = false
	f.rereport = false // the snapshot below is one
	f.mu.Unlock()

	var snap []Prefix
	if f.snap != nil {
		snap = f.snap.AppendSnapshot(nil)
	}
	blocks := len(snap)
	ops := f.snapshotOps(snap, now)
	f.mu.Lock()
	f.supersedeSnapshotsLocked()
	f.queue = append(ops, f.queue...)
	f.signalIdleLocked() // Flush waits for the end of the resync too
	f.mu.Unlock()
	// The snapshot is a complete re-report: the next refresh is due one
	// interval from now, and a walk in progress is moot.
	f.ref.active = false
	f.ref.due = f.cfg.Now().Add(f.cfg.RefreshInterval)
	f.cfg.Metrics.resync()
	f.cfg.Logger.Info("resync: replica cleared on the server; re-reporting the positional index",
		"blocks", blocks)
	return true
}

// snapshotOps cuts a snapshot of the positional index into report ops of
// at most MaxPending entries, stamped now.
func (f *Forwarder) snapshotOps(snap []Prefix, now int64) []op {
	ops := make([]op, 0, len(snap)/f.cfg.MaxPending+1)
	for len(snap) > 0 {
		n := min(len(snap), f.cfg.MaxPending)
		ops = append(ops, op{kind: opReport, prefixes: snap[:n:n], tsUS: now, snapshot: true})
		snap = snap[n:]
	}
	return ops
}

// doRereport puts a re-report of the whole positional index, stamped now,
// at the front of the queue. As for a resync's snapshot, the front is
// right: a block whose newest change is still queued is re-reported with a
// state at most as new as that change, which is delivered after it; any
// change made after the read is queued behind it.
func (f *Forwarder) doRereport(reason string) {
	if f.snap == nil {
		return
	}
	now := f.cfg.Now().UnixMicro()
	snap := f.snap.AppendSnapshot(nil)
	blocks := len(snap)
	ops := f.snapshotOps(snap, now)
	f.mu.Lock()
	f.supersedeSnapshotsLocked()
	f.queue = append(ops, f.queue...)
	f.mu.Unlock()
	f.ref.active = false
	f.ref.due = f.cfg.Now().Add(f.cfg.RefreshInterval)
	f.cfg.Metrics.rereport(reason)
	f.cfg.Logger.Info("re-reporting the positional index", "reason", reason, "blocks", blocks)
}

// heartbeat sends one REPLICA_UPDATED when no call was made for Heartbeat
// (Heartbeat/4 after a failed call). It reports false when the call failed.
func (f *Forwarder) heartbeat(ctx context.Context) bool {
	if f.cfg.Heartbeat <= 0 {
		return true
	}
	every := f.cfg.Heartbeat
	if !f.lastCallOK {
		every /= 4
	}
	now := f.cfg.Now()
	if now.Sub(f.lastCall) < every {
		return true
	}
	f.mu.Lock()
	busy := f.resync || f.rereport || len(f.queue) > 0
	f.mu.Unlock()
	if busy {
		return true
	}
	return f.call(ctx, "PublishEvent", func(ctx context.Context) error {
		return f.sink.PublishEvent(ctx, f.event(icv1.CacheEvent_REPLICA_UPDATED, nil, now.UnixMicro()))
	}) == nil
}

// refreshStep advances the periodic refresh by one chunk: when a walk is due
// (or in progress) it reads up to MaxPending held blocks from the positional
// index and re-reports them at their current tier and adapter, stamped now,
// in one ReportCacheState update. The Run goroutine calls it only when the
// queue is empty; after a chunk it kicks itself so the next chunk comes
// after any work queued meanwhile and after the Window tick's flush. It
// reports false when the sink failed (the chunk is read again after the
// backoff).
//
// Delivering the chunk directly rather than through the queue is safe: the
// chunk is delivered right after it is read, so any later change to one of
// its blocks (queued by the processor after the read) reaches the server
// after it, and an op queued before the read carries the same or older state
// for a block whose newest op is still to come. Either way the last write
// the server sees for a block is the newest.
//
// While the replica's server-side state is unknown (the resync state)
// nothing is refreshed: the resync re-reports the whole index anyway and
// schedules the next refresh one interval after itself.
func (f *Forwarder) refreshStep(ctx context.Context) bool {
	r := &f.ref
	if f.cfg.RefreshInterval < 0 || f.snap == nil {
		return true
	}
	now := f.cfg.Now()
	if !r.active {
		if now.Before(r.due) {
			return true
		}
		r.active, r.started, r.pos, r.entries = true, now, 0, 0
	}
	f.mu.Lock()
	resync := f.resync
	f.mu.Unlock()
	if resync {
		r.active = false
		return true
	}
	var next int
	var done bool
	r.buf, next, done = f.snap.AppendHeld(r.buf[:0], r.pos, f.cfg.MaxPending)
	if len(r.buf) > 0 {
		ts := now.UnixMicro()
		if err := f.call(ctx, "ReportCacheState", func(ctx context.Context) error {
			return f.sink.ReportCacheState(ctx, f.update(r.buf, ts, nil))
		}); err != nil {
			return false
		}
		f.cfg.Metrics.refreshed(len(r.buf))
		r.entries += len(r.buf)
	}
	r.pos = next
	if !done {
		f.kick()
		return true
	}
	r.active = false
	r.due = r.started.Add(f.cfg.RefreshInterval)
	f.cfg.Metrics.refreshDone()
	f.cfg.Logger.Debug("refresh: re-reported the blocks the engine holds",
		"entries", r.entries, "took", f.cfg.Now().Sub(r.started))
	return true
}

// send delivers o; for an opEvict it returns how many evictions were
// delivered in total, so a retry resumes after them.
func (f *Forwarder) send(ctx context.Context, o *op) (int, error) {
	switch o.kind {
	case opReport:
		return 0, f.call(ctx, "ReportCacheState", func(ctx context.Context) error {
			return f.sink.ReportCacheState(ctx, f.update(o.prefixes, o.tsUS, nil))
		})
	case opStats:
		return 0, f.call(ctx, "ReportCacheState", func(ctx context.Context) error {
			return f.sink.ReportCacheState(ctx, f.update(nil, o.tsUS, o.stats))
		})
	case opClear:
		return 0, f.call(ctx, "PublishEvent", func(ctx context.Context) error {
			return f.sink.PublishEvent(ctx, f.event(icv1.CacheEvent_ALL_CLEARED, nil, o.tsUS))
		})
	case opEvict:
		done := o.done
		for done < len(o.prefixes) {
			p := &o.prefixes[done]
			if err := f.call(ctx, "PublishEvent", func(ctx context.Context) error {
				return f.sink.PublishEvent(ctx, f.event(icv1.CacheEvent_PREFIX_EVICTED, p, o.tsUS))
			}); err != nil {
				return done, err
			}
			done++
		}
		return done, nil
	}
	panic("BUG: unknown forwarder op")
}

// call makes one sink call bounded by RPCTimeout. Run goroutine only.
func (f *Forwarder) call(ctx context.Context, rpc string, fn func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, f.cfg.RPCTimeout)
	defer cancel()
	start := time.Now()
	err := fn(cctx)
	f.cfg.Metrics.forwarded(rpc, time.Since(start), err)
	f.lastCall, f.lastCallOK = f.cfg.Now(), err == nil
	f.checkLoss()
	if err != nil {
		f.cfg.Logger.Debug("forward failed", "rpc", rpc, "err", err)
		return err
	}
	f.watchServer()
	return nil
}

// checkLoss enters the resync state when the sink reports deliveries it
// accepted and then lost (LossReporter). Run goroutine only. Anything
// queued is dropped (the resync's snapshot covers it); a call in flight
// sees the queue generation change.
func (f *Forwarder) checkLoss() {
	lr, ok := f.sink.(LossReporter)
	if !ok {
		return
	}
	n := lr.TakeLost()
	if n == 0 {
		return
	}
	f.cfg.Logger.Warn("deliveries the sink had accepted were lost: dropping the queue and resyncing the replica", "lost", n)
	f.cfg.Metrics.lost(n)
	f.mu.Lock()
	f.dropAllLocked()
	f.resync = true
	f.mu.Unlock()
	f.kick()
}

// watchServer compares the sink's ServerEpoch with the last one seen and
// asks for a re-report of the index when it changed. Run goroutine only.
func (f *Forwarder) watchServer() {
	w, ok := f.sink.(ServerWatcher)
	if !ok {
		return
	}
	epoch, reason := w.ServerEpoch()
	if f.epochKnown && epoch != f.epoch {
		f.cfg.Logger.Info("the server may have lost the replica's state", "reason", reason)
		f.Rereport(reason) // delivered by this goroutine's next round
	}
	f.epoch, f.epochKnown = epoch, true
}

func (f *Forwarder) update(ps []Prefix, tsUS int64, stats *icv1.ReplicaStats) *icv1.CacheStateUpdate {
	u := &icv1.CacheStateUpdate{
		ReplicaId:   f.cfg.ReplicaID,
		ModelId:     f.cfg.ModelID,
		TenantId:    f.cfg.TenantID,
		HashScheme:  f.cfg.HashScheme,
		TimestampUs: tsUS,
		Stats:       stats,
		Role:        f.cfg.Placement.Role,
		PdPool:      f.cfg.Placement.Pool,
		NodeName:    f.cfg.Placement.Node,
		Zone:        f.cfg.Placement.Zone,
	}
	if len(ps) > 0 {
		entries := make([]icv1.PrefixEntry, len(ps))
		keys := make([]byte, 8*len(ps))
		u.Prefixes = make([]*icv1.PrefixEntry, len(ps))
		for i, p := range ps {
			k := keys[8*i : 8*i+8 : 8*i+8]
			fingerprint.PutWire(k, p.Key)
			e := &entries[i]
			e.PrefixHash = k
			e.TokenCount = p.Tokens
			e.Tier = icv1.CacheTier(p.Tier)
			e.AdapterId = p.Adapter
			u.Prefixes[i] = e
		}
	}
	return u
}

func (f *Forwarder) event(t icv1.CacheEvent_Type, p *Prefix, tsUS int64) *icv1.CacheEvent {
	e := &icv1.CacheEvent{
		Type:        t,
		ReplicaId:   f.cfg.ReplicaID,
		ModelId:     f.cfg.ModelID,
		TenantId:    f.cfg.TenantID,
		TimestampUs: tsUS,
	}
	if p != nil {
		e.PrefixHash = make([]byte, 8)
		fingerprint.PutWire(e.PrefixHash, p.Key)
		e.AdapterId = p.Adapter
	}
	return e
}

// sleepCtx waits d or until ctx is done; it reports whether d elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// refused reports whether err is the server refusing the request's content
// (InvalidArgument), which no retry can fix.
func refused(err error) bool { return status.Code(err) == codes.InvalidArgument }
