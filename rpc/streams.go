package rpc

import (
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Limits of the observer streams (docs/wire.md).
const (
	// DefaultMaxStreams bounds the StreamCacheEvents streams, and
	// separately the StreamMetrics streams, open at once; one more is
	// refused with RESOURCE_EXHAUSTED.
	DefaultMaxStreams = 64
	// DefaultEventBuffer is each StreamCacheEvents subscriber's buffer, in
	// events: a subscriber that falls this far behind is ended with
	// RESOURCE_EXHAUSTED.
	DefaultEventBuffer = engine.DefaultChangeBuffer
	// DefaultMetricsInterval, MinMetricsInterval and MaxMetricsInterval
	// bound StreamMetrics' interval_ms.
	DefaultMetricsInterval = time.Second
	MinMetricsInterval     = 100 * time.Millisecond
	MaxMetricsInterval     = time.Hour
	// MaxMetricNames bounds a StreamMetricsRequest's names.
	MaxMetricNames = 256
)

// StreamReadyHeader is the response header key both streams send once they
// are live: from then on every matching change is delivered (events), or
// the first batch follows (metrics).
const StreamReadyHeader = "inferencecache-stream"

// Stream names and outcomes (FeatureObserver.StreamEnded).
const (
	StreamCacheEventsName = "cache_events"
	StreamMetricsName     = "metrics"

	StreamOutcomeClosed   = "closed"   // the client went away (or its deadline passed)
	StreamOutcomeOverflow = "overflow" // a slow subscriber: RESOURCE_EXHAUSTED
	StreamOutcomeRefused  = "refused"  // over the stream limit, or an invalid request
	StreamOutcomeDraining = "draining" // the server shuts down: UNAVAILABLE
	StreamOutcomeError    = "error"    // a send failed
)

// StreamOutcomes lists every stream outcome, for metrics.
var StreamOutcomes = []string{StreamOutcomeClosed, StreamOutcomeOverflow, StreamOutcomeRefused, StreamOutcomeDraining, StreamOutcomeError}

// MetricSample is one sample StreamMetrics sends.
type MetricSample struct {
	Name, Type string
	Labels     map[string]string
	Value      float64
}

// MetricsSource produces the current samples of the metric families named
// (nil: every family). The server wires its Prometheus registry.
type MetricsSource interface {
	AppendSamples(dst []MetricSample, names map[string]bool) ([]MetricSample, error)
}

// FeatureObserver records LookupPDRoute, RenderTemplate and the two streams
// (servermetrics implements it). It is called concurrently and must not
// block.
type FeatureObserver interface {
	ObservePDRoute(reason string, elapsed time.Duration)
	ObserveRender(reason string, elapsed time.Duration)
	// StreamMessages counts n messages sent on a stream.
	StreamMessages(stream string, n int)
	// StreamEnded counts one stream's end by outcome.
	StreamEnded(stream, outcome string)
}

type nopFeatures struct{}

func (nopFeatures) ObservePDRoute(string, time.Duration) {}
func (nopFeatures) ObserveRender(string, time.Duration)  {}
func (nopFeatures) StreamMessages(string, int)           {}
func (nopFeatures) StreamEnded(string, string)           {}

// EventStreamsOpen and MetricStreamsOpen count the observer streams open.
func (s *Service) EventStreamsOpen() int64 { return s.eventStreams.Load() }

// MetricStreamsOpen: see EventStreamsOpen.
func (s *Service) MetricStreamsOpen() int64 { return s.metricStreams.Load() }

// errStreamDraining ends an observer stream of a draining server.
var errStreamDraining = status.Error(codes.Unavailable, "server draining: resubscribe on another server")

// StreamCacheEvents streams every index change matching the request
// (tenant_id and model_id, empty for any; types, empty for every type), from
// the moment the stream's header (StreamReadyHeader) is sent, as
// CacheEvents (docs/wire.md): PREFIX_ADDED (a replica came to hold a key,
// or it changed tier), PREFIX_EVICTED with its reason, ALL_CLEARED (one
// per producer clear), REPLICA_REMOVED. The reserved probe tenant is never
// streamed (and asking for it is INVALID_ARGUMENT). Each subscriber has a
// bounded buffer; one that falls behind it is ended with
// RESOURCE_EXHAUSTED, and writers never wait for it. Over DefaultMaxStreams
// streams, or a type this server does not know, is refused.
func (s *Service) StreamCacheEvents(req *pb.StreamEventsRequest, stream pb.InferenceCache_StreamCacheEventsServer) error {
	f := engine.ChangeFilter{TenantID: req.GetTenantId(), ModelID: req.GetModelId()}
	for _, t := range req.GetTypes() {
		switch t {
		case pb.CacheEvent_PREFIX_ADDED, pb.CacheEvent_PREFIX_EVICTED, pb.CacheEvent_ALL_CLEARED, pb.CacheEvent_REPLICA_REMOVED, pb.CacheEvent_REPLICA_UPDATED:
			f.Types |= 1 << uint(t)
		default:
			s.features.StreamEnded(StreamCacheEventsName, StreamOutcomeRefused)
			return status.Errorf(codes.InvalidArgument, "unknown event type %d", int32(t))
		}
	}
	if f.TenantID == policy.ReservedTenantID {
		s.features.StreamEnded(StreamCacheEventsName, StreamOutcomeRefused)
		return status.Error(codes.InvalidArgument, "the reserved probe tenant is not streamed")
	}
	if len(f.TenantID) > MaxIDBytes || len(f.ModelID) > MaxIDBytes {
		s.features.StreamEnded(StreamCacheEventsName, StreamOutcomeRefused)
		return status.Error(codes.InvalidArgument, "tenant_id or model_id over the id limit")
	}
	if s.eventStreams.Add(1) > int64(s.maxStreams) {
		s.eventStreams.Add(-1)
		s.features.StreamEnded(StreamCacheEventsName, StreamOutcomeRefused)
		return status.Errorf(codes.ResourceExhausted, "%d event streams are open, the most this server serves", s.maxStreams)
	}
	defer s.eventStreams.Add(-1)
	sub := s.index.SubscribeChanges(f, s.eventBuffer)
	defer sub.Close()
	outcome, err := s.serveEvents(stream, sub)
	s.features.StreamEnded(StreamCacheEventsName, outcome)
	return err
}

func (s *Service) serveEvents(stream pb.InferenceCache_StreamCacheEventsServer, sub *engine.Subscription) (string, error) {
	if err := stream.SendHeader(metadata.Pairs(StreamReadyHeader, StreamCacheEventsName)); err != nil {
		return StreamOutcomeError, err
	}
	ctx := stream.Context()
	var batch []engine.IndexChange
	var ev pb.CacheEvent
	for {
		select {
		case <-ctx.Done():
			return StreamOutcomeClosed, status.FromContextError(ctx.Err()).Err()
		case <-s.drainCh:
			return StreamOutcomeDraining, errStreamDraining
		case <-sub.Ready():
		}
		var over bool
		batch, over = sub.Next(batch)
		if over {
			// What is buffered is stale by now and the subscriber must
			// resubscribe anyway: end at once.
			return StreamOutcomeOverflow, status.Errorf(codes.ResourceExhausted,
				"the subscriber fell %d events behind the index; resubscribe (and read faster, or filter by tenant, model or type)", s.eventBuffer)
		}
		for i := range batch {
			c := &batch[i]
			ev = pb.CacheEvent{
				Type: pb.CacheEvent_Type(c.Type), ReplicaId: c.ReplicaID, ModelId: c.ModelID, TenantId: c.TenantID,
				PrefixHash: c.Hash, TimestampUs: c.At, AdapterId: c.AdapterID,
				Reason: c.Reason, HashScheme: c.HashScheme, TokenCount: c.Tokens, Tier: pb.CacheTier(c.Tier.Wire()),
			}
			// Send marshals before it returns, so ev and the batch's hash
			// buffers are free again afterwards.
			if err := stream.Send(&ev); err != nil {
				return StreamOutcomeError, err
			}
		}
		s.features.StreamMessages(StreamCacheEventsName, len(batch))
	}
}

// StreamMetrics sends the current value of every sample of the named
// metric families (every family when names is empty) at once and then
// every interval_ms (0: DefaultMetricsInterval; clamped to
// [MinMetricsInterval, MaxMetricsInterval]), each batch stamped with the
// time it was read. Histograms send their _bucket (label "le"), _sum and
// _count samples with type "histogram", summaries their quantiles
// ("quantile"), _sum and _count. A name that matches nothing sends nothing
// (families appear once they have a sample). Over DefaultMaxStreams
// streams, or over MaxMetricNames names, is refused.
func (s *Service) StreamMetrics(req *pb.StreamMetricsRequest, stream pb.InferenceCache_StreamMetricsServer) error {
	if s.metricsSrc == nil {
		s.features.StreamEnded(StreamMetricsName, StreamOutcomeRefused)
		return status.Error(codes.Unimplemented, "this server has no metrics source")
	}
	if n := len(req.GetNames()); n > MaxMetricNames {
		s.features.StreamEnded(StreamMetricsName, StreamOutcomeRefused)
		return status.Errorf(codes.InvalidArgument, "%d metric names, over %d", n, MaxMetricNames)
	}
	var names map[string]bool
	if len(req.GetNames()) > 0 {
		names = make(map[string]bool, len(req.GetNames()))
		for _, n := range req.GetNames() {
			names[n] = true
		}
	}
	every := DefaultMetricsInterval
	if ms := req.GetIntervalMs(); ms > 0 {
		every = min(max(time.Duration(ms)*time.Millisecond, MinMetricsInterval), MaxMetricsInterval)
	}
	if s.metricStreams.Add(1) > int64(s.maxStreams) {
		s.metricStreams.Add(-1)
		s.features.StreamEnded(StreamMetricsName, StreamOutcomeRefused)
		return status.Errorf(codes.ResourceExhausted, "%d metric streams are open, the most this server serves", s.maxStreams)
	}
	defer s.metricStreams.Add(-1)
	outcome, err := s.serveMetrics(stream, names, every)
	s.features.StreamEnded(StreamMetricsName, outcome)
	return err
}

func (s *Service) serveMetrics(stream pb.InferenceCache_StreamMetricsServer, names map[string]bool, every time.Duration) (string, error) {
	if err := stream.SendHeader(metadata.Pairs(StreamReadyHeader, StreamMetricsName)); err != nil {
		return StreamOutcomeError, err
	}
	ctx := stream.Context()
	tick := time.NewTicker(every)
	defer tick.Stop()
	var samples []MetricSample
	var m pb.Metric
	for {
		var err error
		samples, err = s.metricsSrc.AppendSamples(samples[:0], names)
		if err != nil {
			// A collector failed: send what was gathered, log rarely.
			s.rateLimitedStreamLog("cannot gather every metric for StreamMetrics", err)
		}
		at := s.now().UnixMicro()
		for i := range samples {
			x := &samples[i]
			m = pb.Metric{Name: x.Name, Type: x.Type, Labels: x.Labels, Value: x.Value, TimestampUs: at}
			if err := stream.Send(&m); err != nil {
				return StreamOutcomeError, err
			}
		}
		s.features.StreamMessages(StreamMetricsName, len(samples))
		select {
		case <-ctx.Done():
			return StreamOutcomeClosed, status.FromContextError(ctx.Err()).Err()
		case <-s.drainCh:
			return StreamOutcomeDraining, errStreamDraining
		case <-tick.C:
		}
	}
}

// rateLimitedStreamLog logs at WARN at most once a minute.
func (s *Service) rateLimitedStreamLog(msg string, err error) {
	now := s.now().UnixNano()
	last := s.lastStreamLog.Load()
	if now-last < int64(time.Minute) || !s.lastStreamLog.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn(msg, "err", err)
}
