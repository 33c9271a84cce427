package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/inferencecache/inferencecache/bench"
	"github.com/inferencecache/inferencecache/bench/workload"
)

// runPD is "bench pd": the disaggregated prefill/decode mode of package
// bench on the Mooncake trace and the synthetic workloads, comparing the
// server with always disaggregating, llm-d's threshold and Dynamo's
// bypass, and the server at other skip thresholds; it writes
// <out>/<name>.md and prints it.
//
//	go run ./cmd/bench pd -trace ../shared/traces/mooncake_conversation_trace.jsonl
func runPD(args []string, stdout io.Writer) error {
	def := bench.DefaultPDConfig()
	cfg := def
	fs := flag.NewFlagSet("bench pd", flag.ContinueOnError)
	var (
		trace      = fs.String("trace", "", "Mooncake-format JSONL trace (empty: synthetic workloads only)")
		blockSize  = fs.Int("trace-block-size", workload.MooncakeBlockSize, "tokens per hash id in the trace")
		limit      = fs.Int("limit", 0, "use at most this many requests of each workload (0 = all)")
		synth      = fs.String("workloads", "chat,rag,shared-prompt", "synthetic workloads (comma-separated; empty: none)")
		speedup    = fs.Float64("speedup", 1, "divide every arrival time by this")
		thresholds = fs.String("sweep", "0,256,1024,2048", "other skip thresholds to run the server at (comma-separated tokens)")
		seed       = fs.Uint64("seed", 1, "seed of the synthetic workloads")
		out        = fs.String("out", "bench/results", "output directory")
		name       = fs.String("name", "pd", "base name of the output file")
		parallel   = fs.Int("parallel", 0, "simulations at once (0 = GOMAXPROCS)")
	)
	fs.IntVar(&cfg.Prefill, "prefill", def.Prefill, "prefill replicas")
	fs.IntVar(&cfg.Decode, "decode", def.Decode, "decode replicas")
	fs.IntVar(&cfg.CacheBlocks, "cache-blocks", def.CacheBlocks, "cache blocks per replica")
	fs.IntVar(&cfg.Slots, "slots", def.Slots, "decode slots per decode replica")
	fs.DurationVar(&cfg.TransferPerToken, "transfer-per-token", def.TransferPerToken, "KV transfer time per prompt token")
	fs.Float64Var(&cfg.Interference, "interference", def.Interference, "share of a local prefill's time the decode batch is held back")
	fs.DurationVar(&cfg.Lag, "lag", def.Lag, "KV-event delivery lag")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var wls []bench.PDWorkload
	if *trace != "" {
		reqs, err := workload.LoadTrace(*trace, *blockSize, *limit)
		if err != nil {
			return err
		}
		wls = append(wls, bench.PDWorkload{Name: "trace " + filepath.Base(*trace), Requests: reqs})
	}
	for _, k := range splitList(*synth) {
		n, reqs, err := bench.Synthetic(k, *seed)
		if err != nil {
			return err
		}
		if *limit > 0 && len(reqs) > *limit {
			reqs = reqs[:*limit]
		}
		wls = append(wls, bench.PDWorkload{Name: n, Requests: reqs})
	}
	if *speedup != 1 {
		if !(*speedup > 0) {
			return fmt.Errorf("-speedup must be positive, got %v", *speedup)
		}
		for i := range wls {
			bench.SpeedUp(wls[i].Requests, *speedup)
			wls[i].Name += fmt.Sprintf(" (arrivals %g× faster)", *speedup)
		}
	}
	var sweep []int32
	for _, f := range splitList(*thresholds) {
		t, err := strconv.ParseInt(f, 10, 32)
		if err != nil || t < 0 {
			return fmt.Errorf("cannot parse -sweep %q: want comma-separated token counts", *thresholds)
		}
		sweep = append(sweep, int32(t))
	}
	policies := bench.PDPoliciesWithSweep(sweep)
	rep, err := bench.RunPD(cfg, wls, policies, *parallel)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("cannot create results dir: %w", err)
	}
	f, err := os.Create(filepath.Join(*out, *name+".md"))
	if err != nil {
		return err
	}
	if err := rep.WriteMarkdown(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return rep.WriteMarkdown(stdout)
}
