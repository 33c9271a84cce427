package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/inferencecache/inferencecache/loadgen"
)

// runServerScenario starts bin, runs cfg against it, reads the server's CPU
// over the measured window, and stops it. onWindow, when set, is called
// too (after the CPU reading) when the window opens and closes; after is
// called, when set, while the server still runs.
func runServerScenario(ctx context.Context, bin string, cfg loadgen.Config, onWindow func(open bool, p *serverProc), after func(p *serverProc) error) (*loadgen.Report, error) {
	p, err := startServerProc(bin, nil)
	if err != nil {
		return nil, err
	}
	meter := &cpuMeter{p: p, ctx: ctx}
	cfg.Target = p.grpcAddr
	cfg.OnWindow = func(open bool) {
		meter.onWindow(open)
		if onWindow != nil {
			onWindow(open, p)
		}
	}
	rep, err := loadgen.Run(ctx, cfg)
	if err == nil && after != nil {
		err = after(p)
	}
	if stopErr := p.stop(); err == nil {
		err = stopErr
	}
	if err != nil {
		return nil, err
	}
	cpu, err := meter.seconds()
	if err != nil {
		return nil, fmt.Errorf("cannot read the server's CPU time: %w", err)
	}
	rep.Server = &loadgen.ServerUsage{Binary: filepath.Base(bin), CPUSeconds: cpu}
	if rep.Lookups.OK > 0 {
		rep.Server.CPUPerLookupUs = cpu / float64(rep.Lookups.OK) * 1e6
	}
	return rep, nil
}

// profileDefaults is the fixed profiling scenario: the default chat
// workload, seed 1, 2,000 Poisson lookups a second with the feedback loop,
// 3 s of warm-up and a 20 s window.
func profileDefaults() loadgen.Config {
	cfg := loadgen.DefaultConfig()
	cfg.Rate = 2000
	cfg.Warmup = 3 * time.Second
	cfg.Duration = 20 * time.Second
	return cfg
}

// profile runs the profiling scenario against a server binary and saves its
// CPU, mutex and block profiles over the window, its heap and allocs
// profiles at the end, and the load report.
func profile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := profileDefaults()
	fs := flag.NewFlagSet("loadgen profile", flag.ContinueOnError)
	sf := scenarioFlags(fs, &cfg)
	bin := fs.String("server", "", "server binary to profile (built from ./cmd/server; pprof is enabled with --enable-pprof)")
	out := fs.String("out", "profiles", "directory for cpu, heap, allocs, mutex and block .pprof files and loadgen.{json,md,svg}")
	if done, err := parse(fs, args, stderr); done || err != nil {
		return err
	}
	if *bin == "" {
		return errors.New("profile needs -server")
	}
	sf.apply(&cfg, stderr)
	window := int(math.Floor(cfg.Duration.Seconds())) - 1
	if window < 1 {
		return fmt.Errorf("-duration %v leaves no whole-second profile window (need at least 2s)", cfg.Duration)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %w", *out, err)
	}
	save := func(p *serverProc, name, path string) error {
		return writeFile(filepath.Join(*out, name+".pprof"), func(w io.Writer) error { return p.get(ctx, path, w) })
	}
	var (
		wg sync.WaitGroup
		// mu guards errs, appended by the profile fetchers.
		mu   sync.Mutex
		errs []error
	)
	onWindow := func(open bool, p *serverProc) {
		if !open {
			return
		}
		for _, name := range []string{"profile", "mutex", "block"} {
			file := name
			if name == "profile" {
				file = "cpu"
			}
			wg.Go(func() {
				if err := save(p, file, fmt.Sprintf("/debug/pprof/%s?seconds=%d", name, window)); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
	}
	after := func(p *serverProc) error {
		wg.Wait()
		return errors.Join(save(p, "heap", "/debug/pprof/heap?gc=1"), save(p, "allocs", "/debug/pprof/allocs"))
	}
	rep, err := runServerScenario(ctx, *bin, cfg, onWindow, after)
	wg.Wait() // when Run failed early, the fetchers may still run
	if err = errors.Join(err, errors.Join(errs...)); err != nil {
		return err
	}
	if sf.jsonOut == "" {
		sf.jsonOut = filepath.Join(*out, "loadgen.json")
	}
	if sf.mdOut == "" {
		sf.mdOut = filepath.Join(*out, "loadgen.md")
	}
	if err := sf.output(rep, stdout); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nProfiles of %s (CPU, mutex, block over %ds of the window; heap and allocs at the end) in %s.\n", *bin, window, *out)
	return nil
}

// abDefaults is the A/B scenario: saturation (closed loop, 16 workers) on
// the default chat workload with the feedback loop, 2 s warm-up, 10 s
// window.
func abDefaults() loadgen.Config {
	cfg := loadgen.DefaultConfig()
	cfg.Mode = loadgen.ClosedLoop
	cfg.Concurrency = 16
	cfg.Warmup = 2 * time.Second
	cfg.Duration = 10 * time.Second
	return cfg
}

// ab runs the same scenario against two server binaries, alternating A B,
// B A, A B, ... (each run on a fresh server), and prints each round's B/A
// ratios and their medians.
func ab(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := abDefaults()
	fs := flag.NewFlagSet("loadgen ab", flag.ContinueOnError)
	sf := scenarioFlags(fs, &cfg)
	binA := fs.String("a", "", "server binary A (the baseline)")
	binB := fs.String("b", "", "server binary B")
	rounds := fs.Int("rounds", 3, "A/B rounds (each runs both binaries once)")
	out := fs.String("out", "", "directory for each run's JSON report (none when empty)")
	bStream := fs.Bool("b-lookup-stream", false, "B's runs send lookups on LookupRouteStream streams (A/B of the two transports; -a and -b may name the same binary)")
	if done, err := parse(fs, args, stderr); done || err != nil {
		return err
	}
	switch {
	case *binA == "" || *binB == "":
		return errors.New("ab needs -a and -b")
	case *rounds < 1 || *rounds > 100:
		return fmt.Errorf("-rounds %d out of [1, 100]", *rounds)
	}
	sf.apply(&cfg, stderr)
	type pair struct{ a, b *loadgen.Report }
	results := make([]pair, *rounds)
	for r := range results {
		order := []string{"a", "b"}
		if r%2 == 1 {
			order = []string{"b", "a"}
		}
		for _, which := range order {
			bin := *binA
			if which == "b" {
				bin = *binB
			}
			fmt.Fprintf(stderr, "ab: round %d/%d, %s = %s\n", r+1, *rounds, which, bin)
			runCfg := cfg
			if which == "b" && *bStream {
				runCfg.LookupStream = true
			}
			rep, err := runServerScenario(ctx, bin, runCfg, nil, nil)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, which, err)
			}
			rep.Machine.Note = sf.note
			if which == "a" {
				results[r].a = rep
			} else {
				results[r].b = rep
			}
			if *out != "" {
				if err := os.MkdirAll(*out, 0o755); err != nil {
					return err
				}
				if err := writeFile(filepath.Join(*out, fmt.Sprintf("%s-%d.json", which, r+1)), rep.WriteJSON); err != nil {
					return err
				}
			}
		}
	}
	figures := []struct {
		name   string
		higher bool
		get    func(*loadgen.Report) float64
	}{
		{"throughput /s", true, func(r *loadgen.Report) float64 { return r.Lookups.ThroughputPerSec }},
		{"server CPU µs / lookup", false, func(r *loadgen.Report) float64 { return r.Server.CPUPerLookupUs }},
		{"p50 µs", false, func(r *loadgen.Report) float64 { return r.Latency.P50Us }},
		{"p99 µs", false, func(r *loadgen.Report) float64 { return r.Latency.P99Us }},
		{"p99.9 µs", false, func(r *loadgen.Report) float64 { return r.Latency.P999Us }},
		{"server p50 µs", false, func(r *loadgen.Report) float64 { return r.ServerLatency.P50Us }},
	}
	fmt.Fprintf(stdout, "A/B: A = %s, B = %s; %d rounds (A B, B A, ...), each on a fresh server; B/A per round.\n\n", *binA, *binB, *rounds)
	fmt.Fprint(stdout, "| figure |")
	for r := range results {
		fmt.Fprintf(stdout, " round %d: A | B | B/A |", r+1)
	}
	fmt.Fprint(stdout, " median B/A |\n|---|")
	for range results {
		fmt.Fprint(stdout, "---:|---:|---:|")
	}
	fmt.Fprint(stdout, "---:|\n")
	for _, f := range figures {
		fmt.Fprintf(stdout, "| %s |", f.name)
		ratios := make([]float64, 0, len(results))
		for _, p := range results {
			a, b := f.get(p.a), f.get(p.b)
			ratio := math.NaN()
			if a != 0 {
				ratio = b / a
				ratios = append(ratios, ratio)
			}
			fmt.Fprintf(stdout, " %.1f | %.1f | %.3f |", a, b, ratio)
		}
		med := math.NaN()
		if len(ratios) > 0 {
			slices.Sort(ratios)
			med = ratios[len(ratios)/2]
			if len(ratios)%2 == 0 {
				med = (ratios[len(ratios)/2-1] + ratios[len(ratios)/2]) / 2
			}
		}
		verdict := ""
		if !math.IsNaN(med) && med != 1 {
			if (med > 1) == f.higher {
				verdict = " (B better)"
			} else {
				verdict = " (B worse)"
			}
		}
		fmt.Fprintf(stdout, " %.3f%s |\n", med, verdict)
	}
	return nil
}
