package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferencecache/inferencecache/internal/reconnect"
	"github.com/inferencecache/inferencecache/kvevents/wire"
)

// Subscriber defaults (contract §6 and §7.1).
const (
	DefaultEndpoint         = "tcp://127.0.0.1:5557"
	DefaultTopic            = "kv-events"
	DefaultReconnectBackoff = time.Second
	DefaultReplayTimeout    = 5 * time.Second
	// DefaultStatsInterval is 1 s, not the contract's 10 s: the scrape
	// carries the live load that load-aware routing ranks by (docs/routing.md).
	DefaultStatsInterval   = time.Second
	DefaultShutdownTimeout = 5 * time.Second
	// DefaultStateInterval is how often a changed positional index is
	// written to the state file.
	DefaultStateInterval = 5 * time.Second
	// DefaultRecoveryInterval spaces replays triggered by a BlockStored
	// whose parent is unknown.
	DefaultRecoveryInterval = 30 * time.Second
	// ClientVersion is reported in ReplicaStats.client_version.
	ClientVersion = "inferencecache-kvevent-subscriber/v1alpha1"
	// MaxReceiveQueueBytes bounds the frames of the messages received and
	// not yet handled (the receive queue holds at most 256 messages, each
	// up to MaxZMTPMessageBytes: 4 GiB without it). A message that would
	// take the queue past it is dropped, counted in
	// batches_dropped_total{reason="receive_queue"}, and handled as a lost
	// batch: repaired from the replay like a gap.
	MaxReceiveQueueBytes = 64 << 20
	// receiveQueueLen bounds the receive queue in messages.
	receiveQueueLen = 256
)

// Config configures a Subscriber; cmd/kvevent-subscriber fills it from its
// flags. Zero values take the defaults.
type Config struct {
	ReplicaID, TenantID, ModelID string
	// HashScheme is the engine domain tag sent with every update ("vllm",
	// "sglang").
	HashScheme string

	// Endpoint is the engine's PUB endpoint the SUB socket dials or, with
	// EndpointMode EndpointBind, the loopback address it binds for the
	// engine's PUB to connect to.
	Endpoint string
	// EndpointMode is which side binds Endpoint: "" or EndpointConnect
	// (the engine), EndpointBind (the subscriber).
	EndpointMode EndpointMode
	// ReplayEndpoint is the engine's replay ROUTER; "" means gaps cannot be
	// repaired (every gap resets the replica).
	ReplayEndpoint string
	// Topic is the subscription prefix; "" receives every topic (vLLM's
	// own default topic is ""; the reference stack uses "kv-events").
	Topic string

	// MetricsURL is the engine's Prometheus /metrics; "" disables stats.
	MetricsURL string
	// QueuedTokensMetric is StatsScraper.QueuedTokensMetric.
	QueuedTokensMetric string
	// MetricsRankLabel and MetricsRank are StatsScraper.RankLabel and Rank:
	// set (DataParallel.Config) for one rank of a data-parallel engine.
	MetricsRankLabel, MetricsRank string
	// CacheSizeBytes scales the engine's cache usage into
	// ReplicaStats.cache_memory_bytes.
	CacheSizeBytes int64

	// BlockSize is used for events without a block size.
	BlockSize int
	// L2 says an offload tier keeps what the engine evicts
	// (--ignore-block-removed): BlockRemoved re-reports at T2.
	L2 bool
	// LoRAAdapters maps lora_id to adapter names.
	LoRAAdapters map[int64]string
	// Placement is the replica's role, pool, node and zone for
	// disaggregated serving (--role, --pd-pool, --node-name, --zone).
	Placement Placement
	// MaxIndexBlocks bounds the positional index (DefaultMaxIndexBlocks).
	MaxIndexBlocks int

	// RefreshInterval is how often every block the engine still holds is
	// re-reported (ForwarderConfig.RefreshInterval): 0 means
	// DefaultRefreshInterval, negative disables it.
	RefreshInterval time.Duration

	// Forwarding knobs; see ForwarderConfig.
	Window, RPCTimeout     time.Duration
	MaxPending, MaxBuffer  int
	MinBackoff, MaxBackoff time.Duration

	ReconnectBackoff time.Duration
	ReplayTimeout    time.Duration
	StatsInterval    time.Duration
	// ShutdownTimeout bounds the final flush after ctx is done.
	ShutdownTimeout time.Duration

	// StateFile, when set, keeps the positional index and the engine
	// sequence it reflects across subscriber restarts: it is read at start
	// (a missing, corrupt or foreign file is logged and ignored) and written
	// atomically every StateInterval while it changes, and on shutdown.
	StateFile string
	// StateInterval is how often the state file is written; 0 means
	// DefaultStateInterval.
	StateInterval time.Duration
	// Heartbeat is ForwarderConfig.Heartbeat: 0 means DefaultHeartbeat, a
	// negative value disables it.
	Heartbeat time.Duration
	// RecoveryInterval spaces the replays from the engine's oldest batch
	// that a BlockStored with an unknown parent triggers; 0 means
	// DefaultRecoveryInterval.
	RecoveryInterval time.Duration

	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: metrics are not registered
}

func (c *Config) setDefaults() {
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	if c.EndpointMode == "" {
		c.EndpointMode = EndpointConnect
	}
	if c.BlockSize <= 0 {
		c.BlockSize = 16
	}
	if c.ReconnectBackoff <= 0 {
		c.ReconnectBackoff = DefaultReconnectBackoff
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = DefaultReplayTimeout
	}
	if c.StatsInterval <= 0 {
		c.StatsInterval = DefaultStatsInterval
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.StateInterval <= 0 {
		c.StateInterval = DefaultStateInterval
	}
	switch {
	case c.Heartbeat == 0:
		c.Heartbeat = DefaultHeartbeat
	case c.Heartbeat < 0:
		c.Heartbeat = 0
	}
	if c.RecoveryInterval <= 0 {
		c.RecoveryInterval = DefaultRecoveryInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Subscriber follows one engine endpoint: it receives KV-event batches on
// a ZMQ SUB socket, repairs sequence gaps through the engine's replay
// endpoint, keeps the replica's positional index and forwards the result
// to a Sink. Whenever the SUB socket (re)connects it brings the index up to
// the engine's present through the replay endpoint (sync), which also
// recognizes a restarted engine. Run it once.
type Subscriber struct {
	cfg Config // immutable after New
	// bindAddr is the host:port EndpointBind listens on; immutable after
	// New.
	bindAddr string
	// bound is the endpoint the SUB listens on (EndpointBind, once
	// listening): written by the receive goroutine, read by anyone
	// (BoundEndpoint).
	bound   atomic.Pointer[string]
	log     *slog.Logger
	metrics *Metrics
	idx     *Index
	fwd     *Forwarder
	proc    *Processor

	// next mirrors seq.next for observers (tests, logs): written by the Run
	// goroutine after each message, read by anyone.
	next atomic.Uint64
	// connects counts the SUB connections whose sync (onConnect) is done:
	// written by the Run goroutine, read by observers (tests).
	connects atomic.Uint64
	// connNow is the number of the SUB connection established last:
	// written by the receive goroutine, read by the Run goroutine after a
	// sync.
	connNow atomic.Uint64
	// queued is the frame bytes of the messages in the receive queue and in
	// the Run goroutine's hands: added by the receive goroutine before it
	// queues a message, subtracted by the Run goroutine once it handled
	// it. The receive goroutine drops what would take it past
	// MaxReceiveQueueBytes.
	queued atomic.Int64

	// Owned by the Run goroutine.
	dec   *wire.Decoder
	batch wire.Batch
	// rdec and rbatch decode replayed batches of a sync or a recovery,
	// which can run while batch is still in use.
	rdec   *wire.Decoder
	rbatch wire.Batch
	seq    seqTracker
	// synced is set by the first sync (or, without a replay endpoint, the
	// startup re-report): the loaded state has been re-reported.
	synced bool
	// extendable says the index's history might reach further back
	// through a replay from the engine's oldest buffered batch (it started
	// at a live message, not at a replay from the oldest or at seq 0).
	extendable   bool
	lastRecovery time.Time
	// replaying is set while a replay is being applied (no recovery
	// inside it).
	replaying bool
	// changes counts changes of the index or seq; the state is written
	// when it differs from saved.
	changes, saved uint64
	// keepSaved is set when a shutdown interrupted a sync or a history
	// recovery: the index then holds replayed batches whose outcome was
	// never forwarded, so the state file is left as last saved and the
	// next start replays from there.
	keepSaved bool
}

// seqTracker follows the sequence numbers of one endpoint.
type seqTracker struct {
	started bool
	next    uint64 // first sequence number not applied yet
	conn    uint64 // connection the last message came on
	// lastSum is payloadSum of batch next-1, to recognize it in a replay.
	lastSum uint32
	// historyFrom is the first sequence number of the contiguous history
	// the index was built from.
	historyFrom uint64
}

// message is one ZMQ message and the connection it came on: the receive
// goroutine counts connections so a restarted engine (which restarts its
// sequence numbers) can be told from a late, reordered message. A message
// with connected set carries no frames: it marks the start of connection
// conn. One with lost set carries no frames either: the receive goroutine
// dropped that message (the receive queue's byte bound) and kept only its
// sequence number, if it had one (hasSeq).
type message struct {
	frames    [][]byte
	size      int64 // bytes of frames, counted in Subscriber.queued
	conn      uint64
	connected bool
	lost      bool
	seq       uint64
	hasSeq    bool
}

// New returns a Subscriber delivering to sink.
func New(cfg Config, sink Sink) (*Subscriber, error) {
	cfg.setDefaults()
	if cfg.ReplicaID == "" || cfg.ModelID == "" {
		return nil, errors.New("kvevents: replica id and model id are required")
	}
	for _, id := range []struct{ name, v string }{
		{"replica id", cfg.ReplicaID}, {"model id", cfg.ModelID}, {"tenant id", cfg.TenantID}, {"hash scheme", cfg.HashScheme},
	} {
		if len(id.v) > MaxIDBytes {
			return nil, fmt.Errorf("kvevents: %s is %d bytes, the server accepts at most %d", id.name, len(id.v), MaxIDBytes)
		}
	}
	var bindAddr string
	switch cfg.EndpointMode {
	case EndpointConnect:
	case EndpointBind:
		var err error
		if bindAddr, err = checkBindEndpoint(cfg.Endpoint); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("kvevents: unknown endpoint mode %q", cfg.EndpointMode)
	}
	for lid, name := range cfg.LoRAAdapters {
		if len(name) > MaxIDBytes {
			return nil, fmt.Errorf("kvevents: adapter name of lora_id %d is %d bytes, the server accepts at most %d", lid, len(name), MaxIDBytes)
		}
	}
	m := NewMetrics(cfg.Registerer)
	idx := NewIndex(cfg.BlockSize, cfg.MaxIndexBlocks, cfg.LoRAAdapters)
	fwd := NewForwarder(ForwarderConfig{
		ReplicaID:       cfg.ReplicaID,
		ModelID:         cfg.ModelID,
		TenantID:        cfg.TenantID,
		HashScheme:      cfg.HashScheme,
		Window:          cfg.Window,
		MaxPending:      cfg.MaxPending,
		MaxBuffered:     cfg.MaxBuffer,
		RPCTimeout:      cfg.RPCTimeout,
		MinBackoff:      cfg.MinBackoff,
		MaxBackoff:      cfg.MaxBackoff,
		RefreshInterval: cfg.RefreshInterval,
		Heartbeat:       cfg.Heartbeat,
		Placement:       cfg.Placement,
		Logger:          cfg.Logger,
		Metrics:         m,
	}, sink, idx)
	return &Subscriber{
		cfg:      cfg,
		bindAddr: bindAddr,
		log:      cfg.Logger,
		metrics:  m,
		idx:      idx,
		fwd:      fwd,
		proc:     NewProcessor(idx, fwd, cfg.L2, cfg.Logger, m),
		dec:      wire.NewDecoder(),
		rdec:     wire.NewDecoder(),
	}, nil
}

// Index returns the positional index (read-only use: Len, AppendSnapshot).
func (s *Subscriber) Index() *Index { return s.idx }

// Forwarder returns the forwarder (Flush, Buffered).
func (s *Subscriber) Forwarder() *Forwarder { return s.fwd }

// BoundEndpoint returns the endpoint the SUB socket listens on in
// EndpointBind mode (with port 0 configured, the port chosen), or "" before
// it listens and in EndpointConnect mode.
func (s *Subscriber) BoundEndpoint() string {
	if ep := s.bound.Load(); ep != nil {
		return *ep
	}
	return ""
}

// NextSeq returns the first engine sequence number not applied yet.
func (s *Subscriber) NextSeq() uint64 { return s.next.Load() }

// Run subscribes and forwards until ctx is done, then flushes what is
// queued for at most ShutdownTimeout and writes the state file. It returns
// nil after a clean shutdown, or the flush error.
func (s *Subscriber) Run(ctx context.Context) error {
	s.loadState()
	// The forwarder outlives ctx by the shutdown flush.
	fctx, stopForwarder := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.fwd.Run(fctx) })
	defer func() {
		stopForwarder()
		wg.Wait()
	}()
	var w *stateWriter
	var saveTick <-chan time.Time
	if s.cfg.StateFile != "" {
		w = newStateWriter(s.cfg.StateFile, s.log, s.metrics)
		wg.Go(w.run)
		defer w.close()
		t := time.NewTicker(s.cfg.StateInterval)
		defer t.Stop()
		saveTick = t.C
	}

	msgs := make(chan message, receiveQueueLen)
	wg.Go(func() { s.receive(ctx, msgs) })
	if s.cfg.MetricsURL != "" {
		wg.Go(func() { s.scrapeLoop(ctx) })
	}
	s.log.Info("subscribing to engine KV events", "endpoint", s.cfg.Endpoint, "mode", s.cfg.EndpointMode, "topic", s.cfg.Topic,
		"replay", s.cfg.ReplayEndpoint, "replica", s.cfg.ReplicaID)

loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case msg := <-msgs:
			s.handle(ctx, msg)
			s.queued.Add(-msg.size)
			s.next.Store(s.seq.next)
		case <-saveTick:
			// A failed write is retried at the next tick even without a
			// change.
			if data := s.encodeState(w.failed.Load()); data != nil && w.offer(data) {
				s.saved = s.changes
			}
		}
	}

	flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	var flushErr error
	if err := s.fwd.Flush(flushCtx); err != nil {
		s.log.Warn("shutdown: could not deliver everything", "buffered", s.fwd.Buffered(), "err", err)
		flushErr = fmt.Errorf("cannot flush on shutdown: %w", err)
	}
	if w != nil {
		w.close() // waits for a write in progress
		switch {
		case s.keepSaved:
			s.log.Info("shutdown interrupted a replay sync; the state file stays as last saved", "path", s.cfg.StateFile)
		default:
			if data := s.encodeState(w.failed.Load()); data != nil {
				w.write(data)
			}
		}
	}
	return flushErr
}

// handle applies one live message, repairing a gap before it if needed. A
// lost message (dropped by the receive queue's byte bound) is a batch not
// received: the gap up to and including it is repaired from the replay.
func (s *Subscriber) handle(ctx context.Context, msg message) {
	if msg.connected {
		s.onConnect(ctx, msg.conn)
		s.connects.Add(1)
		return
	}
	seq, hasSeq, lost := msg.seq, msg.hasSeq, msg.lost
	var payload []byte
	if !lost {
		var err error
		if seq, hasSeq, payload, err = wire.ParseMessage(msg.frames); err != nil {
			s.dropBatch(err)
			return
		}
	}
	if !hasSeq {
		if lost || !s.apply(ctx, payload, false) {
			// Without a sequence number nothing can replay it: the
			// replica is cleared, as for an unrepairable gap.
			s.log.Warn("undecodable or dropped batch without a sequence number; clearing the replica")
			s.proc.Reset(time.Now().UnixMicro())
			s.changes++
			s.extendable = false
		}
		return
	}
	t := &s.seq
	newConn := msg.conn != t.conn
	t.conn = msg.conn
	switch {
	case !t.started:
		t.started, t.historyFrom = true, seq
		s.extendable = seq > 0
		if lost {
			// The history starts at the batch that was dropped: take it
			// from the replay.
			t.next = seq
			s.metrics.gap()
			s.recover(ctx, seq+1)
			return
		}
	case newConn && seq < t.next:
		// A new connection whose numbering went backwards: the engine's
		// publisher restarted, and its cache with it. Forget everything and
		// take the new engine's batches before this one (and a dropped
		// one itself) from its replay.
		s.engineRestarted("its sequence went back on a new connection", seq)
		t.started = true
		upTo := seq
		if lost {
			upTo++
		}
		if upTo > 0 && !s.recover(ctx, upTo) {
			// Shutdown: what the new engine's replay delivered so far is
			// applied; without any of it there is no history to verify,
			// and the next start syncs from the new engine's oldest batch.
			t.started = t.next > 0
			return
		}
		if lost {
			return
		}
	case seq < t.next:
		// Late (reordered) or already applied from a replay.
		return
	case seq > t.next, lost:
		s.metrics.gap()
		upTo := seq
		if lost {
			upTo++ // the dropped batch is missing too
		}
		if !s.recover(ctx, upTo) || lost {
			return // shutdown (the gap is left to the next start), or nothing to apply
		}
		if seq < t.next {
			return // the replay went past it
		}
	}
	prevSum := t.lastSum
	t.next = seq + 1
	t.lastSum = payloadSum(payload)
	if !s.apply(ctx, payload, true) {
		// A batch that does not decode is a batch not received: a gap of
		// one, repaired from the replay or, when its copy there does not
		// decode either (the same bytes), cleared. Skipping it would keep
		// blocks its events may have removed, re-reported by every
		// refresh.
		t.next, t.lastSum = seq, prevSum
		s.recover(ctx, seq+1)
	}
}

// recover fills [next, upTo) from the engine's replay endpoint. When it
// cannot, the replica is reset: ALL_CLEARED and an empty positional index,
// so the server keeps nothing the subscriber cannot vouch for. It returns
// false when ctx ended (shutdown) before the gap was filled: that proves
// nothing about the engine, so nothing is reset; next stays at the first
// batch still missing (the state file says so) and the next start's sync
// replays from there.
func (s *Subscriber) recover(ctx context.Context, upTo uint64) bool {
	t := &s.seq
	from := t.next
	outcome := ReplayOK
	if s.cfg.ReplayEndpoint == "" {
		outcome = ReplayUnavailable
	} else {
		rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
		s.replaying = true
		err := Replay(rctx, s.cfg.ReplayEndpoint, from, func(seq uint64, payload []byte) error {
			switch {
			case seq < t.next:
				return nil // overlap
			case seq > t.next:
				return errReplayHole
			}
			prevSum := t.lastSum
			t.next++
			t.lastSum = payloadSum(payload)
			if !s.apply(ctx, payload, true) {
				t.next--
				t.lastSum = prevSum
				return errReplayUndecodable
			}
			return nil
		})
		s.replaying = false
		cancel()
		if t.next < upTo && err != nil && ctx.Err() != nil {
			s.log.Info("shutdown during a gap replay; leaving the gap to the next start", "from", t.next, "to", upTo-1)
			return false
		}
		switch {
		case t.next >= upTo:
			// Every missing batch was applied; what went wrong after that
			// (waiting for the end marker, a hole past the gap) costs
			// nothing.
		case errors.Is(err, errReplayHole):
			outcome = ReplayIncomplete
		case errors.Is(err, errReplayUndecodable):
			outcome = ReplayError
		case errors.Is(err, ErrReplayTimeout):
			outcome = ReplayTimeout
		case errors.Is(err, ErrReplayUnavailable):
			outcome = ReplayUnavailable
		case err != nil:
			outcome = ReplayError
		case t.next < upTo:
			outcome = ReplayIncomplete
		}
	}
	s.metrics.replay(outcome)
	if outcome == ReplayOK {
		s.log.Info("sequence gap repaired by replay", "from", from, "to", upTo-1, "applied", t.next-from)
		return true
	}
	s.log.Warn("sequence gap not repairable; clearing the replica", "from", t.next, "to", upTo-1, "outcome", outcome)
	s.proc.Reset(time.Now().UnixMicro())
	s.changes++
	t.next, t.historyFrom = upTo, upTo
	s.extendable = false // the engine's buffer does not reach back past upTo
	return true
}

var (
	errReplayHole        = errors.New("kvevents: replay does not cover the gap")
	errReplayUndecodable = errors.New("kvevents: a replayed batch does not decode")
)

// engineRestarted clears the replica after evidence that the engine
// restarted (its cache is gone): ALL_CLEARED, an empty index, no history.
func (s *Subscriber) engineRestarted(why string, seq uint64) {
	s.metrics.restart()
	s.log.Warn("the engine restarted; clearing the replica", "why", why, "seq", seq, "expected", s.seq.next)
	s.proc.Reset(time.Now().UnixMicro())
	s.changes++
	s.seq = seqTracker{conn: s.seq.conn}
	s.extendable = false
}

// apply decodes and applies one batch. For a batch of the sequenced stream
// (tracked) whose BlockStored names a parent the index does not know, it
// first tries to extend the index's history (recoverHistory); the event is
// dropped and counted only if that does not resolve it. It returns false,
// having changed nothing, when the batch does not decode (counted and
// logged): the caller treats that as a lost batch.
func (s *Subscriber) apply(ctx context.Context, payload []byte, tracked bool) bool {
	if err := s.dec.Decode(payload, &s.batch); err != nil {
		s.dropBatch(err)
		return false
	}
	s.metrics.batchDecoded()
	s.changes++
	i := s.proc.applyFrom(&s.batch, 0, tracked && s.canRecover())
	if i < len(s.batch.Events) {
		if s.recoverHistory(ctx) {
			return true // the rebuilt index includes this batch
		}
		if ctx.Err() != nil {
			// Shutdown interrupted the recovery: the batch is half
			// applied, so keep the saved state, which the next start
			// replays from.
			s.keepSaved = true
			return true
		}
		s.proc.applyFrom(&s.batch, i, false)
	}
	return true
}

func (s *Subscriber) dropBatch(err error) {
	reason := wire.DecodeReason(err)
	s.metrics.batchDropped(reason)
	badBatchLog.Warn(context.Background(), s.log, "undecodable event batch", "reason", reason, "err", err)
}

// receive follows the engine's PUB and passes messages to out: in
// EndpointConnect mode it dials Endpoint, in EndpointBind mode it listens
// on it and takes the engine's connections one at a time. After a
// connection fails it waits ReconnectBackoff (a constant wait) and dials,
// or takes the next connection, again; each time is counted
// (zmq_reconnects_total). A ctx ended before the first session dials and
// binds nothing.
func (s *Subscriber) receive(ctx context.Context, out chan<- message) {
	if ctx.Err() != nil {
		return
	}
	r := &receiver{s: s, out: out}
	defer r.close()
	_ = reconnect.Loop(ctx, reconnect.Backoff{Min: s.cfg.ReconnectBackoff, Max: s.cfg.ReconnectBackoff},
		r.session, func(error, time.Duration) { s.metrics.reconnect() })
}

// receiver is the state of receive's goroutine, which alone uses it.
type receiver struct {
	s     *Subscriber
	out   chan<- message
	conn  uint64 // connections made so far: message.conn
	drops dropLog
	// ln listens on the bound endpoint (EndpointBind) from the first
	// session until receive returns.
	ln *engineListener
	// listenFailed rate-limits the warning of a failing listen.
	listenFailed logLimit
}

func (r *receiver) close() {
	if r.ln != nil {
		r.ln.close()
	}
}

// session follows one connection of the engine: a dialed one, or in
// EndpointBind mode the next the engine makes to the bound endpoint
// (waiting for it as long as it takes).
func (r *receiver) session(ctx context.Context) error {
	s := r.s
	if s.cfg.EndpointMode != EndpointBind {
		return r.connection(ctx, limitedEndpoint(s.cfg.Endpoint), nil)
	}
	if r.ln == nil {
		ln, err := listenEngine(s.bindAddr)
		if err != nil {
			if r.listenFailed.allow(time.Minute) {
				s.log.Warn("cannot bind the engine endpoint; retrying", "endpoint", s.cfg.Endpoint, "err", err)
			}
			return err
		}
		r.ln = ln
		ep := ln.endpoint()
		s.bound.Store(&ep)
		s.log.Info("listening for the engine's PUB to connect", "endpoint", ep)
	}
	c, err := r.ln.next(ctx)
	if err != nil {
		return err
	}
	return r.connection(withAccepted(ctx, c), acceptedScheme+"://engine", c)
}

// connection dials target once (the engine's endpoint, or with accepted
// set the connection the engine made to the bound endpoint) and passes
// messages to out (admit) until the connection fails (logged here) or ctx
// ends; it returns the error that ended it. A connection made increments
// r.conn.
func (r *receiver) connection(ctx context.Context, target string, accepted net.Conn) error {
	s := r.s
	refusal := &frameRefusal{}
	sock := zmq4.NewSub(withFrameRefusal(ctx, refusal), zmq4.WithLogger(zmqLogger), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(s.cfg.ReconnectBackoff))
	defer func() { _ = sock.Close() }()
	again := "dialing again"
	if accepted != nil {
		// zmq4 closes a connection it failed to open only when the
		// failure was a read or write error; this one is ours to close.
		defer func() { _ = accepted.Close() }()
		// A peer that connects and stays silent must not hold the
		// engine's place: the handshake has a deadline.
		_ = accepted.SetDeadline(time.Now().Add(handshakeTimeout))
		again = "waiting for the engine to connect again"
	}
	// A refused frame closes the connection; whatever zmq4 call comes
	// next fails with "closed connection", so the refusal is logged as
	// the reason.
	lost := func(what string, err error) {
		if r := refusal.Err(); r != nil {
			s.log.Warn("the engine's ZMTP frame is over the limit; dropping the connection and "+again,
				"endpoint", s.cfg.Endpoint, "err", r)
			return
		}
		switch {
		case what == "dial" && accepted != nil:
			s.log.Info("a connection to the bound endpoint failed the ZMTP handshake; waiting for the engine",
				"endpoint", s.cfg.Endpoint, "peer", accepted.RemoteAddr().String(), "err", err)
		case what == "dial":
			s.log.Debug("cannot dial engine; retrying", "endpoint", s.cfg.Endpoint, "err", err)
		case what == "subscribe":
			s.log.Warn("cannot subscribe; retrying", "topic", s.cfg.Topic, "err", err)
		default:
			s.log.Info("engine connection lost; "+again, "err", err)
		}
	}
	if err := sock.Dial(target); err != nil {
		lost("dial", err)
		return err
	}
	if accepted != nil {
		_ = accepted.SetDeadline(time.Time{})
	}
	if err := sock.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		lost("subscribe", err)
		return err
	}
	r.conn++
	s.connNow.Store(r.conn)
	select {
	case r.out <- message{conn: r.conn, connected: true}:
	case <-ctx.Done():
	}
	for {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() == nil {
				lost("recv", err)
			}
			return err
		}
		m, ok := s.admit(message{frames: msg.Frames, conn: r.conn}, &r.drops)
		if !ok {
			continue
		}
		select {
		case r.out <- m:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// logLimit rate-limits one log line: allow reports whether it may be
// logged now, at most once per interval. One goroutine's.
type logLimit struct{ last time.Time }

func (l *logLimit) allow(interval time.Duration) bool {
	if now := time.Now(); l.last.IsZero() || now.Sub(l.last) >= interval {
		l.last = now
		return true
	}
	return false
}

// admit counts m into the receive queue's bytes or, when that would take
// the queue past MaxReceiveQueueBytes, drops its frames and returns the
// lost marker that stands for it (with its sequence number, so the Run
// goroutine repairs it from the replay). A dropped message that does not
// even parse is only counted (ok false): the Run goroutine would have
// dropped it too. receive's goroutine only.
func (s *Subscriber) admit(m message, drops *dropLog) (_ message, ok bool) {
	for _, f := range m.frames {
		m.size += int64(len(f))
	}
	if s.queued.Add(m.size) <= MaxReceiveQueueBytes {
		return m, true
	}
	s.queued.Add(-m.size)
	s.metrics.batchDropped(dropReceiveQueue)
	drops.note(s.log, m.size)
	seq, hasSeq, _, err := wire.ParseMessage(m.frames)
	if err != nil {
		return message{}, false
	}
	return message{conn: m.conn, lost: true, seq: seq, hasSeq: hasSeq}, true
}

// dropReceiveQueue is the batches_dropped_total reason of a message the
// receive queue's byte bound dropped.
const dropReceiveQueue = "receive_queue"

// dropLog rate-limits the receive queue's warning to one line per 10 s,
// with the drops since the previous one. receive's goroutine only.
type dropLog struct {
	last  time.Time
	n     int
	bytes int64
}

func (d *dropLog) note(log *slog.Logger, size int64) {
	d.n++
	d.bytes += size
	if now := time.Now(); now.Sub(d.last) >= 10*time.Second {
		log.Warn("the receive queue is over its byte bound; dropping engine batches (repaired from the replay like a gap)",
			"dropped", d.n, "bytes", d.bytes, "bound", MaxReceiveQueueBytes)
		d.last, d.n, d.bytes = now, 0, 0
	}
}

// scrapeLoop sends engine stats every StatsInterval.
func (s *Subscriber) scrapeLoop(ctx context.Context) {
	sc := &StatsScraper{URL: s.cfg.MetricsURL, CacheSizeBytes: s.cfg.CacheSizeBytes, ClientVersion: ClientVersion,
		QueuedTokensMetric: s.cfg.QueuedTokensMetric, RankLabel: s.cfg.MetricsRankLabel, Rank: s.cfg.MetricsRank}
	tick := time.NewTicker(s.cfg.StatsInterval)
	defer tick.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, min(s.cfg.StatsInterval, 5*time.Second))
		st, err := sc.Scrape(sctx)
		cancel()
		if err != nil {
			s.metrics.scrape("error")
			s.log.Debug("engine stats scrape failed", "url", s.cfg.MetricsURL, "err", err)
		} else {
			s.metrics.scrape("ok")
			st.ReplicaId = s.cfg.ReplicaID
			s.fwd.Stats(st, time.Now().UnixMicro())
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
