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
//   - the producer RPCs count what the index did not apply through
//     AddDroppedReports (rpc.DropObserver);
//   - the server's panic recovery counts through RecoveredPanic;
//   - the server lifecycle sets SetUp and SetTLSEnabled, and calls
//     RetireDrainedModels periodically.
//
// Bounded model label. The model label of the lookup series comes from
// requests, so it is not trusted: a model has its own lookup series only
// while the index holds keys for it (SetIndexEntries reported n > 0) or
// when it is configured (Options.Models). Every other model, including
// those of UNKNOWN_MODEL answers and of the reserved tenant, is recorded
// under the one shared value OtherModel. A model that drains to 0 keys
// keeps its series, index_entries reading 0, for Options.ModelGrace; then
// RetireDrainedModels removes them. The series count is thus bounded by
// the models the index holds, plus the configured ones, plus one.
//
// ObserveLookup is on the LookupRoute hot path. A model's series are
// resolved when it becomes known and found with one lock-free map load;
// its call counters are resolved once per (reason code, hint used). A
// steady-state call is that load, a short scan of the model's counters and
// the counter and histogram updates (atomics inside client_golang): no
// allocation and no lock. A *Metrics is safe for concurrent use; the zero
// value is not usable (call New or NewWithOptions).
package servermetrics

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

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

// OtherModel is the model label value shared by every lookup whose model
// has no series of its own: not held by the index (nor drained within the
// grace period) and not configured. A model literally named OtherModel
// never gets its own series (nor an index_entries series).
const OtherModel = "__other__"

// MaxModelLabelBytes is the longest model id that can get its own series;
// a longer one is recorded under OtherModel. It equals the id cap of the
// gRPC handlers (rpc.MaxIDBytes), so an id the index can hold fits.
const MaxModelLabelBytes = 1024

// DefaultModelGrace is how long a model that drained to 0 keys keeps its
// own series when Options.ModelGrace is 0. It outlasts an engine restart
// (ALL_CLEARED, then re-reports) so dashboards do not see a reset.
const DefaultModelGrace = 10 * time.Minute

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
	drops           dropCounters             // reason
	panics          *prometheus.CounterVec   // listener
	// panicsByListener holds panics' fixed children; built by
	// NewWithOptions, read-only afterwards.
	panicsByListener map[string]prometheus.Counter
	// clamped is producer_timestamps_clamped_total{rpc}; its two series
	// are resolved once in New (clampedReport, clampedEvent).
	clamped                     *prometheus.CounterVec
	clampedReport, clampedEvent prometheus.Counter

	// other is the shared series of every model without its own; set by
	// NewWithOptions and never changed.
	other *modelSeries
	grace time.Duration
	now   func() time.Time

	// mu serializes the writers of the model registry (SetIndexEntries,
	// RetireDrainedModels) and guards retiring and the fields of
	// modelSeries documented as guarded by it. ObserveLookup never takes it.
	mu sync.Mutex
	// models maps each model with its own series to them. Written under
	// mu; ObserveLookup reads it with lock-free loads.
	models *xsync.MapOf[string, *modelSeries]
	// retiring holds the models RetireDrainedModels removed from models on
	// its previous pass; their series are deleted on the next pass (a
	// lookup that loaded one just before its removal still lands in an
	// exported series) unless their keys come back first. Guarded by mu.
	retiring map[string]*modelSeries

	// pickerMetrics is set once by RegisterPicker; deleteSeries loads it
	// to delete a retired model's picker series too.
	pickerMetrics atomic.Pointer[PickerMetrics]
}

// modelSeries is one model's series (or the shared OtherModel ones).
type modelSeries struct {
	model   string
	latency prometheus.Observer
	// calls is the immutable list of the model's resolved call counters, one
	// per (reason code, hint used) seen so far. It is replaced copy-on-write
	// under mu when a new pair first appears; readers scan it lock-free.
	calls atomic.Pointer[[]callSeries]
	// mu serializes writers of calls (counter's slow path) and of deleted;
	// readers of calls never take it.
	mu sync.Mutex
	// deleted is set, under mu, once the model's series are deleted from
	// the registry; counter then resolves nothing new for it.
	deleted bool
	// picker is the model's endpoint picker series (picker.go), nil until
	// first used; stored once under mu, loaded lock-free.
	picker atomic.Pointer[pickerSeries]

	// Guarded by Metrics.mu:
	// entries is the model's index_entries child, nil until the index
	// reports the model.
	entries prometheus.Gauge
	// configured models never retire.
	configured bool
	// drainedAt is when the index last reported 0 keys for the model; zero
	// while it holds keys.
	drainedAt time.Time
}

type callSeries struct {
	reason string
	hint   bool
	c      prometheus.Counter
}

// Options tune the metric set.
type Options struct {
	// Models always get their own lookup series, whether or not the index
	// holds them (--metrics-models). Each must be non-empty, valid UTF-8,
	// at most MaxModelLabelBytes long and not OtherModel.
	Models []string
	// ModelGrace is how long a model that drained to 0 keys keeps its own
	// series; 0 means DefaultModelGrace.
	ModelGrace time.Duration
	// Now is the clock of the grace period; nil means time.Now.
	Now func() time.Time
}

// ErrInvalidOptions is wrapped by NewWithOptions's errors.
var ErrInvalidOptions = errors.New("servermetrics: invalid options")

// New builds the metric set with the default Options.
func New() *Metrics {
	m, err := NewWithOptions(Options{})
	if err != nil {
		panic("BUG: the default options are invalid: " + err.Error())
	}
	return m
}

// NewWithOptions builds the metric set on a fresh registry with the Go and
// process collectors. server_up and grpc_tls_enabled start at 0.
func NewWithOptions(o Options) (*Metrics, error) {
	if o.ModelGrace < 0 {
		return nil, fmt.Errorf("%w: negative model grace period %v", ErrInvalidOptions, o.ModelGrace)
	}
	for _, model := range o.Models {
		if model == "" || !ownLabel(model) {
			return nil, fmt.Errorf("%w: model %.64q cannot have its own series (empty, %q, longer than %d bytes or not UTF-8)",
				ErrInvalidOptions, model, OtherModel, MaxModelLabelBytes)
		}
	}
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
			Help: "LookupRoute calls by model and outcome; hint_used is true when replica_scores was non-empty. Models the index does not hold share model=\"" + OtherModel + "\".",
		}, []string{"model", "reason_code", "hint_used"}),
		lookupLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "lookup_route_latency_seconds",
			Help:    "Server-side LookupRoute latency from handler entry to response, including ranking. Models the index does not hold share model=\"" + OtherModel + "\".",
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
		drops:        newDropCounters(),
		grace:        o.ModelGrace,
		now:          o.Now,
		models:       xsync.NewMapOf[string, *modelSeries](),
		retiring:     map[string]*modelSeries{},
	}
	m.panics, m.panicsByListener = newPanicCounters()
	if m.grace == 0 {
		m.grace = DefaultModelGrace
	}
	if m.now == nil {
		m.now = time.Now
	}
	m.other = m.newModelSeries(OtherModel)
	for _, model := range o.Models {
		ms := m.newModelSeries(model)
		ms.configured = true
		m.models.Store(model, ms)
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
		m.drops.vec, m.panics,
	)
	m.reg.MustRegister(m.clamped)
	return m, nil
}

// ownLabel reports whether model may have series of its own: a valid
// UTF-8 label value (client_golang refuses others) of at most
// MaxModelLabelBytes that is not the shared value.
func ownLabel(model string) bool {
	return len(model) <= MaxModelLabelBytes && model != OtherModel && utf8.ValidString(model)
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
// latency histogram, under the model's own series when it has them and
// under OtherModel otherwise. Call it exactly once per call. It creates no
// series for an unknown model and does not allocate once the (model or
// OtherModel, reason, hintUsed) series exist.
func (m *Metrics) ObserveLookup(model, reason string, hintUsed bool, elapsed time.Duration) {
	ms := m.other
	if len(model) <= MaxModelLabelBytes {
		if own, ok := m.models.Load(model); ok {
			ms = own
		}
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
	return ms.counterSlow(m, reason, hint)
}

func (ms *modelSeries) counterSlow(m *Metrics, reason string, hint bool) prometheus.Counter {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.deleted {
		// A lookup that loaded the model just before its retirement and
		// then stalled past the deletion: do not resurrect the series.
		return m.other.counter(m, reason, hint)
	}
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

// deleteSeries removes every series of ms from the registry.
func (m *Metrics) deleteSeries(ms *modelSeries) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	ms.deleted = true
	m.lookupLatency.DeleteLabelValues(ms.model)
	for _, c := range *ms.calls.Load() {
		m.lookupCalls.DeleteLabelValues(ms.model, c.reason, strconv.FormatBool(c.hint))
	}
	if ms.entries != nil {
		m.indexEntries.DeleteLabelValues(ms.model)
	}
	m.deletePickerSeriesLocked(ms)
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

// SetIndexEntries implements engine.Metrics. A model with n > 0 gets its
// own series (index_entries and lookups); a drained model reports 0 and
// keeps its series for the grace period (see RetireDrainedModels). A model
// the index never held does not get a series for n = 0.
func (m *Metrics) SetIndexEntries(model string, n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ms, ok := m.models.Load(model)
	if !ok {
		if n <= 0 {
			return
		}
		if ms, ok = m.retiring[model]; ok {
			delete(m.retiring, model)
		} else {
			if !ownLabel(model) {
				return
			}
			ms = m.newModelSeries(model)
		}
		m.models.Store(model, ms)
	}
	if ms.entries == nil {
		ms.entries = m.indexEntries.WithLabelValues(model)
	}
	ms.entries.Set(float64(n))
	switch {
	case n > 0:
		ms.drainedAt = time.Time{}
	case ms.drainedAt.IsZero():
		ms.drainedAt = m.now()
	}
}

// RetireDrainedModels takes the models that have held 0 keys for at least
// the grace period (configured ones excepted) off their own series: from
// now on their lookups count under OtherModel. Their series are deleted
// from the registry on the next call, unless their keys come back first.
// It returns how many models it retired. The server calls it every sweep
// interval.
func (m *Metrics) RetireDrainedModels() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	for model, ms := range m.retiring {
		m.deleteSeries(ms)
		delete(m.retiring, model)
	}
	now := m.now()
	n := 0
	m.models.Range(func(model string, ms *modelSeries) bool {
		if !ms.configured && !ms.drainedAt.IsZero() && now.Sub(ms.drainedAt) >= m.grace {
			m.models.Delete(model)
			m.retiring[model] = ms
			n++
		}
		return true
	})
	return n
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
