package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// ReportVersion is the version of the JSON report layout.
const ReportVersion = 1

// Report is the result of one Run. Latency, Reasons, Hints and the Lookups
// counts cover the measured window (after the warm-up); Totals covers every
// lookup, warm-up included, so it can be checked against the server's
// inferencecache_lookup_route_calls_total.
type Report struct {
	Version       int      `json:"version"`
	Scenario      Scenario `json:"scenario"`
	Machine       Machine  `json:"machine"`
	Populate      Populate `json:"populate"`
	Lookups       Lookups  `json:"lookups"`
	Latency       Latency  `json:"latency"`
	ServerLatency Latency  `json:"serverLatency"`
	// SendLag is how late requests left against their intended send time
	// (open loop: scheduler and queueing delay, included in Latency;
	// closed loop: the request building time).
	SendLag  Latency          `json:"sendLag"`
	Reasons  map[string]int64 `json:"reasons"`
	Hints    Hints            `json:"hints"`
	Feedback Feedback         `json:"feedback"`
	Totals   Totals           `json:"totals"`
	// Timeline cuts the whole run, warm-up included, into time slices
	// (WriteSVG plots it); absent from reports of older versions.
	Timeline *Timeline `json:"timeline,omitempty"`
	// Server is filled by harnesses that run the server as a process
	// (cmd/loadgen profile and ab); Run leaves it nil.
	Server *ServerUsage `json:"server,omitempty"`
}

// ServerUsage is the server process's resource use over the measured
// window, from its process_cpu_seconds_total.
type ServerUsage struct {
	Binary         string  `json:"binary"`
	CPUSeconds     float64 `json:"cpuSeconds"`
	CPUPerLookupUs float64 `json:"cpuPerLookupUs"`
}

// Scenario echoes the configuration that produced a report.
type Scenario struct {
	Target             string  `json:"target"`
	TLS                bool    `json:"tls"`
	Workload           string  `json:"workload"`
	TracePath          string  `json:"tracePath,omitempty"`
	WorkloadRequests   int     `json:"workloadRequests"`
	Seed               uint64  `json:"seed"`
	Mode               Mode    `json:"mode"`
	Arrival            Arrival `json:"arrival,omitempty"`
	Rate               float64 `json:"rate,omitempty"`
	Speedup            float64 `json:"speedup,omitempty"`
	Concurrency        int     `json:"concurrency"`
	LookupStream       bool    `json:"lookupStream,omitempty"`
	WarmupSec          float64 `json:"warmupSec"`
	DurationSec        float64 `json:"durationSec"`
	Replicas           int     `json:"replicas"`
	ReplicaCacheBlocks int     `json:"replicaCacheBlocks"`
	ClearEverySec      float64 `json:"clearEverySec,omitempty"`
	TenantID           string  `json:"tenantId"`
	ModelID            string  `json:"modelId"`
	HashScheme         string  `json:"hashScheme"`
}

// Machine describes where the load generator ran.
type Machine struct {
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"goVersion"`
	Note       string `json:"note,omitempty"`
}

// Populate describes the populate phase (reports sent before the run, with
// the closing barrier).
type Populate struct {
	Requests     int     `json:"requests"`
	Blocks       int64   `json:"blocks"`
	Messages     int64   `json:"messages"`
	Seconds      float64 `json:"seconds"`
	BlocksPerSec float64 `json:"blocksPerSec"`
}

// Lookups counts the measured window's LookupRoute calls.
type Lookups struct {
	OK           int64            `json:"ok"`
	Errors       int64            `json:"errors"`
	ErrorsByCode map[string]int64 `json:"errorsByCode,omitempty"`
	// Unfinished counts requests of the run that had no answer when the
	// drain deadline passed (never sent, or cut off in flight): the server
	// fell behind the open-loop schedule. They are not errors.
	Unfinished  int64   `json:"unfinished"`
	WarmupCalls int64   `json:"warmupCalls"`
	ElapsedSec  float64 `json:"elapsedSec"`
	// ThroughputPerSec is OK responses in the window over its duration.
	ThroughputPerSec float64 `json:"throughputPerSec"`
	TargetRate       float64 `json:"targetRate,omitempty"`
}

// Latency summarizes a histogram in microseconds.
type Latency struct {
	Count  uint64  `json:"count"`
	MinUs  float64 `json:"minUs"`
	MeanUs float64 `json:"meanUs"`
	P50Us  float64 `json:"p50Us"`
	P90Us  float64 `json:"p90Us"`
	P99Us  float64 `json:"p99Us"`
	P999Us float64 `json:"p999Us"`
	MaxUs  float64 `json:"maxUs"`
}

// Hints are shares of the window's responses.
type Hints struct {
	PrefixMatch float64 `json:"prefixMatch"` // reason PREFIX_MATCH
	HintUsed    float64 `json:"hintUsed"`    // replica_scores non-empty
	Affinity    float64 `json:"affinity"`    // reason AFFINITY_HINT
}

// Feedback describes the emulated replicas over the whole run.
type Feedback struct {
	RoutedByHint     int64 `json:"routedByHint"`
	RoutedByFallback int64 `json:"routedByFallback"`
	// ModeledBlockHitRatio is the share of routed lookups' blocks that the
	// chosen replica held as a leading run when the lookup returned;
	// HintedBlockHitRatio restricts it to lookups routed by the first score.
	ModeledBlockHitRatio float64 `json:"modeledBlockHitRatio"`
	HintedBlockHitRatio  float64 `json:"hintedBlockHitRatio"`
	Reports              int64   `json:"reports"`
	ReportedBlocks       int64   `json:"reportedBlocks"`
	ReportErrors         int64   `json:"reportErrors"`
	Evictions            int64   `json:"evictions"`
	EvictionsDropped     int64   `json:"evictionsDropped"`
	EvictionErrors       int64   `json:"evictionErrors"`
	OrphanEvictions      int64   `json:"orphanEvictions"`
	Resyncs              int64   `json:"resyncs"`
	ResyncBlocks         int64   `json:"resyncBlocks"`
	Clears               int64   `json:"clears"`
	ClearErrors          int64   `json:"clearErrors"`
	// LastError is the last report, event or stream error counted.
	LastError string `json:"lastError,omitempty"`
}

// Totals covers every lookup of the run, warm-up included.
type Totals struct {
	Responses int64            `json:"responses"`
	Errors    int64            `json:"errors"`
	Reasons   map[string]int64 `json:"reasons"`
}

func newReport(cfg *Config, src *source) *Report {
	rep := &Report{
		Version: ReportVersion,
		Scenario: Scenario{
			Target: cfg.Target, TLS: cfg.TLS != nil, Workload: cfg.Workload.Kind, TracePath: cfg.Workload.TracePath,
			WorkloadRequests: len(src.reqs), Seed: cfg.Seed, Mode: cfg.Mode, Concurrency: cfg.Concurrency, LookupStream: cfg.LookupStream,
			WarmupSec: cfg.Warmup.Seconds(), DurationSec: cfg.Duration.Seconds(),
			Replicas: cfg.Replicas, ReplicaCacheBlocks: cfg.ReplicaCacheBlocks, ClearEverySec: cfg.ClearEvery.Seconds(),
			TenantID: cfg.TenantID, ModelID: cfg.ModelID, HashScheme: cfg.HashScheme,
		},
		Machine: Machine{
			GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPUs: runtime.NumCPU(),
			GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
		},
	}
	if cfg.Conn != nil {
		rep.Scenario.Target = "(in-process connection)"
	}
	if cfg.Mode == OpenLoop {
		rep.Scenario.Arrival = cfg.Arrival
		if cfg.Arrival == ArrivalTrace {
			rep.Scenario.Speedup = cfg.Speedup
		} else {
			rep.Scenario.Rate = cfg.Rate
			rep.Lookups.TargetRate = cfg.Rate
		}
	}
	return rep
}

func summarize(h *Histogram) Latency {
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	return Latency{
		Count: h.Count(), MinUs: us(h.Min()), MeanUs: us(h.Mean()),
		P50Us: us(h.Quantile(0.5)), P90Us: us(h.Quantile(0.9)), P99Us: us(h.Quantile(0.99)),
		P999Us: us(h.Quantile(0.999)), MaxUs: us(h.Max()),
	}
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// fill merges the workers' recorders and the cluster's counters into rep.
func (r *runner) fill(rep *Report, elapsed time.Duration) {
	var lat, srv, lag Histogram
	rep.Reasons = map[string]int64{}
	rep.Totals.Reasons = map[string]int64{}
	errs := map[string]int64{}
	var hints int64
	for _, rec := range r.recs {
		rec.mu.Lock()
		lat.Merge(&rec.latency)
		srv.Merge(&rec.server)
		lag.Merge(&rec.lag)
		rep.Lookups.OK += rec.ok
		hints += rec.hints
		rep.Lookups.WarmupCalls += rec.warmup
		rep.Totals.Errors += rec.allErrs
		for k, v := range rec.reasons {
			rep.Reasons[k] += v
		}
		for k, v := range rec.allReasons {
			rep.Totals.Reasons[k] += v
			rep.Totals.Responses += v
		}
		for k, v := range rec.errs {
			errs[k] += v
			rep.Lookups.Errors += v
		}
		rec.mu.Unlock()
	}
	if len(errs) > 0 {
		rep.Lookups.ErrorsByCode = errs
	}
	rep.Lookups.Unfinished = r.unfinished.Load()
	rep.Lookups.ElapsedSec = elapsed.Seconds()
	rep.Lookups.ThroughputPerSec = float64(rep.Lookups.OK) / r.cfg.Duration.Seconds()
	rep.Latency = summarize(&lat)
	rep.ServerLatency = summarize(&srv)
	rep.SendLag = summarize(&lag)
	ok := rep.Lookups.OK
	rep.Hints = Hints{
		PrefixMatch: ratio(rep.Reasons["PREFIX_MATCH"], ok),
		HintUsed:    ratio(hints, ok),
		Affinity:    ratio(rep.Reasons["AFFINITY_HINT"], ok),
	}
	c := r.cluster
	rep.Feedback = Feedback{
		RoutedByHint: c.routedHint.Load(), RoutedByFallback: c.routedFallback.Load(),
		ModeledBlockHitRatio: ratio(c.hitBlocks.Load(), c.routedBlocks.Load()),
		HintedBlockHitRatio:  ratio(c.hintHitBlocks.Load(), c.hintRoutedBlocks.Load()),
		Reports:              c.reports.Load() - rep.Populate.Messages, ReportedBlocks: c.reportedBlocks.Load() - rep.Populate.Blocks,
		ReportErrors: c.reportErrors.Load(), Evictions: c.evictions.Load(), EvictionsDropped: c.evictionsDropped.Load(),
		EvictionErrors: c.evictionErrors.Load(), OrphanEvictions: c.orphans.Load(), Resyncs: c.resyncs.Load(), ResyncBlocks: c.resyncBlocks.Load(), Clears: c.clears.Load(), ClearErrors: c.clearErrors.Load(),
	}
	if e := c.lastErr.Load(); e != nil {
		rep.Feedback.LastError = *e
	}
	if r.tl != nil {
		rep.Timeline = r.tl.report(r.cfg.Warmup, elapsed)
	}
}

// WriteJSON writes rep as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("cannot write the JSON report: %w", err)
	}
	return nil
}

// ReadReport reads a JSON report written by WriteJSON.
func ReadReport(r io.Reader) (*Report, error) {
	var rep Report
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		return nil, fmt.Errorf("cannot read the JSON report: %w", err)
	}
	if rep.Version != ReportVersion {
		return nil, fmt.Errorf("%w: report version %d, want %d", ErrInvalidConfig, rep.Version, ReportVersion)
	}
	return &rep, nil
}

// LoadReport reads the JSON report at path.
func LoadReport(path string) (*Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot open the report: %w", err)
	}
	defer f.Close()
	rep, err := ReadReport(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rep, nil
}

// fmtUs formats microseconds with a unit that keeps 3 significant digits.
func fmtUs(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%.2f s", us/1e6)
	case us >= 1e3:
		return fmt.Sprintf("%.2f ms", us/1e3)
	default:
		return fmt.Sprintf("%.0f µs", us)
	}
}

func pct(x float64) string { return fmt.Sprintf("%.1f %%", 100*x) }

// WriteMarkdown writes rep as a Markdown report.
func (rep *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	s := rep.Scenario
	fmt.Fprintf(&b, "## loadgen: %s workload, ", s.Workload)
	switch {
	case s.Mode == ClosedLoop:
		fmt.Fprintf(&b, "closed loop at concurrency %d\n\n", s.Concurrency)
	case s.Arrival == ArrivalTrace:
		fmt.Fprintf(&b, "open loop, trace arrivals x%g\n\n", s.Speedup)
	default:
		fmt.Fprintf(&b, "open loop, %s arrivals at %g/s\n\n", s.Arrival, s.Rate)
	}
	if s.LookupStream {
		fmt.Fprintf(&b, "Lookups are sent on long-lived LookupRouteStream streams, one per worker.\n\n")
	}
	m := rep.Machine
	fmt.Fprintf(&b, "Target %s; %d replicas of %d blocks; seed %d; warm-up %gs, measured %gs. "+
		"Machine: %s/%s, %d CPUs (GOMAXPROCS %d), %s.", s.Target, s.Replicas, s.ReplicaCacheBlocks, s.Seed,
		s.WarmupSec, s.DurationSec, m.GOOS, m.GOARCH, m.CPUs, m.GOMAXPROCS, m.GoVersion)
	if m.Note != "" {
		fmt.Fprintf(&b, " %s", m.Note)
	}
	b.WriteString("\n\n")

	l := rep.Lookups
	fmt.Fprintf(&b, "| throughput | responses | errors | unfinished | warm-up calls |\n|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(&b, "| %.0f /s | %d | %d | %d | %d |\n\n", l.ThroughputPerSec, l.OK, l.Errors, l.Unfinished, l.WarmupCalls)
	if len(l.ErrorsByCode) > 0 {
		fmt.Fprintf(&b, "Errors by code: %s\n\n", fmtCounts(l.ErrorsByCode))
	}

	b.WriteString("| LookupRoute latency | p50 | p90 | p99 | p99.9 | max | mean |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range []struct {
		name string
		l    Latency
	}{
		{"client, from intended send", rep.Latency},
		{"server (lookup_latency_us)", rep.ServerLatency},
		{"send lag (included in client)", rep.SendLag},
	} {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", row.name, fmtUs(row.l.P50Us), fmtUs(row.l.P90Us),
			fmtUs(row.l.P99Us), fmtUs(row.l.P999Us), fmtUs(row.l.MaxUs), fmtUs(row.l.MeanUs))
	}
	b.WriteString("\n| reason code | responses | share |\n|---|---:|---:|\n")
	for _, k := range slices.Sorted(maps.Keys(rep.Reasons)) {
		fmt.Fprintf(&b, "| %s | %d | %s |\n", k, rep.Reasons[k], pct(ratio(rep.Reasons[k], l.OK)))
	}
	h := rep.Hints
	fmt.Fprintf(&b, "\nHint ratios: PREFIX_MATCH %s, hint_used %s, AFFINITY_HINT %s.\n\n", pct(h.PrefixMatch), pct(h.HintUsed), pct(h.Affinity))

	f := rep.Feedback
	p := rep.Populate
	fmt.Fprintf(&b, "Feedback: %d lookups routed by the first score, %d by the least-loaded fallback; "+
		"modeled block hit ratio %s (%s on hinted routes). Reports: %d updates with %d blocks (%d errors); "+
		"PREFIX_EVICTED %d (%d dropped, %d errors; %d orphans not published); resyncs after lost evictions %d (%d blocks re-reported); ALL_CLEARED by restarts %d (%d errors). "+
		"Populate: %d requests, %d blocks in %d updates, %.2fs (%.0f blocks/s).\n",
		f.RoutedByHint, f.RoutedByFallback, pct(f.ModeledBlockHitRatio), pct(f.HintedBlockHitRatio),
		f.Reports, f.ReportedBlocks, f.ReportErrors, f.Evictions, f.EvictionsDropped, f.EvictionErrors, f.OrphanEvictions,
		f.Resyncs, f.ResyncBlocks, f.Clears, f.ClearErrors, p.Requests, p.Blocks, p.Messages, p.Seconds, p.BlocksPerSec)
	if f.LastError != "" {
		fmt.Fprintf(&b, "\nLast feedback error: %s\n", f.LastError)
	}
	if sv := rep.Server; sv != nil {
		fmt.Fprintf(&b, "\nServer process %s: %.2f CPU seconds over the window, %.1f µs of CPU per lookup (ingest and events included).\n",
			sv.Binary, sv.CPUSeconds, sv.CPUPerLookupUs)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func fmtCounts(m map[string]int64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// Delta is one compared figure of two reports.
type Delta struct {
	Name string
	A, B float64
	// Ratio is B/A (NaN when A is 0).
	Ratio float64
	// Better says which direction improves the figure: +1 higher, -1
	// lower, 0 neither (a share that is only descriptive).
	Better int
}

// Compare returns the figures of a and b side by side, as B/A ratios.
func Compare(a, b *Report) []Delta {
	const higher, lower, neither = 1, -1, 0
	rows := []struct {
		name   string
		better int
		get    func(*Report) float64
	}{
		{"throughput /s", higher, func(r *Report) float64 { return r.Lookups.ThroughputPerSec }},
		{"p50 µs", lower, func(r *Report) float64 { return r.Latency.P50Us }},
		{"p90 µs", lower, func(r *Report) float64 { return r.Latency.P90Us }},
		{"p99 µs", lower, func(r *Report) float64 { return r.Latency.P99Us }},
		{"p99.9 µs", lower, func(r *Report) float64 { return r.Latency.P999Us }},
		{"max µs", lower, func(r *Report) float64 { return r.Latency.MaxUs }},
		{"server p50 µs", lower, func(r *Report) float64 { return r.ServerLatency.P50Us }},
		{"server p99 µs", lower, func(r *Report) float64 { return r.ServerLatency.P99Us }},
		{"server CPU µs per lookup", lower, func(r *Report) float64 {
			if r.Server == nil {
				return 0
			}
			return r.Server.CPUPerLookupUs
		}},
		{"PREFIX_MATCH share", higher, func(r *Report) float64 { return r.Hints.PrefixMatch }},
		{"hint_used share", higher, func(r *Report) float64 { return r.Hints.HintUsed }},
		{"AFFINITY_HINT share", neither, func(r *Report) float64 { return r.Hints.Affinity }},
		{"modeled block hit ratio", higher, func(r *Report) float64 { return r.Feedback.ModeledBlockHitRatio }},
		{"errors", lower, func(r *Report) float64 { return float64(r.Lookups.Errors) }},
		{"unfinished", lower, func(r *Report) float64 { return float64(r.Lookups.Unfinished) }},
	}
	out := make([]Delta, 0, len(rows))
	for _, row := range rows {
		x, y := row.get(a), row.get(b)
		d := Delta{Name: row.name, A: x, B: y, Ratio: math.NaN(), Better: row.better}
		if x != 0 {
			d.Ratio = y / x
		}
		out = append(out, d)
	}
	return out
}

// WriteCompare writes Compare(a, b) as a Markdown table: each figure's B/A
// ratio with a verdict, "(better)" or "(worse)", for figures that have a
// direction. A figure that is zero in A has no ratio ("—") but still gets
// the verdict when B differs.
func WriteCompare(w io.Writer, a, b *Report, nameA, nameB string) error {
	var sb strings.Builder
	fmt.Fprintf(&sb, "| figure | A: %s | B: %s | B/A |\n|---|---:|---:|---:|\n", nameA, nameB)
	for _, d := range Compare(a, b) {
		// From zero there is no ratio, but a figure that appears (errors
		// where there were none) still gets its verdict.
		r, up := "—", d.B > d.A
		if !math.IsNaN(d.Ratio) {
			r, up = fmt.Sprintf("%.3f", d.Ratio), d.Ratio > 1
		}
		switch {
		case d.A == d.B || d.Ratio == 1 || d.Better == 0:
		case up == (d.Better > 0):
			r += " (better)"
		default:
			r += " (worse)"
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s |\n", d.Name, fmtFig(d.A), fmtFig(d.B), r)
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

func fmtFig(x float64) string {
	switch {
	case x != 0 && math.Abs(x) < 1:
		return fmt.Sprintf("%.4f", x)
	default:
		return fmt.Sprintf("%.1f", x)
	}
}
