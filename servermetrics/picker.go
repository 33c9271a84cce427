package servermetrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Endpoint picker metrics (docs/metrics.md, docs/gateway.md), exported when
// the server runs the picker.
const (
	NamePickerPicks           = "inferencecache_picker_picks_total"
	NamePickerDecisionLatency = "inferencecache_picker_decision_latency_seconds"
	NamePickerTokenizeLatency = "inferencecache_picker_tokenize_latency_seconds"
	NamePickerPromptTokens    = "inferencecache_picker_prompt_tokens_total"
	NamePickerPredicted       = "inferencecache_picker_predicted_cached_tokens_total"
	NamePickerDelivered       = "inferencecache_picker_delivered_cached_tokens_total"
	NamePickerUsage           = "inferencecache_picker_usage_total"
	NamePickerInflight        = "inferencecache_picker_inflight_requests"
	NamePickerEndpoints       = "inferencecache_picker_endpoints"
	NamePickerSourceFailures  = "inferencecache_picker_endpoint_source_failures_total"
)

// PickerBuckets are the decision and tokenization latency buckets: 10 µs
// to 100 ms.
var PickerBuckets = []float64{0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1}

// pickerUsageResults are the results of picker_usage_total (picker.Usage*).
var pickerUsageResults = []string{"read", "no_cached_tokens", "absent", "unreadable"}

// PickerMetrics records the endpoint picker; it implements
// picker.Observer. Every child but the per-model ones is resolved at
// registration, so recording allocates nothing.
type PickerMetrics struct {
	m        *Metrics
	picks    map[[2]string]prometheus.Counter // fixed at registration, read-only
	picksVec *prometheus.CounterVec
	decision prometheus.Observer
	tokenize prometheus.Observer
	usage    map[string]prometheus.Counter // fixed at registration, read-only
	usageVec *prometheus.CounterVec
	// prompt, predicted and delivered are {model}; a model has its own
	// series under the same rule as the lookup series (modelSeries.picker).
	prompt, predicted, delivered *prometheus.CounterVec
}

// pickerSeries is one model's delivered-tokens counters.
type pickerSeries struct {
	prompt, predicted, delivered prometheus.Counter
}

// RegisterPicker registers the picker metrics, every (outcome, reason) of
// picks exported at 0, and the in-flight gauge read from inflight at
// scrape time (one series per endpoint of the current pool). Call it once.
func (m *Metrics) RegisterPicker(picks [][2]string, inflight func(fn func(endpoint, replica string, n int64))) *PickerMetrics {
	p := &PickerMetrics{
		m: m,
		picksVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NamePickerPicks,
			Help: "Endpoint picker decisions by outcome (prefix, tenant_hot, affinity: the index's answer; fallback: least loaded, reason says why; 503, 413, 400: answered by the picker) and reason.",
		}, []string{"outcome", "reason"}),
		usageVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NamePickerUsage,
			Help: "Finished responses by how the picker read their usage: read, no_cached_tokens (usage without prompt_tokens_details.cached_tokens), absent, unreadable.",
		}, []string{"result"}),
		prompt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NamePickerPromptTokens,
			Help: "Prompt tokens of the responses whose usage the picker read, by index model id (models the index does not hold share model=\"" + OtherModel + "\").",
		}, []string{"model"}),
		predicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NamePickerPredicted,
			Help: "Cached prompt tokens the index predicted on the endpoint that served (its matched_tokens; 0 when it was not ranked), over the responses whose cached_tokens the engine reported, by model.",
		}, []string{"model"}),
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NamePickerDelivered,
			Help: "Cached prompt tokens the engines reported (usage.prompt_tokens_details.cached_tokens) over the same responses, by model.",
		}, []string{"model"}),
		picks: map[[2]string]prometheus.Counter{},
		usage: map[string]prometheus.Counter{},
	}
	decision := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    NamePickerDecisionLatency,
		Help:    "Endpoint picker decision latency, from the end of the request body (or headers) to the decision: parse, tokenize, lookup, endpoint mapping.",
		Buckets: PickerBuckets,
	})
	tokenize := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    NamePickerTokenizeLatency,
		Help:    "Latency of the picker's successful tokenizations of a whole request (chat template over every message, then tokenize).",
		Buckets: PickerBuckets,
	})
	p.decision, p.tokenize = decision, tokenize
	for _, k := range picks {
		p.picks[k] = p.picksVec.WithLabelValues(k[0], k[1])
	}
	for _, r := range pickerUsageResults {
		p.usage[r] = p.usageVec.WithLabelValues(r)
	}
	m.reg.MustRegister(p.picksVec, decision, tokenize, p.usageVec, p.prompt, p.predicted, p.delivered,
		&inflightCollector{src: inflight, desc: prometheus.NewDesc(NamePickerInflight,
			"Requests the endpoint picker routed to the endpoint whose response has not ended yet (its own exact count), per endpoint of the current pool.",
			[]string{"endpoint", "replica_id"}, nil)})
	m.pickerMetrics.Store(p)
	return p
}

// Picked implements picker.Observer.
func (p *PickerMetrics) Picked(outcome, reason string, elapsed time.Duration) {
	c, ok := p.picks[[2]string{outcome, reason}]
	if !ok {
		c = p.picksVec.WithLabelValues(outcome, reason)
	}
	c.Inc()
	p.decision.Observe(elapsed.Seconds())
}

// Tokenized implements picker.Observer.
func (p *PickerMetrics) Tokenized(elapsed time.Duration) { p.tokenize.Observe(elapsed.Seconds()) }

// Usage implements picker.Observer.
func (p *PickerMetrics) Usage(result string) {
	c, ok := p.usage[result]
	if !ok {
		c = p.usageVec.WithLabelValues(result)
	}
	c.Inc()
}

// Delivered implements picker.Observer.
func (p *PickerMetrics) Delivered(model string, promptTokens, predicted, delivered int64) {
	ms := p.m.other
	if len(model) <= MaxModelLabelBytes {
		if e, ok := p.m.models.Load(model); ok {
			if own := e.series.Load(); own != nil {
				ms = own
			}
		}
	}
	s := ms.pickerSeriesOf(p)
	s.prompt.Add(float64(promptTokens))
	s.predicted.Add(float64(predicted))
	s.delivered.Add(float64(delivered))
}

// pickerSeriesOf resolves the model's picker series on first use; a
// retired model's are not resurrected (its tokens count under OtherModel).
func (ms *modelSeries) pickerSeriesOf(p *PickerMetrics) *pickerSeries {
	if s := ms.picker.Load(); s != nil {
		return s
	}
	if s := ms.resolvePicker(p); s != nil {
		return s
	}
	return p.m.other.pickerSeriesOf(p) // OtherModel is never deleted
}

func (ms *modelSeries) resolvePicker(p *PickerMetrics) *pickerSeries {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.deleted {
		return nil
	}
	if s := ms.picker.Load(); s != nil {
		return s
	}
	s := &pickerSeries{
		prompt:    p.prompt.WithLabelValues(ms.model),
		predicted: p.predicted.WithLabelValues(ms.model),
		delivered: p.delivered.WithLabelValues(ms.model),
	}
	ms.picker.Store(s)
	return s
}

// deletePickerSeriesLocked removes the model's picker series; ms.mu is
// held (deleteSeries).
func (m *Metrics) deletePickerSeriesLocked(ms *modelSeries) {
	p := m.pickerMetrics.Load()
	if p == nil || ms.picker.Load() == nil {
		return
	}
	p.prompt.DeleteLabelValues(ms.model)
	p.predicted.DeleteLabelValues(ms.model)
	p.delivered.DeleteLabelValues(ms.model)
}

type inflightCollector struct {
	src  func(fn func(endpoint, replica string, n int64))
	desc *prometheus.Desc
}

func (c *inflightCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *inflightCollector) Collect(ch chan<- prometheus.Metric) {
	c.src(func(endpoint, replica string, n int64) {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), endpoint, replica)
	})
}

// PickerEndpointsMetrics records the picker's endpoint source; it
// implements endpoints.Observer.
type PickerEndpointsMetrics struct {
	endpoints prometheus.Gauge
	failures  *prometheus.CounterVec
}

// RegisterPickerEndpoints registers the endpoint source's metrics, every
// failure reason exported at 0. Call it once.
func (m *Metrics) RegisterPickerEndpoints(reasons ...string) *PickerEndpointsMetrics {
	p := &PickerEndpointsMetrics{
		endpoints: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: NamePickerEndpoints,
			Help: "Endpoints of the endpoint picker's current pool (--inference-pool's Ready pods x target ports, or --endpoints-file).",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NamePickerSourceFailures,
			Help: "Failed attempts of the endpoint source to make a new pool (the last good pool stays), by reason: read, decode, invalid (the file), watch (the Kubernetes API).",
		}, []string{"reason"}),
	}
	for _, r := range reasons {
		p.failures.WithLabelValues(r)
	}
	m.reg.MustRegister(p.endpoints, p.failures)
	return p
}

// PoolChanged implements endpoints.Observer.
func (p *PickerEndpointsMetrics) PoolChanged(n int) { p.endpoints.Set(float64(n)) }

// ReloadFailed implements endpoints.Observer.
func (p *PickerEndpointsMetrics) ReloadFailed(reason string) {
	p.failures.WithLabelValues(reason).Inc()
}
