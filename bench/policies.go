package bench

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/inferencecache/inferencecache/bench/workload"
	"github.com/inferencecache/inferencecache/engine"
)

// lessLoaded orders replicas by load: fewer pending prefill tokens, then
// fewer requests in flight, then the lower index. It is the tie-break of
// every policy here, so no policy silently prefers replica 0.
func lessLoaded(v *View, a, b int) bool {
	la, lb := v.Replicas[a], v.Replicas[b]
	if la.PendingPrefillTokens != lb.PendingPrefillTokens {
		return la.PendingPrefillTokens < lb.PendingPrefillTokens
	}
	if la.InFlight() != lb.InFlight() {
		return la.InFlight() < lb.InFlight()
	}
	return a < b
}

func leastLoaded(v *View) int {
	best := 0
	for r := 1; r < len(v.Replicas); r++ {
		if lessLoaded(v, r, best) {
			best = r
		}
	}
	return best
}

// DefaultPolicies returns the policies compared by Run, in report order:
// this project's LookupRoute (EnginePolicy), then with load-aware routing
// off (the contract's ranking), with engines that also export queued
// prefill tokens, and driven as the endpoint picker drives it (each
// request's start and end known), then the baselines random, round-robin,
// least-loaded, longest-prefix, Dynamo's cost function and SGLang's
// cache-aware policy (with its own approximate tree, then with the
// event-fed index), each with its documented defaults.
func DefaultPolicies() []Policy { return DefaultPoliciesWith(engine.DefaultLoadConfig()) }

// DefaultPoliciesWith is DefaultPolicies with this project's rows using
// load-aware routing knobs load (cmd/bench -load-*): the comparisons that
// show what each knob trades.
func DefaultPoliciesWith(load engine.LoadConfig) []Policy {
	return []Policy{
		EnginePolicyWith(EnginePolicyName, EngineOptions{Refresh: DefaultRefresh, Load: &load}),
		EnginePolicyWith(EnginePolicyName+"-contract", EngineOptions{Refresh: DefaultRefresh, ContractOnly: true}),
		EnginePolicyWith(EnginePolicyName+"-queued-tokens", EngineOptions{Refresh: DefaultRefresh, QueuedTokens: true, Load: &load}),
		EnginePolicyWith(PickerPolicyName, EngineOptions{Refresh: DefaultRefresh, Picker: true, Load: &load}),
		EnginePolicyWith(EnginePolicyName+"-no-follow", EngineOptions{Refresh: DefaultRefresh, NoFollow: true, Load: &load}),
		RandomPolicy(),
		RoundRobinPolicy(),
		LeastLoadedPolicy(),
		LongestPrefixPolicy(),
		DynamoCostPolicy(DefaultDynamoOverlapWeight),
		SGLangCacheAwarePolicy(DefaultSGLangConfig()),
		SGLangCacheAwarePolicy(sglangWithEvents()),
	}
}

// RandomPolicy picks a replica uniformly at random from a PCG source
// seeded with the run's seed.
func RandomPolicy() Policy {
	return Policy{Name: "random", New: func(n int, seed uint64) Router {
		return &randomRouter{rng: rand.New(rand.NewPCG(seed, 0x72616e646f6d))}
	}}
}

type randomRouter struct{ rng *rand.Rand }

func (*randomRouter) Name() string   { return "random" }
func (*randomRouter) Observe(*Event) {}
func (r *randomRouter) Route(_ *workload.Request, v *View) int {
	return r.rng.IntN(len(v.Replicas))
}

// RoundRobinPolicy cycles through the replicas in index order.
func RoundRobinPolicy() Policy {
	return Policy{Name: "round-robin", New: func(int, uint64) Router { return &roundRobinRouter{} }}
}

type roundRobinRouter struct{ next int }

func (*roundRobinRouter) Name() string   { return "round-robin" }
func (*roundRobinRouter) Observe(*Event) {}
func (r *roundRobinRouter) Route(_ *workload.Request, v *View) int {
	i := r.next % len(v.Replicas)
	r.next = i + 1
	return i
}

// LeastLoadedPolicy picks the replica with the fewest pending prefill
// tokens (ties: fewer requests in flight, then lower index). It ignores
// caches.
func LeastLoadedPolicy() Policy {
	return Policy{Name: "least-loaded", New: func(int, uint64) Router { return leastLoadedRouter{} }}
}

type leastLoadedRouter struct{}

func (leastLoadedRouter) Name() string                           { return "least-loaded" }
func (leastLoadedRouter) Observe(*Event)                         {}
func (leastLoadedRouter) Route(_ *workload.Request, v *View) int { return leastLoaded(v) }

// LongestPrefixPolicy greedily picks the replica with the longest cached
// leading run of the request's chain according to its event-fed
// PrefixIndex; ties (including "no replica has any of it") go to the less
// loaded replica.
func LongestPrefixPolicy() Policy {
	return Policy{Name: "longest-prefix", New: func(n int, _ uint64) Router {
		return &longestPrefixRouter{idx: NewPrefixIndex(n)}
	}}
}

type longestPrefixRouter struct {
	idx     *PrefixIndex
	overlap []int // scratch, one per replica
}

func (*longestPrefixRouter) Name() string       { return "longest-prefix" }
func (r *longestPrefixRouter) Observe(e *Event) { r.idx.Apply(e) }
func (r *longestPrefixRouter) Route(req *workload.Request, v *View) int {
	r.overlap = r.idx.Overlaps(req.Blocks, r.overlap)
	best := 0
	for i := 1; i < len(v.Replicas); i++ {
		if r.overlap[i] > r.overlap[best] || (r.overlap[i] == r.overlap[best] && lessLoaded(v, i, best)) {
			best = i
		}
	}
	return best
}

// DefaultDynamoOverlapWeight is the default of Dynamo's
// --router-kv-overlap-score-weight (DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT).
const DefaultDynamoOverlapWeight = 1.0

// DynamoCostPolicy follows the cost function NVIDIA Dynamo's KV router
// documents ("Routing Concepts"):
//
//	cost = overlap_score_weight × prefill_blocks + decode_blocks
//
// with prefill_blocks the prompt work that would have to be computed on the
// worker, in blocks (here: the replica's pending prefill tokens plus the
// request's tokens beyond its cached overlap, divided by the block size,
// as the current docs add active prefill load to the incoming request's),
// and decode_blocks the worker's active blocks plus the request's blocks.
// The lowest cost wins (router temperature 0, Dynamo's default); ties go
// to the less loaded replica. Overlap comes from the router's event-fed
// PrefixIndex, as Dynamo's comes from KV events. Dynamo deduplicates active
// blocks shared between sequences; this model does not.
func DynamoCostPolicy(overlapWeight float64) Policy {
	name := "dynamo-cost"
	if overlapWeight != DefaultDynamoOverlapWeight {
		name = fmt.Sprintf("dynamo-cost(w=%g)", overlapWeight)
	}
	return Policy{Name: name, New: func(n int, _ uint64) Router {
		return &dynamoRouter{name: name, weight: overlapWeight, idx: NewPrefixIndex(n)}
	}}
}

type dynamoRouter struct {
	name    string
	weight  float64
	idx     *PrefixIndex
	overlap []int
}

func (r *dynamoRouter) Name() string     { return r.name }
func (r *dynamoRouter) Observe(e *Event) { r.idx.Apply(e) }
func (r *dynamoRouter) Route(req *workload.Request, v *View) int {
	r.overlap = r.idx.Overlaps(req.Blocks, r.overlap)
	bs := float64(req.BlockSize)
	best, bestCost := -1, 0.0
	for i, l := range v.Replicas {
		uncached := req.InputTokens - req.PrefixTokens(r.overlap[i])
		prefill := float64(l.PendingPrefillTokens+uncached) / bs
		decode := float64(l.ActiveBlocks + len(req.Blocks))
		// The explicit conversion rounds the product, so no platform fuses
		// it with the addition and the choice is the same everywhere.
		cost := float64(r.weight*prefill) + decode
		if best < 0 || cost < bestCost || (cost == bestCost && lessLoaded(v, i, best)) {
			best, bestCost = i, cost
		}
	}
	return best
}

// SGLangConfig holds the knobs of SGLang's cache-aware router
// (sgl-router / SGLang Model Gateway, policy cache_aware).
type SGLangConfig struct {
	// CacheThreshold: route to the best-matching replica only when the
	// matched fraction of the prompt exceeds it (0..1).
	CacheThreshold float64
	// BalanceAbsThreshold and BalanceRelThreshold: the cluster is
	// imbalanced when max_load - min_load > abs AND max_load > min_load ×
	// rel, load being requests in flight; then the least-loaded replica
	// wins regardless of cache.
	BalanceAbsThreshold int
	BalanceRelThreshold float64
	// MaxTreeTokens bounds each replica's approximate tree (LRU, in
	// tokens; 0 = unbounded). SGLang's max_tree_size is 2^26 characters,
	// and its gateway estimates 4 characters per token, hence 2^24 tokens.
	MaxTreeTokens int
	// UseEvents replaces SGLang's approximate tree (the prompts the router
	// itself sent to each replica) by the event-fed PrefixIndex.
	UseEvents bool
}

// DefaultSGLangConfig returns the defaults the SGLang Model Gateway
// documents: cache_threshold 0.3, balance_abs_threshold 64,
// balance_rel_threshold 1.5, max_tree_size 2^26 characters. (The older
// sgl-router docs listed 0.5, 32 and 1.0001.)
func DefaultSGLangConfig() SGLangConfig {
	return SGLangConfig{CacheThreshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, MaxTreeTokens: 1 << 24}
}

// SGLangCacheAwarePolicy follows SGLang's documented cache-aware policy:
// if the load is imbalanced (see SGLangConfig) pick the replica with the
// fewest requests in flight; otherwise find the replica with the longest
// prefix match and pick it if match_tokens / prompt_tokens exceeds
// CacheThreshold, else pick the replica with the smallest tree (the most
// free cache). Ties go to the less loaded replica.
//
// Like SGLang, the router by default matches against an approximate tree
// per replica: the chains it routed there, inserted at routing time and
// trimmed LRU-first to MaxTreeTokens (SGLang trims periodically; this
// model trims on insert). It ignores KV events, so it neither lags nor
// learns of evictions. With UseEvents it matches against the event-fed
// PrefixIndex instead, and "smallest tree" means fewest blocks reported
// cached.
func SGLangCacheAwarePolicy(c SGLangConfig) Policy {
	name := "sglang-cache-aware"
	d := DefaultSGLangConfig()
	d.UseEvents = c.UseEvents
	if c != d {
		name = fmt.Sprintf("sglang-cache-aware(%g,%d,%g,%d)", c.CacheThreshold, c.BalanceAbsThreshold, c.BalanceRelThreshold, c.MaxTreeTokens)
	}
	if c.UseEvents {
		name += "+events"
	}
	return Policy{Name: name, New: func(n int, _ uint64) Router {
		r := &sglangRouter{name: name, cfg: c}
		if c.UseEvents {
			r.idx = NewPrefixIndex(n)
		} else {
			r.trees = make([]*LRU, n)
		}
		return r
	}}
}

type sglangRouter struct {
	name    string
	cfg     SGLangConfig
	idx     *PrefixIndex // UseEvents
	trees   []*LRU       // approximate trees, built on the first Route
	overlap []int
	scratch []int
	evicted []uint64
}

func (r *sglangRouter) Name() string { return r.name }
func (r *sglangRouter) Observe(e *Event) {
	if r.idx != nil {
		r.idx.Apply(e)
	}
}

func (r *sglangRouter) treeSize(i int) int {
	if r.idx != nil {
		return r.idx.Blocks(i)
	}
	return r.trees[i].Len()
}

func (r *sglangRouter) Route(req *workload.Request, v *View) int {
	if r.idx == nil && r.trees[0] == nil {
		capBlocks := 0
		if r.cfg.MaxTreeTokens > 0 {
			capBlocks = max(1, r.cfg.MaxTreeTokens/req.BlockSize)
		}
		for i := range r.trees {
			r.trees[i] = NewLRU(capBlocks)
		}
	}
	pick := r.choose(req, v)
	if r.trees != nil {
		r.scratch, r.evicted = r.trees[pick].Access(req.Blocks, r.scratch[:0], r.evicted[:0])
	}
	return pick
}

func (r *sglangRouter) choose(req *workload.Request, v *View) int {
	minR, maxLoad := 0, v.Replicas[0].InFlight()
	for i := 1; i < len(v.Replicas); i++ {
		l := v.Replicas[i].InFlight()
		if l < v.Replicas[minR].InFlight() {
			minR = i
		}
		maxLoad = max(maxLoad, l)
	}
	minLoad := v.Replicas[minR].InFlight()
	if maxLoad-minLoad > r.cfg.BalanceAbsThreshold && float64(maxLoad) > float64(minLoad)*r.cfg.BalanceRelThreshold {
		return minR
	}
	if r.idx != nil {
		r.overlap = r.idx.Overlaps(req.Blocks, r.overlap)
	} else {
		r.overlap = slices.Grow(r.overlap[:0], len(r.trees))[:len(r.trees)]
		for i, t := range r.trees {
			r.overlap[i] = t.LeadingRun(req.Blocks)
		}
	}
	best := 0
	for i := 1; i < len(v.Replicas); i++ {
		if r.overlap[i] > r.overlap[best] || (r.overlap[i] == r.overlap[best] && lessLoaded(v, i, best)) {
			best = i
		}
	}
	if float64(req.PrefixTokens(r.overlap[best])) > r.cfg.CacheThreshold*float64(req.InputTokens) {
		return best
	}
	smallest := 0
	for i := 1; i < len(v.Replicas); i++ {
		bi, bs := r.treeSize(i), r.treeSize(smallest)
		if bi < bs || (bi == bs && lessLoaded(v, i, smallest)) {
			smallest = i
		}
	}
	return smallest
}

func sglangWithEvents() SGLangConfig {
	c := DefaultSGLangConfig()
	c.UseEvents = true
	return c
}
