package server_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// peakRSS resets the process's peak resident set size (/proc/self/clear_refs)
// when reset is set, and returns the peak since the last reset (VmHWM); 0
// where /proc does not offer it.
func peakRSS(t *testing.T, reset bool) int64 {
	t.Helper()
	if reset {
		if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
			return 0
		}
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("cannot parse VmHWM %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	return 0
}

// TestManyModelsScrapeFlood: a server whose index holds 10,000 models
// serves a bounded /metrics (parsed with expfmt: the busiest
// DefaultMaxModels models and model="__other__"), and 200 concurrent
// scrapes of it gather at most DefaultMaxScrapesInFlight at a time (the
// rest are answered 503), so the scrapes' peak memory stays bounded.
func TestManyModelsScrapeFlood(t *testing.T) {
	const models, clients = 10_000, 200
	s := start(t, testConfig())
	a, ac := chain(1, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := s.cli.ReportCacheState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range models {
		if err := st.Send(&pb.CacheStateUpdate{TenantId: "team", ModelId: fmt.Sprintf("org/model-%05d", i), HashScheme: "vllm", ReplicaId: "r1",
			Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	for i := range models {
		if _, err := s.cli.LookupRoute(ctx, &pb.LookupRouteRequest{TenantId: "team", ModelId: fmt.Sprintf("org/model-%05d", i), HashScheme: "vllm", BlockHashes: a, BlockTokenCounts: ac}); err != nil {
			t.Fatal(err)
		}
	}

	url := "http://" + s.HTTPAddr().String() + "/metrics"
	get := func() (int, []byte, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	code, body, err := get()
	if err != nil || code != http.StatusOK {
		t.Fatalf("scrape: %d %v", code, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v", err)
	}
	vals := map[string]bool{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" {
					vals[l.GetValue()] = true
				}
			}
		}
	}
	lines := bytes.Count(body, []byte("\n"))
	t.Logf("%d models in the index: /metrics has %d lines (%d bytes), %d model label values", models, lines, len(body), len(vals))
	if len(vals) > servermetrics.DefaultMaxModels+1 || !vals[servermetrics.OtherModel] {
		t.Errorf("%d model label values, want at most %d and %s", len(vals), servermetrics.DefaultMaxModels+1, servermetrics.OtherModel)
	}
	if lines > 4000 {
		t.Errorf("%d lines, want a bound independent of the model count", lines)
	}

	hwm0 := peakRSS(t, true)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex // guards byCode
		byCode = map[int]int{}
	)
	for range clients {
		wg.Go(func() {
			code, _, err := get()
			if err != nil {
				code = 0
			}
			mu.Lock()
			byCode[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	hwm1 := peakRSS(t, false)
	t.Logf("%d concurrent scrapes: %v (status: count), peak RSS %+.1f MiB", clients, byCode, float64(hwm1-hwm0)/(1<<20))
	if byCode[http.StatusOK]+byCode[http.StatusServiceUnavailable] != clients || byCode[http.StatusOK] == 0 {
		t.Fatalf("answers %v, want only 200 and 503, some 200", byCode)
	}
	if !raceEnabled && hwm0 > 0 && hwm1-hwm0 >= 128<<20 {
		t.Errorf("peak RSS grew by %.1f MiB during the scrapes, want < 128 MiB", float64(hwm1-hwm0)/(1<<20))
	}
}
