package servermetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferencecache/inferencecache/engine"
)

// Metric names this project adds beyond the spec's table (documented in
// docs/metrics.md): the index's memory and storage entries, read from the
// engine at scrape time.
const (
	NameIndexMemory         = "inferencecache_index_memory_bytes"
	NameIndexStorageEntries = "inferencecache_index_storage_entries"
)

// indexCollector reads engine.MemoryStats when Prometheus scrapes, so the
// figures cost nothing between scrapes. A scrape takes the index's writer
// lock for the duration of one memory walk (microseconds to a few
// milliseconds with many replicas), never the lookup path.
type indexCollector struct {
	src     func() engine.MemoryStats
	memory  *prometheus.Desc
	entries *prometheus.Desc
}

// RegisterIndex adds the index memory and storage-entry gauges, fed by src
// (normally engine.Engine.Memory) at scrape time. Call it once.
func (m *Metrics) RegisterIndex(src func() engine.MemoryStats) {
	m.reg.MustRegister(&indexCollector{
		src: src,
		memory: prometheus.NewDesc(NameIndexMemory,
			"Memory of the cache index by component: arena_slabs (held from the runtime), arena_live (in live nodes and holder blocks), tables, queues, overhead (Go-side bookkeeping), budgeted (what --max-index-bytes is checked against) and total (held).",
			[]string{"component"}, nil),
		entries: prometheus.NewDesc(NameIndexStorageEntries,
			"Replica x key storage entries in the index (what --max-index-entries caps), reserved tenant excluded.",
			nil, nil),
	})
}

func (c *indexCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.memory
	ch <- c.entries
}

func (c *indexCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src()
	for _, v := range []struct {
		component string
		bytes     int64
	}{
		{"arena_slabs", s.ArenaSlabBytes},
		{"arena_live", s.ArenaLiveBytes},
		{"tables", s.TableBytes},
		{"queues", s.QueueBytes},
		{"overhead", s.OverheadBytes},
		{"budgeted", s.IndexBytes},
		{"total", s.TotalBytes},
	} {
		ch <- prometheus.MustNewConstMetric(c.memory, prometheus.GaugeValue, float64(v.bytes), v.component)
	}
	ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(s.Entries))
}
