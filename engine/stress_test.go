package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/policy"
)

// TestConcurrentStress runs writers, readers, sweeps, credits and policy
// swaps concurrently for a bounded time (run it with -race), then checks
// that every maintained counter equals a recount, that the reserved tenant
// is never counted, and that no writer's entry was lost: each writer owns
// its replicas and keeps a model of exactly what they must hold.
func TestConcurrentStress(t *testing.T) {
	for _, capped := range []bool{false, true} {
		t.Run(fmt.Sprint("capped=", capped), func(t *testing.T) { runStress(t, capped) })
	}
}

func runStress(t *testing.T, capped bool) {
	dur := 1500 * time.Millisecond
	if testing.Short() {
		dur = 300 * time.Millisecond
	}
	store := policy.NewStore()
	cfg := Config{Policies: store}
	if capped {
		cfg.MaxEntries = 400
	}
	e := New(cfg)
	const writers, readers = 3, 3
	var stop atomic.Bool
	var wg sync.WaitGroup
	now := tT
	models := make([]map[string]bool, writers) // per writer: "replica|hash" it must hold
	chains := newUniverse(3).chains

	for w := 0; w < writers; w++ {
		models[w] = map[string]bool{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			replicas := []string{fmt.Sprintf("w%d-a", w), fmt.Sprintf("w%d-b", w)}
			for i := 0; !stop.Load(); i++ {
				rep := replicas[r.IntN(2)]
				c := chains[r.IntN(len(chains))]
				c = c[:1+r.IntN(len(c))]
				switch r.IntN(10) {
				case 0:
					e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: "team", ModelID: "m", ReplicaID: rep}, now)
					for k := range models[w] {
						if k[:len(rep)+1] == rep+"|" {
							delete(models[w], k)
						}
					}
				case 1:
					h := c[r.IntN(len(c))]
					e.ApplyEvent(&Event{Type: EventPrefixEvicted, TenantID: "team", ModelID: "m", ReplicaID: rep, PrefixHash: h}, now)
					delete(models[w], rep+"|"+string(h))
				default:
					e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: rep, TimestampUs: now + int64(i),
						Prefixes: []PrefixEntry{{BlockHashes: c, BlockTokenCounts: sixteens(len(c))}}}, now)
					for _, h := range c {
						models[w][rep+"|"+string(h)] = true
					}
				}
				// The probe tenant comes and goes.
				if i%7 == 0 {
					e.Ingest(&Update{TenantID: policy.ReservedTenantID, ModelID: "m", HashScheme: "vllm", ReplicaID: "__probe-" + rep, TimestampUs: now,
						Prefixes: []PrefixEntry{{BlockHashes: c, BlockTokenCounts: sixteens(len(c))}}}, now)
					e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: policy.ReservedTenantID, ModelID: "m", ReplicaID: "__probe-" + rep}, now)
				}
			}
		}()
	}
	var lookups, matches atomic.Int64
	for rd := 0; rd < readers; rd++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(rd), 2))
			var res LookupResult
			for !stop.Load() {
				c := chains[r.IntN(len(chains))]
				req := LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockHashes: c, BlockTokenCounts: sixteens(len(c))}
				if r.IntN(4) == 0 {
					req = LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "vllm", PrefixHash: c[0]}
				}
				e.LookupRoute(&req, now, &res)
				lookups.Add(1)
				if res.Strategy == StrategyPrefixMatch {
					matches.Add(1)
				}
				for i, s := range res.Scores {
					if s.ReplicaID == "" || (res.Strategy == StrategyPrefixMatch && s.MatchedTokens <= 0) {
						t.Errorf("bad score %+v", s)
						return
					}
					if i > 0 && (s.Score > res.Scores[i-1].Score || s.Score == res.Scores[i-1].Score && s.ReplicaID < res.Scores[i-1].ReplicaID) {
						t.Errorf("scores out of order: %+v", res.Scores)
						return
					}
				}
				e.Credit(&res)
				_, _ = e.AffinityHint("team", "m", "vllm", c[0])
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(9, 9))
		for !stop.Load() {
			e.Sweep(now)
			_ = e.Snapshot()
			algo := []string{"lru", "lfu"}[r.IntN(2)]
			store.Apply(&policy.Body{Version: 7, Policies: []policy.ResolvedPolicy{{Namespace: "team", Eviction: algo}}})
			time.Sleep(time.Millisecond)
		}
	}()
	time.Sleep(dur)
	stop.Store(true)
	wg.Wait()
	if t.Failed() {
		return
	}
	checkInvariants(t, e)
	if entries, _ := e.Counts(); e.reservedEntries.Load() != 0 || entries != int64(len(e.dump())) {
		t.Fatalf("reserved entries %d; counted %d of %d", e.reservedEntries.Load(), entries, len(e.dump()))
	}
	if !capped {
		var got, want []string
		for _, d := range e.dump() {
			got = append(got, d.replica+"|"+d.key.hash)
		}
		for _, m := range models {
			for k := range m {
				want = append(want, k)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("index holds %d entries, writers' models %d", len(got), len(want))
		}
	}
	t.Logf("%d lookups (%d matches)", lookups.Load(), matches.Load())
}
