package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	"github.com/inferencecache/inferencecache/server/servertest"
)

// rankEngines starts fake engines for ranks 0..n-1 on base+rank ports (PUB
// and replay), as a data-parallel vLLM binds them.
func rankEngines(t *testing.T, n int) (pubs []*fakeengine.Publisher, pubBase, repBase int) {
	t.Helper()
	free := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port
	}
	for range 20 {
		pp, rp := free(), free()
		var started []*fakeengine.Publisher
		for r := range n {
			pub, err := fakeengine.NewPublisher(fakeengine.Config{
				Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pp+r), ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", rp+r),
				Topic: "kv-events", RingSize: 100})
			if err != nil {
				break
			}
			started = append(started, pub)
		}
		if len(started) == n {
			for _, p := range started {
				t.Cleanup(func() { _ = p.Close() })
			}
			return started, pp, rp
		}
		for _, p := range started {
			_ = p.Close()
		}
	}
	t.Fatal("cannot bind consecutive ports for the ranks")
	return nil, 0, 0
}

// connectingRankEngines starts fake engines for ranks 0..n-1 as the pod
// injection wires a data-parallel vLLM: rank r's PUB connects to
// 127.0.0.1:base+r (which the subscriber binds), its replay ROUTER binds
// base+n+r. It returns the engines and base.
func connectingRankEngines(t *testing.T, n int) ([]*fakeengine.Publisher, int) {
	t.Helper()
	for range 20 {
		// 2n consecutive free ports: listen on them all, then let go.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := ln.Addr().(*net.TCPAddr).Port
		held := []net.Listener{ln}
		for i := 1; i < 2*n; i++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				break
			}
			held = append(held, l)
		}
		for _, l := range held {
			_ = l.Close()
		}
		if len(held) < 2*n {
			continue
		}
		var started []*fakeengine.Publisher
		for r := range n {
			pub, err := fakeengine.NewPublisher(fakeengine.Config{
				Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+r), Connect: true,
				ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", base+n+r), Topic: "kv-events", RingSize: 100})
			if err != nil {
				break
			}
			started = append(started, pub)
		}
		if len(started) == n {
			for _, p := range started {
				t.Cleanup(func() { _ = p.Close() })
			}
			return started, base
		}
		for _, p := range started {
			_ = p.Close()
		}
	}
	t.Fatal("cannot find consecutive free ports for the ranks")
	return nil, 0
}

// TestRunDataParallel: one subscriber process for a 2-rank data-parallel
// engine (--data-parallel-size 2) follows each rank on its port (base +
// rank) and reports each as its own replica, <pod>-dp<rank>, to a real
// server: its rank's blocks and its rank's load (the engine's /metrics
// carries both ranks, labelled engine="<rank>"). The bind variant is the
// layout the pod injection wires: the subscriber binds 127.0.0.1:base+r
// (--engine-endpoint-mode=bind) and each rank's PUB connects to it; the
// replays follow the last rank's publisher (base+2+r).
func TestRunDataParallel(t *testing.T) {
	for _, bind := range []bool{false, true} {
		t.Run(fmt.Sprintf("bind=%t", bind), func(t *testing.T) { runDataParallel(t, bind) })
	}
}

func runDataParallel(t *testing.T, bind bool) {
	srv := servertest.Start(t, nil)
	var (
		pubs             []*fakeengine.Publisher
		pubBase, repBase int
		mode             = "connect"
	)
	if bind {
		pubs, pubBase = connectingRankEngines(t, 2)
		repBase, mode = pubBase+2, "bind"
	} else {
		pubs, pubBase, repBase = rankEngines(t, 2)
	}
	page := "# TYPE vllm:num_requests_running gauge\n" +
		"vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\n" +
		"vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 7\n" +
		"# TYPE vllm:num_requests_waiting gauge\n" +
		"vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\n" +
		"vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 5\n"
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(page)) }))
	t.Cleanup(metrics.Close)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// wctx bounds the waits below and ends early if run returns.
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	go func() {
		defer wcancel()
		done <- run(ctx, []string{"--replica-id", "pod", "--tenant-id", "t", "--model-id", "m",
			"--engine-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", pubBase),
			"--engine-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", repBase), "--engine-endpoint-mode", mode,
			"--engine-metrics-url", metrics.URL, "--stats-interval", "50ms",
			"--server-address", srv.GRPCAddr().String(), "--metrics-bind-address", "",
			"--state-file", filepath.Join(t.TempDir(), "state"), "--log-level", "warn",
			"--data-parallel-size", "2"})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("run did not return")
		}
	})

	for _, p := range pubs {
		if err := p.WaitSubscribed(wctx); err != nil {
			select {
			case err := <-done:
				t.Fatalf("run: %v", err)
			default:
			}
			t.Fatal(err)
		}
	}
	for rank, p := range pubs {
		for b := range rank + 1 { // rank r holds r+1 blocks
			h := uint64(100*(rank+1) + b)
			toks := make([]uint32, 16)
			for i := range toks {
				toks[i] = uint32(h*16) + uint32(i)
			}
			if _, err := p.Publish(fakeengine.Batch{TS: float64(time.Now().Unix()), Events: []fakeengine.Event{{
				Kind: fakeengine.BlockStored, BlockHashes: []uint64{h}, TokenIDs: toks, BlockSize: 16}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := map[string]struct {
		prefixes         int64
		running, waiting int32
	}{"pod-dp0": {1, 3, 1}, "pod-dp1": {2, 7, 5}}
	var rows map[string]controlapi.ReplicaSnapshot
	for {
		rows = map[string]controlapi.ReplicaSnapshot{}
		for _, r := range srv.Engine().Snapshot().Replicas {
			if r.Tenant == "t" {
				rows[r.ReplicaID] = r
			}
		}
		ok := len(rows) == len(want)
		for id, w := range want {
			r, found := rows[id]
			ok = ok && found && r.PrefixCount == w.prefixes && r.Load != nil &&
				r.Load.RunningRequests == w.running && r.Load.WaitingRequests == w.waiting
		}
		if ok {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("run returned: %v", err)
		case <-wctx.Done():
			var b strings.Builder
			for id, r := range rows {
				fmt.Fprintf(&b, "\n  %s: prefixes %d load %+v", id, r.PrefixCount, r.Load)
			}
			t.Fatalf("server replicas of tenant t:%s\nwant pod-dp0 (1 block, 3 running, 1 waiting) and pod-dp1 (2 blocks, 7 running, 5 waiting)", b.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
