package rpc_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// FuzzService drives a sequence of requests, decoded from the fuzz input,
// into one rpc.Service over a real engine and the production metrics, and
// checks after every step that nothing panicked, that every answer is
// well-formed (contract §2.1: the reason vocabulary, ranking, the shape of
// each reason's scores; InvalidArgument exactly for oversized ids), and that
// the index's counts agree with /snapshot; at the end it checks the
// metrics against the index (index_entries per model, one lookup count per
// call, no lookup series for a model the index does not know).
//
// The input is a little program: each op byte picks ReportCacheState,
// PublishEvent, LookupRoute, a policy push, a raw protobuf message (decoded
// as the gRPC codec would), a clock step with a TTL sweep, a metrics
// retirement pass, or GetCacheState; the following bytes pick ids, hashes,
// counts and knobs from small pools (with edge values: empty, oversized,
// the reserved tenant, the shared metrics label, bad hashes, extreme
// counts, NaN stats). Run it with
//
//	go test ./rpc -run '^$' -fuzz FuzzService -fuzztime 5m
func FuzzService(f *testing.F) {
	for _, seed := range [][]byte{
		{},
		// report a chain, look it up
		{0, 1, 0, 0, 0, 0, 0, 1, 0, 4, 0, 1, 2, 3, 2, 0, 0, 0, 0, 1, 4, 0, 1, 2, 3},
		// a stream of several updates, events, lookups and a policy
		{0, 3, 1, 1, 1, 1, 0, 2, 2, 5, 1, 2, 3, 4, 5, 1, 3, 7, 3, 2, 1, 4, 0, 1, 2, 1, 1, 2, 2, 0, 3, 1, 2, 0, 2, 0, 2, 2, 1, 0, 0, 1, 5, 7, 2, 1, 1, 2, 0, 0, 1, 4, 1, 2, 3, 4},
		// raw protobuf lookups and updates
		{4, 0, 12, 0x0a, 0x02, 'm', '0', 0x12, 0x02, 't', '0', 0x2a, 0x02, 'v', 'x', 4, 1, 6, 0x0a, 0x02, 'r', '0', 0x12, 0x00},
		// clock step, sweep, retirement, GetCacheState
		{0, 1, 0, 0, 0, 0, 0, 1, 1, 2, 0, 1, 5, 200, 6, 7, 0, 0},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h := newFuzzHarness(t)
		r := &fuzzReader{b: data}
		for step := 0; step < 64 && r.more(); step++ {
			h.step(t, r)
			h.checkSnapshot(t)
		}
		h.checkMetrics(t)
	})
}

// Pools the fuzz reader picks from.
var (
	fuzzOversized = strings.Repeat("x", rpc.MaxIDBytes+1)
	fuzzTenants   = []string{"t0", "t1", policy.ReservedTenantID, "", fuzzOversized}
	fuzzModels    = []string{"m0", "m1", "m2", "", servermetrics.OtherModel, fuzzOversized}
	fuzzReplicas  = []string{"r0", "r1", "r2", "", fuzzOversized}
	fuzzSchemes   = []string{"vllm", "sglang", "", fuzzOversized}
	fuzzAdapters  = []string{"", "a1", fuzzOversized}
	fuzzHashes    = func() [][]byte {
		var hs [][]byte
		for i := range 10 {
			hs = append(hs, binary.BigEndian.AppendUint64(nil, uint64(i)*0x9e3779b97f4a7c15|1))
		}
		return append(hs, nil, []byte{}, []byte("abc"), make([]byte, engine.MaxHashBytes), make([]byte, engine.MaxHashBytes+1))
	}()
	fuzzCounts = []int32{0, -1, -16, math.MaxInt32, math.MinInt32, 1 << 30, 1}
	fuzzFloats = []float32{0, 0.5, 1, -1, 2, float32(math.NaN()), float32(math.Inf(1))}
	// fuzzConfigured is the one model configured to always have series.
	fuzzConfigured = "m2"
)

// fuzzReader hands out the input's bytes; past the end it returns zeros.
type fuzzReader struct {
	b []byte
	i int
}

func (r *fuzzReader) more() bool { return r.i < len(r.b) }

func (r *fuzzReader) byte() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

func (r *fuzzReader) n(k int) int { return int(r.byte()) % k }

func pick[T any](r *fuzzReader, pool []T) T { return pool[r.n(len(pool))] }

func (r *fuzzReader) bytes(n int) []byte {
	end := min(r.i+n, len(r.b))
	out := r.b[r.i:end]
	r.i = end
	return out
}

// count is mostly a block's 16 tokens, sometimes an edge value.
func (r *fuzzReader) count() int32 {
	if b := r.byte(); b < 200 {
		return 16
	} else {
		return fuzzCounts[int(b)%len(fuzzCounts)]
	}
}

// chain returns n blocks from the hash pool, balanced unless the reader
// says otherwise.
func (r *fuzzReader) chain() ([][]byte, []int32) {
	n := r.n(6)
	hs := make([][]byte, n)
	cs := make([]int32, n)
	for i := range hs {
		// Mostly good hashes, so chains match.
		if b := r.byte(); b < 230 {
			hs[i] = fuzzHashes[int(b)%10]
		} else {
			hs[i] = fuzzHashes[int(b)%len(fuzzHashes)]
		}
		cs[i] = r.count()
	}
	switch r.n(8) {
	case 0:
		cs = append(cs, 16)
	case 1:
		if n > 0 {
			cs = cs[:n-1]
		}
	}
	return hs, cs
}

// fuzzHarness is one in-process server: a real engine with a small entry
// cap, a policy store, the production metrics and the Service, plus what
// the checks need to know about what was sent.
type fuzzHarness struct {
	e      *engine.Engine
	store  *policy.Store
	m      *servermetrics.Metrics
	svc    *rpc.Service
	clock  *fuzzClock
	mclock *fuzzClock

	// lookups counts LookupRoute calls since the last retirement pass;
	// lookupsBase is what the call counters summed to right after it (a
	// retired model's counts leave with its series).
	lookups, lookupsBase int
	maxTokens            int64           // the largest token count ever reported
	replicas             map[string]bool // replica ids ever reported
	pairs                map[[2]string]bool
}

const fuzzMaxEntries = 48

// fuzzClock is a settable clock.
type fuzzClock struct {
	mu  sync.Mutex // guards now
	now time.Time
}

func (c *fuzzClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fuzzClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newFuzzHarness(t *testing.T) *fuzzHarness {
	h := &fuzzHarness{
		clock:     &fuzzClock{now: time.Unix(1_700_000_000, 0)},
		mclock:    &fuzzClock{now: time.Unix(1_700_000_000, 0)},
		maxTokens: math.MinInt64,
		replicas:  map[string]bool{},
		pairs:     map[[2]string]bool{},
	}
	m, err := servermetrics.NewWithOptions(servermetrics.Options{Models: []string{fuzzConfigured}, ModelGrace: time.Minute, Now: h.mclock.Now})
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	h.store = policy.NewStore()
	h.e = engine.New(engine.Config{MaxEntries: fuzzMaxEntries, Policies: h.store, Metrics: m})
	h.svc, err = rpc.NewService(rpc.Config{Index: h.e, Policies: h.store, Observer: m, Drops: m,
		Logger: slog.New(slog.DiscardHandler), Now: h.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *fuzzHarness) step(t *testing.T, r *fuzzReader) {
	switch r.n(8) {
	case 0:
		var us []*pb.CacheStateUpdate
		for range 1 + r.n(3) {
			us = append(us, h.update(r))
		}
		h.report(t, us)
	case 1:
		h.publish(t, &pb.CacheEvent{Type: pb.CacheEvent_Type(r.n(6)), TenantId: pick(r, fuzzTenants), ModelId: pick(r, fuzzModels),
			ReplicaId: pick(r, fuzzReplicas), AdapterId: pick(r, fuzzAdapters), PrefixHash: pick(r, fuzzHashes),
			TimestampUs: h.timestamp(r)})
	case 2:
		h.lookup(t, h.lookupRequest(r))
	case 3:
		h.pushPolicy(r)
	case 4:
		h.raw(t, r)
	case 5:
		h.clock.add(time.Duration(r.byte()) * 10 * time.Second)
		h.e.Sweep(h.clock.Now().UnixMicro())
	case 6:
		h.mclock.add(2 * time.Minute)
		h.m.RetireDrainedModels()
		h.m.RetireDrainedModels()
		h.lookupsBase, h.lookups = int(sumCounters(t, h.m, servermetrics.NameLookupCalls)), 0
	case 7:
		req := &pb.GetCacheStateRequest{TenantId: pick(r, fuzzTenants), ModelId: pick(r, fuzzModels)}
		resp, err := h.svc.GetCacheState(context.Background(), req)
		if err != nil || resp.GetSummary() == nil || resp.GetSummary().GetTotalPrefixes() < 0 || resp.GetSummary().GetHotPrefixes() != 0 {
			t.Fatalf("GetCacheState(%.40v): %v, %v", req, resp, err)
		}
		for i, rs := range resp.GetReplicas() {
			if i > 0 && resp.GetReplicas()[i-1].GetReplicaId() >= rs.GetReplicaId() {
				t.Fatalf("GetCacheState replicas not sorted and unique: %v", resp.GetReplicas())
			}
		}
	}
}

func (h *fuzzHarness) timestamp(r *fuzzReader) int64 {
	switch r.n(4) {
	case 0:
		return 0
	case 1:
		return h.clock.Now().UnixMicro() - int64(r.byte())*1e6
	case 2:
		return h.clock.Now().Add(time.Hour).UnixMicro()
	default:
		return int64(r.byte())
	}
}

func (h *fuzzHarness) update(r *fuzzReader) *pb.CacheStateUpdate {
	u := &pb.CacheStateUpdate{TenantId: pick(r, fuzzTenants), ModelId: pick(r, fuzzModels), ReplicaId: pick(r, fuzzReplicas),
		HashScheme: pick(r, fuzzSchemes), AdapterId: pick(r, fuzzAdapters), TimestampUs: h.timestamp(r)}
	for range r.n(4) {
		p := &pb.PrefixEntry{Tier: pb.CacheTier(r.n(6) - 1)}
		if r.n(4) == 0 {
			p.AdapterId = pick(r, fuzzAdapters)
		}
		switch r.n(3) {
		case 0:
			p.BlockHashes, p.BlockTokenCounts = r.chain()
		case 1:
			p.PrefixHash, p.TokenCount = pick(r, fuzzHashes), r.count()
		default:
			p.BlockHashes, p.BlockTokenCounts = r.chain()
			p.PrefixHash, p.TokenCount = pick(r, fuzzHashes), r.count()
		}
		u.Prefixes = append(u.Prefixes, p)
	}
	if r.n(2) == 0 {
		u.Stats = &pb.ReplicaStats{ReplicaId: pick(r, fuzzReplicas), HitRate: pick(r, fuzzFloats), Pressure: pick(r, fuzzFloats),
			CacheMemoryBytes: int64(r.byte()) << 20, T2HitTokens: int64(r.byte()), T2QueryTokens: int64(r.byte())}
	}
	return u
}

func (h *fuzzHarness) lookupRequest(r *fuzzReader) *pb.LookupRouteRequest {
	req := &pb.LookupRouteRequest{TenantId: pick(r, fuzzTenants), ModelId: pick(r, fuzzModels), HashScheme: pick(r, fuzzSchemes),
		AdapterId: pick(r, fuzzAdapters), PrefixTokenCount: r.count()}
	if r.n(3) == 0 {
		req.Slo = &pb.SLO{TtftMs: int32(r.byte()), TbtMs: int32(r.byte())}
	}
	switch r.n(6) {
	case 0, 1:
		req.BlockHashes, req.BlockTokenCounts = r.chain()
	case 2:
		req.PrefixHash = pick(r, fuzzHashes)
	case 3:
		for range r.n(64) {
			req.TokenIds = append(req.TokenIds, uint32(r.byte()))
		}
	case 4:
		req.PromptText = string(r.bytes(r.n(16)))
	}
	return req
}

func (h *fuzzHarness) pushPolicy(r *fuzzReader) {
	floors := []*float32{nil, ptr(float32(0)), ptr(float32(0.1)), ptr(float32(0.9))}
	bools := []*bool{nil, ptr(false), ptr(true)}
	body := &policy.Body{Version: policy.PropagationVersion}
	for _, ns := range []string{"t0", "t1"} {
		if r.n(2) == 0 {
			continue
		}
		p := policy.ResolvedPolicy{
			Namespace:            ns,
			EvictionTTL:          []time.Duration{0, time.Minute, time.Hour}[r.n(3)],
			MinimumPrefixTokens:  []int32{0, 16, 64}[r.n(3)],
			MinimumMatchedTokens: []int32{0, 16, 64}[r.n(3)],
			RoutingFloorScore:    pick(r, floors),
			AffinityRouting:      pick(r, bools),
			Eviction:             []string{"", "lru", "lfu"}[r.n(3)],
		}
		if r.n(2) == 0 {
			p.Strategy = &policy.LookupStrategy{EnableChainMatching: pick(r, bools), RequireChain: pick(r, bools), EnableTenantHot: pick(r, bools)}
		}
		body.Policies = append(body.Policies, p)
		if r.n(2) == 0 {
			body.Tenants = append(body.Tenants, policy.ResolvedTenant{TenantID: ns, MaxIndexEntries: []int64{0, 4, 16}[r.n(3)],
				IsolationMode: []string{"", "Fairness", "Strict"}[r.n(3)]})
		}
	}
	h.store.Apply(body)
}

// raw decodes the next bytes as a protobuf message, as the gRPC codec would
// (proto3 strings must be UTF-8), and sends it when it decodes.
func (h *fuzzHarness) raw(t *testing.T, r *fuzzReader) {
	kind, raw := r.n(3), r.bytes(r.n(64))
	switch kind {
	case 0:
		var req pb.LookupRouteRequest
		if proto.Unmarshal(raw, &req) == nil {
			h.lookup(t, &req)
		}
	case 1:
		var u pb.CacheStateUpdate
		if proto.Unmarshal(raw, &u) == nil {
			h.report(t, []*pb.CacheStateUpdate{&u})
		}
	case 2:
		var ev pb.CacheEvent
		if proto.Unmarshal(raw, &ev) == nil {
			h.publish(t, &ev)
		}
	}
}

// oversized reports whether any of ids is over rpc.MaxIDBytes.
func oversized(ids ...string) bool {
	for _, id := range ids {
		if len(id) > rpc.MaxIDBytes {
			return true
		}
	}
	return false
}

func updateOversized(u *pb.CacheStateUpdate) bool {
	if oversized(u.GetTenantId(), u.GetModelId(), u.GetReplicaId(), u.GetHashScheme(), u.GetAdapterId()) {
		return true
	}
	for _, p := range u.GetPrefixes() {
		if oversized(p.GetAdapterId()) {
			return true
		}
	}
	return false
}

func (h *fuzzHarness) report(t *testing.T, us []*pb.CacheStateUpdate) {
	wantErr := false
	for _, u := range us {
		if u.GetTenantId() == policy.ReservedTenantID {
			continue
		}
		if updateOversized(u) {
			wantErr = true
			continue
		}
		h.noteReported(u)
	}
	st := &fuzzReportStream{ctx: context.Background(), in: us}
	err := h.svc.ReportCacheState(st)
	switch {
	case wantErr && status.Code(err) != codes.InvalidArgument:
		t.Fatalf("ReportCacheState with an oversized id: %v, want InvalidArgument", err)
	case !wantErr && (err != nil || st.ack == nil || !st.ack.GetAccepted()):
		t.Fatalf("ReportCacheState: ack %v, %v", st.ack, err)
	}
}

// noteReported records what an applied update can make the index hold.
func (h *fuzzHarness) noteReported(u *pb.CacheStateUpdate) {
	h.pairs[[2]string{u.GetTenantId(), u.GetModelId()}] = true
	if u.GetReplicaId() != "" {
		h.replicas[u.GetReplicaId()] = true
	}
	for _, p := range u.GetPrefixes() {
		var cum int64
		for _, c := range p.GetBlockTokenCounts() {
			cum += int64(c)
			h.maxTokens = max(h.maxTokens, min(max(cum, math.MinInt32), math.MaxInt32))
		}
		h.maxTokens = max(h.maxTokens, int64(p.GetTokenCount()))
	}
}

func (h *fuzzHarness) publish(t *testing.T, ev *pb.CacheEvent) {
	ack, err := h.svc.PublishEvent(context.Background(), ev)
	if oversized(ev.GetTenantId(), ev.GetModelId(), ev.GetReplicaId(), ev.GetAdapterId()) {
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("PublishEvent with an oversized id: %v, want InvalidArgument", err)
		}
		return
	}
	if err != nil || !ack.GetAccepted() || ack.GetReasonCode() != "" {
		t.Fatalf("PublishEvent(%v): %v, %v", ev, ack, err)
	}
}

var fuzzReasons = map[string]bool{
	rpc.ReasonPrefixMatch: true, rpc.ReasonTenantHot: true, rpc.ReasonAffinityHint: true, rpc.ReasonNoHint: true,
	rpc.ReasonPolicyRequiresChain: true, rpc.ReasonTimeout: true, rpc.ReasonUnknownTenant: true,
	rpc.ReasonUnknownModel: true, rpc.ReasonUnknownHashScheme: true,
}

func (h *fuzzHarness) lookup(t *testing.T, req *pb.LookupRouteRequest) {
	h.lookups++
	resp, err := h.svc.LookupRoute(context.Background(), req)
	if err != nil || resp == nil {
		t.Fatalf("LookupRoute returned %v, %v; it must fail open", resp, err)
	}
	reason, scores := resp.GetReasonCode(), resp.GetReplicaScores()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("LookupRoute(tenant %.20q model %.20q scheme %.20q chain %d/%d exact %x tokens %d): %s %v: %s", req.GetTenantId(), req.GetModelId(),
			req.GetHashScheme(), len(req.GetBlockHashes()), len(req.GetBlockTokenCounts()), req.GetPrefixHash(), len(req.GetTokenIds()),
			reason, scores, fmt.Sprintf(format, args...))
	}
	if !fuzzReasons[reason] {
		fail("reason code outside the contract vocabulary")
	}
	if resp.GetLookupLatencyUs() < 0 {
		fail("negative latency")
	}
	if len(resp.GetTokenIds()) != 0 {
		fail("tokens echoed without a tokenizer")
	}
	if a := resp.GetAdapterId(); a != "" && a != req.GetAdapterId() {
		fail("adapter echo %q", a)
	}
	if (req.GetTenantId() == policy.ReservedTenantID || oversized(req.GetTenantId(), req.GetModelId(), req.GetHashScheme(), req.GetAdapterId())) && (reason != rpc.ReasonNoHint || resp.GetAdapterId() != "") {
		fail("the reserved tenant and oversized ids get a bare NO_HINT")
	}
	switch reason {
	case rpc.ReasonPrefixMatch, rpc.ReasonTenantHot:
		if len(scores) == 0 {
			fail("no scores")
		}
	case rpc.ReasonAffinityHint:
		if len(scores) != 1 || scores[0].GetScore() != 0 || scores[0].GetMatchedTokens() != 0 || scores[0].GetEstimatedCacheHitProb() != 0 || scores[0].GetTier() != 0 {
			fail("AFFINITY_HINT must carry exactly one all-zero score")
		}
	default:
		if len(scores) != 0 {
			fail("scores with a no-hint reason")
		}
	}
	seen := map[string]bool{}
	for i, s := range scores {
		id := s.GetReplicaId()
		if id == "" || seen[id] || !h.replicas[id] {
			fail("replica %q empty, repeated or never reported", id)
		}
		seen[id] = true
		if f := float64(s.GetScore()); math.IsNaN(f) || math.IsInf(f, 0) {
			fail("non-finite score")
		}
		if bound := max(h.maxTokens, requestTokens(req)); int64(s.GetMatchedTokens()) > bound {
			fail("matched_tokens %d above every count ever reported and the request's own (%d)", s.GetMatchedTokens(), bound)
		}
		if reason == rpc.ReasonTenantHot && s.GetMatchedTokens() != 0 {
			fail("TENANT_HOT with matched tokens")
		}
		if i > 0 {
			prev := scores[i-1]
			if c := cmp.Or(cmp.Compare(s.GetScore(), prev.GetScore()), cmp.Compare(prev.GetReplicaId(), id)); c > 0 {
				fail("not ranked best-first with the replica id tie-break at %d", i)
			}
		}
	}
}

// requestTokens bounds the matched tokens a chain match can claim: on the
// chain path matched_tokens adds up the request's own counts (contract
// §3.6), so it is at most the largest running sum of block_token_counts (or
// of the 16-token blocks token_ids fingerprint into); on the exact path it
// is a stored token_count, bounded by what was reported.
func requestTokens(req *pb.LookupRouteRequest) int64 {
	best, cum := int64(math.MinInt64), int64(0)
	for _, c := range req.GetBlockTokenCounts() {
		cum += int64(c)
		best = max(best, min(max(cum, math.MinInt32), math.MaxInt32))
	}
	return max(best, int64(len(req.GetTokenIds())/rpc.DefaultEngineBlockSize*rpc.DefaultEngineBlockSize))
}

// checkSnapshot: the index's counters agree with /snapshot's aggregate and
// the entry cap holds.
func (h *fuzzHarness) checkSnapshot(t *testing.T) {
	entries, keys := h.e.Counts()
	snap := h.e.Snapshot()
	var tenantSum, prefixSum int64
	for i, tn := range snap.Tenants {
		if tn.TenantID == policy.ReservedTenantID || tn.IndexEntries < 0 || (i > 0 && snap.Tenants[i-1].TenantID >= tn.TenantID) {
			t.Fatalf("bad tenant rows: %+v", snap.Tenants)
		}
		tenantSum += tn.IndexEntries
	}
	for i, rs := range snap.Replicas {
		if rs.Tenant == policy.ReservedTenantID || rs.PrefixCount < 0 || rs.ReplicaID == "" {
			t.Fatalf("bad replica row %+v", rs)
		}
		if i > 0 {
			p := snap.Replicas[i-1]
			if cmp.Or(cmp.Compare(p.Tenant, rs.Tenant), cmp.Compare(p.ReplicaID, rs.ReplicaID)) >= 0 {
				t.Fatalf("replica rows not sorted and unique at %d: %+v", i, snap.Replicas)
			}
		}
		prefixSum += rs.PrefixCount
	}
	switch {
	case tenantSum != snap.TotalPrefixes:
		t.Fatalf("sum of tenants' indexEntries %d != totalPrefixes %d", tenantSum, snap.TotalPrefixes)
	case snap.TotalPrefixes != keys:
		t.Fatalf("totalPrefixes %d != the index's distinct keys %d", snap.TotalPrefixes, keys)
	case prefixSum != entries:
		t.Fatalf("sum of replicas' prefixCount %d != the index's storage entries %d", prefixSum, entries)
	case entries > fuzzMaxEntries:
		t.Fatalf("%d storage entries over the cap of %d", entries, fuzzMaxEntries)
	}
}

// checkMetrics: index_entries per model matches the index, every lookup
// was counted once, and lookup series exist only for models that have
// index_entries series or are configured, plus the shared label.
func (h *fuzzHarness) checkMetrics(t *testing.T) {
	fams, err := h.m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	model := func(m *dto.Metric) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == "model" {
				return l.GetValue()
			}
		}
		return ""
	}
	entries := map[string]float64{}
	for _, m := range byName[servermetrics.NameIndexEntries].GetMetric() {
		entries[model(m)] = m.GetGauge().GetValue()
	}
	want := map[string]int64{}
	for pair := range h.pairs {
		if pair[0] == policy.ReservedTenantID {
			continue
		}
		_, keys := h.e.ModelState(pair[0], pair[1])
		want[pair[1]] += keys
	}
	for m, n := range want {
		got, ok := entries[m]
		labelable := m != servermetrics.OtherModel && len(m) <= servermetrics.MaxModelLabelBytes
		switch {
		case labelable && n > 0 && (!ok || got != float64(n)):
			t.Fatalf("index_entries{model=%.20q} = %v (present %v), the index holds %d", m, got, ok, n)
		case ok && got != float64(n):
			t.Fatalf("index_entries{model=%.20q} = %v, the index holds %d", m, got, n)
		}
	}
	if calls := sumCounters(t, h.m, servermetrics.NameLookupCalls); calls != float64(h.lookupsBase+h.lookups) {
		t.Fatalf("lookup_route_calls_total sums to %v, want %d + %d lookups since the last retirement", calls, h.lookupsBase, h.lookups)
	}
	for _, name := range []string{servermetrics.NameLookupCalls, servermetrics.NameLookupLatency} {
		for _, m := range byName[name].GetMetric() {
			if mod := model(m); mod != servermetrics.OtherModel && mod != fuzzConfigured {
				if _, ok := entries[mod]; !ok {
					t.Fatalf("%s has a series for model %.20q, which has no index_entries series", name, mod)
				}
			}
		}
	}
	var dropped float64
	for _, m := range byName[servermetrics.NameDroppedReports].GetMetric() {
		dropped += m.GetCounter().GetValue()
	}
	if dropped != float64(h.svc.DroppedReports()) {
		t.Fatalf("dropped_reports_total sums to %v, the service counted %d", dropped, h.svc.DroppedReports())
	}
}

// sumCounters sums the counter family name.
func sumCounters(t *testing.T, m *servermetrics.Metrics, name string) float64 {
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() == name {
			for _, s := range f.GetMetric() {
				sum += s.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// fuzzReportStream is the server side of one ReportCacheState stream in
// process: RecvMsg hands out the updates in order (as the gRPC codec would,
// into the handler's reused message), then io.EOF; SendAndClose keeps the
// Ack.
type fuzzReportStream struct {
	grpc.ServerStream
	ctx context.Context
	in  []*pb.CacheStateUpdate
	ack *pb.Ack
}

var _ pb.InferenceCache_ReportCacheStateServer = (*fuzzReportStream)(nil)

func (s *fuzzReportStream) Context() context.Context     { return s.ctx }
func (s *fuzzReportStream) SetHeader(metadata.MD) error  { return nil }
func (s *fuzzReportStream) SendHeader(metadata.MD) error { return nil }
func (s *fuzzReportStream) SetTrailer(metadata.MD)       {}
func (s *fuzzReportStream) SendMsg(any) error            { return nil }

func (s *fuzzReportStream) Recv() (*pb.CacheStateUpdate, error) {
	var m pb.CacheStateUpdate
	if err := s.RecvMsg(&m); err != nil {
		return nil, err
	}
	return &m, nil
}

func (s *fuzzReportStream) RecvMsg(m any) error {
	if len(s.in) == 0 {
		return io.EOF
	}
	dst := m.(*pb.CacheStateUpdate)
	proto.Reset(dst)
	proto.Merge(dst, s.in[0])
	s.in = s.in[1:]
	return nil
}

func (s *fuzzReportStream) SendAndClose(a *pb.Ack) error {
	s.ack = a
	return nil
}
