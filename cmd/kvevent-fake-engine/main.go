// Command kvevent-fake-engine publishes vLLM-shaped KV events over ZMQ
// (PUB plus a replay ROUTER) from a synthetic workload or the Mooncake
// conversation trace, with knobs that drop or reorder messages. It stands
// in for an engine when testing kvevent-subscriber without GPUs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kvevent-fake-engine:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var (
		pcfg                                 fakeengine.Config
		layout, workload, trace, ids, flavor string
		mapBatch, hashBytes, linger          bool
		syn                                  fakeengine.SyntheticConfig
		moon                                 fakeengine.MooncakeConfig
		limit                                int
		duration, waitSub                    time.Duration
		stateAddr                            string
	)
	fs := flag.NewFlagSet("kvevent-fake-engine", flag.ContinueOnError)
	fs.StringVar(&pcfg.Endpoint, "endpoint", "tcp://127.0.0.1:5557", "PUB bind endpoint (with --connect: the endpoint it connects to)")
	fs.BoolVar(&pcfg.Connect, "connect", false, "connect the PUB socket to --endpoint instead of binding it, as vLLM and SGLang do for an endpoint without a wildcard (a subscriber run with --engine-endpoint-mode=bind listens there); retried every 100 ms, and again after a lost connection")
	fs.StringVar(&pcfg.ReplayEndpoint, "replay-endpoint", "tcp://127.0.0.1:5558", "replay ROUTER bind endpoint (empty: no replay)")
	fs.StringVar(&pcfg.Topic, "topic", "kv-events", "topic frame")
	fs.IntVar(&pcfg.RingSize, "ring-size", fakeengine.DefaultRingSize, "batches kept for replay (the engine's buffer_steps)")
	fs.StringVar(&flavor, "engine", "vllm", "wire shapes of: vllm or sglang (array-like [ts, events, attn_dp_rank], BlockStored without medium and lora_name)")
	fs.BoolVar(&linger, "linger", false, "after the workload ends, keep the sockets open and serve replay requests until stopped (an idle engine)")
	fs.StringVar(&layout, "layout", "array", "event layout: array (tag-first tuples) or map")
	fs.BoolVar(&mapBatch, "map-batch", false, "send the batch envelope as a map instead of [ts, events, dp_rank]")
	fs.BoolVar(&hashBytes, "hash-bytes", false, "send block hashes as 32-byte digests instead of uint64")
	fs.IntVar(&pcfg.DropEvery, "drop-every", 0, "withhold every Nth message from PUB (it stays replayable)")
	fs.Float64Var(&pcfg.DropProb, "drop-prob", 0, "withhold each message with this probability")
	fs.IntVar(&pcfg.ReorderEvery, "reorder-every", 0, "send every Nth message after the next one")
	fs.Uint64Var(&pcfg.Seed, "seed", 1, "random seed")
	fs.StringVar(&workload, "workload", "synthetic", "synthetic or mooncake")
	fs.StringVar(&trace, "trace", "../shared/traces/mooncake_conversation_trace.jsonl", "Mooncake trace (JSONL)")
	fs.IntVar(&limit, "trace-limit", 0, "replay at most this many trace requests (0: all)")
	fs.Float64Var(&moon.Speedup, "speedup", 1, "trace time / wall time")
	fs.IntVar(&syn.Sessions, "sessions", 32, "synthetic: concurrent sessions")
	fs.IntVar(&syn.BlocksPerTurn, "blocks-per-turn", 4, "synthetic: blocks appended per turn")
	fs.IntVar(&syn.BlockSize, "block-size", 16, "synthetic: tokens per block")
	fs.DurationVar(&syn.Interval, "interval", 10*time.Millisecond, "synthetic: time between batches")
	fs.IntVar(&syn.Turns, "turns", 0, "synthetic: batches to publish (0: until stopped)")
	fs.StringVar(&ids, "lora-ids", "", "synthetic: comma-separated lora ids given to sessions")
	capacity := fs.Int("capacity-blocks", 0, "simulated cache size in blocks (default 4096 synthetic, 8192 mooncake)")
	fs.DurationVar(&duration, "duration", 0, "stop after this long (0: when the workload ends or on SIGTERM)")
	fs.DurationVar(&waitSub, "wait-subscriber", 10*time.Second, "wait this long for a subscriber before publishing (0: don't wait)")
	fs.StringVar(&stateAddr, "state-bind-address", "", "serve GET /blocks (the keys of the blocks the engine holds, per the batches it published: the ground truth of a server's index) and POST /pause (stop publishing for good, keep serving replay) here; empty: off")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	var err error
	if pcfg.Encoding.Layout, err = fakeengine.ParseLayout(layout); err != nil {
		return err
	}
	pcfg.Encoding.MapBatch, pcfg.Encoding.HashBytes = mapBatch, hashBytes
	switch flavor {
	case "vllm":
	case "sglang":
		if pcfg.Encoding.Layout != fakeengine.LayoutArray || mapBatch {
			return errors.New("--engine sglang publishes array-like events: it takes neither --layout map nor --map-batch")
		}
		pcfg.Encoding.SGLang = true
	default:
		return fmt.Errorf("unknown --engine %q (want vllm or sglang)", flavor)
	}
	syn.Seed = pcfg.Seed
	syn.CapacityBlocks, moon.CapacityBlocks = *capacity, *capacity
	// Batches are stamped from now, as an engine stamps its events: the
	// server ages entries by that stamp, and one older than its TTL never
	// matches.
	syn.Start, moon.Start = time.Now(), time.Now()
	for s := range strings.SplitSeq(ids, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("cannot parse --lora-ids: %w", err)
		}
		syn.LoRAIDs = append(syn.LoRAIDs, id)
	}

	var w fakeengine.Workload
	switch workload {
	case "synthetic":
		w = fakeengine.NewSynthetic(syn)
	case "mooncake":
		reqs, err := fakeengine.LoadTrace(trace, limit)
		if err != nil {
			return err
		}
		w = fakeengine.NewMooncake(reqs, moon)
		log.Info("trace loaded", "requests", len(reqs))
	default:
		return fmt.Errorf("unknown --workload %q (want synthetic or mooncake)", workload)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}

	var tr *tracked
	if stateAddr != "" {
		tr = newTracked(ctx, w, syn.BlockSize)
		if workload == "mooncake" {
			tr = newTracked(ctx, w, fakeengine.MooncakeBlockSize)
		}
		w = tr
		bound, err := serveState(ctx, stateAddr, tr)
		if err != nil {
			return err
		}
		log.Info("serving the engine's block set", "addr", bound)
	}

	pub, err := fakeengine.NewPublisher(pcfg)
	if err != nil {
		return err
	}
	defer pub.Close()
	log.Info("publishing", "endpoint", pub.Endpoint(), "replay", pub.ReplayEndpoint(), "topic", pcfg.Topic,
		"layout", layout, "workload", workload)
	if waitSub > 0 {
		wctx, cancel := context.WithTimeout(ctx, waitSub)
		err := pub.WaitSubscribed(wctx)
		cancel()
		if err != nil {
			log.Warn("no subscriber yet; publishing anyway", "err", err)
		}
	}
	start := time.Now()
	n, err := fakeengine.Run(ctx, pub, w, true)
	if tr != nil {
		tr.setIdle()
	}
	published, dropped := pub.Counts()
	log.Info("done", "batches", n, "sent", published, "withheld", dropped, "elapsed", time.Since(start).Round(time.Millisecond))
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if linger && ctx.Err() == nil {
		log.Info("workload done; idle, serving replay until stopped", "replay", pub.ReplayEndpoint())
		<-ctx.Done()
	}
	return nil
}
