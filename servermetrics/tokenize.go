package servermetrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Tokenizer metrics (documented in docs/metrics.md), exported when the
// server has a --tokenizer-dir.
const (
	NameTokenizations    = "inferencecache_tokenizations_total"
	NameTokenizeFailures = "inferencecache_tokenize_failures_total"
	NameTokenizeLatency  = "inferencecache_tokenize_latency_seconds"
	NameTokenizerLoads   = "inferencecache_tokenizer_loads_total"
	// NameTokenizerLoadFailures counts failed loads by model and reason;
	// at most MaxLoadFailureModels model values, the rest OtherModel.
	NameTokenizerLoadFailures = "inferencecache_tokenizer_load_failures_total"
)

// MaxLoadFailureModels bounds the model label of
// tokenizer_load_failures_total (model ids come from requests); models
// past it are counted as OtherModel.
const MaxLoadFailureModels = 64

// TokenizeBuckets are the buckets of tokenize_latency_seconds: 50 µs for a
// short prompt to 2.5 s for 1 MiB or a first load.
var TokenizeBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

// TokenizeMetrics records prompt_text tokenizations; it implements
// modeldir.Observer. Its children are resolved at construction, so
// recording allocates nothing.
type TokenizeMetrics struct {
	ok        prometheus.Counter
	latency   prometheus.Histogram
	failures  map[string]prometheus.Counter // fixed at construction, read-only
	failVec   *prometheus.CounterVec
	loadOK    prometheus.Counter
	loadError prometheus.Counter

	loadFailVec *prometheus.CounterVec
	// mu protects failModels, the model label values in use.
	mu         sync.Mutex
	failModels map[string]bool
}

// RegisterTokenizer registers the tokenizer metrics with every failure
// reason (modeldir.Reasons) exported at 0 and returns their recorder. Call
// it once.
func (m *Metrics) RegisterTokenizer(reasons ...string) *TokenizeMetrics {
	t := &TokenizeMetrics{
		ok: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "tokenizations_total",
			Help: "prompt_text tokenizations that produced tokens (chat template rendered and tokenized).",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "tokenize_latency_seconds",
			Help:    "Latency of successful prompt_text tokenizations: template rendering and tokenization, plus the model's first load.",
			Buckets: TokenizeBuckets,
		}),
		failVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "tokenize_failures_total",
			Help: "prompt_text tokenizations that failed (the lookup failed open to NO_HINT), by reason.",
		}, []string{"reason"}),
		failures: map[string]prometheus.Counter{},
	}
	loads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "tokenizer_loads_total",
		Help: "Loads of a model's tokenizer files from --tokenizer-dir, by result (ok or error).",
	}, []string{"result"})
	t.loadOK, t.loadError = loads.WithLabelValues("ok"), loads.WithLabelValues("error")
	for _, r := range reasons {
		t.failures[r] = t.failVec.WithLabelValues(r)
	}
	t.loadFailVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "tokenizer_load_failures_total",
		Help: "Failed loads of a model's tokenizer files, by model (at most 64 models, the rest __other__) and reason.",
	}, []string{"model", "reason"})
	t.failModels = map[string]bool{}
	m.reg.MustRegister(t.ok, t.latency, t.failVec, loads, t.loadFailVec)
	return t
}

// Tokenized records one successful tokenization.
func (t *TokenizeMetrics) Tokenized(elapsed time.Duration) {
	t.ok.Inc()
	t.latency.Observe(elapsed.Seconds())
}

// TokenizeFailed records one failed tokenization.
func (t *TokenizeMetrics) TokenizeFailed(reason string) {
	c, ok := t.failures[reason]
	if !ok {
		c = t.failVec.WithLabelValues(reason)
	}
	c.Inc()
}

// TokenizerLoaded records one load of a model's tokenizer files.
func (t *TokenizeMetrics) TokenizerLoaded(ok bool) {
	if ok {
		t.loadOK.Inc()
	} else {
		t.loadError.Inc()
	}
}

// TokenizerLoadFailed records one failed load of a model's files (it
// implements modeldir.LoadFailureObserver). The first
// MaxLoadFailureModels models get their own series; later ones count as
// OtherModel.
func (t *TokenizeMetrics) TokenizerLoadFailed(model, reason string) {
	t.mu.Lock()
	if len(model) > MaxModelLabelBytes {
		model = OtherModel
	}
	if model != OtherModel && !t.failModels[model] {
		if len(t.failModels) < MaxLoadFailureModels {
			t.failModels[model] = true
		} else {
			model = OtherModel
		}
	}
	t.mu.Unlock()
	t.loadFailVec.WithLabelValues(model, reason).Inc()
}
