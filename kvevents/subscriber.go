package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
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
)

// Config configures a Subscriber; cmd/kvevent-subscriber fills it from its
// flags. Zero values take the defaults.
type Config struct {
	ReplicaID, TenantID, ModelID string
	// HashScheme is the engine domain tag sent with every update ("vllm",
	// "sglang").
	HashScheme string

	// Endpoint is the engine's PUB endpoint the SUB socket dials.
	Endpoint string
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
	cfg     Config // immutable after New
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

	// Owned by the Run goroutine.
	dec   *Decoder
	batch Batch
	// rdec and rbatch decode replayed batches of a sync or a recovery,
	// which can run while batch is still in use.
	rdec   *Decoder
	rbatch Batch
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
// conn.
type message struct {
	frames    [][]byte
	conn      uint64
	connected bool
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
		cfg:     cfg,
		log:     cfg.Logger,
		metrics: m,
		idx:     idx,
		fwd:     fwd,
		proc:    NewProcessor(idx, fwd, cfg.L2, cfg.Logger, m),
		dec:     NewDecoder(),
		rdec:    NewDecoder(),
	}, nil
}

// Index returns the positional index (read-only use: Len, AppendSnapshot).
func (s *Subscriber) Index() *Index { return s.idx }

// Forwarder returns the forwarder (Flush, Buffered).
func (s *Subscriber) Forwarder() *Forwarder { return s.fwd }

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

	msgs := make(chan message, 256)
	wg.Go(func() { s.receive(ctx, msgs) })
	if s.cfg.MetricsURL != "" {
		wg.Go(func() { s.scrapeLoop(ctx) })
	}
	s.log.Info("subscribing to engine KV events", "endpoint", s.cfg.Endpoint, "topic", s.cfg.Topic,
		"replay", s.cfg.ReplayEndpoint, "replica", s.cfg.ReplicaID)

loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case msg := <-msgs:
			s.handle(ctx, msg)
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
		if data := s.encodeState(w.failed.Load()); data != nil {
			w.write(data)
		}
	}
	return flushErr
}

// handle applies one live message, repairing a gap before it if needed.
func (s *Subscriber) handle(ctx context.Context, msg message) {
	if msg.connected {
		s.onConnect(ctx, msg.conn)
		s.connects.Add(1)
		return
	}
	seq, hasSeq, payload, err := ParseMessage(msg.frames)
	if err != nil {
		s.dropBatch(err)
		return
	}
	if !hasSeq {
		s.apply(ctx, payload, false)
		return
	}
	t := &s.seq
	newConn := msg.conn != t.conn
	t.conn = msg.conn
	switch {
	case !t.started:
		t.started, t.historyFrom = true, seq
		s.extendable = seq > 0
	case newConn && seq < t.next:
		// A new connection whose numbering went backwards: the engine's
		// publisher restarted, and its cache with it. Forget everything and
		// take the new engine's batches before this one from its replay.
		s.engineRestarted("its sequence went back on a new connection", seq)
		t.started = true
		if seq > 0 {
			s.recover(ctx, seq)
		}
	case seq < t.next:
		// Late (reordered) or already applied from a replay.
		return
	case seq > t.next:
		s.metrics.gap()
		s.recover(ctx, seq)
		if seq < t.next {
			return // the replay went past it
		}
	}
	t.next = seq + 1
	t.lastSum = payloadSum(payload)
	s.apply(ctx, payload, true)
}

// recover fills [next, upTo) from the engine's replay endpoint. When it
// cannot, the replica is reset: ALL_CLEARED and an empty positional index,
// so the server keeps nothing the subscriber cannot vouch for.
func (s *Subscriber) recover(ctx context.Context, upTo uint64) {
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
			t.next++
			t.lastSum = payloadSum(payload)
			s.apply(ctx, payload, true)
			return nil
		})
		s.replaying = false
		cancel()
		switch {
		case t.next >= upTo:
			// Every missing batch was applied; what went wrong after that
			// (waiting for the end marker, a hole past the gap) costs
			// nothing.
		case errors.Is(err, errReplayHole):
			outcome = ReplayIncomplete
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
		return
	}
	s.log.Warn("sequence gap not repairable; clearing the replica", "from", t.next, "to", upTo-1, "outcome", outcome)
	s.proc.Reset(time.Now().UnixMicro())
	s.changes++
	t.next, t.historyFrom = upTo, upTo
	s.extendable = false // the engine's buffer does not reach back past upTo
}

var errReplayHole = errors.New("kvevents: replay does not cover the gap")

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
// dropped and counted only if that does not resolve it.
func (s *Subscriber) apply(ctx context.Context, payload []byte, tracked bool) {
	if err := s.dec.Decode(payload, &s.batch); err != nil {
		s.dropBatch(err)
		return
	}
	s.metrics.batchDecoded()
	s.changes++
	i := s.proc.applyFrom(&s.batch, 0, tracked && s.canRecover())
	if i < len(s.batch.Events) {
		if s.recoverHistory(ctx) {
			return // the rebuilt index includes this batch
		}
		s.proc.applyFrom(&s.batch, i, false)
	}
}

func (s *Subscriber) dropBatch(err error) {
	reason := DecodeReason(err)
	s.metrics.batchDropped(reason)
	s.log.Warn("skipping undecodable event batch", "reason", reason, "err", err)
}

// receive dials the engine's PUB endpoint and passes messages to out,
// re-dialing after ReconnectBackoff whenever the connection fails.
func (s *Subscriber) receive(ctx context.Context, out chan<- message) {
	first := true
	var conn uint64
	for ctx.Err() == nil {
		if !first {
			s.metrics.reconnect()
			if !sleepCtx(ctx, s.cfg.ReconnectBackoff) {
				return
			}
		}
		first = false
		sock := zmq4.NewSub(ctx, zmq4.WithLogger(zmqLogger), zmq4.WithDialerMaxRetries(0),
			zmq4.WithDialerTimeout(s.cfg.ReconnectBackoff))
		if err := sock.Dial(s.cfg.Endpoint); err != nil {
			s.log.Debug("cannot dial engine; retrying", "endpoint", s.cfg.Endpoint, "err", err)
			_ = sock.Close()
			continue
		}
		if err := sock.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
			s.log.Warn("cannot subscribe; retrying", "topic", s.cfg.Topic, "err", err)
			_ = sock.Close()
			continue
		}
		conn++
		s.connNow.Store(conn)
		select {
		case out <- message{conn: conn, connected: true}:
		case <-ctx.Done():
		}
		for {
			msg, err := sock.Recv()
			if err != nil {
				if ctx.Err() == nil {
					s.log.Info("engine connection lost; reconnecting", "err", err)
				}
				break
			}
			select {
			case out <- message{frames: msg.Frames, conn: conn}:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
		}
		_ = sock.Close()
	}
}

// scrapeLoop sends engine stats every StatsInterval.
func (s *Subscriber) scrapeLoop(ctx context.Context) {
	sc := &StatsScraper{URL: s.cfg.MetricsURL, CacheSizeBytes: s.cfg.CacheSizeBytes, ClientVersion: ClientVersion, QueuedTokensMetric: s.cfg.QueuedTokensMetric}
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
