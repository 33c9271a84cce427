package kvevents

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
)

func TestRankEndpoint(t *testing.T) {
	for _, tc := range []struct {
		ep   string
		rank int
		want string // "" = error
	}{
		{"tcp://127.0.0.1:5557", 0, "tcp://127.0.0.1:5557"},
		{"tcp://127.0.0.1:5557", 3, "tcp://127.0.0.1:5560"},
		{"tcp://[::1]:5558", 1, "tcp://[::1]:5559"},
		{"tcp://engine:5557", 2, "tcp://engine:5559"},
		{"ipc:///tmp/kv", 1, "ipc:///tmp/kv_dp1"},
		{"inproc://cache", 2, "inproc://cache_dp2"},
		{"tcp://127.0.0.1:65535", 1, ""},
		{"tcp://127.0.0.1", 1, ""},
		{"tcp://127.0.0.1:x", 1, ""},
		{"udp://127.0.0.1:5557", 1, ""},
		{"127.0.0.1:5557", 1, ""},
	} {
		got, err := RankEndpoint(tc.ep, tc.rank)
		if tc.want == "" {
			if err == nil {
				t.Errorf("RankEndpoint(%q, %d) = %q, want an error", tc.ep, tc.rank, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("RankEndpoint(%q, %d) = %q, %v; want %q", tc.ep, tc.rank, got, err, tc.want)
		}
	}
}

func TestDataParallelConfig(t *testing.T) {
	base := Config{ReplicaID: "pod", ModelID: "m", HashScheme: "vllm", Endpoint: "tcp://127.0.0.1:5557",
		ReplayEndpoint: "tcp://127.0.0.1:5600", StateFile: "/s/state"}
	// One rank: everything as given (the replica is the pod).
	for _, d := range []DataParallel{{Size: 0, Rank: -1}, {Size: 1, Rank: -1}, {Size: 1, Rank: 0}} {
		if err := d.Validate(); err != nil {
			t.Fatalf("%+v: %v", d, err)
		}
		if r := d.Ranks(); len(r) != 1 || r[0] != 0 {
			t.Fatalf("%+v: ranks %v", d, r)
		}
		c, err := d.Config(base, 0)
		if err != nil || c.ReplicaID != "pod" || c.Endpoint != base.Endpoint || c.MetricsRankLabel != "" || c.StateFile != base.StateFile {
			t.Fatalf("%+v: %+v, %v", d, c, err)
		}
	}
	d := DataParallel{Size: 4, Rank: -1}
	if r := d.Ranks(); fmt.Sprint(r) != "[0 1 2 3]" {
		t.Fatalf("ranks %v", r)
	}
	c, err := d.Config(base, 2)
	if err != nil {
		t.Fatal(err)
	}
	if c.ReplicaID != "pod-dp2" || c.Endpoint != "tcp://127.0.0.1:5559" || c.ReplayEndpoint != "tcp://127.0.0.1:5602" ||
		c.StateFile != "/s/state.dp2" || c.MetricsRankLabel != RankLabelVLLM || c.MetricsRank != "2" {
		t.Fatalf("rank 2: %+v", c)
	}
	sg := base
	sg.HashScheme = "sglang"
	if c, _ := d.Config(sg, 1); c.MetricsRankLabel != RankLabelSGLang {
		t.Fatalf("sglang rank label %q", c.MetricsRankLabel)
	}
	if c, _ := (DataParallel{Size: 2, Rank: 1, RankLabel: "dp"}).Config(base, 1); c.MetricsRankLabel != "dp" {
		t.Fatalf("explicit rank label %q", c.MetricsRankLabel)
	}
	if r := (DataParallel{Size: 4, Rank: 3}).Ranks(); fmt.Sprint(r) != "[3]" {
		t.Fatalf("one rank: %v", r)
	}
	for _, bad := range []DataParallel{{Size: -1, Rank: -1}, {Size: 2, Rank: 2}, {Size: 2, Rank: -2}, {Size: 1, Rank: 1}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if _, err := d.Config(base, 4); err == nil {
		t.Error("rank 4 of 4 accepted")
	}
}

// dpExposition renders a vLLM /metrics page of two data-parallel ranks
// (series labelled engine="0" and "1"), rank r with running = 10*(r+1)
// and waiting = r+1, plus an SGLang-style dp_rank-labelled family.
func dpExposition() string {
	var b strings.Builder
	for _, g := range []struct {
		name string
		v    func(r int) int
	}{
		{"vllm:num_requests_running", func(r int) int { return 10 * (r + 1) }},
		{"vllm:num_requests_waiting", func(r int) int { return r + 1 }},
	} {
		fmt.Fprintf(&b, "# TYPE %s gauge\n", g.name)
		for r := range 2 {
			fmt.Fprintf(&b, "%s{engine=\"%d\",model_name=\"m\"} %d\n", g.name, r, g.v(r))
		}
	}
	b.WriteString("# TYPE vllm:kv_cache_usage_perc gauge\n")
	b.WriteString("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n")
	b.WriteString("vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.75\n")
	return b.String()
}

// TestStatsRankFilter: a rank's scraper reads only its own series; without
// a rank every series is summed (one engine, or one replica per pod).
func TestStatsRankFilter(t *testing.T) {
	for _, tc := range []struct {
		rank             string
		running, waiting int32
		mem              int64
	}{{"0", 10, 1, 250}, {"1", 20, 2, 750}, {"", 30, 3, 1000}} {
		s := &StatsScraper{CacheSizeBytes: 1000}
		if tc.rank != "" {
			s.RankLabel, s.Rank = RankLabelVLLM, tc.rank
		}
		st, err := s.Parse(strings.NewReader(dpExposition()))
		if err != nil {
			t.Fatal(err)
		}
		if st.GetRunningRequests() != tc.running || st.GetWaitingRequests() != tc.waiting || st.CacheMemoryBytes != tc.mem {
			t.Errorf("rank %q: running %d waiting %d mem %d; want %d %d %d", tc.rank,
				st.GetRunningRequests(), st.GetWaitingRequests(), st.CacheMemoryBytes, tc.running, tc.waiting, tc.mem)
		}
	}
	// A rank the page does not have: its gauges are absent, not 0 of
	// someone else's.
	s := &StatsScraper{RankLabel: RankLabelVLLM, Rank: "7"}
	st, err := s.Parse(strings.NewReader(dpExposition()))
	if err != nil {
		t.Fatal(err)
	}
	if st.RunningRequests != nil || st.WaitingRequests != nil {
		t.Errorf("rank 7 got load %v/%v", st.RunningRequests, st.WaitingRequests)
	}
	// SGLang labels its ranks dp_rank.
	page := "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{dp_rank=\"0\",tp_rank=\"0\"} 4\n" +
		"sglang:num_running_reqs{dp_rank=\"1\",tp_rank=\"0\"} 6\n"
	s = &StatsScraper{RankLabel: RankLabelSGLang, Rank: "1"}
	if st, err := s.Parse(strings.NewReader(page)); err != nil || st.GetRunningRequests() != 6 {
		t.Errorf("sglang rank 1: %v, %v", st, err)
	}
}

// startRankEngines starts fake engines for ranks 0..n-1 whose PUB and
// replay ports follow the engines' rule (base + rank), and returns them
// with the rank-0 endpoints.
func startRankEngines(t *testing.T, n int) (pubs []*fakeengine.Publisher, pubBase, repBase string) {
	t.Helper()
	freeRun := func() int {
		for range 50 {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			p := ln.Addr().(*net.TCPAddr).Port
			_ = ln.Close()
			if p+n <= 65535 {
				return p
			}
		}
		t.Fatal("no free port")
		return 0
	}
	for range 20 {
		pp, rp := freeRun(), freeRun()
		var started []*fakeengine.Publisher
		ok := true
		for r := range n {
			pub, err := fakeengine.NewPublisher(fakeengine.Config{
				Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pp+r), ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", rp+r),
				Topic: "kv-events", RingSize: 100})
			if err != nil {
				ok = false
				break
			}
			started = append(started, pub)
		}
		if ok {
			for _, p := range started {
				t.Cleanup(func() { _ = p.Close() })
			}
			return started, fmt.Sprintf("tcp://127.0.0.1:%d", pp), fmt.Sprintf("tcp://127.0.0.1:%d", rp)
		}
		for _, p := range started {
			_ = p.Close()
		}
	}
	t.Fatal("cannot bind consecutive ports for the ranks")
	return nil, "", ""
}

// TestDataParallelSubscribers: one subscriber per rank, configured from the
// rank-0 endpoints by DataParallel.Config, follows its rank's engine and
// reports as <pod>-dp<rank>, with its rank's blocks and its rank's stats.
func TestDataParallelSubscribers(t *testing.T) {
	pubs, pubBase, repBase := startRankEngines(t, 2)
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(dpExposition()))
	}))
	t.Cleanup(metrics.Close)
	d := DataParallel{Size: 2, Rank: -1}
	base := Config{ReplicaID: "pod", ModelID: "m", TenantID: "t", HashScheme: "vllm",
		Endpoint: pubBase, ReplayEndpoint: repBase, Topic: "kv-events", MetricsURL: metrics.URL,
		Window: 10 * time.Millisecond, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		ReconnectBackoff: 50 * time.Millisecond, ReplayTimeout: 2 * time.Second, Heartbeat: -1,
		StatsInterval: 20 * time.Millisecond}
	var subs []*runningSub
	for _, rank := range d.Ranks() {
		pub := pubs[rank]
		r := runSub(t, pub, func(c *Config) {
			rc, err := d.Config(base, rank)
			if err != nil {
				t.Fatal(err)
			}
			rc.Registerer = prometheus.NewRegistry()
			*c = rc
		})
		subs = append(subs, r)
	}
	for rank, pub := range pubs {
		last := publish(t, pub, rootBatch(uint64(10*(rank+1))), rootBatch(uint64(10*(rank+1)+1)))
		subs[rank].settle(t, last+1)
	}
	for rank, r := range subs {
		want := fmt.Sprintf("pod-dp%d", rank)
		ctx := testCtx(t, 10*time.Second)
		for {
			r.sink.mu.Lock()
			var stats int
			for _, u := range r.sink.updates {
				if u.ReplicaId != want {
					r.sink.mu.Unlock()
					t.Fatalf("rank %d reported as %q, want %q", rank, u.ReplicaId, want)
				}
				if u.Stats != nil {
					if u.Stats.GetRunningRequests() != int32(10*(rank+1)) || u.Stats.GetWaitingRequests() != int32(rank+1) {
						r.sink.mu.Unlock()
						t.Fatalf("rank %d stats: running %d waiting %d", rank, u.Stats.GetRunningRequests(), u.Stats.GetWaitingRequests())
					}
					stats++
				}
			}
			r.sink.mu.Unlock()
			if stats > 0 {
				break
			}
			if !sleepCtx(ctx, 5*time.Millisecond) {
				t.Fatalf("rank %d sent no stats", rank)
			}
		}
		own := uint64(10 * (rank + 1))
		if !holdsEngine(r.Index(), own) || !holdsEngine(r.Index(), own+1) || r.Index().Len() != 2 {
			t.Fatalf("rank %d holds %v, want engine blocks %d and %d", rank, r.Index().AppendState(nil), own, own+1)
		}
		checkAgrees(t, r)
	}
}
