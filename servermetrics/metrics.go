// Package servermetrics holds the server binary's Prometheus metrics (the
// "Server metrics" table of shared/spec/metrics.md) on a per-server
// registry, together with the standard Go and process collectors.
//
// Every writer is a typed method, so handlers never touch a collector
// directly:
//
//   - the index reports through the engine.Metrics methods
//     (AddIndexEvictions, AddTenantEvictions, SetIndexEntries);
//   - the LookupRoute handler calls ObserveLookup exactly once per call;
//   - the /snapshot, /policy and /probe auth middlewares record through the
//     AuthRecorder values (controlserver/auth.Recorder) returned by
//     SnapshotAuth, PolicyAuth and ProbeAuth;
//   - the server lifecycle sets SetUp and SetTLSEnabled.
//
// ObserveLookup is on the LookupRoute hot path. It resolves its label
// children once per (model, reason code) and caches them in a lock-free map,
// so a steady-state call is one map load, a short scan of the model's
// counters and the counter and histogram updates (atomics inside
// client_golang): no allocation and no lock. A *Metrics is safe for concurrent use; the zero
// value is not usable (call New).
package servermetrics

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/puzpuzpuz/xsync/v3"
)

// Namespace prefixes every metric this package owns.
const Namespace = "inferencecache"

// Metric names (full, with the namespace), as the spec lists them.
const (
	NameServerUp         = "inferencecache_server_up"
	NameGRPCTLSEnabled   = "inferencecache_server_grpc_tls_enabled"
	NameIndexEntries     = "inferencecache_index_entries"
	NameLookupCalls      = "inferencecache_lookup_route_calls_total"
	NameLookupLatency    = "inferencecache_lookup_route_latency_seconds"
	NameTenantEvictions  = "inferencecache_tenant_evictions_total"
	NameIndexEvictions   = "inferencecache_index_evictions_total"
	NameSnapshotAuth     = "inferencecache_snapshot_auth_total"
	NamePolicyAuth       = "inferencecache_policy_auth_total"
	NameProbeAuth        = "inferencecache_probe_auth_total"
	tenantEvictionReason = "over_entries"
)

// NameTimestampsClamped is beyond the spec (docs/metrics.md): producer
// messages whose timestamp_us lay too far in the future, by rpc.
const NameTimestampsClamped = "inferencecache_producer_timestamps_clamped_total"

// LatencyBuckets are the LookupRoute latency histogram's upper bounds in
// seconds: 100µs, 250µs, 500µs, 1ms, 2.5ms, 5ms, 10ms, 25ms, 50ms, 100ms.
var LatencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1}

// Metrics is the server's metric set. Create it with New.
type Metrics struct {
	reg *prometheus.Registry

	up, tlsEnabled  prometheus.Gauge
	indexEntries    *prometheus.GaugeVec     // model
	lookupCalls     *prometheus.CounterVec   // model, reason_code, hint_used
	lookupLatency   *prometheus.HistogramVec // model
	tenantEvictions *prometheus.CounterVec   // tenant_id, reason
	indexEvictions  *prometheus.CounterVec   // algorithm, reason
	snapshotAuth    *prometheus.CounterVec   // result
	policyAuth      *prometheus.CounterVec   // result
	probeAuth       *prometheus.CounterVec   // result
	// clamped is producer_timestamps_clamped_total{rpc}; its two series
	// are resolved once in New (clampedReport, clampedEvent).
	clamped                     *prometheus.CounterVec
	clampedReport, clampedEvent prometheus.Counter

	// models caches each model's resolved lookup series and entries its
	// index_entries child. Both are filled with LoadOrCompute on a model's
	// first use (which runs the constructor once per key, under the map's
	// bucket lock) and never shrink; ObserveLookup and SetIndexEntries read
	// them with lock-free loads.
	models  *xsync.MapOf[string, *modelSeries]
	entries *xsync.MapOf[string, prometheus.Gauge]
}

// modelSeries is one model's lookup series.
type modelSeries struct {
	model   string
	latency prometheus.Observer
	// calls is the immutable list of the model's resolved call counters, one
	// per (reason code, hint used) seen so far. It is replaced copy-on-write
	// under mu when a new pair first appears; readers scan it lock-free.
	calls atomic.Pointer[[]callSeries]
	// mu serializes writers of calls (counter's slow path); readers never
	// take it.
	mu sync.Mutex
}

type callSeries struct {
	reason string
	hint   bool
	c      prometheus.Counter
}

// New builds the metric set on a fresh registry with the Go and process
// collectors. server_up and grpc_tls_enabled start at 0.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "server_up",
			Help: "1 if the cache server is serving requests, 0 otherwise.",
		}),
		tlsEnabled: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "server_grpc_tls_enabled",
			Help: "1 if the gRPC listener terminates TLS, 0 if it serves plaintext.",
		}),
		indexEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "index_entries",
			Help: "Distinct (tenant, model, hash_scheme, adapter, prefix_hash) keys the index holds per model, reserved tenant excluded.",
		}, []string{"model"}),
		lookupCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "lookup_route_calls_total",
			Help: "LookupRoute calls by model and outcome; hint_used is true when replica_scores was non-empty.",
		}, []string{"model", "reason_code", "hint_used"}),
		lookupLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "lookup_route_latency_seconds",
			Help:    "Server-side LookupRoute latency from handler entry to response, including ranking.",
			Buckets: LatencyBuckets,
		}, []string{"model"}),
		tenantEvictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "tenant_evictions_total",
			Help: "Distinct prefixes evicted from a tenant to bring it back within its CacheTenant quota.",
		}, []string{"tenant_id", "reason"}),
		indexEvictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "index_evictions_total",
			Help: "Replica x prefix entries removed by the index itself (reason cap or ttl), by the namespace's eviction algorithm.",
		}, []string{"algorithm", "reason"}),
		snapshotAuth: authVec("snapshot_auth_total", "/snapshot"),
		policyAuth:   authVec("policy_auth_total", "/policy"),
		probeAuth:    authVec("probe_auth_total", "/probe"),
		models:       xsync.NewMapOf[string, *modelSeries](),
		entries:      xsync.NewMapOf[string, prometheus.Gauge](),
	}
	m.clamped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "producer_timestamps_clamped_total",
		Help: "Producer messages (ReportCacheState updates, PublishEvent events) whose timestamp_us lay beyond now plus the allowed clock skew and was clamped to it, by rpc.",
	}, []string{"rpc"})
	m.clampedReport = m.clamped.WithLabelValues("ReportCacheState")
	m.clampedEvent = m.clamped.WithLabelValues("PublishEvent")
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.up, m.tlsEnabled, m.indexEntries, m.lookupCalls, m.lookupLatency,
		m.tenantEvictions, m.indexEvictions, m.snapshotAuth, m.policyAuth, m.probeAuth,
	)
	m.reg.MustRegister(m.clamped)
	return m
}

func authVec(name, path string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: name,
		Help: "Requests reaching the " + path + " auth middleware, by result (ok, unauth, forbidden, error).",
	}, []string{"result"})
}

// Registry returns the per-server registry (for /metrics and tests).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// SetUp sets inferencecache_server_up.
func (m *Metrics) SetUp(up bool) { m.up.Set(b2f(up)) }

// SetTLSEnabled sets inferencecache_server_grpc_tls_enabled.
func (m *Metrics) SetTLSEnabled(on bool) { m.tlsEnabled.Set(b2f(on)) }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// ObserveLookup records one LookupRoute call: it increments
// lookup_route_calls_total{model, reason_code, hint_used} and observes the
// latency histogram. Call it exactly once per call. It does not allocate
// once the (model, reason, hintUsed) series exist.
func (m *Metrics) ObserveLookup(model, reason string, hintUsed bool, elapsed time.Duration) {
	ms, ok := m.models.Load(model)
	if !ok {
		ms, _ = m.models.LoadOrCompute(model, func() *modelSeries { return m.newModelSeries(model) })
	}
	ms.counter(m, reason, hintUsed).Inc()
	ms.latency.Observe(elapsed.Seconds())
}

// newModelSeries resolves a model's latency series; its call counters are
// resolved as their (reason, hint) pairs appear.
func (m *Metrics) newModelSeries(model string) *modelSeries {
	ms := &modelSeries{model: model, latency: m.lookupLatency.WithLabelValues(model)}
	ms.calls.Store(&[]callSeries{})
	return ms
}

// counter returns the (reason, hint) call counter, resolving it on first use.
func (ms *modelSeries) counter(m *Metrics, reason string, hint bool) prometheus.Counter {
	for _, c := range *ms.calls.Load() {
		if c.hint == hint && c.reason == reason {
			return c.c
		}
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	cur := *ms.calls.Load()
	for _, c := range cur {
		if c.hint == hint && c.reason == reason {
			return c.c
		}
	}
	c := m.lookupCalls.WithLabelValues(ms.model, reason, strconv.FormatBool(hint))
	next := make([]callSeries, len(cur), len(cur)+1)
	copy(next, cur)
	next = append(next, callSeries{reason: reason, hint: hint, c: c})
	ms.calls.Store(&next)
	return c
}

// AddIndexEvictions implements engine.Metrics.
func (m *Metrics) AddIndexEvictions(algorithm, reason string, n int) {
	if n > 0 {
		m.indexEvictions.WithLabelValues(algorithm, reason).Add(float64(n))
	}
}

// AddTenantEvictions implements engine.Metrics (reason over_entries).
func (m *Metrics) AddTenantEvictions(tenantID string, n int) {
	if n > 0 {
		m.tenantEvictions.WithLabelValues(tenantID, tenantEvictionReason).Add(float64(n))
	}
}

// SetIndexEntries implements engine.Metrics. A drained model reports 0
// rather than disappearing.
func (m *Metrics) SetIndexEntries(model string, n int64) {
	g, ok := m.entries.Load(model)
	if !ok {
		g, _ = m.entries.LoadOrCompute(model, func() prometheus.Gauge { return m.indexEntries.WithLabelValues(model) })
	}
	g.Set(float64(n))
}

// TimestampClamped implements rpc.ProducerObserver: one increment of
// producer_timestamps_clamped_total{rpc}.
func (m *Metrics) TimestampClamped(rpc string) {
	switch rpc {
	case "ReportCacheState":
		m.clampedReport.Inc()
	case "PublishEvent":
		m.clampedEvent.Inc()
	default:
		m.clamped.WithLabelValues(rpc).Inc()
	}
}

// AuthRecorder counts one control endpoint's auth outcomes. It satisfies
// controlserver/auth.Recorder.
type AuthRecorder struct{ vec *prometheus.CounterVec }

// Record implements auth.Recorder: one increment of the endpoint's
// *_auth_total{result}.
func (r AuthRecorder) Record(result string) { r.vec.WithLabelValues(result).Inc() }

// SnapshotAuth returns the /snapshot recorder (snapshot_auth_total).
func (m *Metrics) SnapshotAuth() AuthRecorder { return AuthRecorder{m.snapshotAuth} }

// PolicyAuth returns the /policy recorder (policy_auth_total).
func (m *Metrics) PolicyAuth() AuthRecorder { return AuthRecorder{m.policyAuth} }

// ProbeAuth returns the /probe recorder (probe_auth_total).
func (m *Metrics) ProbeAuth() AuthRecorder { return AuthRecorder{m.probeAuth} }
