package loadgen_test

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/inferencecache/inferencecache/loadgen"
)

func sampleReport() *loadgen.Report {
	return &loadgen.Report{
		Version: loadgen.ReportVersion,
		Scenario: loadgen.Scenario{Target: "127.0.0.1:9090", Workload: "chat", WorkloadRequests: 4000, Seed: 1,
			Mode: loadgen.OpenLoop, Arrival: loadgen.ArrivalPoisson, Rate: 1000, Concurrency: 64, WarmupSec: 1, DurationSec: 5,
			Replicas: 8, ReplicaCacheBlocks: 16384, TenantID: "t", ModelID: "m", HashScheme: "vllm"},
		Machine:       loadgen.Machine{GOOS: "linux", GOARCH: "amd64", CPUs: 2, GOMAXPROCS: 2, GoVersion: "go1.26", Note: "shared"},
		Populate:      loadgen.Populate{Requests: 1000, Blocks: 70000, Messages: 16, Seconds: 0.06, BlocksPerSec: 1.1e6},
		Lookups:       loadgen.Lookups{OK: 5000, Errors: 2, ErrorsByCode: map[string]int64{"DeadlineExceeded": 2}, WarmupCalls: 1000, ElapsedSec: 6.1, ThroughputPerSec: 1000, TargetRate: 1000},
		Latency:       loadgen.Latency{Count: 5000, MinUs: 80, MeanUs: 300, P50Us: 250, P90Us: 700, P99Us: 3000, P999Us: 7000, MaxUs: 9000},
		ServerLatency: loadgen.Latency{Count: 5000, MinUs: 2, MeanUs: 14, P50Us: 11, P90Us: 17, P99Us: 90, P999Us: 400, MaxUs: 900},
		SendLag:       loadgen.Latency{Count: 5000, P99Us: 2000},
		Reasons:       map[string]int64{"PREFIX_MATCH": 4000, "AFFINITY_HINT": 1000},
		Hints:         loadgen.Hints{PrefixMatch: 0.8, HintUsed: 1, Affinity: 0.2},
		Feedback:      loadgen.Feedback{RoutedByHint: 6000, ModeledBlockHitRatio: 0.77, HintedBlockHitRatio: 0.77, Reports: 3000, ReportedBlocks: 120000, Evictions: 700, OrphanEvictions: 60000},
		Totals:        loadgen.Totals{Responses: 6000, Errors: 2, Reasons: map[string]int64{"PREFIX_MATCH": 4800, "AFFINITY_HINT": 1200}},
	}
}

func TestReportJSONRoundTrip(t *testing.T) {
	rep := sampleReport()
	rep.Timeline = sampleTimeline()
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	got, err := loadgen.ReadReport(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rep) {
		t.Fatalf("round trip changed the report:\n got %+v\nwant %+v", got, rep)
	}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := loadgen.LoadReport(path); err != nil || !reflect.DeepEqual(got, rep) {
		t.Fatalf("LoadReport: %v", err)
	}

	bad := strings.Replace(buf.String(), `"version": 1`, `"version": 99`, 1)
	if _, err := loadgen.ReadReport(strings.NewReader(bad)); !errors.Is(err, loadgen.ErrInvalidConfig) {
		t.Errorf("a future version: error %v, want ErrInvalidConfig", err)
	}
	unknown := strings.Replace(buf.String(), `"version": 1,`, `"version": 1, "surprise": true,`, 1)
	if _, err := loadgen.ReadReport(strings.NewReader(unknown)); err == nil {
		t.Error("an unknown field was accepted")
	}
	if _, err := loadgen.LoadReport(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("a missing file was accepted")
	}
}

func TestReportMarkdown(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"chat workload, open loop, poisson arrivals at 1000/s",
		"| 1000 /s | 5000 | 2 | 0 | 1000 |",
		"| client, from intended send | 250 µs | 700 µs | 3.00 ms | 7.00 ms | 9.00 ms | 300 µs |",
		"| PREFIX_MATCH | 4000 | 80.0 % |",
		"Hint ratios: PREFIX_MATCH 80.0 %, hint_used 100.0 %, AFFINITY_HINT 20.0 %.",
		"Errors by code: DeadlineExceeded 2",
		"2 CPUs (GOMAXPROCS 2), go1.26. shared",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("Markdown lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestCompare(t *testing.T) {
	a, b := sampleReport(), sampleReport()
	b.Lookups.ThroughputPerSec = 1500
	b.Latency.P99Us = 1500
	b.Hints.Affinity = 0
	a.Lookups.Errors = 0
	got := map[string]loadgen.Delta{}
	for _, d := range loadgen.Compare(a, b) {
		got[d.Name] = d
	}
	for name, want := range map[string]float64{"throughput /s": 1.5, "p99 µs": 0.5, "p50 µs": 1, "AFFINITY_HINT share": 0} {
		if d, ok := got[name]; !ok || math.Abs(d.Ratio-want) > 1e-12 {
			t.Errorf("%s: ratio %v, want %v", name, d.Ratio, want)
		}
	}
	if !math.IsNaN(got["errors"].Ratio) {
		t.Errorf("errors 0 -> 2: ratio %v, want NaN", got["errors"].Ratio)
	}
	var buf bytes.Buffer
	if err := loadgen.WriteCompare(&buf, a, b, "a.json", "b.json"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| figure | A: a.json | B: b.json | B/A |",
		"| throughput /s | 1000.0 | 1500.0 | 1.500 (better) |",
		"| p99 µs | 3000.0 | 1500.0 | 0.500 (better) |",
		"| p50 µs | 250.0 | 250.0 | 1.000 |",
		"| AFFINITY_HINT share | 0.2000 | 0.0 | 0.000 |",
		// No ratio from zero, but a figure that appears is still judged.
		"| errors | 0.0 | 2.0 | — (worse) |",
		"| unfinished | 0.0 | 0.0 | — |",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("comparison lacks %q:\n%s", want, buf.String())
		}
	}
}
