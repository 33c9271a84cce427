// Package bench is an in-process, deterministic cluster simulator that
// measures routing quality: how much prefill a KV-cache-aware router saves
// compared with cache-blind baselines and with a pooled-cache bound.
//
// A run replays one request stream (package workload) once per routing
// policy and cache size. Each replica has a bounded LRU KV cache (LRU),
// a FIFO queue and a linear cost model (CostModel); every cache change
// becomes a KV event (Event) that reaches the router after a configurable
// lag, so a router sees what a real KV-event subscriber would. Policies
// implement Router; DefaultPolicies lists the built-in baselines. Run
// collects per-policy metrics (Result) into a Report, which renders as
// Markdown (WriteMarkdown) and as an SVG plot (WriteSVG).
//
// Everything here is deterministic for a seed: the same Config gives the
// same Report, byte for byte, whatever the parallelism.
//
// Layout, following pebble's bench/: this package is the library; the
// thin cmd/bench binds flags to Config and calls Run.
package bench

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
)

// Config configures Run.
type Config struct {
	// Workload names the request stream in reports.
	Workload string
	// Requests is the stream, sorted by arrival. Run does not modify it.
	Requests []workload.Request
	// Replicas is the cluster size, 1..MaxReplicas.
	Replicas int
	// CacheBlocks lists per-replica cache sizes to sweep, each > 0.
	CacheBlocks []int
	// Lag delays every KV event on its way to the router.
	Lag time.Duration
	// Seed seeds every random choice (routers that draw numbers).
	Seed uint64
	// Slots is the number of requests each replica serves at once.
	Slots int
	// Cost is the replica cost model.
	Cost CostModel
	// Window is the load-imbalance window.
	Window time.Duration
	// Clears lists cache clears to inject (AllCleared events).
	Clears []Clear
	// Model is the replica model (SimModel); DefaultConfig sets
	// EngineSimModel, the zero value is LegacySimModel.
	Model SimModel
	// Policies to compare; nil means DefaultPolicies().
	Policies []Policy
	// Parallelism bounds the simulations run at once; 0 means GOMAXPROCS.
	// It does not affect results.
	Parallelism int
}

// DefaultConfig returns a configuration for reqs with 8 replicas, cache
// sizes of 1,000 and 4,000 blocks per replica, 50 ms event lag, 32 slots,
// the default cost model, 60 s windows, seed 1 and EngineSimModel.
func DefaultConfig(name string, reqs []workload.Request) Config {
	return Config{
		Workload: name, Requests: reqs, Replicas: 8, CacheBlocks: []int{1000, 4000},
		Lag: 50 * time.Millisecond, Seed: 1, Slots: 32, Cost: DefaultCostModel(),
		Window: time.Minute, Model: EngineSimModel(),
	}
}

// Report is the outcome of Run.
type Report struct {
	Workload    string
	Requests    int
	Replicas    int
	Lag         time.Duration
	Seed        uint64
	Slots       int
	Cost        CostModel
	Window      time.Duration
	Model       SimModel
	BlockSize   int // of the first request; 0 when there are none
	MeanArrival float64
	// Infinite is the pooled bound with unbounded capacity.
	Infinite Hits
	// Sizes holds one entry per cache size, in Config order.
	Sizes []SizeReport
}

// SizeReport holds the results for one per-replica cache size.
type SizeReport struct {
	CacheBlocks int  // per replica
	Pooled      Hits // one LRU of Replicas × CacheBlocks blocks
	Results     []Result
}

// FractionOfPooled returns r's block hit ratio as a fraction of the pooled
// bound's (0 when the bound is 0).
func (s *SizeReport) FractionOfPooled(r *Result) float64 {
	if s.Pooled.HitBlocks == 0 {
		return 0
	}
	return r.BlockHitRatio() / s.Pooled.BlockHitRatio()
}

// Run simulates every policy at every cache size over cfg.Requests and
// returns the report. Simulations run concurrently, at most
// cfg.Parallelism at a time, each with its own Router; the report does not
// depend on scheduling.
func Run(cfg Config) (*Report, error) {
	policies := cfg.Policies
	if policies == nil {
		policies = DefaultPolicies()
	}
	if len(cfg.CacheBlocks) == 0 {
		return nil, fmt.Errorf("%w: no cache sizes", ErrConfig)
	}
	seen := make(map[string]bool, len(policies))
	for _, p := range policies {
		if p.Name == "" || p.New == nil || seen[p.Name] {
			return nil, fmt.Errorf("%w: policy %q is unnamed, has no constructor or is listed twice", ErrConfig, p.Name)
		}
		seen[p.Name] = true
	}
	for _, c := range cfg.CacheBlocks {
		if c <= 0 {
			return nil, fmt.Errorf("%w: cache size %d is not positive", ErrConfig, c)
		}
	}
	base := SimConfig{Replicas: cfg.Replicas, Lag: cfg.Lag, Slots: cfg.Slots, Cost: cfg.Cost, Window: cfg.Window, Clears: cfg.Clears, Model: cfg.Model}
	if err := base.validate(); err != nil {
		return nil, err
	}
	if err := workload.ValidateStream(cfg.Requests); err != nil {
		return nil, fmt.Errorf("cannot run: %w", err)
	}

	rep := &Report{
		Workload: cfg.Workload, Requests: len(cfg.Requests), Replicas: cfg.Replicas, Lag: cfg.Lag,
		Seed: cfg.Seed, Slots: cfg.Slots, Cost: cfg.Cost, Window: cfg.Window, Model: cfg.Model,
		Infinite: PooledHitsModel(cfg.Requests, 0, cfg.Model),
	}
	if n := len(cfg.Requests); n > 0 {
		rep.BlockSize = cfg.Requests[0].BlockSize
		if span := cfg.Requests[n-1].Arrival - cfg.Requests[0].Arrival; span > 0 {
			rep.MeanArrival = float64(n-1) / span.Seconds()
		}
	}
	rep.Sizes = make([]SizeReport, len(cfg.CacheBlocks))
	for i, c := range cfg.CacheBlocks {
		rep.Sizes[i] = SizeReport{CacheBlocks: c, Results: make([]Result, len(policies))}
	}

	par := cfg.Parallelism
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	errs := make([]error, len(cfg.CacheBlocks)*(len(policies)+1))
	for si := range rep.Sizes {
		sr := &rep.Sizes[si]
		k := si * (len(policies) + 1)
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			sr.Pooled = PooledHitsModel(cfg.Requests, cfg.Replicas*sr.CacheBlocks, cfg.Model)
		})
		for pi, p := range policies {
			sc := base
			sc.CacheBlocks = sr.CacheBlocks
			out := &sr.Results[pi]
			errp := &errs[k+1+pi]
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				router := p.New(cfg.Replicas, cfg.Seed)
				res, err := Simulate(cfg.Requests, sc, router)
				if err != nil {
					*errp = fmt.Errorf("cannot simulate policy %s at %d blocks: %w", p.Name, sc.CacheBlocks, err)
					return
				}
				res.Policy = p.Name
				*out = res
			})
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return rep, nil
}

// WriteFiles writes the report as dir/name.md and dir/name.svg, creating
// dir if needed. The Markdown embeds the SVG by relative path.
func (r *Report) WriteFiles(dir, name string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cannot create results dir: %w", err)
	}
	write := func(path string, fn func(f *os.File) error) error {
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("cannot create %s: %w", path, err)
		}
		if err := fn(f); err != nil {
			f.Close()
			return fmt.Errorf("cannot write %s: %w", path, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("cannot close %s: %w", path, err)
		}
		return nil
	}
	svgName := name + ".svg"
	if err := write(filepath.Join(dir, svgName), func(f *os.File) error { return r.WriteSVG(f) }); err != nil {
		return err
	}
	return write(filepath.Join(dir, name+".md"), func(f *os.File) error { return r.WriteMarkdown(f, svgName) })
}

// Synthetic generates one of the synthetic request streams cmd/bench
// offers (chat, rag, shared-prompt) with its defaults and seed, and names
// it for reports.
func Synthetic(kind string, seed uint64) (name string, reqs []workload.Request, err error) {
	switch kind {
	case "chat":
		c := workload.DefaultChat()
		c.Seed = seed
		reqs, err = c.Generate()
		name = "synthetic multi-turn chat"
	case "rag":
		c := workload.DefaultRAG()
		c.Seed = seed
		reqs, err = c.Generate()
		name = "synthetic RAG"
	case "shared-prompt":
		c := workload.DefaultSharedPrompt()
		c.Seed = seed
		reqs, err = c.Generate()
		name = "synthetic single-turn behind a shared system prompt"
	default:
		return "", nil, fmt.Errorf("%w: unknown synthetic workload %q", ErrConfig, kind)
	}
	return name, reqs, err
}

// Jitter moves every arrival of reqs by a uniform draw in [−d, d] (never
// before 0), drawn from seed, then re-sorts them by arrival (stably) and
// renumbers their IDs, in place. One replay of a trace is one draw of a
// chaotic system: a few milliseconds of jitter keep the trace's load and
// reuse and give other draws of the same workload to judge a change on.
// d <= 0 leaves reqs as they are.
func Jitter(reqs []workload.Request, d time.Duration, seed uint64) {
	if d <= 0 {
		return
	}
	rng := rand.New(rand.NewPCG(seed, 0x6a6974746572))
	span := 2*int64(d) + 1
	for i := range reqs {
		reqs[i].Arrival = max(reqs[i].Arrival+time.Duration(rng.Int64N(span)-int64(d)), 0)
	}
	slices.SortStableFunc(reqs, func(a, b workload.Request) int { return cmp.Compare(a.Arrival, b.Arrival) })
	for i := range reqs {
		reqs[i].ID = i
	}
}

// SpeedUp divides every arrival time of reqs by f (> 1 compresses the
// stream: a heavier load of the same requests), in place.
func SpeedUp(reqs []workload.Request, f float64) {
	for i := range reqs {
		reqs[i].Arrival = time.Duration(float64(reqs[i].Arrival) / f)
	}
}
