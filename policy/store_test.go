package policy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// markedBody returns a body in which every tenant carries the marker m in
// three knobs (and a quota), so a reader can tell whether all the tenants it
// sees through one Load come from the same push.
func markedBody(ids []string, m int32) *Body {
	b := &Body{Version: PropagationVersion}
	for _, id := range ids {
		b.Policies = append(b.Policies, ResolvedPolicy{
			Namespace:           id,
			MinimumPrefixTokens: m,
			LookupTimeoutMs:     m,
			EvictionTTL:         time.Duration(m) * time.Second,
		})
		b.Tenants = append(b.Tenants, ResolvedTenant{TenantID: id, MaxIndexEntries: int64(m)})
	}
	return b
}

func tenantIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("team-%02d", i)
	}
	return ids
}

// TestConcurrentApplyAndLookup runs readers against a writer that Applies
// snapshots back to back for a bounded time. Every Load must yield one
// consistent push: all tenants carry the same marker, the marker equals the
// generation (the writer's i-th Apply is generation i and carries marker i),
// and generations never go backwards for a reader. Run it with -race.
func TestConcurrentApplyAndLookup(t *testing.T) {
	const readers = 4
	ids := tenantIDs(16)
	s := NewStore()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()

	var wg sync.WaitGroup
	var applied atomic.Int64 // number of Applies done; written by the writer only
	wg.Go(func() {
		for m := int32(1); ctx.Err() == nil; m++ {
			snap := s.Apply(markedBody(ids, m))
			if snap.Generation() != uint64(m) {
				t.Errorf("Apply %d got generation %d", m, snap.Generation())
				cancel()
				return
			}
			applied.Add(1)
		}
	})

	var loads, distinct atomic.Int64 // totals over all readers, for the log
	for r := range readers {
		wg.Go(func() {
			var last uint64
			seen := int64(0)
			for i := 0; ctx.Err() == nil; i++ {
				snap := s.Load()
				gen := snap.Generation()
				if gen < last {
					t.Errorf("reader %d: generation went back from %d to %d", r, last, gen)
					cancel()
					return
				}
				if gen != last {
					seen++
				}
				last = gen
				want := int32(gen) // gen 0 is the empty snapshot: marker 0
				for _, id := range ids {
					tn := snap.Tenant(id)
					if tn.MinimumPrefixTokens != want || tn.LookupTimeout != time.Duration(want)*time.Millisecond ||
						tn.MaxIndexEntries != int64(want) || tn.HasPolicy != (gen > 0) || tn.HasQuota != (gen > 0) {
						t.Errorf("reader %d: generation %d, tenant %s = %+v: mixed snapshot", r, gen, id, *tn)
						cancel()
						return
					}
					if gen > 0 && tn.TTL != time.Duration(want)*time.Second {
						t.Errorf("reader %d: generation %d, tenant %s TTL %v", r, gen, id, tn.TTL)
						cancel()
						return
					}
				}
				loads.Add(1)
			}
			distinct.Add(seen)
		})
	}
	wg.Wait()
	t.Logf("%d applies, %d consistent loads, %d generation changes observed by %d readers",
		applied.Load(), loads.Load(), distinct.Load(), readers)
	if applied.Load() < 2 {
		t.Fatalf("writer applied only %d snapshots", applied.Load())
	}
	if distinct.Load() < 2 {
		t.Fatalf("readers observed only %d generation changes; the test did not exercise swaps", distinct.Load())
	}
}

// TestTenantLookupAllocs: the read path allocates nothing, for a resolved
// tenant and for a default one.
func TestTenantLookupAllocs(t *testing.T) {
	s := NewStore()
	s.Apply(markedBody(tenantIDs(8), 3))
	var sink int32
	for _, id := range []string{"team-03", "unknown"} {
		if n := testing.AllocsPerRun(1000, func() { sink += s.Load().Tenant(id).MinimumPrefixTokens }); n != 0 {
			t.Errorf("Load+Tenant(%q) allocates %v", id, n)
		}
	}
	_ = sink
}

// BenchmarkTenantLookupDuringSwaps measures Load+Tenant, the per-lookup cost
// of policy resolution, with and without a goroutine publishing snapshots as
// fast as it can (a worst case: the controller pushes every 30 s). The
// swapper alternates two already-published snapshots with the Store's atomic
// pointer directly, so it allocates nothing itself and allocs/op counts only
// the reader.
func BenchmarkTenantLookupDuringSwaps(b *testing.B) {
	ids := tenantIDs(64)
	ids = append(ids, "no-policy") // one miss: resolves to the defaults
	for _, swapping := range []bool{false, true} {
		name := "idle"
		if swapping {
			name = "swapping"
		}
		b.Run(name, func(b *testing.B) {
			s := NewStore()
			one := s.Apply(markedBody(ids[:64], 1))
			two := Build(markedBody(ids[:64], 2))
			two.published.Store(true)

			var stop atomic.Bool   // set by the benchmark to end the swapper
			var swaps atomic.Int64 // swaps done; stored by the swapper when it stops
			var wg sync.WaitGroup
			if swapping {
				wg.Go(func() {
					n := int64(0)
					for !stop.Load() {
						s.cur.Store(two)
						s.cur.Store(one)
						n += 2
					}
					swaps.Store(n)
				})
			}
			b.ReportAllocs()
			var sink int32
			i := 0
			for b.Loop() {
				sink += s.Load().Tenant(ids[i%len(ids)]).MinimumPrefixTokens
				i++
			}
			stop.Store(true)
			wg.Wait()
			if swapping {
				b.ReportMetric(float64(swaps.Load())/float64(b.N), "swaps/op")
			}
			_ = sink
		})
	}
}
