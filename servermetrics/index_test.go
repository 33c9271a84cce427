package servermetrics

import (
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"

	"github.com/inferencecache/inferencecache/engine"
)

func TestIndexCollector(t *testing.T) {
	m := New()
	m.RegisterIndex(func() engine.MemoryStats {
		return engine.MemoryStats{ArenaSlabBytes: 4 << 20, ArenaLiveBytes: 1000, TableBytes: 128, QueueBytes: 64, OverheadBytes: 32, IndexBytes: 1224, TotalBytes: 4<<20 + 224, Entries: 9}
	})
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "inferencecache_index_") {
			_, _ = expfmt.MetricFamilyToText(&text, f)
		}
	}
	for _, want := range []string{
		`inferencecache_index_memory_bytes{component="arena_live"} 1000`,
		`inferencecache_index_memory_bytes{component="budgeted"} 1224`,
		`inferencecache_index_memory_bytes{component="total"} 4.194528e+06`,
		`inferencecache_index_storage_entries 9`,
	} {
		if !strings.Contains(text.String(), want) {
			t.Fatalf("missing %q in\n%s", want, text.String())
		}
	}
}
