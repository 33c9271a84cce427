// Command loadgen drives a running inferencecache server over gRPC and
// reports LookupRoute latency, throughput, reason codes and hint ratios
// (package loadgen does the work; this file maps flags).
//
//	loadgen [flags]                  run a scenario (see -help)
//	loadgen compare a.json b.json    diff two JSON reports as B/A ratios
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/inferencecache/inferencecache/loadgen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "compare" {
		return compare(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "run" {
		args = args[1:]
	}
	cfg := loadgen.DefaultConfig()
	var (
		mode, arrival              string
		jsonOut, mdOut             string
		useTLS, tlsSkipVerify      bool
		tlsCA, tlsServerName, note string
		quiet                      bool
	)
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Target, "addr", cfg.Target, "server gRPC address (host:port)")
	fs.BoolVar(&useTLS, "tls", false, "dial with TLS")
	fs.StringVar(&tlsCA, "tls-ca", "", "PEM CA bundle to verify the server (default: system roots)")
	fs.StringVar(&tlsServerName, "tls-server-name", "", "server name to verify (default: the address's host)")
	fs.BoolVar(&tlsSkipVerify, "tls-insecure-skip-verify", false, "do not verify the server certificate (testing only)")
	fs.StringVar(&cfg.TenantID, "tenant", cfg.TenantID, "tenant id of every request and report")
	fs.StringVar(&cfg.ModelID, "model", cfg.ModelID, "model id of every request and report")
	fs.StringVar(&cfg.HashScheme, "hash-scheme", cfg.HashScheme, "hash scheme of every request and report")
	fs.StringVar(&cfg.Workload.Kind, "workload", cfg.Workload.Kind, "chat, rag, shared-prompt or trace")
	fs.StringVar(&cfg.Workload.TracePath, "trace", "", "Mooncake JSONL trace for -workload trace (e.g. ../shared/traces/mooncake_conversation_trace.jsonl)")
	fs.IntVar(&cfg.Workload.Size, "workload-size", 0, "requests per workload epoch (0: 4000 generated, or the whole trace)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "workload and arrival seed")
	fs.StringVar(&mode, "mode", string(cfg.Mode), "open (target rate) or closed (fixed concurrency)")
	fs.StringVar(&arrival, "arrival", string(cfg.Arrival), "open-loop arrivals: constant, poisson or trace")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "open-loop target lookups per second")
	fs.Float64Var(&cfg.Speedup, "speedup", cfg.Speedup, "trace arrivals: time compression factor")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "closed-loop workers; open-loop cap on requests in flight")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "warm-up, excluded from the figures")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured window after the warm-up")
	fs.DurationVar(&cfg.RequestTimeout, "request-timeout", cfg.RequestTimeout, "per-RPC deadline")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "bound on finishing queued requests after the window")
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "emulated engine replicas")
	fs.IntVar(&cfg.ReplicaCacheBlocks, "replica-cache-blocks", cfg.ReplicaCacheBlocks, "each replica's LRU capacity in blocks")
	fs.IntVar(&cfg.PopulateRequests, "populate", cfg.PopulateRequests, "requests reported before the run (-1: a quarter of the epoch)")
	fs.DurationVar(&cfg.PrefillBase, "prefill-base", cfg.PrefillBase, "modeled prefill overhead per request")
	fs.DurationVar(&cfg.PrefillPerToken, "prefill-per-token", cfg.PrefillPerToken, "modeled prefill time per uncached token")
	fs.DurationVar(&cfg.PrefillMax, "prefill-max", cfg.PrefillMax, "cap on the modeled prefill time")
	fs.DurationVar(&cfg.ClearEvery, "clear-every", 0, "one replica publishes ALL_CLEARED at this period (0: never)")
	fs.StringVar(&jsonOut, "json", "", "write the JSON report to this file")
	fs.StringVar(&mdOut, "md", "", "write the Markdown report to this file (it is always printed to stdout)")
	fs.StringVar(&note, "note", "", "free text stored in the report's machine note (e.g. the machine)")
	fs.BoolVar(&quiet, "quiet", false, "no progress line on stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	cfg.Mode, cfg.Arrival = loadgen.Mode(mode), loadgen.Arrival(arrival)
	if !quiet {
		cfg.Progress = stderr
	}
	if useTLS {
		tc, err := tlsConfig(tlsCA, tlsServerName, tlsSkipVerify)
		if err != nil {
			return err
		}
		cfg.TLS = tc
	}
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	rep.Machine.Note = note
	if jsonOut != "" {
		if err := writeFile(jsonOut, rep.WriteJSON); err != nil {
			return err
		}
	}
	if mdOut != "" {
		if err := writeFile(mdOut, rep.WriteMarkdown); err != nil {
			return err
		}
	}
	return rep.WriteMarkdown(stdout)
}

func tlsConfig(caFile, serverName string, skipVerify bool) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, InsecureSkipVerify: skipVerify} //nolint:gosec // opt-in flag for testing
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read -tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-tls-ca %s holds no PEM certificate", caFile)
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", path, err)
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	return nil
}

func compare(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loadgen compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, "usage: loadgen compare a.json b.json") }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() != 2 {
		fs.Usage()
		return errors.New("compare takes exactly two JSON reports")
	}
	a, err := loadgen.LoadReport(fs.Arg(0))
	if err != nil {
		return err
	}
	b, err := loadgen.LoadReport(fs.Arg(1))
	if err != nil {
		return err
	}
	return loadgen.WriteCompare(stdout, a, b, fs.Arg(0), fs.Arg(1))
}
