package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
)

// Publisher defaults.
const (
	// DefaultMaxPending bounds the publishes awaiting their JetStream ack.
	DefaultMaxPending = 256
	// DefaultAckTimeout is how long a publish may wait for its ack before
	// it counts as lost.
	DefaultAckTimeout = 5 * time.Second
)

// Errors of Publish.
var (
	// ErrNotConnected is returned while the connection to NATS is down: the
	// message was not sent (retry later).
	ErrNotConnected = errors.New("bus: not connected to NATS")
	// ErrTooLarge is returned for a message over the NATS server's maximum
	// payload: it was not sent, and never will be as it is (split it).
	ErrTooLarge = errors.New("bus: message over the NATS maximum payload")
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	Stream StreamConfig
	// Producer goes into HeaderProducer.
	Producer string
	// MaxPending bounds publishes awaiting their ack; 0 means
	// DefaultMaxPending. A publish that finds it full waits (bounded by its
	// context) for room.
	MaxPending int
	// AckTimeout; 0 means DefaultAckTimeout.
	AckTimeout time.Duration
	Logger     *slog.Logger
}

// Publisher publishes reports to the stream asynchronously: Publish hands
// the message to NATS and returns; its JetStream ack arrives later. A
// message NATS did not store (a negative or missing ack, the connection lost
// with the message in flight) is counted, and TakeLost hands the count to
// the caller, who must then assume anything it published may be missing
// (the forwarder clears and resyncs its replica). Messages reach the stream
// in publish order: a publish is never retried behind later ones.
//
// It is safe for concurrent use.
type Publisher struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	cfg PublisherConfig // immutable after NewPublisher
	log *slog.Logger

	// streamOK is set once the stream was ensured and cleared when an ack
	// says no stream took a message (NATS lost it); Publish ensures the
	// stream again before the next message.
	streamOK atomic.Bool
	// lost counts messages not stored since the last TakeLost (written by
	// the ack error callback, swapped to 0 by TakeLost); lostTotal never
	// resets (Lost).
	lost, lostTotal atomic.Uint64
}

// NewPublisher returns a Publisher on nc (which the caller closes).
func NewPublisher(nc *nats.Conn, cfg PublisherConfig) (*Publisher, error) {
	if err := cfg.Stream.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Publisher{nc: nc, cfg: cfg, log: cfg.Logger}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout),
		jetstream.WithPublishAsyncErrHandler(p.onAckError),
	)
	if err != nil {
		return nil, fmt.Errorf("cannot create a JetStream context: %w", err)
	}
	p.js = js
	return p, nil
}

func (p *Publisher) onAckError(_ jetstream.JetStream, m *nats.Msg, err error) {
	p.lost.Add(1)
	p.lostTotal.Add(1)
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		p.streamOK.Store(false)
	}
	p.log.Debug("a published message was not stored", "subject", m.Subject, "err", err)
}

// JetStream returns the publisher's JetStream context.
func (p *Publisher) JetStream() jetstream.JetStream { return p.js }

// Publish sends m (encoded) to subject with kind k. It returns once NATS
// has the message, or an error when it was not sent: not connected
// (ErrNotConnected), no room among the pending acks before ctx ended, the
// stream could not be ensured. ctx should carry a deadline.
func (p *Publisher) Publish(ctx context.Context, subject string, k Kind, m proto.Message) error {
	if p.nc.Status() != nats.CONNECTED {
		return ErrNotConnected
	}
	if !p.streamOK.Load() {
		if _, err := EnsureStream(ctx, p.js, p.cfg.Stream, true); err != nil {
			return err
		}
		p.streamOK.Store(true)
	}
	data, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("cannot encode a %s: %w", k, err)
	}
	if limit := p.nc.MaxPayload(); limit > 0 && int64(len(data)) > limit-1024 { // room for the headers
		return fmt.Errorf("%w: %s of %d bytes, limit %d", ErrTooLarge, k, len(data), limit)
	}
	msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{
		HeaderKind:     []string{k.String()},
		HeaderProducer: []string{p.cfg.Producer},
	}}
	stall := time.Second
	if dl, ok := ctx.Deadline(); ok {
		stall = max(time.Until(dl), time.Millisecond)
	}
	if _, err := p.js.PublishMsgAsync(msg,
		jetstream.WithRetryAttempts(0), // a retry could land behind later messages
		jetstream.WithStallWait(stall),
		jetstream.WithExpectStream(p.cfg.Stream.Name),
	); err != nil {
		return fmt.Errorf("cannot publish to %s: %w", subject, err)
	}
	return nil
}

// TakeLost returns how many published messages were not stored since the
// last call, and resets the count.
func (p *Publisher) TakeLost() uint64 { return p.lost.Swap(0) }

// Lost returns how many published messages were not stored in all.
func (p *Publisher) Lost() uint64 { return p.lostTotal.Load() }

// Pending returns the publishes awaiting their ack.
func (p *Publisher) Pending() int { return p.js.PublishAsyncPending() }

// Flush waits until every publish was acknowledged (or counted lost), or
// ctx ends.
func (p *Publisher) Flush(ctx context.Context) error {
	select {
	case <-p.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("cannot flush %d pending publishes: %w", p.Pending(), ctx.Err())
	}
}
