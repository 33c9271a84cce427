package servermetrics

import "github.com/prometheus/client_golang/prometheus"

// NameLookupStreamsOpen is the gauge of open LookupRouteStream streams.
const NameLookupStreamsOpen = "inferencecache_lookup_streams_open"

// RegisterLookupStreams registers lookup_streams_open, read from open at
// scrape time.
func (m *Metrics) RegisterLookupStreams(open func() int64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: NameLookupStreamsOpen,
		Help: "LookupRouteStream streams open on this server (gateways sending their lookups on long-lived streams).",
	}, func() float64 { return float64(open()) }))
}
