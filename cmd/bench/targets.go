package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inferencecache/inferencecache/bench"
	"github.com/inferencecache/inferencecache/bench/workload"
)

// runTargets is `bench targets`: the routing targets of bench/results
// (the default row against the best baseline of each column, on the trace
// at 1×, 1.5× and 2× and on the synthetic workloads, at 1,000 and 4,000
// blocks) over several seeds, so a change to routing is judged on more
// than one draw of the simulator: on one seed a knob moves cells by
// amounts a perturbation alone explains (docs/routing.md).
func runTargets(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("bench targets", flag.ContinueOnError)
	var (
		trace     = fs.String("trace", "", "Mooncake-format JSONL trace (empty: synthetic workloads only)")
		blockSize = fs.Int("trace-block-size", workload.MooncakeBlockSize, "tokens per hash id in the trace")
		speedups  = fs.String("speedups", "1,1.5,2", "trace arrival speedups (comma-separated)")
		synth     = fs.String("workloads", "chat,rag,shared-prompt", "synthetic workloads (comma-separated; empty: none)")
		seeds     = fs.String("seeds", "1-4", "seeds: a range a-b or a comma-separated list")
		row       = fs.String("row", bench.EnginePolicyName, "the row judged against the baselines")
		verbose   = fs.Bool("v", false, "print every workload's cells, per seed")
		parallel  = fs.Int("parallel", 0, "simulations at once (0 = GOMAXPROCS); results do not depend on it")
		limit     = fs.Int("limit", 0, "use at most this many requests of each workload (0 = all)")
		jitter    = fs.Duration("trace-jitter", 10*time.Millisecond, "seeds other than 1 move each trace arrival by a uniform draw in ±this (seed 1 replays the trace as recorded; 0: every seed does)")
	)
	load := addLoadFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *jitter < 0 {
		return fmt.Errorf("-trace-jitter %v is negative", *jitter)
	}
	seedList, err := parseSeeds(*seeds)
	if err != nil {
		return err
	}
	type stream struct {
		name string
		reqs func(seed uint64) ([]workload.Request, error)
	}
	var streams []stream
	if *trace != "" {
		base, err := workload.LoadTrace(*trace, *blockSize, *limit)
		if err != nil {
			return err
		}
		for _, f := range splitList(*speedups) {
			sp, err := strconv.ParseFloat(f, 64)
			if err != nil || !(sp > 0) {
				return fmt.Errorf("bad -speedups entry %q", f)
			}
			name := "conversation"
			if sp != 1 {
				name += "-x" + f
			}
			streams = append(streams, stream{name, func(seed uint64) ([]workload.Request, error) {
				reqs := slices.Clone(base)
				if seed != 1 {
					bench.Jitter(reqs, *jitter, seed)
				}
				bench.SpeedUp(reqs, sp)
				return reqs, nil
			}})
		}
	}
	for _, w := range splitList(*synth) {
		streams = append(streams, stream{w, func(seed uint64) ([]workload.Request, error) {
			_, reqs, err := bench.Synthetic(w, seed)
			if *limit > 0 && len(reqs) > *limit {
				reqs = reqs[:*limit]
			}
			return reqs, err
		}})
	}
	if len(streams) == 0 {
		return fmt.Errorf("nothing to run: give -trace or -workloads")
	}
	policies := bench.DefaultPoliciesWith(*load)
	var runs []bench.TargetRun
	for _, seed := range seedList {
		for _, st := range streams {
			reqs, err := st.reqs(seed)
			if err != nil {
				return fmt.Errorf("%s: %w", st.name, err)
			}
			cfg := bench.DefaultConfig(st.name, reqs)
			cfg.Seed, cfg.Policies, cfg.Parallelism = seed, policies, *parallel
			rep, err := bench.Run(cfg)
			if err != nil {
				return fmt.Errorf("%s seed %d: %w", st.name, seed, err)
			}
			tr := bench.TargetRun{Name: st.name, Seed: seed}
			for i := range rep.Sizes {
				c, ok := rep.Sizes[i].Targets(*row)
				if !ok {
					return fmt.Errorf("%s: no row %q or no baseline", st.name, *row)
				}
				tr.Cells = append(tr.Cells, c)
				if *verbose {
					fmt.Fprintf(stdout, "seed %d %-24s %5d blocks  %.2f %% of the bound (best %.2f) %s  p50 %.3fx %s  p99 %.3fx %s\n",
						seed, st.name, c.CacheBlocks, 100*c.Bound, 100*c.BestBound, mark(c.Met[0]),
						c.P50, mark(c.Met[1]), c.P99, mark(c.Met[2]))
				}
			}
			runs = append(runs, tr)
		}
	}
	sum := bench.Summarize(runs)
	return sum.WriteText(stdout)
}

func mark(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseSeeds reads "a-b" (inclusive, at most 1,000 seeds) or "a,b,c".
func parseSeeds(s string) ([]uint64, error) {
	if a, b, ok := strings.Cut(s, "-"); ok {
		lo, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 64)
		hi, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 64)
		if err1 != nil || err2 != nil || hi < lo || hi-lo >= 1000 {
			return nil, fmt.Errorf("bad -seeds range %q (a-b, a <= b, at most 1,000 seeds)", s)
		}
		var out []uint64
		for v := lo; v <= hi; v++ {
			out = append(out, v)
		}
		return out, nil
	}
	var out []uint64
	for _, f := range splitList(s) {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad -seeds entry %q", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-seeds is empty")
	}
	return out, nil
}
