// Command loadgen drives a running inferencecache server over gRPC and
// reports LookupRoute latency, throughput, reason codes and hint ratios
// (package loadgen does the work; this command maps flags and, for profile
// and ab, runs server binaries as child processes on 127.0.0.1). run and
// profile also draw the run over time as an SVG (-svg; by default next to
// -md or -json, else in the temporary directory) and print its path.
//
//	loadgen [run] [flags]            run a scenario against -addr (see -help)
//	loadgen compare a.json b.json    diff two JSON reports as B/A ratios
//	loadgen profile -server BIN      profile a server process under a scenario
//	loadgen ab -a BIN -b BIN         A/B two server binaries, alternating runs
//	loadgen picker [flags]           drive an endpoint picker through ext_proc streams
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
	"path/filepath"
	"runtime/pprof"
	"strings"
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
	if len(args) > 0 {
		switch args[0] {
		case "compare":
			return compare(args[1:], stdout, stderr)
		case "profile":
			return profile(ctx, args[1:], stdout, stderr)
		case "ab":
			return ab(ctx, args[1:], stdout, stderr)
		case "picker":
			return pickerCmd(ctx, args[1:], stdout, stderr)
		case "run":
			args = args[1:]
		}
	}
	cfg := loadgen.DefaultConfig()
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	sf := scenarioFlags(fs, &cfg)
	fs.StringVar(&cfg.Target, "addr", cfg.Target, "server gRPC address (host:port)")
	var (
		useTLS, tlsSkipVerify bool
		tlsCA, tlsServerName  string
		cpuProfile            string
	)
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write the load generator's own CPU profile to this file")
	fs.BoolVar(&useTLS, "tls", false, "dial with TLS (implied by any other -tls-* flag)")
	fs.StringVar(&tlsCA, "tls-ca", "", "PEM CA bundle to verify the server (default: system roots)")
	fs.StringVar(&tlsServerName, "tls-server-name", "", "server name to verify (default: the address's host)")
	fs.BoolVar(&tlsSkipVerify, "tls-insecure-skip-verify", false, "do not verify the server certificate (testing only)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage:
  loadgen [run] [flags]                   run a scenario against -addr
  loadgen compare a.json b.json           diff two JSON reports as B/A ratios
  loadgen profile -server BIN [flags]     profile a server binary under a scenario (see make profile)
  loadgen ab -a BIN -b BIN [flags]        A/B two server binaries, alternating fresh runs
  loadgen picker [flags]                  drive an endpoint picker through real ext_proc streams (see picker -help)

run flags:
`)
		fs.PrintDefaults()
	}
	if done, err := parse(fs, args, stderr); done || err != nil {
		return err
	}
	sf.apply(&cfg, stderr)
	// A TLS option without -tls would otherwise be silently ignored.
	if useTLS || tlsCA != "" || tlsServerName != "" || tlsSkipVerify {
		tc, err := tlsConfig(tlsCA, tlsServerName, tlsSkipVerify)
		if err != nil {
			return err
		}
		cfg.TLS = tc
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return fmt.Errorf("cannot create -cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cannot start the CPU profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	return sf.output(rep, stdout)
}

// parse parses args; done is true after -help.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) (done bool, _ error) {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, nil
		}
		return true, err
	}
	if fs.NArg() > 0 {
		return true, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	return false, nil
}

// scenario holds the flags shared by run, profile and ab that do not map
// straight onto a Config field.
type scenario struct {
	mode, arrival  string
	jsonOut, mdOut string
	svgOut         string // a path, svgAuto, or "" / svgNone for no SVG
	note           string
	quiet          bool
}

// scenarioFlags registers the scenario flags on fs, with cfg's values as
// defaults.
func scenarioFlags(fs *flag.FlagSet, cfg *loadgen.Config) *scenario {
	sf := &scenario{mode: string(cfg.Mode), arrival: string(cfg.Arrival)}
	fs.StringVar(&cfg.TenantID, "tenant", cfg.TenantID, "tenant id of every request and report")
	fs.StringVar(&cfg.ModelID, "model", cfg.ModelID, "model id of every request and report")
	fs.StringVar(&cfg.HashScheme, "hash-scheme", cfg.HashScheme, "hash scheme of every request and report")
	fs.StringVar(&cfg.Workload.Kind, "workload", cfg.Workload.Kind, "chat, rag, shared-prompt or trace")
	fs.StringVar(&cfg.Workload.TracePath, "trace", cfg.Workload.TracePath, "Mooncake JSONL trace for -workload trace (e.g. ../shared/traces/mooncake_conversation_trace.jsonl)")
	fs.IntVar(&cfg.Workload.Size, "workload-size", cfg.Workload.Size, "requests per workload epoch (0: what the run sends, 4000 to 40000, or the whole trace)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "workload and arrival seed")
	fs.StringVar(&sf.mode, "mode", sf.mode, "open (target rate) or closed (fixed concurrency)")
	fs.StringVar(&sf.arrival, "arrival", sf.arrival, "open-loop arrivals: constant, poisson or trace")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "open-loop target lookups per second")
	fs.Float64Var(&cfg.Speedup, "speedup", cfg.Speedup, "trace arrivals: time compression factor")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "closed-loop workers; open-loop cap on requests in flight")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "warm-up, excluded from the figures")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured window after the warm-up")
	fs.BoolVar(&cfg.LookupStream, "lookup-stream", cfg.LookupStream, "send lookups on one long-lived LookupRouteStream per worker instead of unary LookupRoute calls")
	fs.DurationVar(&cfg.RequestTimeout, "request-timeout", cfg.RequestTimeout, "per-RPC deadline")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "bound on finishing queued requests after the window")
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "emulated engine replicas")
	fs.IntVar(&cfg.ReplicaCacheBlocks, "replica-cache-blocks", cfg.ReplicaCacheBlocks, "each replica's LRU capacity in blocks")
	fs.IntVar(&cfg.PopulateRequests, "populate", cfg.PopulateRequests, "requests reported before the run (-1: a quarter of the epoch, at most what fills the caches once)")
	fs.DurationVar(&cfg.PrefillBase, "prefill-base", cfg.PrefillBase, "modeled prefill overhead per request")
	fs.DurationVar(&cfg.PrefillPerToken, "prefill-per-token", cfg.PrefillPerToken, "modeled prefill time per uncached token")
	fs.DurationVar(&cfg.PrefillMax, "prefill-max", cfg.PrefillMax, "cap on the modeled prefill time")
	fs.Float64Var(&cfg.EvictionRate, "eviction-rate", cfg.EvictionRate, "cap on PREFIX_EVICTED calls per second, all replicas (0: none)")
	fs.BoolVar(&cfg.EvictOrphans, "evict-orphans", cfg.EvictOrphans, "also publish evictions of blocks whose parent was evicted already")
	fs.DurationVar(&cfg.ClearEvery, "clear-every", cfg.ClearEvery, "one replica publishes ALL_CLEARED at this period (0: never)")
	fs.StringVar(&sf.jsonOut, "json", "", "write the JSON report to this file")
	fs.StringVar(&sf.mdOut, "md", "", "write the Markdown report to this file (it is always printed to stdout)")
	fs.StringVar(&sf.svgOut, "svg", svgAuto, "write the SVG charts of the run (latency, reason codes and modeled hit ratio over time) to this file; "+
		svgAuto+": next to -md or -json with the extension .svg, else "+filepath.Join(os.TempDir(), defaultSVGName)+"; "+svgNone+" or empty: no SVG")
	fs.StringVar(&sf.note, "note", "", "free text stored in the report's machine note (e.g. the machine)")
	fs.BoolVar(&sf.quiet, "quiet", false, "no progress line on stderr")
	return sf
}

// apply copies the parsed flags into cfg.
func (sf *scenario) apply(cfg *loadgen.Config, stderr io.Writer) {
	cfg.Mode, cfg.Arrival = loadgen.Mode(sf.mode), loadgen.Arrival(sf.arrival)
	if !sf.quiet {
		cfg.Progress = stderr
	}
}

// output notes, writes and prints the report.
func (sf *scenario) output(rep *loadgen.Report, stdout io.Writer) error {
	rep.Machine.Note = sf.note
	if sf.jsonOut != "" {
		if err := writeFile(sf.jsonOut, rep.WriteJSON); err != nil {
			return err
		}
	}
	if sf.mdOut != "" {
		if err := writeFile(sf.mdOut, rep.WriteMarkdown); err != nil {
			return err
		}
	}
	if err := rep.WriteMarkdown(stdout); err != nil {
		return err
	}
	if path := svgPath(sf.svgOut, sf.mdOut, sf.jsonOut); path != "" {
		if err := writeFile(path, rep.WriteSVG); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\nwrote SVG: %s\n", path)
	}
	return nil
}

// Values of -svg besides a path.
const (
	svgAuto        = "auto"
	svgNone        = "none"
	defaultSVGName = "loadgen-report.svg"
)

// svgPath resolves -svg: "" when it is off, the path it names, or for
// svgAuto the first report file given with its extension replaced by .svg
// (the temporary directory when the report goes only to stdout, so a run
// does not litter the working tree).
func svgPath(flagValue string, reports ...string) string {
	switch flagValue {
	case "", svgNone:
		return ""
	case svgAuto:
	default:
		return flagValue
	}
	for _, r := range reports {
		if r == "" {
			continue
		}
		p := strings.TrimSuffix(r, filepath.Ext(r)) + ".svg"
		if p == r {
			p += ".svg"
		}
		return p
	}
	return filepath.Join(os.TempDir(), defaultSVGName)
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
