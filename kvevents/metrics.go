package kvevents

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferencecache/inferencecache/kvevents/wire"
)

// Metrics are the subscriber's own Prometheus metrics, all prefixed
// inferencecache_subscriber_. A nil *Metrics is valid and records nothing,
// so unit tests can leave it out.
type Metrics struct {
	batchesDecoded prometheus.Counter
	batchesDropped *prometheus.CounterVec // reason
	eventsDecoded  *prometheus.CounterVec // type
	// decodedByKind are eventsDecoded's series by EventKind, resolved once:
	// Processor.Apply counts every event, and resolving the label costs
	// more than the increment.
	decodedByKind   [wire.KindAllBlocksCleared + 1]prometheus.Counter
	eventsDropped   *prometheus.CounterVec // reason
	unknownRemovals prometheus.Counter
	gaps            prometheus.Counter
	replays         *prometheus.CounterVec // outcome
	restarts        prometheus.Counter
	resyncs         prometheus.Counter
	overflows       prometheus.Counter
	forwardLatency  *prometheus.HistogramVec // rpc
	forwardErrors   *prometheus.CounterVec   // rpc
	buffered        prometheus.Gauge
	indexBlocks     prometheus.Gauge
	scrapes         *prometheus.CounterVec // result
	reconnects      prometheus.Counter
	refreshEntries  prometheus.Counter
	refreshes       prometheus.Counter
	rereports       *prometheus.CounterVec // reason
	stateSaves      *prometheus.CounterVec // result
	stateLoads      *prometheus.CounterVec // result
	recoveries      *prometheus.CounterVec // outcome
	lostDeliveries  prometheus.Counter
}

// Replay outcomes (the replays counter's label).
const (
	ReplayOK          = "ok"          // the gap was filled
	ReplayUnavailable = "unavailable" // no replay endpoint configured or it could not be reached
	ReplayTimeout     = "timeout"     // no end marker before the deadline
	ReplayIncomplete  = "incomplete"  // the engine's buffer no longer covers the gap
	ReplayError       = "error"       // malformed reply
)

// NewMetrics registers the subscriber metrics on reg (which may be nil to
// keep them unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns, sub = "inferencecache", "subscriber"
	m := &Metrics{
		batchesDecoded: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "batches_decoded_total", Help: "Engine event batches decoded."}),
		batchesDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "batches_dropped_total", Help: "Engine event batches skipped as malformed, or dropped by the receive queue's byte bound (reason receive_queue), by reason."}, []string{"reason"}),
		eventsDecoded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "events_decoded_total", Help: "Engine KV events decoded, by type."}, []string{"type"}),
		eventsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "events_dropped_total", Help: "Decoded engine KV events not forwarded, by reason."}, []string{"reason"}),
		unknownRemovals: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "removed_unknown_blocks_total", Help: "BlockRemoved hashes absent from the positional index (skipped)."}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "sequence_gaps_total", Help: "Sequence gaps seen on the engine's PUB stream."}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "replays_total", Help: "Replay requests to the engine, by outcome."}, []string{"outcome"}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "engine_restarts_total", Help: "Sequence numbers that went backwards (engine publisher restarted)."}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "resyncs_total", Help: "Clear-and-resync cycles completed (ALL_CLEARED then a re-report of the positional index)."}),
		overflows: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "buffer_overflows_total", Help: "Times the forward buffer overflowed and was dropped."}),
		forwardLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "forward_latency_seconds", Help: "Latency of successful calls to the inferencecache server, by RPC.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}, []string{"rpc"}),
		forwardErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "forward_errors_total", Help: "Failed calls to the inferencecache server, by RPC."}, []string{"rpc"}),
		buffered: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "forward_buffered_entries", Help: "Entries waiting to be forwarded."}),
		indexBlocks: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "positional_index_blocks", Help: "Engine blocks held by the positional index."}),
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "stats_scrapes_total", Help: "Engine /metrics scrapes, by result."}, []string{"result"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "zmq_reconnects_total", Help: "Times the SUB socket was re-dialed."}),
		refreshEntries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "refreshed_entries_total", Help: "Held blocks re-reported by the periodic refresh."}),
		refreshes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "refreshes_total", Help: "Periodic refresh walks of the positional index completed."}),
	}
	m.rereports = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "rereports_total", Help: "Re-reports of the whole positional index without ALL_CLEARED, by reason (sync, server_restart, server_reconnect)."}, []string{"reason"})
	m.stateSaves = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "state_saves_total", Help: "State file writes, by result (ok, error)."}, []string{"result"})
	m.stateLoads = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "state_loads_total", Help: "State file reads at start, by result (ok, missing, invalid, foreign, error)."}, []string{"result"})
	m.recoveries = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "history_recoveries_total", Help: "Replays from the engine's oldest buffered batch triggered by a BlockStored with an unknown parent, by outcome (adopted, no_further, failed)."}, []string{"outcome"})
	m.lostDeliveries = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
		Name: "forward_lost_total", Help: "Deliveries the sink had accepted and later reported not stored (NATS: a negative or missing JetStream ack); each loss triggers a clear-and-resync."})
	for k := range m.decodedByKind {
		m.decodedByKind[k] = m.eventsDecoded.WithLabelValues(wire.EventKind(k).String())
	}
	if reg != nil {
		reg.MustRegister(m.batchesDecoded, m.batchesDropped, m.eventsDecoded, m.eventsDropped,
			m.unknownRemovals, m.gaps, m.replays, m.restarts, m.resyncs, m.overflows,
			m.forwardLatency, m.forwardErrors, m.buffered, m.indexBlocks, m.scrapes, m.reconnects,
			m.refreshEntries, m.refreshes, m.rereports, m.stateSaves, m.stateLoads, m.recoveries,
			m.lostDeliveries)
	}
	return m
}

func (m *Metrics) batchDecoded() {
	if m != nil {
		m.batchesDecoded.Inc()
	}
}

func (m *Metrics) batchDropped(reason string) {
	if m != nil {
		m.batchesDropped.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) eventDecoded(k wire.EventKind) {
	if m != nil && int(k) < len(m.decodedByKind) {
		m.decodedByKind[k].Inc()
	}
}

func (m *Metrics) eventDropped(reason string) {
	if m != nil {
		m.eventsDropped.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) removedUnknown(n int) {
	if m != nil && n > 0 {
		m.unknownRemovals.Add(float64(n))
	}
}

func (m *Metrics) gap() {
	if m != nil {
		m.gaps.Inc()
	}
}

func (m *Metrics) replay(outcome string) {
	if m != nil {
		m.replays.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) restart() {
	if m != nil {
		m.restarts.Inc()
	}
}

func (m *Metrics) resync() {
	if m != nil {
		m.resyncs.Inc()
	}
}

func (m *Metrics) lost(n uint64) {
	if m != nil {
		m.lostDeliveries.Add(float64(n))
	}
}

func (m *Metrics) overflow() {
	if m != nil {
		m.overflows.Inc()
	}
}

func (m *Metrics) forwarded(rpc string, d time.Duration, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.forwardErrors.WithLabelValues(rpc).Inc()
		return
	}
	m.forwardLatency.WithLabelValues(rpc).Observe(d.Seconds())
}

func (m *Metrics) setBuffered(n int) {
	if m != nil {
		m.buffered.Set(float64(n))
	}
}

func (m *Metrics) setIndexBlocks(n int) {
	if m != nil {
		m.indexBlocks.Set(float64(n))
	}
}

func (m *Metrics) scrape(result string) {
	if m != nil {
		m.scrapes.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) reconnect() {
	if m != nil {
		m.reconnects.Inc()
	}
}

func (m *Metrics) refreshed(n int) {
	if m != nil {
		m.refreshEntries.Add(float64(n))
	}
}

func (m *Metrics) refreshDone() {
	if m != nil {
		m.refreshes.Inc()
	}
}

func (m *Metrics) rereport(reason string) {
	if m != nil {
		m.rereports.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) stateSave(result string) {
	if m != nil {
		m.stateSaves.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) stateLoad(result string) {
	if m != nil {
		m.stateLoads.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) recovery(outcome string) {
	if m != nil {
		m.recoveries.WithLabelValues(outcome).Inc()
	}
}
