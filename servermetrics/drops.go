package servermetrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/puzpuzpuz/xsync/v3"
)

// Counters this project adds beyond the spec's table (documented in
// docs/metrics.md): producer reports the index did not apply, and handler
// panics the server recovered from.
const (
	NameDroppedReports  = "inferencecache_dropped_reports_total"
	NameRecoveredPanics = "inferencecache_recovered_panics_total"
)

// Listener label values of recovered_panics_total.
const (
	ListenerGRPC    = "grpc"
	ListenerHTTP    = "http"
	ListenerControl = "control"
)

// dropCounters is inferencecache_dropped_reports_total{reason} with its
// children resolved once per reason: the reasons are the gRPC handlers' fixed
// vocabulary (rpc.DropReasons), never request data.
type dropCounters struct {
	vec *prometheus.CounterVec
	// byReason caches each reason's child; filled with LoadOrCompute and
	// never shrunk, read lock-free.
	byReason *xsync.MapOf[string, prometheus.Counter]
}

func newDropCounters() dropCounters {
	return dropCounters{
		vec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "dropped_reports_total",
			Help: "Producer reports (prefix entries, stats, events) the index did not apply, by reason.",
		}, []string{"reason"}),
		byReason: xsync.NewMapOf[string, prometheus.Counter](),
	}
}

func (d dropCounters) child(reason string) prometheus.Counter {
	c, ok := d.byReason.Load(reason)
	if !ok {
		c, _ = d.byReason.LoadOrCompute(reason, func() prometheus.Counter { return d.vec.WithLabelValues(reason) })
	}
	return c
}

// DeclareDropReasons exports dropped_reports_total at 0 for each reason, so
// rate() and alerts work before the first drop. The server passes
// rpc.DropReasons.
func (m *Metrics) DeclareDropReasons(reasons ...string) {
	for _, r := range reasons {
		m.drops.child(r)
	}
}

// AddDroppedReports implements rpc.DropObserver: n reports dropped for
// reason. It does not allocate once the reason's series exists.
func (m *Metrics) AddDroppedReports(reason string, n int) {
	if n > 0 {
		m.drops.child(reason).Add(float64(n))
	}
}

// newPanicCounters builds recovered_panics_total{listener} with the three
// listeners' children, exported at 0 from the start.
func newPanicCounters() (*prometheus.CounterVec, map[string]prometheus.Counter) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "recovered_panics_total",
		Help: "Handler panics recovered by the server (the request got Internal or 500), by listener: grpc, http (public) or control.",
	}, []string{"listener"})
	byListener := map[string]prometheus.Counter{}
	for _, l := range []string{ListenerGRPC, ListenerHTTP, ListenerControl} {
		byListener[l] = vec.WithLabelValues(l)
	}
	return vec, byListener
}

// RecoveredPanic counts one handler panic the server recovered from on
// listener (ListenerGRPC, ListenerHTTP or ListenerControl).
func (m *Metrics) RecoveredPanic(listener string) {
	c, ok := m.panicsByListener[listener]
	if !ok {
		c = m.panics.WithLabelValues(listener)
	}
	c.Inc()
}
