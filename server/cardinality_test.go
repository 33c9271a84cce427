package server_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server/servertest"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// rssBytes reads the process's resident set size from /proc/self/status
// after a full collection that returns freed memory to the OS. It returns 0
// where /proc is not available.
func rssBytes(t *testing.T) int64 {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("cannot parse VmRSS %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	return 0
}

// TestNewModelLookupsBoundMetrics: 20,000 lookups each naming a model the
// index does not hold (UNKNOWN_MODEL, UNKNOWN_TENANT, the reserved tenant)
// add fewer than 2,000 lines to /metrics and less than 64 MiB of RSS: the
// model label of a model without its own series is the shared value.
func TestNewModelLookupsBoundMetrics(t *testing.T) {
	const lookups, workers = 20_000, 8
	s := start(t, testConfig())
	a, ac := chain(1, 4)
	report(t, s.cli, &pb.CacheStateUpdate{TenantId: "team", ModelId: "llama", HashScheme: "vllm", ReplicaId: "r1",
		Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}})
	if r, err := s.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: "llama", HashScheme: "vllm", BlockHashes: a, BlockTokenCounts: ac}); err != nil || r.GetReasonCode() == "" {
		t.Fatalf("warm-up lookup: %v %v", r, err)
	}
	before := strings.Count(servertest.ScrapeText(t, s.Server), "\n")
	rss0 := rssBytes(t)

	tenants := []string{"team", "ghost", policy.ReservedTenantID}
	// One context for every call: tctx registers a cleanup per call, which
	// would itself hold memory until the test ends. 20,000 calls under the
	// race detector on a loaded 2-core machine take well over tctx's 10 s.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < lookups; i += workers {
				_, err := s.cli.LookupRoute(ctx, &pb.LookupRouteRequest{
					TenantId: tenants[i%len(tenants)], ModelId: fmt.Sprintf("new-model-%06d", i), HashScheme: "vllm",
					BlockHashes: a, BlockTokenCounts: ac,
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	text := servertest.ScrapeText(t, s.Server)
	added := strings.Count(text, "\n") - before
	rss1 := rssBytes(t)
	t.Logf("%d lookups naming new models: %d lines added to /metrics (%d bytes now), RSS %+.1f MiB",
		lookups, added, len(text), float64(rss1-rss0)/(1<<20))
	if added >= 2000 {
		t.Errorf("%d lines added to /metrics, want < 2000", added)
	}
	if !raceEnabled && rss0 > 0 && rss1-rss0 >= 64<<20 {
		t.Errorf("RSS grew by %.1f MiB, want < 64 MiB", float64(rss1-rss0)/(1<<20))
	}
	fams := servertest.Scrape(t, s.Server)
	var total float64
	for _, m := range fams[servermetrics.NameLookupCalls].GetMetric() {
		total += m.GetCounter().GetValue()
	}
	if total != lookups+1 {
		t.Errorf("lookup_route_calls_total sums to %v, want %d", total, lookups+1)
	}
	if got, ok := servertest.Value(fams, servermetrics.NameLookupCalls, "hint_used=false,model="+servermetrics.OtherModel+",reason_code="+rpc.ReasonUnknownModel); !ok || got == 0 {
		t.Errorf("no UNKNOWN_MODEL calls under the shared model label (%v, %v)", got, ok)
	}
}

// TestDrainedModelSeriesRetired: a model cleared from the index keeps its
// series (index_entries 0) for the grace period, then the server's sweep
// loop retires them; a configured model keeps its series regardless.
func TestDrainedModelSeriesRetired(t *testing.T) {
	cfg := testConfig()
	cfg.SweepInterval = 20 * time.Millisecond
	cfg.MetricsModelGrace = 100 * time.Millisecond
	cfg.MetricsModels = []string{"pinned"}
	s := start(t, cfg)
	a, ac := chain(1, 2)
	for _, model := range []string{"llama", "pinned"} {
		report(t, s.cli, &pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: "vllm", ReplicaId: "r1",
			Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}})
		if _, err := s.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: "vllm", BlockHashes: a, BlockTokenCounts: ac}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.cli.PublishEvent(tctx(t), &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, TenantId: "team", ModelId: model, ReplicaId: "r1"}); err != nil {
			t.Fatal(err)
		}
	}
	fams := servertest.Scrape(t, s.Server)
	if got, ok := servertest.Value(fams, servermetrics.NameIndexEntries, "model=llama"); !ok || got != 0 {
		t.Fatalf("index_entries{llama} = %v (present %v) right after the clear, want 0", got, ok)
	}
	if _, ok := servertest.Value(fams, servermetrics.NameLookupLatency, "model=llama"); !ok {
		t.Fatal("llama's latency series gone before the grace period")
	}
	waitFor(t, "llama's series to be retired", func() bool {
		fams := servertest.Scrape(t, s.Server)
		_, e := servertest.Value(fams, servermetrics.NameIndexEntries, "model=llama")
		_, l := servertest.Value(fams, servermetrics.NameLookupLatency, "model=llama")
		return !e && !l
	})
	fams = servertest.Scrape(t, s.Server)
	if got, ok := servertest.Value(fams, servermetrics.NameLookupLatency, "model=pinned"); !ok || got != 1 {
		t.Fatalf("the configured model lost its series: %v %v", got, ok)
	}
	if got, ok := servertest.Value(fams, servermetrics.NameIndexEntries, "model=pinned"); !ok || got != 0 {
		t.Fatalf("index_entries{pinned} = %v (present %v), want 0", got, ok)
	}
}

// TestOversizedIDsOverTheWire: through the real server, a 1 MiB tenant id
// is refused (InvalidArgument) and counted as dropped, a 7 MB model name in
// a lookup answers NO_HINT and leaves /metrics as small as it was, and a
// malformed chain is counted under its reason.
func TestOversizedIDsOverTheWire(t *testing.T) {
	s := start(t, testConfig())
	before := len(servertest.ScrapeText(t, s.Server))
	a, ac := chain(1, 2)

	st, err := s.cli.ReportCacheState(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []*pb.CacheStateUpdate{
		{TenantId: strings.Repeat("t", 1<<20), ModelId: "llama", HashScheme: "vllm", ReplicaId: "r1", Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}},
		{TenantId: "team", ModelId: "llama", HashScheme: "vllm", ReplicaId: "r1", Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac[:1]}}},
	} {
		if err := st.Send(u); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.CloseAndRecv(); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "tenant_id") {
		t.Fatalf("1 MiB tenant id: %v, want InvalidArgument naming tenant_id", err)
	}
	resp, err := s.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: strings.Repeat("m", 7<<20), HashScheme: "vllm", BlockHashes: a, BlockTokenCounts: ac})
	if err != nil || resp.GetReasonCode() != rpc.ReasonNoHint {
		t.Fatalf("7 MB model: %v, %v; want NO_HINT", resp, err)
	}
	text := servertest.ScrapeText(t, s.Server)
	if len(text) > before+16<<10 {
		t.Fatalf("/metrics grew from %d to %d bytes", before, len(text))
	}
	fams := servertest.Scrape(t, s.Server)
	for reason, want := range map[string]float64{rpc.DropOversizedID: 1, rpc.DropMalformedChain: 1, rpc.DropIndexFull: 0} {
		if got, ok := servertest.Value(fams, servermetrics.NameDroppedReports, "reason="+reason); !ok || got != want {
			t.Errorf("dropped_reports_total{reason=%s} = %v (present %v), want %v", reason, got, ok, want)
		}
	}
}
