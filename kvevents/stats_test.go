package kvevents

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
)

// vllmExposition renders a vLLM-like /metrics page; withTotal picks the
// counter naming of the text format (_total on the samples and TYPE) or the
// bare one some exporters use.
func vllmExposition(hits, queries, t2h, t2q float64, running, waiting int, usage float64, withTotal bool) string {
	sfx := ""
	if withTotal {
		sfx = "_total"
	}
	var b strings.Builder
	counter := func(name string, v float64) {
		fmt.Fprintf(&b, "# HELP %s%s help\n# TYPE %s%s counter\n", name, sfx, name, sfx)
		// Two engines' series are summed.
		fmt.Fprintf(&b, "%s%s{engine=\"0\",model_name=\"m\"} %g\n", name, sfx, v/2)
		fmt.Fprintf(&b, "%s%s{engine=\"1\",model_name=\"m\"} %g\n", name, sfx, v/2)
	}
	gauge := func(name string, v float64) {
		fmt.Fprintf(&b, "# TYPE %s gauge\n%s{model_name=\"m\"} %g\n", name, name, v)
	}
	counter("vllm:prefix_cache_hits", hits)
	counter("vllm:prefix_cache_queries", queries)
	counter("vllm:external_prefix_cache_hits", t2h)
	counter("vllm:external_prefix_cache_queries", t2q)
	gauge("vllm:num_requests_running", float64(running))
	gauge("vllm:num_requests_waiting", float64(waiting))
	gauge("vllm:kv_cache_usage_perc", usage)
	return b.String()
}

func near(a float32, b float64) bool { return math.Abs(float64(a)-b) < 1e-6 }

func TestStatsVLLM(t *testing.T) {
	for _, withTotal := range []bool{true, false} {
		t.Run(fmt.Sprint("total=", withTotal), func(t *testing.T) {
			s := &StatsScraper{CacheSizeBytes: 1000, ClientVersion: "v"}
			st, err := s.Parse(strings.NewReader(vllmExposition(30, 100, 4, 8, 100, 28, 0.25, withTotal)))
			if err != nil {
				t.Fatal(err)
			}
			// First scrape: lifetime ratio.
			if !near(st.HitRate, 0.3) || !near(st.Pressure, 0.5) || st.CacheMemoryBytes != 250 ||
				st.T2HitTokens != 4 || st.T2QueryTokens != 8 || st.ClientVersion != "v" {
				t.Fatalf("first %v", st)
			}
			// Second: delta ratio (90-30)/(200-100); pressure clamps at 1.
			st, _ = s.Parse(strings.NewReader(vllmExposition(90, 200, 4, 8, 300, 10, 1.5, withTotal)))
			if !near(st.HitRate, 0.6) || !near(st.Pressure, 1) || st.CacheMemoryBytes != 1000 {
				t.Fatalf("second %v", st)
			}
			// No new queries: keep the last rate.
			st, _ = s.Parse(strings.NewReader(vllmExposition(90, 200, 4, 8, 0, 0, 0, withTotal)))
			if !near(st.HitRate, 0.6) || st.Pressure != 0 {
				t.Fatalf("idle %v", st)
			}
			// Counter reset (engine restart): lifetime ratio again.
			st, _ = s.Parse(strings.NewReader(vllmExposition(1, 4, 0, 0, 0, 0, 0, withTotal)))
			if !near(st.HitRate, 0.25) {
				t.Fatalf("reset %v", st)
			}
		})
	}
}

func TestStatsVLLMFallbackUsageAndOldNames(t *testing.T) {
	page := `vllm:gpu_prefix_cache_hits_total 5
vllm:gpu_prefix_cache_queries_total 10
vllm:gpu_cache_usage_perc 0.5
vllm:num_requests_running 2
`
	st, err := (&StatsScraper{CacheSizeBytes: 100}).Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if !near(st.HitRate, 0.5) || st.CacheMemoryBytes != 50 || !near(st.Pressure, 2.0/256) || st.T2QueryTokens != 0 {
		t.Fatalf("stats %v", st)
	}
}

func TestStatsSGLang(t *testing.T) {
	page := `# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.42
sglang:token_usage{model_name="m"} 0.1
sglang:num_running_reqs{model_name="m"} 64
sglang:num_queue_reqs{model_name="m"} 64
`
	st, err := (&StatsScraper{CacheSizeBytes: 1 << 30}).Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if !near(st.HitRate, 0.42) || !near(st.Pressure, 0.5) || st.CacheMemoryBytes != 107374182 || st.T2HitTokens != 0 {
		t.Fatalf("stats %v", st)
	}
	if _, err := (&StatsScraper{}).Parse(strings.NewReader("not a metric line {")); err == nil {
		t.Fatal("garbage parsed")
	}
}

func TestSubscriberSendsStats(t *testing.T) {
	var scrapes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := scrapes.Add(1)
		_, _ = fmt.Fprint(w, vllmExposition(float64(10*n), float64(20*n), 0, 0, 64, 0, 0.5, true))
	}))
	t.Cleanup(srv.Close)
	f := startZMQ(t, fakeengine.Encoding{}, false, func(c *Config) {
		c.MetricsURL = srv.URL + "/metrics"
		c.StatsInterval = 20 * time.Millisecond
		c.CacheSizeBytes = 1000
	})
	ctx := testCtx(t, 10*time.Second)
	for {
		found := false
		for _, c := range f.sink.snapshot() {
			if c == "stats hit=0.50 pressure=0.25 mem=500" {
				found = true
			}
		}
		if found {
			break
		}
		if !sleepCtx(ctx, 5*time.Millisecond) {
			t.Fatalf("no stats update; calls %q", f.sink.snapshot())
		}
	}
	f.sink.mu.Lock()
	defer f.sink.mu.Unlock()
	for _, u := range f.sink.updates {
		if u.Stats != nil && (u.Stats.ReplicaId != "r1" || u.Stats.ClientVersion != ClientVersion || len(u.Prefixes) != 0) {
			t.Fatalf("stats update %v", u)
		}
	}
}

func TestStatsScrapeHTTPError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "nope", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := (&StatsScraper{URL: srv.URL}).Scrape(ctx); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("err %v", err)
	}
}

func TestParseLoRAAdapters(t *testing.T) {
	m, err := ParseLoRAAdapters(" 1=a, 2 = b ,,")
	if err != nil || len(m) != 2 || m[1] != "a" || m[2] != "b" {
		t.Fatalf("%v %v", m, err)
	}
	if m, err := ParseLoRAAdapters(""); err != nil || len(m) != 0 {
		t.Fatalf("%v %v", m, err)
	}
	for _, bad := range []string{"1", "x=a", "1=", "1=a,1=b"} {
		if _, err := ParseLoRAAdapters(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

// TestStatsLoadFields: the request gauges become ReplicaStats 8-9 (the live
// load), queued prefill tokens only from a configured gauge; an engine
// without the gauges reports no load at all (pressure-only).
func TestStatsLoadFields(t *testing.T) {
	s := &StatsScraper{}
	st, err := s.Parse(strings.NewReader(vllmExposition(1, 2, 0, 0, 3, 5, 0.1, true)))
	if err != nil {
		t.Fatal(err)
	}
	if st.WaitingRequests == nil || st.GetWaitingRequests() != 5 || st.RunningRequests == nil || st.GetRunningRequests() != 3 || st.QueuedPrefillTokens != nil {
		t.Fatalf("vLLM load: waiting %v running %v queued %v", st.WaitingRequests, st.RunningRequests, st.QueuedPrefillTokens)
	}

	s = &StatsScraper{QueuedTokensMetric: "engine:queued_prefill_tokens"}
	text := vllmExposition(1, 2, 0, 0, 3, 5, 0.1, true) + "# TYPE engine:queued_prefill_tokens gauge\nengine:queued_prefill_tokens 12345\n"
	if st, err = s.Parse(strings.NewReader(text)); err != nil {
		t.Fatal(err)
	}
	if st.GetQueuedPrefillTokens() != 12345 {
		t.Fatalf("queued tokens gauge: %v", st.QueuedPrefillTokens)
	}

	sg := "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 7\n# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs -2\n"
	if st, err = (&StatsScraper{}).Parse(strings.NewReader(sg)); err != nil {
		t.Fatal(err)
	}
	if st.GetRunningRequests() != 7 || st.WaitingRequests == nil || st.GetWaitingRequests() != 0 {
		t.Fatalf("SGLang load (negative gauge read as 0): %v", st)
	}

	none := "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.2\n"
	if st, err = (&StatsScraper{}).Parse(strings.NewReader(none)); err != nil {
		t.Fatal(err)
	}
	if st.WaitingRequests != nil || st.RunningRequests != nil {
		t.Fatalf("no request gauges but load reported: %v", st)
	}
}
