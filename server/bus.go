package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/metadata"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/internal/ratelog"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// NATSConfig turns on consuming producer reports from a NATS JetStream
// stream (docs/scaleout.md), alongside the gRPC producer RPCs.
type NATSConfig struct {
	// URL of the NATS server(s); empty: no NATS.
	URL string
	// Stream is the stream's configuration; the server creates the stream
	// with it when missing, and never updates an existing one (the
	// subscribers own its retention).
	Stream bus.StreamConfig
	// Filters are the subjects this server consumes (a shard); empty: all.
	Filters []string
	// ReadyLag is the lag, in messages, under which the server counts as
	// caught up and turns ready; 0 means bus.DefaultReadyLag.
	ReadyLag int
}

// busApplier applies stream messages through the Service's own producer
// handlers, so a report means the same whether it came over gRPC or NATS.
// One goroutine (the consumer's) calls apply.
//
// A message is applied only when its subject is the one of its payload's
// (tenant, model): NATS subject permissions are the tenant boundary on the
// bus (a producer allowed to publish on <stream>.teamA.* only), so a
// payload naming another tenant or model than its subject is dropped.
type busApplier struct {
	s      *Server
	log    *slog.Logger
	stream string // the stream's name, its subjects' first token
	// subj is the scratch subject of the payload being checked (the
	// consumer's goroutine only).
	subj []byte
	// drops counts messages not applied, by reason; read by metrics.
	malformed, refused, panics, subject atomic.Uint64
	// One limiter per log call site a stream message can trigger (the
	// zero value: one line per 10 s, the next counting those held back).
	malformedUpdateLog, refusedUpdateLog, malformedEventLog, refusedEventLog, panicLog, subjectLog ratelog.Limiter
}

// Reasons of inferencecache_bus_messages_dropped_total.
const (
	busDropMalformed = "malformed" // the payload does not decode
	busDropRefused   = "refused"   // the handler refused it (an oversized id)
	busDropPanic     = "panic"     // the handler panicked (a bug; logged with the stack)
	busDropSubject   = "subject"   // the subject is not the payload's (tenant, model)
)

// subjectMatches reports whether subject is the one of (tenant, model), and
// counts and logs the drop when not.
func (a *busApplier) subjectMatches(m *bus.Message, tenant, model string) bool {
	a.subj = bus.AppendSubject(a.subj[:0], a.stream, tenant, model)
	if string(a.subj) == m.Subject {
		return true
	}
	a.subject.Add(1)
	a.subjectLog.Warn(context.Background(), a.log, "dropping a NATS message whose subject is not its payload's tenant and model", "subject", m.Subject, "seq", m.Seq,
		"payload_subject", string(a.subj))
	return false
}

func (a *busApplier) apply(batch []bus.Message) {
	for len(batch) > 0 {
		if batch[0].Kind != bus.KindUpdate {
			a.event(batch[0])
			batch = batch[1:]
			continue
		}
		n := 1
		for n < len(batch) && batch[n].Kind == bus.KindUpdate {
			n++
		}
		a.updates(batch[:n])
		batch = batch[n:]
	}
}

// updates feeds consecutive updates to ReportCacheState as one stream (its
// message and converter are reused across them).
func (a *busApplier) updates(msgs []bus.Message) {
	defer a.recover()
	st := &busStream{ctx: context.Background(), msgs: msgs, a: a}
	if err := a.s.service.ReportCacheState(st); err != nil {
		a.refused.Add(1)
		a.refusedUpdateLog.Warn(context.Background(), a.log, "a NATS update was refused", "err", err)
	}
}

func (a *busApplier) event(m bus.Message) {
	defer a.recover()
	var ev pb.CacheEvent
	if err := bus.DecodeEvent(m.Data, &ev); err != nil {
		a.malformed.Add(1)
		a.malformedEventLog.Warn(context.Background(), a.log, "skipping a malformed NATS event", "subject", m.Subject, "seq", m.Seq, "err", err)
		return
	}
	if !a.subjectMatches(&m, ev.GetTenantId(), ev.GetModelId()) {
		return
	}
	if ev.TimestampUs == 0 {
		ev.TimestampUs = m.Time.UnixMicro() // 0 means "now": the time it was published
	}
	if _, err := a.s.service.PublishEvent(context.Background(), &ev); err != nil {
		a.refused.Add(1)
		a.refusedEventLog.Warn(context.Background(), a.log, "a NATS event was refused", "subject", m.Subject, "seq", m.Seq, "err", err)
	}
}

func (a *busApplier) recover() {
	if r := recover(); r != nil {
		a.panics.Add(1)
		a.panicLog.Error(context.Background(), a.s.log, "BUG: panic applying a NATS message; skipped", "panic", r)
	}
}

// busStream presents stream messages to Service.ReportCacheState as a
// client stream: RecvMsg decodes the next update in place (skipping and
// counting malformed ones), then io.EOF.
type busStream struct {
	ctx  context.Context
	msgs []bus.Message
	a    *busApplier
}

var _ pb.InferenceCache_ReportCacheStateServer = (*busStream)(nil)

func (s *busStream) RecvMsg(m any) error {
	u, ok := m.(*pb.CacheStateUpdate)
	if !ok {
		return fmt.Errorf("BUG: busStream.RecvMsg(%T)", m)
	}
	for len(s.msgs) > 0 {
		msg := s.msgs[0]
		s.msgs = s.msgs[1:]
		if err := bus.DecodeUpdate(msg.Data, u); err != nil {
			s.a.malformed.Add(1)
			s.a.malformedUpdateLog.Warn(s.ctx, s.a.log, "skipping a malformed NATS update", "subject", msg.Subject, "seq", msg.Seq, "err", err)
			continue
		}
		if !s.a.subjectMatches(&msg, u.GetTenantId(), u.GetModelId()) {
			continue
		}
		if u.TimestampUs == 0 {
			u.TimestampUs = msg.Time.UnixMicro()
		}
		return nil
	}
	return io.EOF
}

func (s *busStream) Recv() (*pb.CacheStateUpdate, error) {
	u := new(pb.CacheStateUpdate)
	if err := s.RecvMsg(u); err != nil {
		return nil, err
	}
	return u, nil
}

func (s *busStream) SendAndClose(*pb.Ack) error   { return nil }
func (s *busStream) SetHeader(metadata.MD) error  { return nil }
func (s *busStream) SendHeader(metadata.MD) error { return nil }
func (s *busStream) SetTrailer(metadata.MD)       {}
func (s *busStream) Context() context.Context     { return s.ctx }
func (s *busStream) SendMsg(any) error            { return errors.New("busStream: SendMsg is not supported") }

// newBus connects to NATS (without waiting) and builds the consumer.
func (s *Server) newBus() error {
	c := s.cfg.NATS
	nc, err := bus.Connect(c.URL, "inferencecache-server "+s.instanceID, s.log)
	if err != nil {
		return err
	}
	stream := c.Stream
	if err := stream.Validate(); err != nil { // fills the default name
		nc.Close()
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	s.busApp = &busApplier{s: s, log: s.log, stream: stream.Name}
	s.bus, err = bus.NewConsumer(nc, bus.ConsumerConfig{
		Stream: stream, Filters: c.Filters, Apply: s.busApp.apply, ReadyLag: c.ReadyLag, Logger: s.log,
	})
	if err != nil {
		nc.Close()
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	s.busConn = nc
	s.registerBusMetrics()
	return nil
}

// registerBusMetrics exports the consumer's progress (docs/metrics.md).
func (s *Server) registerBusMetrics() {
	const ns, sub = "inferencecache", "bus"
	p := func() bus.Progress { return s.bus.Progress() }
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, f)
	}
	counter := func(name, help string, labels prometheus.Labels, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help, ConstLabels: labels}, f)
	}
	const msgsHelp = "NATS messages applied, by kind (update, event, unknown: skipped)."
	const dropHelp = "NATS messages not applied, by reason (malformed, refused, panic, subject: not the payload's tenant and model)."
	s.metrics.Registry().MustRegister(
		gauge("connected", "1 while the server is connected to NATS.", func() float64 { return b2f(p().Connected) }),
		gauge("caught_up", "1 once the server caught up with the stream after its start (it is ready from then on).", func() float64 { return b2f(p().CaughtUp) }),
		gauge("consumer_lag_messages", "Messages in the stream (this server's filter) not applied yet, last known.", func() float64 { return float64(p().Lag) }),
		gauge("consumer_stale_seconds", "Seconds since the server last knew itself current with the stream (lag 0 and connected); 0 while it is.", func() float64 { return p().Stale.Seconds() }),
		gauge("replay_target_messages", "Messages retained in the stream when the server started: the replay's size.", func() float64 { return float64(p().ReplayTarget) }),
		gauge("replay_progress_ratio", "Share of the start replay applied, 0 to 1.", func() float64 {
			pr := p()
			if pr.ReplayTarget == 0 || pr.Applied >= pr.ReplayTarget {
				return 1
			}
			return float64(pr.Applied) / float64(pr.ReplayTarget)
		}),
		gauge("replay_duration_seconds", "Seconds from start until the server caught up; 0 before.", func() float64 { return p().Replay.Seconds() }),
		gauge("last_sequence", "Stream sequence of the last message applied.", func() float64 { return float64(p().LastSeq) }),
		counter("messages_total", msgsHelp, prometheus.Labels{"kind": "update"}, func() float64 { return float64(p().Updates) }),
		counter("messages_total", msgsHelp, prometheus.Labels{"kind": "event"}, func() float64 { return float64(p().Events) }),
		counter("messages_total", msgsHelp, prometheus.Labels{"kind": "unknown"}, func() float64 { return float64(p().Unknown) }),
		counter("messages_dropped_total", dropHelp, prometheus.Labels{"reason": busDropMalformed}, func() float64 { return float64(s.busApp.malformed.Load()) }),
		counter("messages_dropped_total", dropHelp, prometheus.Labels{"reason": busDropRefused}, func() float64 { return float64(s.busApp.refused.Load()) }),
		counter("messages_dropped_total", dropHelp, prometheus.Labels{"reason": busDropPanic}, func() float64 { return float64(s.busApp.panics.Load()) }),
		counter("messages_dropped_total", dropHelp, prometheus.Labels{"reason": busDropSubject}, func() float64 { return float64(s.busApp.subject.Load()) }),
	)
}

// Bus returns the NATS consumer, nil without NATS.
func (s *Server) Bus() *bus.Consumer { return s.bus }
