package engine

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/policy"
)

// syncMetrics records metric calls from concurrent writers.
type syncMetrics struct {
	mu        sync.Mutex
	evictions map[[2]string]int
	tenantEv  map[string]int
	entries   map[string]int64
	// hold, when set, parks the first SetIndexEntries call: it signals
	// entered and waits for release.
	hold             bool
	entered, release chan struct{}
}

func newSyncMetrics() *syncMetrics {
	return &syncMetrics{evictions: map[[2]string]int{}, tenantEv: map[string]int{}, entries: map[string]int64{}}
}

func (m *syncMetrics) AddIndexEvictions(a, r string, n int) {
	m.mu.Lock()
	m.evictions[[2]string{a, r}] += n
	m.mu.Unlock()
}

func (m *syncMetrics) AddTenantEvictions(t string, n int) {
	m.mu.Lock()
	m.tenantEv[t] += n
	m.mu.Unlock()
}

func (m *syncMetrics) SetIndexEntries(model string, n int64) {
	m.mu.Lock()
	if m.hold {
		m.hold = false
		m.mu.Unlock()
		close(m.entered)
		<-m.release
		m.mu.Lock()
	}
	m.entries[model] = n
	m.mu.Unlock()
}

// TestMetricsUnderConcurrentWriters pins issue 12 item 2: two quota tenants
// ingesting at once must each report exactly their own tenant evictions
// (the pending tally must never be shared with the next writer while it is
// being reported), and the last index_entries value reported for a model
// must be its final count (reports of one model must not overtake each
// other). Run it with -race.
func TestMetricsUnderConcurrentWriters(t *testing.T) {
	const keys = 20_000
	store := policy.NewStore()
	store.Apply(&policy.Body{Version: 7, Tenants: []policy.ResolvedTenant{
		{TenantID: "q0", MaxIndexEntries: 1}, {TenantID: "q1", MaxIndexEntries: 1},
	}})
	m := newSyncMetrics()
	e := New(Config{Policies: store, Metrics: m})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := fmt.Sprint("q", w)
			for i := range keys {
				h := binary.BigEndian.AppendUint64(nil, uint64(w)<<32|uint64(i)+1)
				// Both tenants share the model, so their index_entries
				// reports race for the same series.
				e.Ingest(&Update{TenantID: tenant, ModelID: "shared", HashScheme: "vllm", ReplicaID: "r", TimestampUs: tT + int64(i),
					Prefixes: []PrefixEntry{{PrefixHash: h, TokenCount: 16}}}, tT)
			}
		}()
	}
	wg.Wait()
	for _, tenant := range []string{"q0", "q1"} {
		if got := m.tenantEv[tenant]; got != keys-1 {
			t.Errorf("tenant_evictions_total{%s} = %d, want %d (all: %v)", tenant, got, keys-1, m.tenantEv)
		}
	}
	if _, n := e.Counts(); m.entries["shared"] != n || n != 2 {
		t.Errorf("index_entries{shared} reported %d, index holds %d (want 2)", m.entries["shared"], n)
	}
}

// TestIndexEntriesReportedInWriteOrder pins the second half of item 2: a
// writer whose index_entries report is delayed must not let a later
// writer's report of the same model land first, or the series ends at a
// stale count. The first report is parked until the second writer returns
// (or 200 ms pass, when the second writer is rightly waiting its turn).
func TestIndexEntriesReportedInWriteOrder(t *testing.T) {
	m := newSyncMetrics()
	m.hold, m.entered, m.release = true, make(chan struct{}), make(chan struct{})
	e := New(Config{Metrics: m})
	put := func(h uint64) {
		e.Ingest(&Update{TenantID: "t", ModelID: "m", HashScheme: "vllm", ReplicaID: "r", TimestampUs: tT,
			Prefixes: []PrefixEntry{{PrefixHash: h8(h), TokenCount: 16}}}, tT)
	}
	first, second := make(chan struct{}), make(chan struct{})
	go func() { defer close(first); put(1) }() // reports 1, parked
	<-m.entered
	go func() { defer close(second); put(2) }() // reports 2
	select {
	case <-second:
	case <-time.After(200 * time.Millisecond):
	}
	close(m.release)
	<-first
	<-second
	if _, n := e.Counts(); m.entries["m"] != n || n != 2 {
		t.Fatalf("index_entries{m} ends at %d, index holds %d", m.entries["m"], n)
	}
}
