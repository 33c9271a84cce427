package loadgen_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/inferencecache/inferencecache/loadgen"
	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
	"github.com/inferencecache/inferencecache/tokenizer/modeldir"
)

// pickerServer is a real server in process with its endpoint picker on
// 127.0.0.1 over n fake endpoints, tokenizing with tok (shared with the
// run's engine feedback), and the RunPicker config that drives it.
func pickerServer(t testing.TB, tokDir, model string, n int, mutate func(*server.Config)) loadgen.PickerConfig {
	t.Helper()
	tok, err := modeldir.New(modeldir.Config{Root: tokDir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var eps []endpoints.Endpoint
	for i := range n {
		eps = append(eps, endpoints.Endpoint{ReplicaID: fmt.Sprintf("pod-%d", i), Address: fmt.Sprintf("10.1.0.%d:8000", i+1)})
	}
	pool, err := endpoints.NewPool("team", "vllm", nil, eps)
	if err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, func(c *server.Config) {
		c.TokenizerDir = tokDir
		c.Picker.Addr, c.Picker.Source, c.Picker.Tokenizer = "127.0.0.1:0", endpoints.NewFixed(pool), tok
		if mutate != nil {
			mutate(c)
		}
	})
	cfg := loadgen.DefaultPickerConfig()
	cfg.Target, cfg.Model, cfg.Tenant = srv.PickerAddr().String(), model, "team"
	if srv.PickerTLS() {
		cfg.TLS = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // gateways do not verify an endpoint picker
	}
	cfg.MetricsURL = "http://" + srv.HTTPAddr().String() + "/metrics"
	cfg.CacheConn, cfg.Tokenizer = servertest.Conn(t, srv), tok
	cfg.Replicas = map[string]string{}
	for _, ep := range eps {
		cfg.Replicas[ep.Address] = ep.ReplicaID
	}
	return cfg
}

// demoTokenizer is the demo's checked-in tokenizer folder.
func demoTokenizer(t testing.TB) string {
	dir, err := filepath.Abs("../cmd/demo/tokenizer")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRunPicker drives a real picker through real ext_proc streams: every
// request is picked, the conversations' later turns find the first turn
// the feedback reported (PREFIX_MATCH), the outcome counts come from the
// server's /metrics, and the report prints.
func TestRunPicker(t *testing.T) {
	cfg := pickerServer(t, demoTokenizer(t), "demo-model", 4, nil)
	cfg.Conversations, cfg.Turns, cfg.PromptTokens, cfg.TurnTokens = 8, 4, 600, 40
	cfg.Concurrency, cfg.Warmup, cfg.Requests = 4, 0, 64
	cfg.SSE = true
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := loadgen.RunPicker(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Picks != 64 || rep.Errors != 0 || len(rep.Immediate) != 0 {
		t.Fatalf("picks %d errors %d immediate %v", rep.Picks, rep.Errors, rep.Immediate)
	}
	var total int64
	for _, n := range rep.Outcomes {
		total += n
	}
	// The window's picks, and at most the requests that finished after it
	// closed (workers beyond the count).
	if total < rep.Picks || total > rep.Picks+int64(cfg.Concurrency) || rep.Outcomes["prefix/none"] == 0 {
		t.Fatalf("outcomes %v for %d picks", rep.Outcomes, rep.Picks)
	}
	if rep.Reports == 0 || rep.Decision.Count != 64 || rep.Decision.P50Us <= 0 || rep.CPUPerPickUs <= 0 {
		t.Fatalf("report %+v", rep)
	}
	var md strings.Builder
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| picks/s |", "| decision (last body chunk to the headers answer) |", "| prefix | none |", "engine feedback"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
}

// TestRunPickerImmediate: requests the picker answers itself (here 413,
// bodies over its limit) are counted as such, not as picks or errors.
func TestRunPickerImmediate(t *testing.T) {
	cfg := pickerServer(t, demoTokenizer(t), "demo-model", 2, func(c *server.Config) { c.Picker.MaxBodyBytes = 1000 })
	cfg.Conversations, cfg.Turns, cfg.PromptTokens = 2, 2, 600
	cfg.Concurrency, cfg.Warmup, cfg.Requests = 2, 0, 6
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := loadgen.RunPicker(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Picks != 0 || rep.Errors != 0 || rep.Immediate["413"] != 6 {
		t.Fatalf("picks %d errors %d immediate %v", rep.Picks, rep.Errors, rep.Immediate)
	}
}

func TestRunPickerConfig(t *testing.T) {
	for name, mut := range map[string]func(*loadgen.PickerConfig){
		"no target":    func(c *loadgen.PickerConfig) { c.Target = "" },
		"no model":     func(c *loadgen.PickerConfig) { c.Model = "" },
		"turns":        func(c *loadgen.PickerConfig) { c.Turns = 0 },
		"huge":         func(c *loadgen.PickerConfig) { c.Turns = 1 << 20 },
		"concurrency":  func(c *loadgen.PickerConfig) { c.Concurrency = 0 },
		"no window":    func(c *loadgen.PickerConfig) { c.Duration, c.Requests = 0, 0 },
		"feedback tok": func(c *loadgen.PickerConfig) { c.CacheConn = servertestConnStub{} },
	} {
		cfg := loadgen.DefaultPickerConfig()
		cfg.Target = "127.0.0.1:1"
		mut(&cfg)
		if _, err := loadgen.RunPicker(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "invalid config") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// BenchmarkPickerExtProc is picks through a real picker over real
// ext_proc streams on 127.0.0.1 (TLS, as the server's default), client
// included, as `loadgen picker` runs them: 2,048-token chat requests, 8
// turns a conversation (one full tokenization, then seven incremental
// ones), with engine feedback, 8 streams in flight. With
// TOKENIZER_ASSETS set it tokenizes with Llama 3, else with the demo
// tokenizer. Reports picks/s (this machine, whatever else runs on it), the
// CPU per pick of this process (client and server) and what 2 dedicated
// cores would do with it.
//
//	TOKENIZER_ASSETS=$(bash hack/tokenizer-assets.sh) go test ./loadgen -run '^$' -bench PickerExtProc -benchtime 20000x
func BenchmarkPickerExtProc(b *testing.B) {
	dir, model := os.Getenv("TOKENIZER_ASSETS"), "llama3"
	if dir == "" {
		dir, model = demoTokenizer(b), "demo-model"
	}
	cfg := pickerServer(b, dir, model, 16, nil)
	cfg.Concurrency, cfg.Requests, cfg.Warmup = 8, b.N, 2*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b.ResetTimer()
	rep, err := loadgen.RunPicker(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(rep.PicksPerSec, "picks/s")
	b.ReportMetric(rep.CPUPerPickUs, "cpu-µs/pick")
	b.ReportMetric(2e6/rep.CPUPerPickUs, "picks/s-on-2-cores")
	b.ReportMetric(rep.Decision.P50Us, "decision-p50-µs")
	b.ReportMetric(rep.Decision.P99Us, "decision-p99-µs")
	b.Logf("%s %d picks, outcomes %v", model, rep.Picks, rep.Outcomes)
}

// servertestConnStub is a connection that is never dialed (the config is
// refused first).
type servertestConnStub struct{ grpc.ClientConnInterface }
