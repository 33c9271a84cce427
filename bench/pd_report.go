package bench

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
)

// PDWorkload is one request stream of a P/D report.
type PDWorkload struct {
	Name     string
	Requests []workload.Request
}

// PDReport holds the P/D mode's results: per workload, every policy.
type PDReport struct {
	Config    PDConfig
	Workloads []PDWorkloadReport
}

// PDWorkloadReport is one workload's rows.
type PDWorkloadReport struct {
	Name    string
	Results []PDResult
}

// RunPD simulates every policy on every workload, at most parallel
// simulations at once (0: GOMAXPROCS); results do not depend on it.
func RunPD(cfg PDConfig, wls []PDWorkload, policies []PDPolicy, parallel int) (*PDReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	rep := &PDReport{Config: cfg, Workloads: make([]PDWorkloadReport, len(wls))}
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	errs := make([]error, len(wls)*len(policies))
	for wi, wl := range wls {
		rep.Workloads[wi] = PDWorkloadReport{Name: wl.Name, Results: make([]PDResult, len(policies))}
		for pi, p := range policies {
			out, errp := &rep.Workloads[wi].Results[pi], &errs[wi*len(policies)+pi]
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				res, err := SimulatePD(wl.Requests, cfg, p.New(cfg))
				if err != nil {
					*errp = fmt.Errorf("cannot simulate %s on %s: %w", p.Name, wl.Name, err)
					return
				}
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

// WriteMarkdown writes the report's tables.
func (r *PDReport) WriteMarkdown(w io.Writer) error {
	c := r.Config
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("# Disaggregated prefill/decode: when to take the prefill hop\n\n")
	p("%d prefill and %d decode replicas, %d cache blocks each, %d decode slots; prefill %v + %v/token, decode %v/token, "+
		"KV transfer %v/token, a local prefill holds back the decode batch for %.0f%% of its time; KV events %v late. "+
		"TTFT is arrival to the first decode step; TPOT is decode time per output token; computed is prompt tokens prefilled, "+
		"moved is prompt tokens transferred, both per request. Regenerate with `make bench-report` (bench/results/README.md, Prefill/decode).\n\n",
		c.Prefill, c.Decode, c.CacheBlocks, c.Slots, c.Cost.Overhead, c.Cost.PrefillPerToken, c.Cost.DecodePerToken,
		c.TransferPerToken, 100*c.Interference, c.Lag)
	for _, wl := range r.Workloads {
		p("## %s\n\n", wl.Name)
		p("| policy | TTFT p50 | TTFT p90 | TTFT p99 | TTFT mean | TPOT mean | TPOT p99 | disaggregated | computed | moved |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for i := range wl.Results {
			x := &wl.Results[i]
			n := max(int64(x.Requests), 1)
			p("| %s | %s | %s | %s | %s | %s | %s | %.1f %% | %d | %d |\n", x.Policy,
				secs(x.TTFTP50), secs(x.TTFTP90), secs(x.TTFTP99), secs(x.TTFTMean), ms(x.TPOTMean), ms(x.TPOTP99),
				100*x.DisaggregatedShare(), x.ComputedTokens/n, x.TransferredTokens/n)
		}
		p("\n")
	}
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
