package loadgen_test

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/loadgen"
	"github.com/inferencecache/inferencecache/rpc"
)

// syncBuffer is a bytes.Buffer safe for the progress loop and the test.
type syncBuffer struct {
	// mu guards b.
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func runLoad(t *testing.T, cfg loadgen.Config) *loadgen.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if testing.Verbose() {
		var md bytes.Buffer
		_ = rep.WriteMarkdown(&md)
		t.Logf("report:\n%s", md.String())
	}
	return rep
}

// checkAgainstMetrics compares the report's per-reason totals with the
// server's inferencecache_lookup_route_calls_total.
func checkAgainstMetrics(t *testing.T, s *testServer, rep *loadgen.Report, modelID string) {
	t.Helper()
	if rep.Totals.Errors != 0 {
		t.Fatalf("%d lookups failed; the server may have counted them", rep.Totals.Errors)
	}
	got := s.lookupCalls(t, modelID)
	if !maps.Equal(got, rep.Totals.Reasons) {
		t.Errorf("server /metrics counts %v, the report's totals %v", got, rep.Totals.Reasons)
	}
	var sum int64
	for _, v := range rep.Reasons {
		sum += v
	}
	if sum != rep.Lookups.OK || int64(rep.Latency.Count) != rep.Lookups.OK ||
		rep.Lookups.OK+rep.Lookups.WarmupCalls != rep.Totals.Responses+rep.Totals.Errors {
		t.Errorf("inconsistent counts: reasons %d, ok %d, latency samples %d, warm-up %d, totals %d",
			sum, rep.Lookups.OK, rep.Latency.Count, rep.Lookups.WarmupCalls, rep.Totals.Responses)
	}
}

// checkTimeline checks that the report's timeline adds up to its totals and
// renders.
func checkTimeline(t *testing.T, rep *loadgen.Report) {
	t.Helper()
	tl := rep.Timeline
	if tl == nil || len(tl.Slices) == 0 || len(tl.Slices) > 60 || tl.WarmupSec != rep.Scenario.WarmupSec {
		t.Fatalf("timeline %+v", tl)
	}
	var resp, errs, hit, routed int64
	reasons := map[string]int64{}
	for _, s := range tl.Slices {
		resp += s.Responses
		errs += s.Errors
		hit += s.HitBlocks
		routed += s.RoutedBlocks
		for k, v := range s.Reasons {
			reasons[k] += v
		}
		if s.Responses > 0 && (s.P50Us <= 0 || s.P50Us > s.P99Us) {
			t.Errorf("slice at %.2fs: p50 %v, p99 %v", s.StartSec, s.P50Us, s.P99Us)
		}
	}
	if resp != rep.Totals.Responses || errs != rep.Totals.Errors || !maps.Equal(reasons, rep.Totals.Reasons) ||
		routed == 0 || float64(hit)/float64(routed) != rep.Feedback.ModeledBlockHitRatio {
		t.Errorf("timeline sums: %d responses, %d errors, reasons %v, hits %d of %d; report totals %+v, modeled hit ratio %v",
			resp, errs, reasons, hit, routed, rep.Totals, rep.Feedback.ModeledBlockHitRatio)
	}
	checkSVG(t, renderSVG(t, rep))
}

// TestRunAgainstServer is the acceptance test: a 2-second scenario
// against a real server, checked against the server's own /metrics.
func TestRunAgainstServer(t *testing.T) {
	s := startServer(t, nil)
	var progress syncBuffer
	cfg := loadgen.DefaultConfig()
	cfg.Target = s.grpcAddr()
	cfg.Rate = 300
	cfg.Warmup = 500 * time.Millisecond
	cfg.Duration = 2 * time.Second
	cfg.Replicas, cfg.ReplicaCacheBlocks = 8, 2048 // small caches: evictions within the run
	cfg.ClearEvery = 600 * time.Millisecond
	cfg.Progress = &progress
	rep := runLoad(t, cfg)
	checkAgainstMetrics(t, s, rep, cfg.ModelID)

	if rep.Lookups.Errors != 0 || rep.Lookups.Unfinished != 0 {
		t.Errorf("errors %d, unfinished %d", rep.Lookups.Errors, rep.Lookups.Unfinished)
	}
	// Poisson(600) arrivals in the window: sd 24.5; allow 5 sd.
	if ok := rep.Lookups.OK; ok < 600-125 || ok > 600+125 {
		t.Errorf("%d responses in the window, want about 600", ok)
	}
	if rep.Hints.PrefixMatch < 0.2 || rep.Feedback.ModeledBlockHitRatio <= 0 {
		t.Errorf("PREFIX_MATCH share %.3f, modeled hit ratio %.3f: chat turns should match earlier turns",
			rep.Hints.PrefixMatch, rep.Feedback.ModeledBlockHitRatio)
	}
	f := rep.Feedback
	if f.Reports == 0 || f.ReportedBlocks == 0 || f.Evictions == 0 || f.Clears == 0 || f.ReportErrors != 0 || f.EvictionErrors != 0 {
		t.Errorf("feedback %+v: want reports, evictions and clears without errors", f)
	}
	if f.RoutedByHint+f.RoutedByFallback != rep.Totals.Responses {
		t.Errorf("%d routed lookups, %d responses", f.RoutedByHint+f.RoutedByFallback, rep.Totals.Responses)
	}
	if rep.Latency.P50Us <= 0 || rep.Latency.P50Us > rep.Latency.P99Us || rep.Latency.P99Us > rep.Latency.MaxUs {
		t.Errorf("latency percentiles out of order: %+v", rep.Latency)
	}
	checkTimeline(t, rep)

	// At most one progress line a second.
	lines := strings.Count(progress.String(), "\n")
	if lines < 1 || float64(lines) > math.Floor(rep.Lookups.ElapsedSec) {
		t.Errorf("%d progress lines in %.2fs:\n%s", lines, rep.Lookups.ElapsedSec, progress.String())
	}
}

// TestLookupStreamAgainstServer: with LookupStream every lookup goes on a
// worker's long-lived LookupRouteStream, in both loops, and the report still
// agrees with the server's /metrics (the stream's answers count as
// LookupRoute calls there).
func TestLookupStreamAgainstServer(t *testing.T) {
	for _, mode := range []loadgen.Mode{loadgen.OpenLoop, loadgen.ClosedLoop} {
		t.Run(string(mode), func(t *testing.T) {
			s := startServer(t, nil)
			cfg := loadgen.DefaultConfig()
			cfg.Target = s.grpcAddr()
			cfg.Mode, cfg.Rate, cfg.Concurrency = mode, 400, 4
			cfg.Warmup, cfg.Duration = 300*time.Millisecond, time.Second
			cfg.Replicas, cfg.ReplicaCacheBlocks = 4, 2048
			cfg.LookupStream = true
			rep := runLoad(t, cfg)
			checkAgainstMetrics(t, s, rep, cfg.ModelID)
			if !rep.Scenario.LookupStream || rep.Lookups.OK < 100 || rep.Lookups.Errors != 0 {
				t.Errorf("lookup stream %v: %d answers, %d errors", rep.Scenario.LookupStream, rep.Lookups.OK, rep.Lookups.Errors)
			}
			if rep.Hints.PrefixMatch <= 0 {
				t.Errorf("no PREFIX_MATCH over the stream: %+v", rep.Hints)
			}
		})
	}
}

// TestLookupStreamTimeout: a streamed lookup that outlives RequestTimeout
// counts as DEADLINE_EXCEEDED and its stream is replaced, so the worker
// keeps going instead of waiting on a stalled stream.
func TestLookupStreamTimeout(t *testing.T) {
	s := startServer(t, func(i rpc.Index) rpc.Index { return slowIndex{Index: i, delay: 60 * time.Millisecond} })
	cfg := loadgen.DefaultConfig()
	cfg.Target = s.grpcAddr()
	cfg.Mode, cfg.Concurrency = loadgen.ClosedLoop, 2
	cfg.Warmup, cfg.Duration = 0, time.Second
	cfg.RequestTimeout = 20 * time.Millisecond
	cfg.Replicas = 2
	cfg.LookupStream = true
	rep := runLoad(t, cfg)
	// Each lookup waits 20 ms for its answer, then the worker opens a new
	// stream: about 50 lookups a second per worker, all timed out.
	if n := rep.Lookups.ErrorsByCode["DeadlineExceeded"]; n < 20 {
		t.Errorf("%d DeadlineExceeded errors in 1 s of 20 ms timeouts on 2 workers (errors %v, ok %d)", n, rep.Lookups.ErrorsByCode, rep.Lookups.OK)
	}
}

func TestClosedLoopTraceReplay(t *testing.T) {
	s := startServer(t, nil)
	cfg := loadgen.DefaultConfig()
	cfg.Target = s.grpcAddr()
	cfg.Mode = loadgen.ClosedLoop
	cfg.Concurrency = 4
	cfg.Workload = loadgen.WorkloadConfig{Kind: loadgen.WorkloadTrace, TracePath: "../bench/workload/testdata/sample_trace.jsonl"}
	cfg.Warmup = 200 * time.Millisecond
	cfg.Duration = time.Second
	// The sample's 164 requests wrap (with fresh hashes) every few
	// milliseconds at full speed: prefills must finish within an epoch for
	// later requests to match.
	cfg.PrefillPerToken, cfg.PrefillBase = 0, 200*time.Microsecond
	cfg.FlushInterval = time.Millisecond
	rep := runLoad(t, cfg)
	checkAgainstMetrics(t, s, rep, cfg.ModelID)
	checkTimeline(t, rep)
	if rep.Lookups.OK == 0 || rep.Reasons["PREFIX_MATCH"] == 0 {
		t.Errorf("closed-loop trace replay: %d responses, reasons %v", rep.Lookups.OK, rep.Reasons)
	}
	if rep.Scenario.WorkloadRequests != 164 {
		t.Errorf("trace epoch of %d requests, want the sample's 164", rep.Scenario.WorkloadRequests)
	}
}

func TestOpenLoopTraceArrivals(t *testing.T) {
	s := startServer(t, nil)
	cfg := loadgen.DefaultConfig()
	cfg.Target = s.grpcAddr()
	cfg.Arrival = loadgen.ArrivalTrace
	cfg.Speedup = 50 // the sample trace spans ~5 min: about 30 requests a second
	cfg.Workload = loadgen.WorkloadConfig{Kind: loadgen.WorkloadTrace, TracePath: "../bench/workload/testdata/sample_trace.jsonl"}
	cfg.PopulateRequests = 20
	cfg.Warmup = 0
	cfg.Duration = time.Second
	rep := runLoad(t, cfg)
	checkAgainstMetrics(t, s, rep, cfg.ModelID)
	if rep.Lookups.OK < 5 || rep.Lookups.OK > 150 {
		t.Errorf("%d responses in 1s of the sample trace at x50", rep.Lookups.OK)
	}
}

// slowIndex delays every lookup, to saturate the server.
type slowIndex struct {
	rpc.Index
	delay time.Duration
}

func (s slowIndex) LookupRoute(req *engine.LookupRequest, now int64, res *engine.LookupResult) {
	time.Sleep(s.delay)
	s.Index.LookupRoute(req, now, res)
}

// TestCoordinatedOmission saturates a server whose lookups take 10 ms with
// 200 requests a second through 1 worker: capacity is under 100 a second,
// so requests queue and their latency, timed from the intended send, grows
// far beyond the 10 ms a naive sender would report; what the drain
// deadline cuts off is counted as unfinished.
func TestCoordinatedOmission(t *testing.T) {
	s := startServer(t, func(i rpc.Index) rpc.Index { return slowIndex{Index: i, delay: 10 * time.Millisecond} })
	cfg := loadgen.DefaultConfig()
	cfg.Target = s.grpcAddr()
	cfg.Arrival = loadgen.ArrivalConstant
	cfg.Rate = 200
	cfg.Concurrency = 1
	cfg.Warmup = 0
	cfg.Duration = time.Second
	cfg.DrainTimeout = 300 * time.Millisecond
	rep := runLoad(t, cfg)
	if rep.Lookups.Unfinished == 0 {
		t.Errorf("no unfinished requests at twice the server's capacity")
	}
	if rep.Lookups.OK+rep.Lookups.Unfinished+rep.Lookups.Errors != 200 {
		t.Errorf("ok %d + unfinished %d + errors %d, want the 200 scheduled", rep.Lookups.OK, rep.Lookups.Unfinished, rep.Lookups.Errors)
	}
	if rep.Latency.P90Us < 200_000 {
		t.Errorf("p90 %.0f µs: queueing behind a 10 ms server at 2x capacity for 1s must show in the latency", rep.Latency.P90Us)
	}
	if rep.SendLag.P90Us < 100_000 {
		t.Errorf("send lag p90 %.0f µs, want the queueing delay", rep.SendLag.P90Us)
	}
}

func TestRunErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, mut := range map[string]func(*loadgen.Config){
		"no target":      func(c *loadgen.Config) { c.Target = "" },
		"zero rate":      func(c *loadgen.Config) { c.Rate = 0 },
		"bad mode":       func(c *loadgen.Config) { c.Mode = "half-open" },
		"bad arrival":    func(c *loadgen.Config) { c.Arrival = "bursty" },
		"no speedup":     func(c *loadgen.Config) { c.Arrival, c.Speedup = loadgen.ArrivalTrace, 0 },
		"zero duration":  func(c *loadgen.Config) { c.Duration = 0 },
		"no replicas":    func(c *loadgen.Config) { c.Replicas = 0 },
		"no concurrency": func(c *loadgen.Config) { c.Concurrency = 0 },
		"empty tenant":   func(c *loadgen.Config) { c.TenantID = "" },
		"bad workload":   func(c *loadgen.Config) { c.Workload.Kind = "bursty" },
	} {
		cfg := loadgen.DefaultConfig()
		mut(&cfg)
		if _, err := loadgen.Run(ctx, cfg); !errors.Is(err, loadgen.ErrInvalidConfig) {
			t.Errorf("%s: error %v, want ErrInvalidConfig", name, err)
		}
	}
	// Nothing listens on port 1: the populate phase fails, fast.
	cfg := loadgen.DefaultConfig()
	cfg.Target = "127.0.0.1:1"
	start := time.Now()
	if _, err := loadgen.Run(ctx, cfg); err == nil {
		t.Error("a run against a closed port succeeded")
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("failing against a closed port took %v", el)
	}
}
