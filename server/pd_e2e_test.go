package server_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// End to end, real server and real gRPC on 127.0.0.1: LookupPDRoute,
// StreamCacheEvents and StreamMetrics (RenderTemplate: template_e2e_test.go).

func wire8(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// chainUpdate is a producer's report of hashes 1..n (16 tokens each), with
// a placement and a load report.
func pdChainUpdate(replica string, role pb.ReplicaRole, pool string, n int, waiting, running int32, queued int64) *pb.CacheStateUpdate {
	var hs [][]byte
	var cs []int32
	for i := 1; i <= n; i++ {
		hs = append(hs, wire8(uint64(i)))
		cs = append(cs, 16)
	}
	u := &pb.CacheStateUpdate{ReplicaId: replica, TenantId: "team-a", ModelId: "llama", HashScheme: "vllm",
		Role: role, PdPool: pool, NodeName: "node-" + replica, Zone: "zone-1",
		Stats: &pb.ReplicaStats{WaitingRequests: &waiting, RunningRequests: &running, QueuedPrefillTokens: &queued}}
	if n > 0 {
		u.Prefixes = []*pb.PrefixEntry{{BlockHashes: hs, BlockTokenCounts: cs}}
	}
	return u
}

const pdPolicy = `{"version": 8,
  "pdTopologies": [
    {"namespace": "team-a", "name": "llama-pd", "prefillPools": [{"name": "prefill"}], "decodePools": [{"name": "decode"}],
     "transport": "Mooncake", "skipPrefillBelowTokens": 100},
    {"namespace": "team-a", "name": "no-decode", "prefillPools": [{"name": "prefill"}], "decodePools": [{"name": "absent"}]},
    {"namespace": "team-a", "name": "no-prefill", "prefillPools": [{"name": "absent"}], "decodePools": [{"name": "decode"}]}
  ]}`

func TestE2ELookupPDRoute(t *testing.T) {
	r := start(t, testConfig())
	servertest.PushPolicy(t, r.Server, pdPolicy)
	// p-cold holds nothing, p-warm holds 8 blocks (128 tokens) of the
	// prompt; d1 holds 4 blocks and is busier than d2.
	report(t, r.cli, pdChainUpdate("p-cold", pb.ReplicaRole_REPLICA_ROLE_PREFILL, "prefill", 0, 0, 1, 0))
	report(t, r.cli, pdChainUpdate("p-warm", pb.ReplicaRole_REPLICA_ROLE_PREFILL, "prefill", 8, 0, 1, 0))
	report(t, r.cli, pdChainUpdate("d1", pb.ReplicaRole_REPLICA_ROLE_DECODE, "decode", 4, 0, 20, 0))
	report(t, r.cli, pdChainUpdate("d2", pb.ReplicaRole_REPLICA_ROLE_DECODE, "decode", 0, 0, 2, 0))

	chain := func(n int) ([][]byte, []int32) {
		var hs [][]byte
		var cs []int32
		for i := 1; i <= n; i++ {
			hs, cs = append(hs, wire8(uint64(i))), append(cs, 16)
		}
		return hs, cs
	}
	hs, cs := chain(8)
	for _, c := range []struct {
		name                    string
		req                     *pb.LookupPDRouteRequest
		reason, prefill, decode string
		transport               string
		check                   func(*pb.LookupPDRouteResponse) bool
	}{
		{"disaggregated: the warm prefill replica, the idler decode replica",
			&pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "llama", PdTopologyRef: "team-a/llama-pd", HashScheme: "vllm", BlockHashes: hs, BlockTokenCounts: cs, PrefixTokenCount: 2000},
			rpc.ReasonPDDisaggregated, "p-warm", "d2", "Mooncake", func(resp *pb.LookupPDRouteResponse) bool {
				return resp.GetPrefillMatchedTokens() == 128 && resp.GetUncachedTokens() == 2000-128 && resp.GetDecodeMatchedTokens() == 0
			}},
		// Load-aware: what was routed counts. p-warm now has the first
		// prompt's 1,872 uncached tokens queued: 1,872 + 2 x 1,872 (the
		// P/D prefill weight) outweighs p-cold's 2 x 2,000.
		{"bare topology name in the tenant's namespace; the first prompt's queue sends it to p-cold",
			&pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "llama", PdTopologyRef: "llama-pd", HashScheme: "vllm", BlockHashes: hs, BlockTokenCounts: cs, PrefixTokenCount: 2000},
			rpc.ReasonPDDisaggregated, "p-cold", "d2", "Mooncake", nil},
		{"short prompt: decode does it all",
			&pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "llama", PdTopologyRef: "team-a/llama-pd", HashScheme: "vllm", PrefixTokenCount: 80},
			rpc.ReasonPDPrefillSkipped, "", "d2", "", nil},
		// The cheapest prefill replica (p-warm, 1,872 queued) is further
		// behind than decode doing the 500 tokens itself (d2: 80 queued):
		// the prefill pool is backlogged, the hop is skipped.
		{"token_ids are fingerprinted; a backlogged prefill pool is skipped",
			&pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "llama", PdTopologyRef: "team-a/llama-pd", HashScheme: "vllm", TokenIds: make([]uint32, 500)},
			rpc.ReasonPDPrefillSkipped, "", "d2", "", func(resp *pb.LookupPDRouteResponse) bool { return resp.GetUncachedTokens() == 500 }},
		{"no decode replica", &pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "llama", PdTopologyRef: "team-a/no-decode", PrefixTokenCount: 2000},
			rpc.ReasonNoDecodePool, "", "", "", nil},
		{"no prefill replica: decode named to run it alone", &pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "llama", PdTopologyRef: "team-a/no-prefill", PrefixTokenCount: 2000},
			rpc.ReasonNoPrefillPool, "", "d2", "", nil},
		{"unknown topology", &pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "llama", PdTopologyRef: "team-a/nope"},
			rpc.ReasonUnknownTopology, "", "", "", nil},
		{"empty ref with several topologies", &pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "llama"},
			rpc.ReasonUnknownTopology, "", "", "", nil},
		{"unknown model: nobody to pick", &pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "other", PdTopologyRef: "team-a/llama-pd"},
			rpc.ReasonNoDecodePool, "", "", "", nil},
		{"unbalanced chain", &pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "llama", PdTopologyRef: "team-a/llama-pd", BlockHashes: hs},
			rpc.ReasonNoHint, "", "", "", nil},
		{"reserved tenant", &pb.LookupPDRouteRequest{TenantId: "inferencecache.io/probe", ModelId: "llama", PdTopologyRef: "x/y"},
			rpc.ReasonNoHint, "", "", "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, err := r.cli.LookupPDRoute(tctx(t), c.req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetReasonCode() != c.reason || resp.GetPrefillReplicaId() != c.prefill || resp.GetDecodeReplicaId() != c.decode || resp.GetTransportHint() != c.transport ||
				(c.check != nil && !c.check(resp)) {
				t.Errorf("got %v", resp)
			}
		})
	}
	// And back: p-cold's 2,000 queued tokens and no cache now cost more
	// than p-warm's 1,872 with its 128 cached (6,000 against 5,616).
	resp, _ := r.cli.LookupPDRoute(tctx(t), &pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "llama", PdTopologyRef: "team-a/llama-pd", HashScheme: "vllm", BlockHashes: hs, BlockTokenCounts: cs, PrefixTokenCount: 2000})
	if resp.GetPrefillReplicaId() != "p-warm" {
		t.Errorf("after one prompt on each prefill replica: %v, want p-warm", resp)
	}
	// A deadline already past.
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	time.Sleep(time.Millisecond)
	if _, err := r.cli.LookupPDRoute(ctx, &pb.LookupPDRouteRequest{TenantId: "team-a", ModelId: "llama", PdTopologyRef: "llama-pd"}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("expired deadline: %v", err)
	}

	fams := servertest.Scrape(t, r.Server)
	for reason, want := range map[string]float64{
		rpc.ReasonPDDisaggregated: 3, rpc.ReasonPDPrefillSkipped: 2, rpc.ReasonNoDecodePool: 2,
		rpc.ReasonNoPrefillPool: 1, rpc.ReasonUnknownTopology: 2, rpc.ReasonNoHint: 2, rpc.ReasonTimeout: 0,
	} {
		if got, ok := servertest.Value(fams, servermetrics.NamePDRouteCalls, "reason_code="+reason); !ok || got != want {
			t.Errorf("%s{reason_code=%s} = %v (present %v), want %v", servermetrics.NamePDRouteCalls, reason, got, ok, want)
		}
	}
	if got, _ := servertest.Value(fams, servermetrics.NamePDRouteLatency, ""); got != 12 {
		t.Errorf("latency observations %v, want 12 (the expired call never left the client)", got)
	}
}

// eventStream opens StreamCacheEvents and waits until it is live.
func eventStream(t *testing.T, ctx context.Context, cli pb.InferenceCacheClient, req *pb.StreamEventsRequest) pb.InferenceCache_StreamCacheEventsClient {
	t.Helper()
	st, err := cli.StreamCacheEvents(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	md, err := st.Header()
	if err != nil {
		t.Fatalf("no stream header: %v", err)
	}
	if got := md.Get(rpc.StreamReadyHeader); len(got) != 1 || got[0] != rpc.StreamCacheEventsName {
		t.Fatalf("stream header %v", md)
	}
	return st
}

func recvEvents(t *testing.T, st pb.InferenceCache_StreamCacheEventsClient, n int) []*pb.CacheEvent {
	t.Helper()
	var out []*pb.CacheEvent
	for len(out) < n {
		ev, err := st.Recv()
		if err != nil {
			t.Fatalf("after %d events: %v", len(out), err)
		}
		out = append(out, ev)
	}
	return out
}

func TestE2EStreamCacheEvents(t *testing.T) {
	r := start(t, testConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	all := eventStream(t, ctx, r.cli, &pb.StreamEventsRequest{})
	evictions := eventStream(t, ctx, r.cli, &pb.StreamEventsRequest{TenantId: "team-a", Types: []pb.CacheEvent_Type{pb.CacheEvent_PREFIX_EVICTED, pb.CacheEvent_ALL_CLEARED}})

	report(t, r.cli, &pb.CacheStateUpdate{ReplicaId: "r1", TenantId: "team-a", ModelId: "llama", HashScheme: "vllm", AdapterId: "sql",
		Prefixes: []*pb.PrefixEntry{{BlockHashes: [][]byte{wire8(1), wire8(2)}, BlockTokenCounts: []int32{16, 16}, Tier: pb.CacheTier_CACHE_TIER_T2}}})
	report(t, r.cli, &pb.CacheStateUpdate{ReplicaId: "r9", TenantId: "team-b", ModelId: "llama", HashScheme: "vllm",
		Prefixes: []*pb.PrefixEntry{{PrefixHash: wire8(7), TokenCount: 16}}})
	if _, err := r.cli.PublishEvent(tctx(t), &pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, ReplicaId: "r1", TenantId: "team-a", ModelId: "llama", PrefixHash: wire8(2)}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.cli.PublishEvent(tctx(t), &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, ReplicaId: "r1", TenantId: "team-a", ModelId: "llama"}); err != nil {
		t.Fatal(err)
	}

	got := recvEvents(t, all, 6)
	want := []string{
		"PREFIX_ADDED team-a/llama r1 sql vllm 0000000000000001 16 CACHE_TIER_T2 ",
		"PREFIX_ADDED team-a/llama r1 sql vllm 0000000000000002 32 CACHE_TIER_T2 ",
		"PREFIX_ADDED team-b/llama r9  vllm 0000000000000007 16 CACHE_TIER_T1 ",
		"PREFIX_EVICTED team-a/llama r1 sql vllm 0000000000000002 0 CACHE_TIER_UNSPECIFIED engine",
		"ALL_CLEARED team-a/llama r1    0 CACHE_TIER_UNSPECIFIED engine",
		"REPLICA_REMOVED team-a/llama r1    0 CACHE_TIER_UNSPECIFIED engine",
	}
	for i, ev := range got {
		s := fmt.Sprintf("%s %s/%s %s %s %s %x %d %s %s", ev.GetType(), ev.GetTenantId(), ev.GetModelId(), ev.GetReplicaId(), ev.GetAdapterId(),
			ev.GetHashScheme(), ev.GetPrefixHash(), ev.GetTokenCount(), ev.GetTier(), ev.GetReason())
		if s != want[i] {
			t.Errorf("event %d:\n got %s\nwant %s", i, s, want[i])
		}
		if ev.GetTimestampUs() == 0 {
			t.Errorf("event %d has no timestamp", i)
		}
	}
	if got := recvEvents(t, evictions, 2); got[0].GetType() != pb.CacheEvent_PREFIX_EVICTED || got[1].GetType() != pb.CacheEvent_ALL_CLEARED {
		t.Errorf("filtered stream: %v", got)
	}

	// Refusals.
	for name, req := range map[string]*pb.StreamEventsRequest{
		"reserved tenant": {TenantId: "inferencecache.io/probe"},
		"unknown type":    {Types: []pb.CacheEvent_Type{42}},
	} {
		st, err := r.cli.StreamCacheEvents(tctx(t), req)
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	cancel()
	waitFor(t, "the event streams to close", func() bool {
		v, _ := servertest.Value(servertest.Scrape(t, r.Server), servermetrics.NameStreamsOpen, "stream=cache_events")
		return v == 0
	})
	fams := servertest.Scrape(t, r.Server)
	if v, _ := servertest.Value(fams, servermetrics.NameStreamMessages, "stream=cache_events"); v != 8 {
		t.Errorf("messages sent %v, want 8", v)
	}
	if v, _ := servertest.Value(fams, servermetrics.NameStreamsEnded, "outcome=refused,stream=cache_events"); v != 2 {
		t.Errorf("refused streams %v, want 2", v)
	}
}

// TestE2ESlowSubscriber: a subscriber that reads slowly falls behind its
// buffer and is ended with RESOURCE_EXHAUSTED (counted), while producers
// are never held up.
func TestE2ESlowSubscriber(t *testing.T) {
	cfg := testConfig()
	cfg.EventStreamBuffer = 64
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	slow := eventStream(t, ctx, r.cli, &pb.StreamEventsRequest{})
	fast := eventStream(t, ctx, r.cli, &pb.StreamEventsRequest{TenantId: "nobody"}) // receives nothing, never behind

	// 200 updates of 50 new blocks each: 10,000 events against a buffer
	// of 64. Producers must finish whatever the subscriber does.
	done := make(chan error, 1)
	go func() {
		st, err := r.cli.ReportCacheState(ctx)
		if err != nil {
			done <- err
			return
		}
		for i := range 200 {
			var hs [][]byte
			var cs []int32
			for j := range 50 {
				hs, cs = append(hs, wire8(uint64(i*50+j+1))), append(cs, 16)
			}
			if err := st.Send(&pb.CacheStateUpdate{ReplicaId: "r1", TenantId: "team-a", ModelId: "llama", HashScheme: "vllm",
				Prefixes: []*pb.PrefixEntry{{BlockHashes: hs, BlockTokenCounts: cs}}}); err != nil {
				done <- err
				return
			}
		}
		_, err = st.CloseAndRecv()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the producer was held up by a slow subscriber")
	}
	// Reading slowly now, the subscriber meets the end of its stream.
	var n int
	var err error
	for {
		if _, err = slow.Recv(); err != nil {
			break
		}
		n++
		time.Sleep(time.Millisecond)
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "fell 64 events behind") {
		t.Fatalf("after %d events: %v, want RESOURCE_EXHAUSTED", n, err)
	}
	if n >= 10000 {
		t.Errorf("the slow subscriber received all %d events", n)
	}
	fams := servertest.Scrape(t, r.Server)
	if v, _ := servertest.Value(fams, servermetrics.NameStreamsEnded, "outcome=overflow,stream=cache_events"); v != 1 {
		t.Errorf("overflow count %v, want 1", v)
	}
	// The other subscriber is still live.
	report(t, r.cli, &pb.CacheStateUpdate{ReplicaId: "x", TenantId: "nobody", ModelId: "m", HashScheme: "vllm", Prefixes: []*pb.PrefixEntry{{PrefixHash: wire8(1), TokenCount: 16}}})
	if ev := recvEvents(t, fast, 1)[0]; ev.GetTenantId() != "nobody" {
		t.Errorf("the filtered subscriber got %v", ev)
	}
}

func TestE2EStreamMetrics(t *testing.T) {
	r := start(t, testConfig())
	report(t, r.cli, &pb.CacheStateUpdate{ReplicaId: "r1", TenantId: "team-a", ModelId: "llama", HashScheme: "vllm",
		Prefixes: []*pb.PrefixEntry{{BlockHashes: [][]byte{wire8(1), wire8(2), wire8(3)}, BlockTokenCounts: []int32{16, 16, 16}}}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := r.cli.StreamMetrics(ctx, &pb.StreamMetricsRequest{Names: []string{servermetrics.NameIndexEntries, servermetrics.NameLookupLatency}, IntervalMs: 100})
	if err != nil {
		t.Fatal(err)
	}
	// Batches are told apart by their timestamps; carry is the first
	// sample of the batch after the one read.
	var carry *pb.Metric
	readBatch := func() (map[string]*pb.Metric, int64) {
		b := map[string]*pb.Metric{}
		var at int64
		if carry != nil {
			b[key(carry)], at, carry = carry, carry.GetTimestampUs(), nil
		}
		for {
			m, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if at != 0 && m.GetTimestampUs() != at {
				carry = m
				return b, at
			}
			at = m.GetTimestampUs()
			b[key(m)] = m
		}
	}
	first, at1 := readBatch()
	if _, err := r.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "team-a", ModelId: "llama", HashScheme: "vllm", BlockHashes: [][]byte{wire8(1)}, BlockTokenCounts: []int32{16}}); err != nil {
		t.Fatal(err)
	}
	looked := time.Now().UnixMicro()
	var last map[string]*pb.Metric
	var atLast int64
	for n := 0; atLast <= looked; n++ {
		if n > 100 {
			t.Fatal("no batch gathered after the lookup")
		}
		last, atLast = readBatch()
	}
	// Ticks never come early.
	if gap := time.Duration(atLast-at1) * time.Microsecond; gap < 80*time.Millisecond {
		t.Errorf("batches %v apart, want at least about 100ms", gap)
	}
	e := first[servermetrics.NameIndexEntries+"{model=llama}"]
	if e == nil || e.GetType() != "gauge" || e.GetValue() != 3 {
		t.Errorf("index_entries sample %v, want gauge 3", e)
	}
	for k := range first {
		if !strings.HasPrefix(k, servermetrics.NameIndexEntries) && !strings.HasPrefix(k, servermetrics.NameLookupLatency) {
			t.Errorf("unrequested sample %s", k)
		}
	}
	c := last[servermetrics.NameLookupLatency+"_count{model=llama}"]
	if c == nil || c.GetType() != "histogram" || c.GetValue() != 1 {
		t.Errorf("latency count after one lookup: %v", c)
	}
	if b := last[servermetrics.NameLookupLatency+"_bucket{le=+Inf,model=llama}"]; b == nil || b.GetValue() != 1 {
		t.Errorf("+Inf bucket: %v", b)
	}
	cancel()

	// Over the limits.
	st2, err := r.cli.StreamMetrics(tctx(t), &pb.StreamMetricsRequest{Names: make([]string, rpc.MaxMetricNames+1)})
	if err == nil {
		_, err = st2.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("too many names: %v", err)
	}
}

func key(m *pb.Metric) string {
	var ls []string
	for k, v := range m.GetLabels() {
		ls = append(ls, k+"="+v)
	}
	sortStrings(ls)
	return m.GetName() + "{" + strings.Join(ls, ",") + "}"
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// TestE2EStreamsEndOnDrain: a server shutting down ends its observer
// streams with UNAVAILABLE at once, so the drain is not held.
func TestE2EStreamsEndOnDrain(t *testing.T) {
	cfg := testConfig()
	cfg.MaxObserverStreams = 1
	run := servertest.Run(t, func(c *server.Config) { *c = cfg })
	conn := servertest.Conn(t, run.Server)
	cli := pb.NewInferenceCacheClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ev := eventStream(t, ctx, cli, &pb.StreamEventsRequest{})
	ms, err := cli.StreamMetrics(ctx, &pb.StreamMetricsRequest{Names: []string{servermetrics.NameIndexEntries}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ms.Header(); err != nil {
		t.Fatal(err)
	}
	// The limit: one of each.
	extra, err := cli.StreamCacheEvents(ctx, &pb.StreamEventsRequest{})
	if err == nil {
		_, err = extra.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second event stream: %v, want RESOURCE_EXHAUSTED", err)
	}
	start := time.Now()
	run.Stop()
	for name, recv := range map[string]func() error{
		"events": func() error { _, err := ev.Recv(); return err },
		"metrics": func() error {
			for {
				if _, err := ms.Recv(); err != nil {
					return err
				}
			}
		},
	} {
		err := recv()
		if status.Code(err) != codes.Unavailable && !errors.Is(err, io.EOF) {
			t.Errorf("%s stream on drain: %v, want UNAVAILABLE", name, err)
		}
	}
	select {
	case <-run.Done():
	case <-time.After(servertest.StopTimeout):
		t.Fatal("the server did not stop")
	}
	if d := time.Since(start); d > servertest.DrainTimeout {
		t.Errorf("the drain took %v: the streams held it", d)
	}
}
