// Command bench runs the deterministic cluster simulator of package bench
// and writes a Markdown table and an SVG plot of routing quality.
//
//	go run ./cmd/bench -trace ../shared/traces/mooncake_conversation_trace.jsonl \
//	    -replicas 8 -cache-blocks 1000,4000 -out bench/results -name conversation
//
// With -workload chat, rag or shared-prompt it generates a synthetic
// stream instead (seeded by -seed). "bench pd" runs the prefill/decode
// mode instead (pd.go).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/inferencecache/inferencecache/bench"
	"github.com/inferencecache/inferencecache/bench/workload"
	"github.com/inferencecache/inferencecache/engine"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run parses args, runs the simulation, writes the result files and
// prints the Markdown table to stdout.
func run(args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "pd" {
		return runPD(args[1:], stdout) // the P/D mode (pd.go)
	}
	if len(args) > 0 && args[0] == "targets" {
		return runTargets(args[1:], stdout) // the routing targets over seeds (targets.go)
	}
	def := bench.DefaultConfig("", nil)
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var (
		kind      = fs.String("workload", "trace", "request stream: trace, chat, rag or shared-prompt")
		trace     = fs.String("trace", "", "Mooncake-format JSONL trace (for -workload trace)")
		blockSize = fs.Int("trace-block-size", workload.MooncakeBlockSize, "tokens per hash id in the trace")
		limit     = fs.Int("limit", 0, "use at most this many requests (0 = all)")
		sizes     = fs.String("cache-blocks", "1000,4000", "comma-separated cache sizes per replica, in blocks")
		out       = fs.String("out", "bench/results", "output directory")
		name      = fs.String("name", "", "base name of the output files (default: the workload)")
		speedup   = fs.Float64("speedup", 1, "divide every arrival time by this (> 1 compresses the stream: heavier load on the same requests)")
		model     = fs.String("sim-model", "engine", "replica model: engine (full blocks only, tail-first freeing, chunked-prefill interference) or legacy (the model of earlier results)")
		sens      = fs.Bool("sensitivity", false, "also write <name>-sensitivity.md: inferencecache at event lags 0-1 s and stats intervals 0.5-10 s")
		cfg       = def
	)
	fs.IntVar(&cfg.Replicas, "replicas", def.Replicas, "number of replicas")
	fs.DurationVar(&cfg.Lag, "lag", def.Lag, "KV-event delivery lag")
	fs.Uint64Var(&cfg.Seed, "seed", def.Seed, "seed for routers and synthetic workloads")
	fs.IntVar(&cfg.Slots, "slots", def.Slots, "requests in service per replica (prefill stays one at a time)")
	fs.DurationVar(&cfg.Cost.Overhead, "overhead", def.Cost.Overhead, "per-request prefill overhead")
	fs.DurationVar(&cfg.Cost.PrefillPerToken, "prefill-per-token", def.Cost.PrefillPerToken, "prefill time per uncached prompt token")
	fs.DurationVar(&cfg.Cost.DecodePerToken, "decode-per-token", def.Cost.DecodePerToken, "decode time per output token")
	fs.DurationVar(&cfg.Window, "window", def.Window, "load-imbalance window")
	fs.IntVar(&cfg.Parallelism, "parallel", 0, "simulations at once (0 = GOMAXPROCS); results do not depend on it")
	load := addLoadFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.CacheBlocks = nil
	var err error
	if cfg.Model, err = bench.ParseSimModel(*model); err != nil {
		return err
	}
	if *load != engine.DefaultLoadConfig() {
		cfg.Policies = bench.DefaultPoliciesWith(*load)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("cannot parse -cache-blocks %q: %w", *sizes, err)
		}
		cfg.CacheBlocks = append(cfg.CacheBlocks, n)
	}

	switch *kind {
	case "trace":
		if *trace == "" {
			return fmt.Errorf("-workload trace needs -trace")
		}
		cfg.Requests, err = workload.LoadTrace(*trace, *blockSize, *limit)
		cfg.Workload = "trace " + filepath.Base(*trace)
	case "chat", "rag", "shared-prompt":
		cfg.Workload, cfg.Requests, err = bench.Synthetic(*kind, cfg.Seed)
	default:
		return fmt.Errorf("unknown -workload %q", *kind)
	}
	if err != nil {
		return err
	}
	if *limit > 0 && len(cfg.Requests) > *limit {
		cfg.Requests = cfg.Requests[:*limit]
	}
	if *speedup != 1 {
		if !(*speedup > 0) {
			return fmt.Errorf("-speedup must be positive, got %v", *speedup)
		}
		bench.SpeedUp(cfg.Requests, *speedup)
		cfg.Workload += fmt.Sprintf(" (arrivals %g× faster)", *speedup)
	}
	if *name == "" {
		*name = *kind
	}
	rep, err := bench.Run(cfg)
	if err != nil {
		return err
	}
	if err := rep.WriteFiles(*out, *name); err != nil {
		return err
	}
	if *sens {
		srep, err := bench.RunSensitivity(cfg, bench.DefaultSensitivityLags, bench.DefaultSensitivityIntervals)
		if err != nil {
			return err
		}
		if err := srep.WriteFile(*out, *name); err != nil {
			return err
		}
	}
	return rep.WriteMarkdown(stdout, "")
}

// addLoadFlags registers the -load-* flags of this project's rows on fs and
// returns the configuration they fill (the server's defaults unless set).
func addLoadFlags(fs *flag.FlagSet) *engine.LoadConfig {
	load := engine.DefaultLoadConfig()
	fs.Float64Var(&load.Bound, "load-bound", load.Bound, "inferencecache rows: the server's --load-bound")
	fs.IntVar(&load.MinQueue, "load-min-queue", load.MinQueue, "inferencecache rows: the server's --load-min-queue")
	fs.Float64Var(&load.PrefillWeight, "load-prefill-weight", load.PrefillWeight, "inferencecache rows: the server's --load-prefill-weight")
	fs.Float64Var(&load.MinMatch, "load-min-match", load.MinMatch, "inferencecache rows: the server's --load-min-match")
	fs.Float64Var(&load.ExpectedCredit, "load-expected-credit", engine.DefaultExpectedCredit, "inferencecache rows: what an expected (routed, not yet stored) token counts for, 0..1")
	fs.DurationVar(&load.ExpectedTTL, "load-expected-ttl", engine.DefaultExpectedTTL, "inferencecache rows: the least lifetime of a routing-time entry")
	fs.Int64Var(&load.ExpectedBytes, "load-expected-bytes", load.ExpectedBytes, "inferencecache rows: memory of the routing-time entries (negative = none)")
	fs.Float64Var(&load.EvictionShare, "load-eviction-share", load.EvictionShare, "inferencecache rows: share of the prefill weight that prices evicting other prefixes, scaled by cache occupancy")
	return &load
}
