package controller

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// BackendMetrics are the tier-2 series of docs metrics.md that the
// SnapshotPoller drives, labelled by backend "<namespace>/<name>":
//
//   - inferencecache_backend_t2_hit_rate (gauge): the backend's cumulative
//     tier-2 hit rate, present once the tier was queried;
//   - inferencecache_backend_t2_query_tokens_total (counter): the positive
//     per-poll deltas of the backend's cumulative tier-2 query tokens, so a
//     drop from replica churn or an engine restart never reads as a reset.
//
// Both series of a backend are deleted when its replicas leave the snapshot
// or the backend is deleted. The zero value is not usable; use
// NewBackendMetrics.
type BackendMetrics struct {
	HitRate     *prometheus.GaugeVec
	QueryTokens *prometheus.CounterVec
}

// NewBackendMetrics creates the vectors without registering them.
func NewBackendMetrics() *BackendMetrics {
	return &BackendMetrics{
		HitRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inferencecache_backend_t2_hit_rate",
			Help: "Query-weighted tier-2 reload hit rate of the CacheBackend in [0,1]; present once the tier was queried.",
		}, []string{"backend"}),
		QueryTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferencecache_backend_t2_query_tokens_total",
			Help: "Tier-2 query tokens observed for the CacheBackend (sum of positive per-poll deltas).",
		}, []string{"backend"}),
	}
}

// Register adds both vectors to r.
func (m *BackendMetrics) Register(r prometheus.Registerer) error {
	if err := r.Register(m.HitRate); err != nil {
		return err
	}
	return r.Register(m.QueryTokens)
}

func (m *BackendMetrics) delete(backend string) {
	m.HitRate.DeleteLabelValues(backend)
	m.QueryTokens.DeleteLabelValues(backend)
}

var (
	// processMetrics is registered with the controller-runtime registry the
	// first time Setup wires a SnapshotPoller; the registry is per process.
	// processMetricsOnce guards that: processMetrics and processMetricsErr
	// are written only inside its Do and read only after it returned.
	processMetrics     *BackendMetrics
	processMetricsOnce sync.Once
	processMetricsErr  error
)

func registeredBackendMetrics() (*BackendMetrics, error) {
	processMetricsOnce.Do(func() {
		processMetrics = NewBackendMetrics()
		processMetricsErr = processMetrics.Register(ctrlmetrics.Registry)
	})
	return processMetrics, processMetricsErr
}
