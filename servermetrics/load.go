package servermetrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferencecache/inferencecache/engine"
)

// Load-aware routing gauges (docs/metrics.md, docs/routing.md), read from
// the engine at scrape time: one series per (tenant, model, replica) with a
// fresh load report, so they come and go with the fleet, for the models
// with series of their own (the bounded model label, see the package doc);
// the replicas of every other model are summed into one series per family
// whose three labels read OtherModel.
const (
	NameReplicaQueueTokens      = "inferencecache_replica_queue_tokens"
	NameReplicaInflightRequests = "inferencecache_replica_inflight_requests"
)

type loadCollector struct {
	src      func(now int64, fn func(engine.LoadView))
	own      func(model string) bool
	queue    *prometheus.Desc
	inflight *prometheus.Desc
}

// RegisterLoads adds the replica load gauges, fed by src (normally
// engine.Engine.Loads) at scrape time. Call it once. Reading them takes no
// lock.
func (m *Metrics) RegisterLoads(src func(now int64, fn func(engine.LoadView))) {
	labels := []string{"tenant_id", "model", "replica_id"}
	m.reg.MustRegister(&loadCollector{
		src: src,
		own: m.ownSeries,
		queue: prometheus.NewDesc(NameReplicaQueueTokens,
			"Prefill work, in tokens, the server estimates is queued ahead of a new request on the replica: its last load report, plus what the server routed there since, minus the prefills its KV events showed complete since. Only replicas with a fresh load report.",
			labels, nil),
		inflight: prometheus.NewDesc(NameReplicaInflightRequests,
			"Requests in flight on the replica as load-aware routing sees them: waiting plus running from its last load report, plus the requests the server routed there and its endpoint picker started there since, minus those the picker saw end since, and at least the picker's own live requests. Only replicas with a fresh load report.",
			labels, nil),
	})
}

func (c *loadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.queue
	ch <- c.inflight
}

func (c *loadCollector) Collect(ch chan<- prometheus.Metric) {
	var (
		others          bool
		queue, inflight float64 // sums over the replicas of the other models
	)
	c.src(time.Now().UnixMicro(), func(v engine.LoadView) {
		if !v.Fresh {
			return
		}
		in := v.InFlight
		if !c.own(v.Model) {
			others = true
			queue += v.QueueTokens
			inflight += in
			return
		}
		ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, v.QueueTokens, v.Tenant, v.Model, v.Replica)
		ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, in, v.Tenant, v.Model, v.Replica)
	})
	if others {
		ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, queue, OtherModel, OtherModel, OtherModel)
		ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, inflight, OtherModel, OtherModel, OtherModel)
	}
}
