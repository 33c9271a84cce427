package engine

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/policy"
)

// recMetrics records metric calls for comparison with the reference.
type recMetrics struct {
	evictions map[[2]string]int
	tenantEv  map[string]int
	entries   map[string]int64
}

func newRecMetrics() *recMetrics {
	return &recMetrics{evictions: map[[2]string]int{}, tenantEv: map[string]int{}, entries: map[string]int64{}}
}

func (m *recMetrics) AddIndexEvictions(a, r string, n int) { m.evictions[[2]string{a, r}] += n }
func (m *recMetrics) AddTenantEvictions(t string, n int)   { m.tenantEv[t] += n }
func (m *recMetrics) SetIndexEntries(model string, n int64) {
	m.entries[model] = n
}

// universe is the small key space the random operations draw from, so that
// operations collide often.
type universe struct {
	r        *rand.Rand
	tenants  []string
	models   []string
	schemes  []string
	adapters []string
	replicas []string
	chains   [][][]byte // prompt chains sharing prefixes
	odd      [][]byte   // hashes of other lengths
}

func newUniverse(seed uint64) *universe {
	u := &universe{
		r:        rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		tenants:  []string{"team-a", "team-b", policy.ReservedTenantID, ""},
		models:   []string{"llama", "qwen"},
		schemes:  []string{"vllm", "sglang"},
		adapters: []string{"", "lora-1"},
		replicas: []string{"r0", "r1", "r2", "r3", "r4", "r5"},
	}
	// Chains: 3 roots, branching, up to 8 blocks.
	next := uint64(1)
	newHash := func() []byte {
		next++
		return binary.BigEndian.AppendUint64(nil, next*0x9E3779B97F4A7C15)
	}
	for root := 0; root < 3; root++ {
		base := [][]byte{newHash()}
		for branch := 0; branch < 4; branch++ {
			c := slices.Clone(base)
			n := 1 + u.r.IntN(8)
			for len(c) < n {
				c = append(c, newHash())
			}
			u.chains = append(u.chains, c)
			if len(c) > 2 {
				base = c[:2]
			}
		}
	}
	u.odd = [][]byte{{1, 2, 3}, make([]byte, 32), {9}}
	u.odd[1][0] = 7
	return u
}

func pick[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

func (u *universe) update(now int64) *Update {
	r := u.r
	up := &Update{
		ReplicaID:  pick(r, u.replicas),
		ModelID:    pick(r, u.models),
		TenantID:   pick(r, u.tenants[:3]),
		HashScheme: pick(r, u.schemes),
		AdapterID:  pick(r, u.adapters),
	}
	switch r.IntN(10) {
	case 0:
		up.HashScheme = ""
	case 1:
		up.ReplicaID = ""
	}
	switch r.IntN(3) {
	case 1:
		// Coarse explicit timestamps, so that entries of different updates
		// and replicas tie on lastSeen and the tie-breaks matter.
		up.TimestampUs = now - now%60_000_000 - int64(r.IntN(4))*60_000_000
	case 2:
		up.TimestampUs = now - int64(r.IntN(600))*1_000_000 + int64(r.IntN(3))
	}
	for n := r.IntN(3); n > 0; n-- {
		var p PrefixEntry
		if r.IntN(4) > 0 {
			c := pick(r, u.chains)
			c = c[:1+r.IntN(len(c))]
			p.BlockHashes = c
			for range c {
				p.BlockTokenCounts = append(p.BlockTokenCounts, int32(16))
			}
			switch r.IntN(12) {
			case 0:
				p.BlockTokenCounts = p.BlockTokenCounts[1:] // unbalanced
			case 1:
				p.BlockHashes = append(slices.Clone(p.BlockHashes), nil) // bad hash
				p.BlockTokenCounts = append(p.BlockTokenCounts, 16)
			}
			if r.IntN(5) == 0 {
				p.PrefixHash = pick(r, u.odd)
				p.TokenCount = int32(r.IntN(100))
			}
		} else {
			if r.IntN(2) == 0 {
				p.PrefixHash = pick(r, u.odd)
			} else {
				p.PrefixHash = pick(r, pick(r, u.chains))
			}
			p.TokenCount = int32(r.IntN(200)) - 10
		}
		p.Tier = pick(r, []int32{0, 0, 1, 2, 3, 7, -1})
		if r.IntN(4) == 0 {
			p.AdapterID = pick(r, u.adapters)
		}
		up.Prefixes = append(up.Prefixes, p)
	}
	if r.IntN(3) == 0 {
		up.Stats = &ReplicaStats{
			HitRate:  pick(r, []float32{0, 0.05, 0.3, 0.9, float32(math.NaN())}),
			Pressure: pick(r, []float32{0, 0.5, 1, float32(math.Inf(1))}),
		}
	}
	return up
}

func (u *universe) event() *Event {
	r := u.r
	ev := &Event{
		Type:      EventType(1 + r.IntN(4)),
		ReplicaID: pick(r, u.replicas),
		ModelID:   pick(r, u.models),
		TenantID:  pick(r, u.tenants[:3]),
	}
	if ev.Type == EventPrefixEvicted {
		ev.PrefixHash = pick(r, pick(r, u.chains))
		if r.IntN(2) == 0 {
			ev.AdapterID = pick(r, u.adapters)
		}
	}
	return ev
}

func (u *universe) lookup() *LookupRequest {
	r := u.r
	req := &LookupRequest{
		TenantID:   pick(r, u.tenants),
		ModelID:    pick(r, u.models),
		HashScheme: pick(r, u.schemes),
		AdapterID:  pick(r, u.adapters),
		SLOTTFTMs:  pick(r, []int32{0, 100, 200, 500}),
	}
	if r.IntN(3) > 0 {
		c := pick(r, u.chains)
		req.BlockHashes = c[:1+r.IntN(len(c))]
		for i := range req.BlockHashes {
			req.BlockTokenCounts = append(req.BlockTokenCounts, int32(8+8*(i%3)))
		}
		if r.IntN(15) == 0 {
			req.BlockTokenCounts = req.BlockTokenCounts[1:]
		}
	} else if r.IntN(5) > 0 {
		req.PrefixHash = pick(r, pick(r, u.chains))
	} else {
		req.PrefixHash = pick(r, u.odd)
	}
	return req
}

// quotaPolicy builds a random policy snapshot over the universe.
func (u *universe) policyBody() *policy.Body {
	r := u.r
	b := &policy.Body{Version: policy.PropagationVersion}
	for _, t := range u.tenants[:2] {
		if r.IntN(2) == 0 {
			continue
		}
		p := policy.ResolvedPolicy{Namespace: t, Eviction: pick(r, []string{"lru", "lfu"})}
		if r.IntN(2) == 0 {
			p.EvictionTTL = time.Duration(60+r.IntN(1200)) * time.Second
		}
		b.Policies = append(b.Policies, p)
		if r.IntN(2) == 0 {
			b.Tenants = append(b.Tenants, policy.ResolvedTenant{TenantID: t, MaxIndexEntries: int64(r.IntN(12))})
		}
	}
	return b
}

func TestDifferentialAgainstReference(t *testing.T) {
	seeds := 40
	ops := 3000
	switch {
	case testing.Short():
		seeds, ops = 8, 1500
	case raceEnabled:
		// One goroutine: the race detector needs the paths, not 40 walks
		// of them. `make test` runs all 40 without it (RACE_SKIPPED_RUN).
		seeds = 10
	}
	for seed := 1; seed <= seeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { runDifferential(t, uint64(seed), ops) })
	}
}

func runDifferential(t *testing.T, seed uint64, ops int) {
	u := newUniverse(seed)
	store := policy.NewStore()
	maxEntries := int64(0)
	if seed%2 == 0 {
		maxEntries = int64(20 + u.r.IntN(40))
	}
	metrics := newRecMetrics()
	e := New(Config{MaxEntries: maxEntries, Policies: store, Metrics: metrics})
	ref := newRef(store, maxEntries)
	now := int64(1_700_000_000_000_000)
	var res LookupResult
	seen := map[Strategy]int{}
	// The change stream, replayed into its own model, must describe the
	// index exactly (TestChangesDescribeIndex's randomized form).
	sub := e.SubscribeChanges(ChangeFilter{}, MaxChangeBuffer)
	defer sub.Close()
	replay := newChangeReplay()
	defer func() {
		// The random walk must exercise every outcome, or it proves little.
		if t.Failed() {
			return
		}
		for _, s := range []Strategy{StrategyNone, StrategyPrefixMatch, StrategyTenantHot, StrategyUnknownTenant, StrategyUnknownModel, StrategyUnknownHashScheme} {
			if seen[s] == 0 && ops >= 1500 {
				t.Errorf("seed %d never produced %v (%v)", seed, s, seen)
			}
		}
	}()
	for op := 0; op < ops; op++ {
		now += int64(u.r.IntN(20_000_000))
		switch k := u.r.IntN(100); {
		case k < 45:
			up := u.update(now)
			e.Ingest(up, now)
			ref.Ingest(up, now)
		case k < 55:
			ev := u.event()
			e.ApplyEvent(ev, now)
			ref.ApplyEvent(ev, now)
		case k < 90:
			req := u.lookup()
			e.LookupRoute(req, now, &res)
			want := ref.LookupRoute(req, now)
			compareLookup(t, op, req, &res, want)
			seen[res.Strategy]++
			// Deliver a filtered response: keep replicas at or above a random
			// matched-tokens floor, as the handler's floor would.
			floor := int32(u.r.IntN(40))
			kept := res.Scores[:0]
			var refKept []refScore
			for i, s := range res.Scores {
				if s.MatchedTokens >= floor {
					kept = append(kept, s)
					refKept = append(refKept, want.scores[i])
				}
			}
			res.Scores = kept
			if u.r.IntN(4) > 0 {
				e.Credit(&res)
				ref.Credit(req, want, refKept)
			}
			if u.r.IntN(5) == 0 {
				seedBytes := pick(u.r, pick(u.r, u.chains))
				g1, ok1 := e.AffinityHint(req.TenantID, req.ModelID, req.HashScheme, seedBytes)
				g2, ok2 := ref.AffinityHint(req.TenantID, req.ModelID, req.HashScheme, seedBytes)
				if g1 != g2 || ok1 != ok2 {
					t.Fatalf("op %d: affinity %q,%v want %q,%v", op, g1, ok1, g2, ok2)
				}
			}
		case k < 94:
			e.Sweep(now)
			ref.Sweep(now)
			compareReclaimed(t, op, e, ref)
		default:
			store.Apply(u.policyBody())
		}
		replay.drain(t, op, sub)
		if op%5 == 0 || op == ops-1 {
			compareState(t, op, e, ref)
			replay.compare(t, op, ref)
		}
	}
	compareState(t, ops, e, ref)
	for k, n := range ref.evictions {
		if metrics.evictions[k] != n {
			t.Fatalf("evictions %v: engine %d, reference %d (all: %v vs %v)", k, metrics.evictions[k], n, metrics.evictions, ref.evictions)
		}
	}
	for k, n := range metrics.evictions {
		if ref.evictions[k] != n {
			t.Fatalf("evictions %v: engine %d, reference %d", k, n, ref.evictions[k])
		}
	}
	for k, n := range ref.tenantEv {
		if metrics.tenantEv[k] != n {
			t.Fatalf("tenant evictions %q: engine %d, reference %d", k, metrics.tenantEv[k], n)
		}
	}
	checkInvariants(t, e)
	t.Logf("seed %d: outcomes %v, evictions %v, tenant evictions %v, final entries %d", seed, seen, metrics.evictions, metrics.tenantEv, len(ref.dump()))
}

func compareLookup(t *testing.T, op int, req *LookupRequest, got *LookupResult, want refResult) {
	t.Helper()
	if got.Strategy != want.strategy || len(got.Scores) != len(want.scores) {
		t.Fatalf("op %d: req %+v: got %v %d scores %+v, want %v %d %+v", op, req, got.Strategy, len(got.Scores), got.Scores, want.strategy, len(want.scores), want.scores)
	}
	for i, s := range got.Scores {
		w := want.scores[i]
		if s.ReplicaID != w.replica || s.MatchedTokens != w.matched || s.Tier != w.tier ||
			!approxEqual(float64(s.Score), w.score) || !approxEqual(float64(s.Prob), w.prob) {
			t.Fatalf("op %d: score %d: got %+v, want %+v (all got %+v want %+v)", op, i, s, w, got.Scores, want.scores)
		}
	}
}

func approxEqual(a, b float64) bool {
	return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b))
}

func compareState(t *testing.T, op int, e *Engine, ref *refModel) {
	t.Helper()
	got, want := e.dump(), ref.dump()
	if len(got) != len(want) {
		t.Fatalf("op %d: engine holds %d entries, reference %d\nengine: %v\nref:    %v", op, len(got), len(want), got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("op %d: entry %d: engine %+v, reference %+v", op, i, got[i], want[i])
		}
	}
}

// compareReclaimed checks, right after a sweep, that the engine keeps a
// domain exactly for each (tenant, model) the reference holds a key or
// stats for, a scope exactly for each (tenant, model, scheme, adapter) it
// holds a key for, and tenant states and model counters for exactly the
// tenants and models of those domains: the sweep reclaimed everything else.
func compareReclaimed(t *testing.T, op int, e *Engine, ref *refModel) {
	t.Helper()
	want := ref.liveStructures()
	got := map[string]bool{}
	e.domains.Range(func(k domainKey, _ *domain) bool {
		got["domain "+k.tenant+"/"+k.model] = true
		return true
	})
	e.tenants.Range(func(id string, _ *tenantState) bool {
		got["tenant "+id] = true
		return true
	})
	e.mu.Lock()
	for m := range e.modelKeys {
		got["model "+m] = true
	}
	for _, sc := range e.scopes {
		if sc != nil {
			got["scope "+sc.d.tenant+"/"+sc.d.model+"/"+sc.sch.name+"/"+sc.adapter] = true
		}
	}
	e.mu.Unlock()
	if !maps.Equal(got, want) {
		t.Fatalf("op %d: after a sweep the engine keeps %v, want %v", op, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	checkStructure(t, e)
}
