package servermetrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Names of the metrics of LookupPDRoute, RenderTemplate and the observer
// streams (docs/metrics.md).
const (
	NamePDRouteCalls     = "inferencecache_lookup_pd_route_calls_total"
	NamePDRouteLatency   = "inferencecache_lookup_pd_route_latency_seconds"
	NameRenderCalls      = "inferencecache_render_template_calls_total"
	NameRenderLatency    = "inferencecache_render_template_latency_seconds"
	NameStreamsOpen      = "inferencecache_observer_streams_open"
	NameStreamMessages   = "inferencecache_observer_stream_messages_total"
	NameStreamsEnded     = "inferencecache_observer_streams_ended_total"
	renderLatencyMaxSecs = 1
)

// FeatureMetrics records LookupPDRoute, RenderTemplate and the observer
// streams (it implements rpc.FeatureObserver). Every series of a label
// value declared to RegisterFeatures is created at 0 and resolved once;
// a value not declared is dropped (a bug, not a new series).
type FeatureMetrics struct {
	pdCalls   map[string]prometheus.Counter // reason_code
	pdLatency prometheus.Observer
	// renderCalls by reason_code.
	renderCalls   map[string]prometheus.Counter
	renderLatency prometheus.Observer
	// messages by stream; ended by stream then outcome.
	messages map[string]prometheus.Counter
	ended    map[string]map[string]prometheus.Counter
}

// RegisterFeatures registers the metrics with every declared label value at
// 0. open reports the open streams by stream name at scrape time.
func (m *Metrics) RegisterFeatures(pdReasons, renderReasons, streams, outcomes []string, open func(stream string) int64) *FeatureMetrics {
	pd := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: NamePDRouteCalls,
		Help: "LookupPDRoute calls by reason_code (PD_DISAGGREGATED, PD_PREFILL_SKIPPED, NO_PREFILL_POOL, NO_DECODE_POOL, UNKNOWN_TOPOLOGY, NO_HINT, TIMEOUT).",
	}, []string{"reason_code"})
	pdLat := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    NamePDRouteLatency,
		Help:    "Server-side LookupPDRoute latency from handler entry to response.",
		Buckets: LatencyBuckets,
	})
	render := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: NameRenderCalls,
		Help: "RenderTemplate calls by reason_code (OK, TEMPLATE_NOT_FOUND, RENDER_ERROR).",
	}, []string{"reason_code"})
	renderLat := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    NameRenderLatency,
		Help:    "Server-side RenderTemplate latency, rendering and tokenizing the stable prefix included.",
		Buckets: prometheus.ExponentialBucketsRange(0.0001, renderLatencyMaxSecs, 10),
	})
	msgs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: NameStreamMessages,
		Help: "Messages sent on the observer streams (stream cache_events: CacheEvents; metrics: Metric samples).",
	}, []string{"stream"})
	ended := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: NameStreamsEnded,
		Help: "Observer streams ended, by stream and outcome; outcome overflow is a subscriber that fell behind its buffer and was ended with RESOURCE_EXHAUSTED.",
	}, []string{"stream", "outcome"})
	f := &FeatureMetrics{
		pdCalls: map[string]prometheus.Counter{}, pdLatency: pdLat,
		renderCalls: map[string]prometheus.Counter{}, renderLatency: renderLat,
		messages: map[string]prometheus.Counter{}, ended: map[string]map[string]prometheus.Counter{},
	}
	for _, r := range pdReasons {
		f.pdCalls[r] = pd.WithLabelValues(r)
	}
	for _, r := range renderReasons {
		f.renderCalls[r] = render.WithLabelValues(r)
	}
	m.reg.MustRegister(pd, pdLat, render, renderLat, msgs, ended)
	for _, st := range streams {
		f.messages[st] = msgs.WithLabelValues(st)
		f.ended[st] = map[string]prometheus.Counter{}
		for _, o := range outcomes {
			f.ended[st][o] = ended.WithLabelValues(st, o)
		}
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        NameStreamsOpen,
			Help:        "Observer streams open (StreamCacheEvents, StreamMetrics), by stream.",
			ConstLabels: prometheus.Labels{"stream": st},
		}, func() float64 { return float64(open(st)) }))
	}
	return f
}

// ObservePDRoute records one LookupPDRoute.
func (f *FeatureMetrics) ObservePDRoute(reason string, elapsed time.Duration) {
	if c := f.pdCalls[reason]; c != nil {
		c.Inc()
	}
	f.pdLatency.Observe(elapsed.Seconds())
}

// ObserveRender records one RenderTemplate.
func (f *FeatureMetrics) ObserveRender(reason string, elapsed time.Duration) {
	if c := f.renderCalls[reason]; c != nil {
		c.Inc()
	}
	f.renderLatency.Observe(elapsed.Seconds())
}

// StreamMessages counts n messages sent on stream.
func (f *FeatureMetrics) StreamMessages(stream string, n int) {
	if c := f.messages[stream]; c != nil && n > 0 {
		c.Add(float64(n))
	}
}

// StreamEnded counts one stream's end.
func (f *FeatureMetrics) StreamEnded(stream, outcome string) {
	if c := f.ended[stream][outcome]; c != nil {
		c.Inc()
	}
}
