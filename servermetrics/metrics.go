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
// requests, and the index can hold any number of models, so neither is
// taken as is. A model has its own lookup and index_entries series only
// when it is configured (Options.Models), or when the index holds keys for
// it (SetIndexEntries reported n > 0) and it is among the MaxModels
// busiest such models. Busiest means the most lookups since the previous
// ranking pass (RetireDrainedModels, every sweep interval), ties going to
// the models that already have series, then to the most keys, then to the
// smallest name; until the first pass, models get series in the order the
// index reports them while there is room. Every other model (not held, not
// ranked, over MaxModelLabelBytes, named OtherModel or not UTF-8) is
// recorded under the one shared value OtherModel: its lookups in the
// OtherModel lookup series, its keys in index_entries{model=OtherModel}
// (created when the first model is aggregated), so index_entries still
// sums to the index's keys. A model that drains to 0 keys keeps its
// series, index_entries reading 0, for Options.ModelGrace; then
// RetireDrainedModels removes them. The series count is thus bounded by
// MaxModels plus the configured models plus one, whatever the index and
// the clients hold. The replica load gauges (RegisterLoads) follow the
// same set: a replica of a model without series of its own is summed into
// one series per family labeled OtherModel.
//
// ObserveLookup is on the LookupRoute hot path. A model's entry is found
// with one lock-free map load, its lookup count (for the ranking) is one
// atomic add, its series one atomic load; its call counters are resolved
// once per (reason code, hint used). A steady-state call is that, a short
// scan of the model's counters and the counter and histogram updates
// (atomics inside client_golang): no allocation and no lock. A *Metrics is
// safe for concurrent use; the zero value is not usable (call New or
// NewWithOptions).
package servermetrics

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"
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

// OtherModel is the model label value shared by every model without series
// of its own: not held by the index (nor drained within the grace period),
// or held but not among the MaxModels busiest, and not configured. A model
// literally named OtherModel never gets its own series; its keys count in
// index_entries{model=OtherModel} with the other aggregated models'.
const OtherModel = "__other__"

// MaxModelLabelBytes is the longest model id that can get its own series;
// a longer one is recorded under OtherModel. It equals the id cap of the
// gRPC handlers (rpc.MaxIDBytes), so an id the index can hold fits.
const MaxModelLabelBytes = 1024

// DefaultMaxModels is how many models the index holds keep series of
// their own when Options.MaxModels is 0 (--metrics-max-models). About 25
// exposition lines each.
const DefaultMaxModels = 64

// DefaultMaxScrapesInFlight is how many /metrics scrapes gather at once
// when Options.MaxScrapesInFlight is 0; the next ones are answered 503.
const DefaultMaxScrapesInFlight = 4

// DefaultScrapeTimeout bounds one /metrics scrape when Options.ScrapeTimeout
// is 0 (Prometheus's own default scrape timeout); past it the scrape is
// answered 503.
const DefaultScrapeTimeout = 10 * time.Second

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
	// maxModels, maxScrapes and scrapeTimeout are the normalized Options.
	maxModels, maxScrapes int
	scrapeTimeout         time.Duration

	// mu serializes the writers of the model registry (SetIndexEntries,
	// RetireDrainedModels) and guards the fields below and those of
	// modelEntry and modelSeries documented as guarded by it.
	// ObserveLookup never takes it.
	mu sync.Mutex
	// models maps each model the index holds (or held within the grace
	// period) and each configured model to its entry. Written under mu;
	// ObserveLookup and the load collector read it with lock-free loads.
	models *xsync.MapOf[string, *modelEntry]
	// ranked counts the models that have series of their own and are not
	// configured, those in retiring included: at most maxModels.
	ranked int
	// otherKeys is the sum of the keys of the held models without series
	// of their own, exported as index_entries{model=OtherModel} through
	// otherEntries (nil until the first such model).
	otherKeys    int64
	otherEntries prometheus.Gauge
	// retiring holds the models with series of their own that
	// RetireDrainedModels removed from models on its previous pass; their
	// series are deleted on the next pass (a lookup that loaded one just
	// before its removal still lands in an exported series) unless their
	// keys come back first. They keep their place in ranked until then.
	retiring map[string]*modelEntry

	// pickerMetrics is set once by RegisterPicker; deleteSeries loads it
	// to delete a retired model's picker series too.
	pickerMetrics atomic.Pointer[PickerMetrics]
}

// modelEntry is one model the registry tracks: configured, or held by the
// index (or drained within the grace period).
type modelEntry struct {
	model string
	// series is the model's own series, nil while its lookups and keys
	// count under OtherModel. Stored under Metrics.mu; loaded by lookups.
	series atomic.Pointer[modelSeries]
	// lookups counts the lookups naming the model; added by ObserveLookup,
	// read by the ranking pass.
	lookups atomic.Int64

	// Guarded by Metrics.mu:
	// ownable is false for a model that can never have series of its own
	// (see ownLabel).
	ownable bool
	// configured models always have series and never retire.
	configured bool
	// keys is the index's last count for the model.
	keys int64
	// rankedLookups is lookups at the previous ranking pass.
	rankedLookups int64
	// drainedAt is when the index last reported 0 keys for the model; zero
	// while it holds keys.
	drainedAt time.Time
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

	// entries is the model's index_entries child, nil until set; guarded
	// by Metrics.mu.
	entries prometheus.Gauge
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
	// MaxModels is how many of the models the index holds keep series of
	// their own, the busiest first (--metrics-max-models); 0 means
	// DefaultMaxModels. The configured Models come on top.
	MaxModels int
	// ModelGrace is how long a model that drained to 0 keys keeps its own
	// series; 0 means DefaultModelGrace.
	ModelGrace time.Duration
	// MaxScrapesInFlight bounds the /metrics scrapes gathering at once (more
	// are answered 503); 0 means DefaultMaxScrapesInFlight.
	MaxScrapesInFlight int
	// ScrapeTimeout bounds one /metrics scrape (past it the scrape is
	// answered 503); 0 means DefaultScrapeTimeout.
	ScrapeTimeout time.Duration
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
	switch {
	case o.ModelGrace < 0:
		return nil, fmt.Errorf("%w: negative model grace period %v", ErrInvalidOptions, o.ModelGrace)
	case o.MaxModels < 0:
		return nil, fmt.Errorf("%w: negative max models %d", ErrInvalidOptions, o.MaxModels)
	case o.MaxScrapesInFlight < 0:
		return nil, fmt.Errorf("%w: negative max scrapes in flight %d", ErrInvalidOptions, o.MaxScrapesInFlight)
	case o.ScrapeTimeout < 0:
		return nil, fmt.Errorf("%w: negative scrape timeout %v", ErrInvalidOptions, o.ScrapeTimeout)
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
			Help: "Distinct (tenant, model, hash_scheme, adapter, prefix_hash) keys the index holds per model, reserved tenant excluded. Models without series of their own are summed under model=\"" + OtherModel + "\".",
		}, []string{"model"}),
		lookupCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "lookup_route_calls_total",
			Help: "LookupRoute calls by model and outcome; hint_used is true when replica_scores was non-empty. Models the index does not hold, and those beyond the busiest --metrics-max-models, share model=\"" + OtherModel + "\".",
		}, []string{"model", "reason_code", "hint_used"}),
		lookupLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "lookup_route_latency_seconds",
			Help:    "Server-side LookupRoute latency from handler entry to response, including ranking. Models the index does not hold, and those beyond the busiest --metrics-max-models, share model=\"" + OtherModel + "\".",
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
		snapshotAuth:  authVec("snapshot_auth_total", "/snapshot"),
		policyAuth:    authVec("policy_auth_total", "/policy"),
		probeAuth:     authVec("probe_auth_total", "/probe"),
		drops:         newDropCounters(),
		grace:         o.ModelGrace,
		now:           o.Now,
		maxModels:     cmp.Or(o.MaxModels, DefaultMaxModels),
		maxScrapes:    cmp.Or(o.MaxScrapesInFlight, DefaultMaxScrapesInFlight),
		scrapeTimeout: cmp.Or(o.ScrapeTimeout, DefaultScrapeTimeout),
		models:        xsync.NewMapOf[string, *modelEntry](),
		retiring:      map[string]*modelEntry{},
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
		e := &modelEntry{model: model, ownable: true, configured: true}
		e.series.Store(m.newModelSeries(model))
		m.models.Store(model, e)
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

// Handler serves the registry in the Prometheus exposition format. At most
// MaxScrapesInFlight scrapes gather at once (each builds its own copy of
// the exposition); the next ones are answered 503 at once, and a scrape
// that takes longer than ScrapeTimeout is answered 503 (its gather still
// holds its slot until it ends).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		Registry:            m.reg,
		MaxRequestsInFlight: m.maxScrapes,
		Timeout:             m.scrapeTimeout,
	})
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
// under OtherModel otherwise, and counts the lookup for the model's rank.
// Call it exactly once per call. It creates no series for an unknown model
// and does not allocate once the (model or OtherModel, reason, hintUsed)
// series exist.
func (m *Metrics) ObserveLookup(model, reason string, hintUsed bool, elapsed time.Duration) {
	ms := m.other
	if len(model) <= MaxModelLabelBytes {
		if e, ok := m.models.Load(model); ok {
			e.lookups.Add(1)
			if own := e.series.Load(); own != nil {
				ms = own
			}
		}
	}
	ms.counter(m, reason, hintUsed).Inc()
	ms.latency.Observe(elapsed.Seconds())
}

// ownSeries reports whether model has series of its own (the load
// collector's test).
func (m *Metrics) ownSeries(model string) bool {
	if len(model) > MaxModelLabelBytes {
		return false
	}
	e, ok := m.models.Load(model)
	return ok && e.series.Load() != nil
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
		ms.entries = nil
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

// SetIndexEntries implements engine.Metrics. A model with n > 0 is tracked
// (and gets its own series at once while fewer than MaxModels models have
// theirs); a drained model reports 0 and keeps its series for the grace
// period (see RetireDrainedModels). A model the index never held is not
// tracked for n = 0.
func (m *Metrics) SetIndexEntries(model string, n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.models.Load(model)
	if !ok {
		if n <= 0 {
			return
		}
		if e, ok = m.retiring[model]; ok {
			// Back before its series were deleted: it keeps them (and
			// the place in ranked it kept meanwhile).
			delete(m.retiring, model)
		} else {
			e = &modelEntry{model: model, ownable: ownLabel(model)}
		}
		m.models.Store(model, e)
		if e.series.Load() == nil && e.ownable && m.ranked < m.maxModels {
			m.promoteLocked(e)
		}
	}
	m.setKeysLocked(e, n)
	switch {
	case n > 0:
		e.drainedAt = time.Time{}
	case e.drainedAt.IsZero():
		e.drainedAt = m.now()
	}
}

// setKeysLocked records the model's key count in its index_entries series,
// or in the OtherModel sum.
func (m *Metrics) setKeysLocked(e *modelEntry, n int64) {
	old := e.keys
	e.keys = n
	if ms := e.series.Load(); ms != nil {
		if ms.entries == nil {
			ms.entries = m.indexEntries.WithLabelValues(e.model)
		}
		ms.entries.Set(float64(n))
		return
	}
	m.addOtherKeysLocked(n - old)
}

// addOtherKeysLocked moves index_entries{model=OtherModel} by d.
func (m *Metrics) addOtherKeysLocked(d int64) {
	if d == 0 {
		return
	}
	m.otherKeys += d
	if m.otherEntries == nil {
		m.otherEntries = m.indexEntries.WithLabelValues(OtherModel)
	}
	m.otherEntries.Set(float64(m.otherKeys))
}

// promoteLocked gives a ranked model series of its own (new ones: its
// counts so far were recorded under OtherModel), moving its keys out of
// the OtherModel sum.
func (m *Metrics) promoteLocked(e *modelEntry) {
	ms := m.newModelSeries(e.model)
	e.series.Store(ms)
	m.ranked++
	m.addOtherKeysLocked(-e.keys)
	ms.entries = m.indexEntries.WithLabelValues(e.model)
	ms.entries.Set(float64(e.keys))
}

// demoteLocked moves a ranked model's lookups and keys to OtherModel and
// deletes its series at once, so the bound holds at every scrape and
// index_entries keeps summing to the index's keys. A lookup that loaded
// the series just before may add to a deleted counter: one count lost, as
// the model's past counts are.
func (m *Metrics) demoteLocked(e *modelEntry) {
	ms := e.series.Swap(nil)
	m.ranked--
	m.deleteSeries(ms)
	m.addOtherKeysLocked(e.keys)
}

// RetireDrainedModels is the registry's periodic pass (the server calls it
// every sweep interval). It deletes the series the previous pass retired;
// takes the models that have held 0 keys for at least the
// grace period (configured ones excepted) off the registry, their lookups
// counting under OtherModel from now on and their series deleted on the
// next pass unless their keys come back first; and ranks the models the
// index holds: the MaxModels busiest (see the package doc) have series of
// their own, the others are moved to OtherModel (their series deleted at
// once). It returns how many models it retired.
func (m *Metrics) RetireDrainedModels() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	for model, e := range m.retiring {
		m.deleteSeries(e.series.Load())
		m.ranked--
		delete(m.retiring, model)
	}

	now := m.now()
	retired := 0
	var cands []rankCand
	m.models.Range(func(model string, e *modelEntry) bool {
		if e.configured {
			return true
		}
		if !e.drainedAt.IsZero() && now.Sub(e.drainedAt) >= m.grace {
			m.models.Delete(model)
			if e.series.Load() != nil {
				m.retiring[model] = e // still counted in ranked
			}
			retired++
			return true
		}
		lookups := e.lookups.Load()
		if e.ownable {
			cands = append(cands, rankCand{e: e, recent: lookups - e.rankedLookups, own: e.series.Load() != nil})
		}
		e.rankedLookups = lookups
		return true
	})
	m.rankLocked(cands)
	return retired
}

// rankCand is a model the ranking pass considers.
type rankCand struct {
	e      *modelEntry
	recent int64 // lookups since the previous pass
	own    bool  // it has series of its own now
}

// rankLocked gives the first candidates, in rank order, series of their
// own, as many as MaxModels less the retiring models that still hold
// theirs, and moves the others to OtherModel.
func (m *Metrics) rankLocked(cands []rankCand) {
	slices.SortFunc(cands, func(a, b rankCand) int {
		if c := cmp.Compare(b.recent, a.recent); c != 0 {
			return c
		}
		if a.own != b.own {
			if a.own {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(b.e.keys, a.e.keys); c != 0 {
			return c
		}
		return cmp.Compare(a.e.model, b.e.model)
	})
	keep := max(0, min(len(cands), m.maxModels-len(m.retiring)))
	for _, c := range cands[keep:] {
		if c.own {
			m.demoteLocked(c.e)
		}
	}
	for _, c := range cands[:keep] {
		if !c.own {
			m.promoteLocked(c.e)
		}
	}
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
