// Command demo is the README's run command: it starts the cache server in
// process on embedded defaults (127.0.0.1, ephemeral ports, control
// endpoints without auth since nothing leaves the machine), drives it with
// a short, seeded load-generator scenario (multi-turn chat, whose sessions
// reuse their earlier turns' KV blocks, so lookups get PREFIX_MATCH), and
// prints the report, checked against the server's own /metrics. Then it
// plays Envoy in front of the endpoint picker (picker.go, gateway.go):
// users' multi-turn chats through ext_proc to three fake vLLM engines
// (engine.go) whose KV events and load reach the index through real
// kvevents subscribers, tokenized by the picker with a small real
// tokenizer checked in under tokenizer/ (tokenizer.go), and prints where
// the requests went and why. The load run is also drawn as an SVG (-svg,
// by default inferencecache-demo.svg in the temporary directory), whose
// path the demo prints last.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/inferencecache/inferencecache/loadgen"
	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/servermetrics"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// stopTimeout bounds the server's drain at the end of the demo.
const stopTimeout = 15 * time.Second

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	lg := loadgen.DefaultConfig()
	lg.Rate = 1000
	lg.Warmup = time.Second
	lg.Duration = 5 * time.Second
	var jsonOut, tokenizerDir string
	svgOut := filepath.Join(os.TempDir(), "inferencecache-demo.svg")
	var quiet bool
	conversations, turns := 12, 4
	model := demoModelID
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&lg.Workload.Kind, "workload", lg.Workload.Kind, "chat, rag or shared-prompt")
	fs.Float64Var(&lg.Rate, "rate", lg.Rate, "lookups per second (Poisson arrivals)")
	fs.DurationVar(&lg.Warmup, "warmup", lg.Warmup, "warm-up, excluded from the figures")
	fs.DurationVar(&lg.Duration, "duration", lg.Duration, "measured window")
	fs.Uint64Var(&lg.Seed, "seed", lg.Seed, "workload and arrival seed")
	fs.StringVar(&jsonOut, "json", "", "also write the JSON report to this file")
	fs.StringVar(&svgOut, "svg", svgOut, "write the load run's SVG charts (latency, reason codes, modeled hit ratio over time) to this file (empty or none: no SVG)")
	fs.BoolVar(&quiet, "quiet", false, "no progress line")
	fs.IntVar(&conversations, "picker-conversations", conversations, "conversations sent through the endpoint picker")
	fs.IntVar(&turns, "picker-turns", turns, "turns of each conversation")
	fs.StringVar(&tokenizerDir, "tokenizer-dir", "", "the picker's --tokenizer-dir (default: the embedded demo tokenizer, written to a temporary folder)")
	fs.StringVar(&model, "picker-model", model, "the model of the picker's chats: a folder of -tokenizer-dir")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}

	cfg := server.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.InternalAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.InsecureDisableAuth = true // loopback only; see the line printed below
	cfg.DrainTimeout = 5 * time.Second
	cfg.Logger = slog.New(slog.DiscardHandler)
	tokNote := "the model's chat template and tokenizer from " + tokenizerDir
	if tokenizerDir == "" {
		dir, err := writeDemoTokenizer()
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		tokenizerDir = dir
		tokNote = "the demo tokenizer (cmd/demo/tokenizer: a byte-level BPE with 600 merges learned by hack/demotokenizer, and a ChatML " +
			"chat template), which the picker loads through --tokenizer-dir and applies to the whole conversation (RequestTokens, " +
			"incremental across turns) and the engines apply on their own"
	}
	pd, err := newPickerDemo(tokenizerDir, model)
	if err != nil {
		return err
	}
	defer pd.close()
	pool, err := pd.pool()
	if err != nil {
		return err
	}
	cfg.TokenizerDir = tokenizerDir
	cfg.Picker.Addr, cfg.Picker.Source = "127.0.0.1:0", endpoints.NewFixed(pool)
	srv, err := server.New(cfg)
	if err != nil {
		return fmt.Errorf("cannot start the server: %w", err)
	}
	sctx, stopServer := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServer()
	served := make(chan error, 1)
	go func() { served <- srv.Run(sctx) }()
	stop := func() error {
		stopServer()
		select {
		case err := <-served:
			return err
		case <-time.After(stopTimeout):
			return fmt.Errorf("the server did not stop within %v", stopTimeout)
		}
	}
	select {
	case <-srv.Ready():
	case err := <-served:
		return fmt.Errorf("the server stopped before serving: %w", err)
	case <-time.After(10 * time.Second):
		return errors.Join(errors.New("the server was not ready within 10s"), stop())
	}
	fmt.Fprintf(stdout, "inferencecache demo: server in process, gRPC %s, endpoint picker (ext_proc) %s, metrics http://%s/metrics "+
		"(control endpoints without auth: loopback demo only)\n\n", srv.GRPCAddr(), srv.PickerAddr(), srv.HTTPAddr())

	lg.Target = srv.GRPCAddr().String()
	if !quiet {
		lg.Progress = stderr
	}
	rep, err := loadgen.Run(ctx, lg)
	if err != nil {
		return errors.Join(err, stop())
	}
	rep.Machine.Note = "Client and server share this machine."
	if err := rep.WriteMarkdown(stdout); err != nil {
		return errors.Join(err, stop())
	}
	if jsonOut != "" {
		f, err := os.Create(jsonOut)
		if err == nil {
			err = errors.Join(rep.WriteJSON(f), f.Close())
		}
		if err != nil {
			return errors.Join(fmt.Errorf("cannot write %s: %w", jsonOut, err), stop())
		}
	}
	if svgOut == "none" {
		svgOut = ""
	}
	if svgOut != "" {
		f, err := os.Create(svgOut)
		if err == nil {
			err = errors.Join(rep.WriteSVG(f), f.Close())
		}
		if err != nil {
			return errors.Join(fmt.Errorf("cannot write %s: %w", svgOut, err), stop())
		}
	}
	checkErr := checkMetrics(ctx, stdout, srv.HTTPAddr().String(), lg.ModelID, rep)
	if checkErr != nil {
		return errors.Join(checkErr, stop())
	}
	pr, err := pd.run(ctx, srv, conversations, turns)
	if err != nil {
		return errors.Join(fmt.Errorf("endpoint picker chats: %w", err), stop())
	}
	pr.tokenizerNote = tokNote
	if err := pickerMetrics(ctx, srv.HTTPAddr().String(), pr); err != nil {
		return errors.Join(err, stop())
	}
	writePickerReport(stdout, pr)
	if svgOut != "" {
		fmt.Fprintf(stdout, "\nwrote SVG of the load run (latency, reason codes and modeled hit ratio over time): %s\n", svgOut)
	}
	return stop()
}

// scrape fetches and parses the server's /metrics.
func scrape(ctx context.Context, httpAddr string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot scrape the server's /metrics: %w", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("cannot parse the server's /metrics: %w", err)
	}
	return fams, nil
}

// pickerMetrics reads the picker's outcome counts and predicted/delivered
// tokens from /metrics, and checks the outcomes add up to the requests.
func pickerMetrics(ctx context.Context, httpAddr string, pr *pickerResult) error {
	fams, err := scrape(ctx, httpAddr)
	if err != nil {
		return err
	}
	total := 0
	for _, m := range fams[servermetrics.NamePickerPicks].GetMetric() {
		var o, r string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "outcome":
				o = l.GetValue()
			case "reason":
				r = l.GetValue()
			}
		}
		n := int(m.GetCounter().GetValue())
		pr.outcomes[o+"/"+r] += n
		total += n
	}
	if total != pr.requests {
		return fmt.Errorf("the picker counted %d picks, the demo sent %d requests", total, pr.requests)
	}
	for _, m := range fams[servermetrics.NamePickerPredicted].GetMetric() {
		pr.predicted += m.GetCounter().GetValue()
	}
	for _, m := range fams[servermetrics.NamePickerDelivered].GetMetric() {
		pr.delivered += m.GetCounter().GetValue()
	}
	return nil
}

// checkMetrics prints the server's LookupRoute count by reason code from
// its /metrics and fails when it differs from the load generator's.
func checkMetrics(ctx context.Context, w io.Writer, httpAddr, modelID string, rep *loadgen.Report) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cannot scrape the server's /metrics: %w", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return fmt.Errorf("cannot parse the server's /metrics: %w", err)
	}
	got := map[string]int64{}
	if fam := fams["inferencecache_lookup_route_calls_total"]; fam != nil {
		for _, m := range fam.GetMetric() {
			var mod, reason string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "model":
					mod = l.GetValue()
				case "reason_code":
					reason = l.GetValue()
				}
			}
			if mod == modelID {
				got[reason] += int64(m.GetCounter().GetValue())
			}
		}
	}
	var parts []string
	var total int64
	for _, k := range slices.Sorted(maps.Keys(got)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, got[k]))
		total += got[k]
	}
	fmt.Fprintf(w, "\nServer /metrics, inferencecache_lookup_route_calls_total{model=%q}: %d (%s), warm-up included.\n",
		modelID, total, strings.Join(parts, ", "))
	// Requests cut off in flight at the end may have been answered by the
	// server without the client recording it, so the server's count may
	// exceed the client's by up to the unfinished requests, never more and
	// never less.
	var reported int64
	for _, n := range rep.Totals.Reasons {
		reported += n
	}
	switch {
	case rep.Totals.Errors == 0 && rep.Lookups.Unfinished == 0 && !maps.Equal(got, rep.Totals.Reasons):
		return fmt.Errorf("the server counted %v LookupRoute calls by reason, the load generator %v", got, rep.Totals.Reasons)
	case total < reported || total > reported+rep.Totals.Errors+rep.Lookups.Unfinished:
		return fmt.Errorf("the server counted %d LookupRoute calls, the load generator %d responses (%d errors, %d unfinished)",
			total, reported, rep.Totals.Errors, rep.Lookups.Unfinished)
	}
	fmt.Fprintln(w, "It matches the load generator's count of responses.")
	return nil
}
