package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/inferencecache/inferencecache/internal/reconnect"
)

// Consumer defaults.
const (
	// DefaultReadyLag is the lag, in messages, under which the consumer
	// counts as caught up (--nats-ready-lag).
	DefaultReadyLag = 64
	// DefaultMaxBatch bounds the messages handed to Apply at once.
	DefaultMaxBatch = 256
	// lagPoll is how often the lag is read from NATS while idle.
	lagPoll = time.Second
	// callTimeout bounds one JetStream API call.
	callTimeout = 5 * time.Second
	// retry bounds the wait before a new consumer session.
	retryMin, retryMax = 250 * time.Millisecond, 5 * time.Second
)

// sessionBackoff is the wait before a new consumer session: retryMin
// doubling to retryMax, and retryMin again after a session that ran
// retryMax or longer (a working one, not one more failed attempt: without
// the reset a consumer whose NATS failed five times early in its life
// waited 5 s after every later session end).
var sessionBackoff = reconnect.Backoff{Min: retryMin, Max: retryMax, ResetAfter: retryMax}

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Stream names the stream; the consumer creates it with this
	// configuration when it does not exist (it never updates one).
	Stream StreamConfig
	// Filters are the subjects consumed (see Subject, TenantFilter); empty
	// consumes the whole stream.
	Filters []string
	// Apply receives messages in stream order from one goroutine; the
	// slice and the payloads are valid until it returns. Required.
	Apply func(batch []Message)
	// ReadyLag: CaughtUp closes once the messages the stream held at start
	// are applied and the lag is at most this many messages (or the lag is
	// 0); 0 means DefaultReadyLag (a negative value means 0).
	ReadyLag int
	// MaxBatch; 0 means DefaultMaxBatch.
	MaxBatch int
	Logger   *slog.Logger
}

// Consumer reads the stream from its first retained message with an
// ordered (ephemeral, per-process, flow-controlled) JetStream consumer, so
// every server sees every message, in order. On start it replays the
// retained window; CaughtUp closes once the lag first falls to ReadyLag.
// When the connection is lost the nats.go ordered consumer recreates itself
// from the last stream sequence delivered once NATS is back; if that fails
// (the stream was deleted, ...), Run starts a new session from the last
// sequence it applied. A stream found re-created (another creation time, or
// its sequences behind the last one applied: NATS lost its store, or
// someone deleted it) is read again from its start.
//
// Run never waits on a call into the ordered consumer that ignores
// contexts (its Info and Stop wait on a lock it holds while it retries its
// own recovery, without bound while the stream is missing): those run on
// goroutines of their own, and a session's delivery callback returns once
// the session ended.
type Consumer struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	cfg ConsumerConfig // immutable after NewConsumer
	log *slog.Logger

	// caughtUp is closed once (caughtOnce) when the lag first reached
	// ReadyLag.
	caughtUp   chan struct{}
	caughtOnce sync.Once

	// Only the Run goroutine reads or writes these.
	//
	// streamCreated is the creation time of the stream read so far (zero
	// before a session read it): another one means the stream was
	// re-created. targetSet is set once a session read the consumer's
	// pending count: the replay target.
	streamCreated time.Time
	targetSet     bool

	// Progress, written by the Run goroutine, read by metrics and tests at
	// any time.
	started      time.Time     // set by NewConsumer
	applied      atomic.Uint64 // messages passed to Apply (or skipped as unknown)
	lastSeq      atomic.Uint64 // stream sequence of the last applied message; moves back only to 0 when the stream was re-created
	lag          atomic.Uint64 // messages in the stream (filtered) not applied yet
	replayTarget atomic.Uint64 // messages pending when the first session read the stream
	replayEnd    atomic.Uint64 // the stream's last sequence then: the replay ends there
	lastCurrent  atomic.Int64  // unix nanos when the lag was last seen at 0
	replayNanos  atomic.Int64  // start to caught up; 0 before
	sessions     atomic.Uint64 // consumer sessions begun
	streamResets atomic.Uint64 // streams found re-created
	byKind       [3]atomic.Uint64
}

// NewConsumer returns a Consumer on nc (which the caller closes).
func NewConsumer(nc *nats.Conn, cfg ConsumerConfig) (*Consumer, error) {
	if err := cfg.Stream.Validate(); err != nil {
		return nil, err
	}
	if cfg.Apply == nil {
		return nil, errors.New("bus: ConsumerConfig.Apply is required")
	}
	switch {
	case cfg.ReadyLag == 0:
		cfg.ReadyLag = DefaultReadyLag
	case cfg.ReadyLag < 0:
		cfg.ReadyLag = 0
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("cannot create a JetStream context: %w", err)
	}
	return &Consumer{nc: nc, js: js, cfg: cfg, log: cfg.Logger, caughtUp: make(chan struct{}), started: time.Now()}, nil
}

// CaughtUp is closed once the consumer first caught up with the stream.
func (c *Consumer) CaughtUp() <-chan struct{} { return c.caughtUp }

// Progress is a consistent-enough view of the consumer for metrics.
type Progress struct {
	Connected    bool
	CaughtUp     bool
	Applied      uint64 // messages applied in all
	LastSeq      uint64
	Lag          uint64 // messages not applied yet (last known)
	ReplayTarget uint64 // messages retained when the first session began
	Replay       time.Duration
	// Stale is how long ago the consumer last knew itself current (lag 0);
	// 0 while it is.
	Stale    time.Duration
	Sessions uint64
	// StreamResets counts the times the stream was found re-created.
	StreamResets uint64
	Updates      uint64 // applied messages by kind
	Events       uint64
	Unknown      uint64
}

// Progress returns the consumer's progress.
func (c *Consumer) Progress() Progress {
	p := Progress{
		Connected:    c.nc.Status() == nats.CONNECTED,
		Applied:      c.applied.Load(),
		LastSeq:      c.lastSeq.Load(),
		Lag:          c.lag.Load(),
		ReplayTarget: c.replayTarget.Load(),
		Replay:       time.Duration(c.replayNanos.Load()),
		Sessions:     c.sessions.Load(),
		StreamResets: c.streamResets.Load(),
		Updates:      c.byKind[KindUpdate].Load(),
		Events:       c.byKind[KindEvent].Load(),
		Unknown:      c.byKind[KindUnknown].Load(),
	}
	select {
	case <-c.caughtUp:
		p.CaughtUp = true
	default:
	}
	if !p.Connected || p.Lag > 0 {
		if last := c.lastCurrent.Load(); last > 0 {
			p.Stale = time.Since(time.Unix(0, last))
		} else {
			p.Stale = time.Since(c.started)
		}
	}
	return p
}

// Run consumes until ctx ends; it returns ctx.Err(). A session that ends
// while ctx is live is logged and followed by a new one after retryMin,
// doubling to retryMax, back to retryMin after a session that ran at least
// retryMax (sessionBackoff, reconnect.Loop).
func (c *Consumer) Run(ctx context.Context) error {
	return reconnect.Loop(ctx, sessionBackoff, c.session, func(err error, wait time.Duration) {
		c.log.Warn("NATS consumer session ended; starting a new one", "err", err, "after", wait, "last_seq", c.lastSeq.Load())
	})
}

// waitConnected waits until nc is connected or ctx ends.
func (c *Consumer) waitConnected(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for c.nc.Status() != nats.CONNECTED {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// errStreamRecreated ends a session whose stream was replaced by another
// of the same name.
var errStreamRecreated = errors.New("bus: the stream was re-created")

// session runs one ordered consumer from the message after the last one
// applied until ctx ends or it fails.
func (c *Consumer) session(ctx context.Context) error {
	if err := c.waitConnected(ctx); err != nil {
		return err
	}
	c.sessions.Add(1)
	// The session's own scope: its end releases the delivery callback and
	// any call still in flight.
	sctx, endSession := context.WithCancel(ctx)
	defer endSession()
	cctx, cancel := context.WithTimeout(sctx, callTimeout)
	defer cancel()
	stream, err := EnsureStream(cctx, c.js, c.cfg.Stream, false)
	if err != nil {
		return err
	}
	c.adoptStream(stream.CachedInfo())
	occ := jetstream.OrderedConsumerConfig{FilterSubjects: c.cfg.Filters, DeliverPolicy: jetstream.DeliverAllPolicy}
	if last := c.lastSeq.Load(); last > 0 {
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, last+1
	}
	cons, err := stream.OrderedConsumer(cctx, occ)
	if err != nil {
		return fmt.Errorf("cannot create the ordered consumer: %w", err)
	}
	// Nothing holds the ordered consumer's lock before Consume: this Info
	// honors cctx.
	info, err := cons.Info(cctx)
	if err != nil {
		return fmt.Errorf("cannot read the consumer: %w", err)
	}
	c.lag.Store(info.NumPending)
	if !c.targetSet {
		c.targetSet = true
		c.replayTarget.Store(info.NumPending)
		c.replayEnd.Store(stream.CachedInfo().State.LastSeq)
		c.log.Info("replaying the NATS stream", "stream", c.cfg.Stream.Name, "messages", info.NumPending, "filters", c.cfg.Filters)
	}
	c.noteLag(info.NumPending)

	// The callback only hands messages over; a full channel holds NATS's
	// delivery back (flow control) until the apply loop catches up. recv
	// counts the messages handed over in this session, applied (the loop's
	// own) those it applied: recv-applied are in the channel.
	ch := make(chan jetstream.Msg, 4*c.cfg.MaxBatch)
	var recv atomic.Uint64
	var applied uint64
	errCh := make(chan error, 1)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case ch <- m:
			recv.Add(1)
		case <-sctx.Done():
		}
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		c.log.Debug("NATS consumer", "err", err)
		if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrStreamNotFound) {
			select {
			case errCh <- err:
			default:
			}
		}
	}))
	if err != nil {
		return fmt.Errorf("cannot consume: %w", err)
	}
	// Stop can wait on the ordered consumer's lock for seconds; it ends the
	// consumer's own retries (bounded), so nothing waits for it.
	defer func() { go cc.Stop() }()
	closed := cc.Closed() // one goroutine per call, waiting for the stop: call it once

	// pending receives the consumer's pending count, read by a goroutine
	// of its own (infoBusy: at most one in flight) since the read waits on
	// the ordered consumer's lock.
	pending := make(chan uint64, 1)
	var infoBusy atomic.Bool
	batch := make([]Message, 0, c.cfg.MaxBatch)
	poll := time.NewTicker(lagPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errCh:
			return err
		case <-closed:
			return errors.New("bus: the consumer closed")
		case <-poll.C:
			if err := c.checkStream(sctx); err != nil {
				return err
			}
			if c.nc.Status() == nats.CONNECTED && infoBusy.CompareAndSwap(false, true) {
				go func() {
					defer infoBusy.Store(false)
					ictx, cancel := context.WithTimeout(sctx, callTimeout)
					defer cancel()
					if info, err := cons.Info(ictx); err == nil && ictx.Err() == nil {
						select {
						case pending <- info.NumPending:
						default:
						}
					}
				}()
			}
			continue
		case n := <-pending:
			inFlight := recv.Load() - applied
			c.lag.Store(n + inFlight)
			if inFlight == 0 {
				c.noteLag(n)
			}
			continue
		case m := <-ch:
			batch = c.appendMsg(batch[:0], m)
		}
		for len(batch) < c.cfg.MaxBatch {
			select {
			case m := <-ch:
				batch = c.appendMsg(batch, m)
				continue
			default:
			}
			break
		}
		applied += uint64(len(batch))
		c.apply(batch)
		clear(batch) // drop the payload references
	}
}

// adoptStream compares the stream a session found with the one read so
// far: a re-created stream (another creation time, or its last sequence
// behind the last one applied) is read from its start; messages the
// stream's limits discarded before this consumer read them are logged.
// Run goroutine only.
func (c *Consumer) adoptStream(si *jetstream.StreamInfo) {
	if si == nil {
		return
	}
	last := c.lastSeq.Load()
	if !c.streamCreated.IsZero() && (!si.Created.Equal(c.streamCreated) || si.State.LastSeq < last) {
		c.streamResets.Add(1)
		c.log.Warn("the NATS stream was re-created; reading it from its start", "stream", c.cfg.Stream.Name,
			"created", si.Created, "was_created", c.streamCreated, "last_seq", si.State.LastSeq, "applied_up_to", last)
		c.lastSeq.Store(0)
		last = 0
	}
	c.streamCreated = si.Created
	if last > 0 && si.State.FirstSeq > last+1 {
		c.log.Warn("the stream discarded messages before this server read them (its age or byte bound); the index may miss what they reported until the next refresh",
			"stream", c.cfg.Stream.Name, "missed", si.State.FirstSeq-last-1)
	}
}

// checkStream reads the stream's state (honoring ctx, unlike the ordered
// consumer's calls) and ends the session when the stream is gone or was
// re-created: the ordered consumer would otherwise go on retrying, or
// resume past the new stream's messages.
func (c *Consumer) checkStream(ctx context.Context) error {
	if c.nc.Status() != nats.CONNECTED {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	s, err := c.js.Stream(cctx, c.cfg.Stream.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("bus: stream %s: %w", c.cfg.Stream.Name, err)
	case err != nil:
		return nil // a timeout or a disconnect: the next poll sees
	}
	si := s.CachedInfo()
	if !si.Created.Equal(c.streamCreated) || si.State.LastSeq < c.lastSeq.Load() {
		return errStreamRecreated
	}
	return nil
}

// appendMsg converts m; its pending count becomes the lag once applied.
func (c *Consumer) appendMsg(batch []Message, m jetstream.Msg) []Message {
	msg := Message{Kind: KindOf(m.Headers()), Subject: m.Subject(), Data: m.Data()}
	if meta, err := m.Metadata(); err == nil {
		msg.Seq, msg.Time, msg.pending = meta.Sequence.Stream, meta.Timestamp, meta.NumPending
	}
	return append(batch, msg)
}

// apply hands batch to Apply (unknown kinds and messages at or below the
// last sequence applied removed) and records progress.
func (c *Consumer) apply(batch []Message) {
	if len(batch) == 0 {
		return
	}
	last := c.lastSeq.Load()
	known := batch[:0]
	var n, seq uint64
	for _, m := range batch {
		if m.Seq != 0 && m.Seq <= last {
			continue // applied already (a redelivery)
		}
		n++
		seq = max(seq, m.Seq)
		c.byKind[m.Kind].Add(1)
		if m.Kind == KindUnknown {
			unknownKindLog.Warn(context.Background(), c.log, "skipping a NATS message without a known kind header", "subject", m.Subject, "seq", m.Seq)
			continue
		}
		known = append(known, m)
	}
	if len(known) > 0 {
		c.cfg.Apply(known)
	}
	c.applied.Add(n)
	if seq > last {
		c.lastSeq.Store(seq)
	}
	pending := batch[len(batch)-1].pending
	c.lag.Store(pending)
	c.noteLag(pending)
}

// noteLag records a lag reading: current at 0; caught up at 0, or at
// ReadyLag once the replay of what the stream held at start is done (the
// lag bound is for live traffic: at start, ReadyLag messages of thousands
// of entries each may be most of the window).
func (c *Consumer) noteLag(lag uint64) {
	if lag == 0 {
		c.lastCurrent.Store(time.Now().UnixNano())
	}
	if !c.targetSet {
		return // no session read the stream yet: nothing is known
	}
	if lag == 0 || lag <= uint64(c.cfg.ReadyLag) && c.lastSeq.Load() >= c.replayEnd.Load() {
		c.caughtOnce.Do(func() {
			d := time.Since(c.started)
			c.replayNanos.Store(int64(d))
			c.log.Info("caught up with the NATS stream", "took", d.Round(time.Millisecond), "applied", c.applied.Load(), "lag", lag)
			close(c.caughtUp)
		})
	}
}
