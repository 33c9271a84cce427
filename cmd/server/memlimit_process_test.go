package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/internal/testbin"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// TestFullIndexStaysInsideMemoryLimit runs the server binary as the
// manifests do (--memory-limit from the container limit, here 192 MiB),
// with the entry cap off so only the derived byte budget bounds the index,
// and fills the index far past that budget (about twice the limit's worth
// of entries). The index must evict at its budget and the process's peak
// RSS (the kernel's VmHWM, what the OOM killer compares with the cgroup
// limit) must stay below the limit.
func TestFullIndexStaysInsideMemoryLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and fills a server; skipped with -short")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc for the peak RSS")
	}
	const limit = 192 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A binary of its own: without -race, so its memory is what a pod's is.
	dir := t.TempDir()
	bin := filepath.Join(dir, "server")
	if err := testbin.Build(ctx, dir, "./cmd/server"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "--insecure-disable-auth", "--max-index-entries=0",
		"--memory-limit="+strconv.Itoa(limit), "--grpc-bind-address=127.0.0.1:0",
		"--http-bind-address=127.0.0.1:0", "--snapshot-bind-address=127.0.0.1:0")
	cmd.Env = append(os.Environ(), "GOMEMLIMIT=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	// The start-up log names the listeners.
	var serving struct{ GRPC, HTTP string }
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		if strings.Contains(lines.Text(), "inferencecache server serving") {
			if err := json.Unmarshal(lines.Bytes(), &serving); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if serving.GRPC == "" {
		t.Fatal("the server did not log its listeners")
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()

	conn, err := grpc.NewClient(serving.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Sample the anonymous RSS while filling: the cgroup charges file pages
	// (the binary's text) too, but reclaims them before it OOM-kills, so
	// anonymous memory is what must stay below the limit.
	peak := make(chan int64, 1)
	stopSampling := make(chan struct{})
	go func() {
		var max int64
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			if v, ok := procStatus(cmd.Process.Pid, "RssAnon:"); ok && v > max {
				max = v
			}
			select {
			case <-stopSampling:
				peak <- max
				return
			case <-tick.C:
			}
		}
	}()
	stream, err := pb.NewInferenceCacheClient(conn).ReportCacheState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 4 replicas x 1M distinct prefixes: some 200 MB of index unbounded.
	const replicas, perReplica, batch = 4, 1 << 20, 4096
	key := uint64(1)
	for r := range replicas {
		for sent := 0; sent < perReplica; sent += batch {
			u := &pb.CacheStateUpdate{ReplicaId: fmt.Sprintf("r%d", r), TenantId: "t", ModelId: "m", HashScheme: "vllm"}
			for range batch {
				u.Prefixes = append(u.Prefixes, &pb.PrefixEntry{PrefixHash: fingerprint.AppendWire(nil, key), TokenCount: 16})
				key++
			}
			if err := stream.Send(u); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}

	budgeted := scrapeValue(t, ctx, "http://"+serving.HTTP+"/metrics", `inferencecache_index_memory_bytes{component="budgeted"}`)
	if budgeted > limit/2 {
		t.Errorf("the index holds %.0f budgeted bytes, over its budget of %d", budgeted, limit/2)
	}
	if ev := scrapeValue(t, ctx, "http://"+serving.HTTP+"/metrics", `inferencecache_index_evictions_total{algorithm="lru",reason="cap"}`); ev == 0 {
		t.Error("nothing was evicted: the fill did not reach the budget, so it proves nothing")
	}
	if testing.Verbose() {
		for _, c := range []string{"arena_slabs", "arena_live", "tables", "queues", "overhead", "budgeted", "total"} {
			t.Logf("index %s: %.1f MiB", c, scrapeValue(t, ctx, "http://"+serving.HTTP+"/metrics", `inferencecache_index_memory_bytes{component="`+c+`"}`)/(1<<20))
		}
		for _, s := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_sys_bytes", "go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes", "go_gc_gomemlimit_bytes", "process_resident_memory_bytes"} {
			t.Logf("%s: %.1f MiB", s, scrapeValue(t, ctx, "http://"+serving.HTTP+"/metrics", s)/(1<<20))
		}
	}
	close(stopSampling)
	anon := <-peak
	hwm, _ := procStatus(cmd.Process.Pid, "VmHWM:")
	t.Logf("limit %d MiB: budgeted index %.1f MiB, peak anonymous RSS %.1f MiB (peak RSS with file pages %.1f MiB)",
		limit>>20, budgeted/(1<<20), float64(anon)/(1<<20), float64(hwm)/(1<<20))
	if anon == 0 {
		t.Fatal("no RssAnon sample")
	}
	if anon >= limit {
		t.Errorf("peak anonymous RSS %d bytes reached the memory limit %d: the pod would be OOM-killed", anon, limit)
	}
}

// scrapeValue reads one series of a Prometheus text exposition.
func scrapeValue(t *testing.T, ctx context.Context, url, series string) float64 {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no series %s in /metrics", series)
	return 0
}

// procStatus reads a kB field of /proc/<pid>/status, in bytes.
func procStatus(pid int, field string) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}
