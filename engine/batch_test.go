package engine

import (
	"maps"
	"testing"

	"github.com/inferencecache/inferencecache/policy"
)

// TestIngestBatchMatchesIngest: IngestBatch over random runs of updates and
// events (random lengths, the differential universe, a small entry cap so writes
// evict, default policies) leaves the index, every
// result and every metric exactly as the same updates applied one by one
// with Ingest and ApplyEvent, and the reference model agrees with both.
func TestIngestBatchMatchesIngest(t *testing.T) {
	seeds := uint64(6)
	if raceEnabled {
		seeds = 2 // one goroutine; all 6 run without -race (RACE_SKIPPED_RUN)
	}
	for seed := uint64(1); seed <= seeds; seed++ {
		u := newUniverse(seed)
		store := policy.NewStore()
		maxEntries := int64(20 + u.r.IntN(40))
		m1, m2 := newRecMetrics(), newRecMetrics()
		one := New(Config{MaxEntries: maxEntries, Policies: store, Metrics: m1})
		batched := New(Config{MaxEntries: maxEntries, Policies: store, Metrics: m2})
		ref := newRef(store, maxEntries)
		now := int64(1_700_000_000_000_000)
		var items []BatchItem
		for op := 0; op < 300; op++ {
			items = items[:0]
			for n := 1 + u.r.IntN(8); n > 0; n-- {
				now += int64(u.r.IntN(20_000_000))
				if u.r.IntN(4) == 0 {
					items = append(items, BatchItem{Event: u.event(), Now: now})
				} else {
					items = append(items, BatchItem{Update: u.update(now), Now: now})
				}
			}
			batched.IngestBatch(items)
			for i, it := range items {
				if it.Update == nil {
					one.ApplyEvent(it.Event, it.Now)
					ref.ApplyEvent(it.Event, it.Now)
					continue
				}
				want := one.Ingest(it.Update, it.Now)
				ref.Ingest(it.Update, it.Now)
				if it.Result != want {
					t.Fatalf("seed %d op %d item %d: batched result %+v, one by one %+v", seed, op, i, it.Result, want)
				}
			}
			compareState(t, op, batched, ref)
			if got, want := batched.dump(), one.dump(); len(got) != len(want) {
				t.Fatalf("seed %d op %d: batched holds %d entries, one by one %d", seed, op, len(got), len(want))
			}
		}
		if !maps.Equal(m1.evictions, m2.evictions) || !maps.Equal(m1.tenantEv, m2.tenantEv) || !maps.Equal(m1.entries, m2.entries) {
			t.Fatalf("seed %d: metrics differ: one by one %+v, batched %+v", seed, m1, m2)
		}
	}
}
