package kvevents

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/inferencecache/bus"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// NATSSink delivers to the NATS JetStream stream the servers consume
// (--nats-url) instead of to one server: the same CacheStateUpdate and
// CacheEvent messages, protobuf-encoded, on the subject of their (tenant,
// model). Publishing is asynchronous (bus.Publisher): a call returns once
// NATS has the message and fails at once while NATS is unreachable, so the
// forwarder retries and buffers as for an unreachable server (bounded,
// then clear-and-resync). A message NATS later reports not stored is
// reported through LossReporter, and the forwarder clears and resyncs the
// replica. It is not a ServerWatcher: a restarted server rebuilds from the
// stream, not from a re-report.
type NATSSink struct {
	pub    *bus.Publisher
	stream string

	// mu guards the subject cache below (one (tenant, model) per replica,
	// so it is computed once).
	mu             sync.Mutex
	tenant, model  string
	subject        string
	subjectIsValid bool
}

var (
	_ Sink         = (*NATSSink)(nil)
	_ LossReporter = (*NATSSink)(nil)
)

// NewNATSSink returns a sink publishing through pub to stream.
func NewNATSSink(pub *bus.Publisher, stream string) *NATSSink {
	return &NATSSink{pub: pub, stream: stream}
}

func (s *NATSSink) subjectOf(tenant, model string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.subjectIsValid || tenant != s.tenant || model != s.model {
		s.tenant, s.model, s.subject, s.subjectIsValid = tenant, model, bus.Subject(s.stream, tenant, model), true
	}
	return s.subject
}

// ReportCacheState publishes u. An update over the NATS server's maximum
// payload (long adapter ids) is published in halves, recursively, in order;
// if a later part fails the forwarder retries the whole update, and
// re-adding the parts already published is harmless.
func (s *NATSSink) ReportCacheState(ctx context.Context, u *icv1.CacheStateUpdate) error {
	err := s.pub.Publish(ctx, s.subjectOf(u.GetTenantId(), u.GetModelId()), bus.KindUpdate, u)
	if !errors.Is(err, bus.ErrTooLarge) || len(u.Prefixes) < 2 {
		return err
	}
	half := len(u.Prefixes) / 2
	first, second := proto.CloneOf(u), proto.CloneOf(u)
	first.Prefixes, second.Prefixes, second.Stats = u.Prefixes[:half], u.Prefixes[half:], nil
	if err := s.ReportCacheState(ctx, first); err != nil {
		return err
	}
	return s.ReportCacheState(ctx, second)
}

// PublishEvent publishes e.
func (s *NATSSink) PublishEvent(ctx context.Context, e *icv1.CacheEvent) error {
	return s.pub.Publish(ctx, s.subjectOf(e.GetTenantId(), e.GetModelId()), bus.KindEvent, e)
}

// TakeLost implements LossReporter.
func (s *NATSSink) TakeLost() uint64 { return s.pub.TakeLost() }

// Flush waits until every publish was acknowledged, or ctx ends.
func (s *NATSSink) Flush(ctx context.Context) error { return s.pub.Flush(ctx) }
