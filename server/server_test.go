package server_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
	"github.com/inferencecache/inferencecache/servermetrics"
)

func chain(id, blocks int) ([][]byte, []int32) {
	var hs [][]byte
	var cs []int32
	for i := 0; i < blocks; i++ {
		hs = append(hs, binary.BigEndian.AppendUint64(nil, uint64(id)<<32|uint64(i)|1<<63))
		cs = append(cs, 16)
	}
	return hs, cs
}

func report(t *testing.T, cli pb.InferenceCacheClient, us ...*pb.CacheStateUpdate) {
	t.Helper()
	st, err := cli.ReportCacheState(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range us {
		if err := st.Send(u); err != nil {
			t.Fatal(err)
		}
	}
	if ack, err := st.CloseAndRecv(); err != nil || !ack.GetAccepted() {
		t.Fatalf("ack %v, %v", ack, err)
	}
}

// TestServerEndToEnd pushes policy through the real /policy endpoint, feeds
// the index over gRPC, sends known LookupRoute traffic and checks the
// answers and the /metrics scrape, the control endpoints and the probe.
func TestServerEndToEnd(t *testing.T) {
	s := start(t, testConfig())
	httpBase, intBase := "http://"+s.HTTPAddr().String(), "http://"+s.InternalAddr().String()

	if code, _ := httpDo(t, http.MethodGet, httpBase+"/healthz", "", nil); code != http.StatusOK {
		t.Fatalf("/healthz %d", code)
	}
	if code, _ := httpDo(t, http.MethodGet, httpBase+"/readyz", "", nil); code != http.StatusOK {
		t.Fatalf("/readyz %d", code)
	}
	if code, _ := httpDo(t, http.MethodGet, httpBase+"/debug/pprof/", "", nil); code != http.StatusNotFound {
		t.Fatalf("pprof without --enable-pprof: %d", code)
	}

	body := `{"version":7,"policies":[{"namespace":"noaff","affinityRouting":false,"minimumMatchedTokens":64},` +
		`{"namespace":"team","minimumMatchedTokens":64,"routingFloorScore":0.1}]}`
	if code, msg := httpDo(t, http.MethodPost, intBase+"/policy", body, nil); code != http.StatusNoContent {
		t.Fatalf("/policy: %d %s", code, msg)
	}
	if tn := s.Policies().Load().Tenant("noaff"); tn.AffinityRouting {
		t.Fatal("policy not applied")
	}

	a, ac := chain(1, 8)
	b, bc := chain(2, 8)
	miss, missc := chain(3, 2)
	for _, tenant := range []string{"team", "noaff"} {
		report(t, s.cli,
			&pb.CacheStateUpdate{TenantId: tenant, ModelId: "llama", HashScheme: "vllm", ReplicaId: "r1", Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}},
			&pb.CacheStateUpdate{TenantId: tenant, ModelId: "llama", HashScheme: "vllm", ReplicaId: "r2", Prefixes: []*pb.PrefixEntry{{BlockHashes: b, BlockTokenCounts: bc}}},
		)
	}
	report(t, s.cli, &pb.CacheStateUpdate{TenantId: "team", ModelId: "qwen", HashScheme: "vllm", ReplicaId: "q1",
		Prefixes: []*pb.PrefixEntry{{PrefixHash: a[0], TokenCount: 16}}})

	lookups := []struct {
		tenant, model string
		hs            [][]byte
		cs            []int32
		want          string
	}{
		{"team", "llama", a, ac, rpc.ReasonPrefixMatch},
		{"team", "llama", b, bc, rpc.ReasonPrefixMatch},
		{"team", "llama", miss, missc, rpc.ReasonAffinityHint},
		{"noaff", "llama", miss, missc, rpc.ReasonNoHint},
		{"ghost", "llama", a, ac, rpc.ReasonUnknownTenant},
		{policy.ReservedTenantID, "llama", a, ac, rpc.ReasonNoHint},
		{"team", "qwen", a, ac[:1], rpc.ReasonNoHint},
	}
	for _, l := range lookups {
		resp, err := s.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: l.tenant, ModelId: l.model, HashScheme: "vllm", BlockHashes: l.hs, BlockTokenCounts: l.cs})
		if err != nil || resp.GetReasonCode() != l.want {
			t.Fatalf("%s/%s: %v, %v; want %s", l.tenant, l.model, resp.GetReasonCode(), err, l.want)
		}
	}

	fams := servertest.Scrape(t, s.Server)
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{servermetrics.NameServerUp, "", 1},
		{servermetrics.NameGRPCTLSEnabled, "", 0},
		{servermetrics.NameLookupCalls, "hint_used=true,model=llama,reason_code=PREFIX_MATCH", 2},
		{servermetrics.NameLookupCalls, "hint_used=true,model=llama,reason_code=AFFINITY_HINT", 1},
		{servermetrics.NameLookupCalls, "hint_used=false,model=llama,reason_code=NO_HINT", 2},
		{servermetrics.NameLookupCalls, "hint_used=false,model=llama,reason_code=UNKNOWN_TENANT", 1},
		{servermetrics.NameLookupCalls, "hint_used=false,model=qwen,reason_code=NO_HINT", 1},
		{servermetrics.NameLookupLatency, "model=llama", 6},
		{servermetrics.NameLookupLatency, "model=qwen", 1},
		// Distinct keys per model: two tenants x (8 + 8) for llama, 1 for qwen.
		{servermetrics.NameIndexEntries, "model=llama", 32},
		{servermetrics.NameIndexEntries, "model=qwen", 1},
	} {
		if got, ok := servertest.Value(fams, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s{%s} = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if n := len(fams[servermetrics.NameLookupCalls].GetMetric()); n != 5 {
		t.Errorf("%d lookup call series, want 5", n)
	}
	h := fams[servermetrics.NameLookupLatency].GetMetric()[0].GetHistogram()
	var bounds []float64
	for _, b := range h.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	// The text format adds the +Inf bucket.
	if !slices.Equal(bounds[:len(bounds)-1], servermetrics.LatencyBuckets) || !math.IsInf(bounds[len(bounds)-1], 1) {
		t.Errorf("latency buckets = %v", h.GetBucket())
	}
	for _, name := range []string{servermetrics.NameSnapshotAuth, servermetrics.NamePolicyAuth, servermetrics.NameProbeAuth, servermetrics.NameIndexEvictions, servermetrics.NameTenantEvictions} {
		if f := fams[name]; f != nil && len(f.GetMetric()) > 0 {
			t.Errorf("%s has series without any event: %v", name, f.GetMetric())
		}
	}
	if fams["go_goroutines"] == nil || fams["process_open_fds"] == nil && fams["process_cpu_seconds_total"] == nil {
		t.Error("standard Go/process collectors missing")
	}

	// The probe runs through the real engine and leaves nothing behind.
	code, msg := httpDo(t, http.MethodPost, intBase+"/probe", `{"backend":"ns/cb","model":"llama","hashScheme":"vllm"}`, nil)
	var pr controlapi.ProbeResponse
	if code != http.StatusOK || json.Unmarshal([]byte(msg), &pr) != nil || pr.Ingest != "ok" || pr.Routing != "ok" || pr.T2 != "skipped" {
		t.Fatalf("/probe: %d %s", code, msg)
	}
	code, msg = httpDo(t, http.MethodGet, intBase+"/snapshot", "", nil)
	var snap controlapi.CacheSnapshot
	if code != http.StatusOK || json.Unmarshal([]byte(msg), &snap) != nil || snap.TotalPrefixes != 33 {
		t.Fatalf("/snapshot: %d %s", code, msg)
	}
	for _, r := range snap.Replicas {
		if strings.HasPrefix(r.ReplicaID, "__probe-") {
			t.Fatalf("probe replica in /snapshot: %+v", r)
		}
	}
	if got, _ := servertest.Value(servertest.Scrape(t, s.Server), servermetrics.NameIndexEntries, "model=llama"); got != 32 {
		t.Fatalf("index_entries{llama} = %v after the probe, want 32", got)
	}
	st, err := s.cli.GetCacheState(tctx(t), &pb.GetCacheStateRequest{TenantId: "team", ModelId: "llama"})
	if err != nil || st.GetSummary().GetTotalPrefixes() != 16 {
		t.Fatalf("GetCacheState: %v, %v", st, err)
	}

	// grpc.health.v1 answers SERVING.
	hc, err := healthpb.NewHealthClient(s.conn).Check(tctx(t), &healthpb.HealthCheckRequest{Service: server.ServiceName})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", hc, err)
	}
}

// TestReflection lists the services and resolves the service's file through
// the reflection API, as grpcurl and ghz do without a proto file.
func TestReflection(t *testing.T) {
	s := start(t, testConfig())
	stream, err := reflectionpb.NewServerReflectionClient(s.conn).ServerReflectionInfo(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, svc := range resp.GetListServicesResponse().GetService() {
		names = append(names, svc.GetName())
	}
	for _, want := range []string{server.ServiceName, "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Fatalf("services %v lack %s", names, want)
		}
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: server.ServiceName + ".LookupRoute"}}); err != nil {
		t.Fatal(err)
	}
	resp, err = stream.Recv()
	if err != nil || len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("file containing LookupRoute: %v, %v", resp, err)
	}
	_ = stream.CloseSend()
}

// fakeReviewer authenticates "good" as the controller, "other" as another
// identity, and nothing else; the requested audience is echoed.
type fakeReviewer struct{}

const controllerSA = "system:serviceaccount:ic-system:controller"

func (fakeReviewer) Create(_ context.Context, rv *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	out := rv.DeepCopy()
	switch rv.Spec.Token {
	case "good":
		out.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: rv.Spec.Audiences, User: authnv1.UserInfo{Username: controllerSA}}
	case "other":
		out.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: rv.Spec.Audiences, User: authnv1.UserInfo{Username: "system:serviceaccount:x:y"}}
	case "broken":
		return nil, errors.New("apiserver down")
	default:
		out.Status = authnv1.TokenReviewStatus{Authenticated: false, Error: "invalid token"}
	}
	return out, nil
}

// TestControlAuth wires the TokenReview middleware and checks the status
// codes and the per-endpoint auth counters.
func TestControlAuth(t *testing.T) {
	cfg := testConfig()
	cfg.InsecureDisableAuth = false
	cfg.AllowedControllerSA = controllerSA
	cfg.Reviewer = fakeReviewer{}
	s := start(t, cfg)
	base := "http://" + s.InternalAddr().String()
	bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
	for _, c := range []struct {
		method, path, body string
		hdr                map[string]string
		want               int
	}{
		{http.MethodPost, "/policy", `{"version":7,"policies":[]}`, nil, http.StatusUnauthorized},
		{http.MethodPost, "/policy", `{"version":7,"policies":[]}`, bearer("good"), http.StatusNoContent},
		{http.MethodPost, "/policy", `{"version":7,"policies":[]}`, bearer("bad"), http.StatusUnauthorized},
		{http.MethodGet, "/snapshot", "", bearer("other"), http.StatusForbidden},
		{http.MethodGet, "/snapshot", "", bearer("good"), http.StatusOK},
		{http.MethodPost, "/probe", `{"backend":"b","model":"m","hashScheme":"vllm"}`, bearer("broken"), http.StatusServiceUnavailable},
		{http.MethodPost, "/probe", `{"backend":"b","model":"m","hashScheme":"vllm"}`, bearer("good"), http.StatusOK},
	} {
		if code, msg := httpDo(t, c.method, base+c.path, c.body, c.hdr); code != c.want {
			t.Fatalf("%s %s %v: %d %s, want %d", c.method, c.path, c.hdr, code, msg, c.want)
		}
	}
	fams := servertest.Scrape(t, s.Server)
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{servermetrics.NamePolicyAuth, "result=unauth", 2},
		{servermetrics.NamePolicyAuth, "result=ok", 1},
		{servermetrics.NameSnapshotAuth, "result=forbidden", 1},
		{servermetrics.NameSnapshotAuth, "result=ok", 1},
		{servermetrics.NameProbeAuth, "result=error", 1},
		{servermetrics.NameProbeAuth, "result=ok", 1},
	} {
		if got, ok := servertest.Value(fams, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s{%s} = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for name, mod := range map[string]func(*server.Config){
		"empty controller audience":  func(c *server.Config) { c.ControllerAudience = "" },
		"padded controller audience": func(c *server.Config) { c.ControllerAudience = " inferencecache.io/controller" },
		"empty policy audience":      func(c *server.Config) { c.PolicyAudience = "" },
		"padded policy audience":     func(c *server.Config) { c.PolicyAudience = "inferencecache.io/policy\t" },
		"auth without an identity":   func(c *server.Config) { c.InsecureDisableAuth = false },
		"bad identity": func(c *server.Config) {
			c.InsecureDisableAuth, c.AllowedControllerSA, c.Reviewer = false, "controller", fakeReviewer{}
		},
		"negative entry cap":  func(c *server.Config) { c.MaxIndexEntries = -1 },
		"negative byte cap":   func(c *server.Config) { c.MaxIndexBytes = -1 },
		"zero block size":     func(c *server.Config) { c.EngineBlockSize = 0 },
		"zero sweep interval": func(c *server.Config) { c.SweepInterval = 0 },
		"busy port":           func(c *server.Config) { c.HTTPAddr = "256.0.0.1:1" },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			mod(&cfg)
			if s, err := server.New(cfg); err == nil {
				_ = s.Close()
				t.Fatal("New accepted the config")
			}
		})
	}
}

// slowIndex blocks lookups of model "slow" until released, and signals
// when one is in flight.
type slowIndex struct {
	rpc.Index
	entered chan struct{}
	release chan struct{}
}

func (s *slowIndex) LookupRoute(req *engine.LookupRequest, now int64, res *engine.LookupResult) {
	if req.ModelID == "slow" {
		s.entered <- struct{}{}
		<-s.release
	}
	s.Index.LookupRoute(req, now, res)
}

// waitEntered waits at most 5 s for a lookup of model "slow" to reach the
// index.
func (s *slowIndex) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-s.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("call never reached the index")
	}
}

// TestGracefulDrain: on cancel, /readyz turns 503 and server_up 0 while an
// in-flight call is still running; the call then completes normally; Run
// returns nil.
func TestGracefulDrain(t *testing.T) {
	slow := &slowIndex{entered: make(chan struct{}, 1), release: make(chan struct{})}
	cfg := testConfig()
	cfg.WrapIndex = func(ix rpc.Index) rpc.Index { slow.Index = ix; return slow }
	s := start(t, cfg)
	var wg sync.WaitGroup
	var callErr error
	var reason string
	wg.Go(func() {
		resp, err := s.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "t", ModelId: "slow", HashScheme: "vllm", PrefixHash: []byte("12345678")})
		callErr, reason = err, resp.GetReasonCode()
	})
	slow.waitEntered(t)
	s.Stop()
	readyz := "http://" + s.HTTPAddr().String() + "/readyz"
	waitFor(t, "/readyz 503", func() bool {
		code, _ := httpDo(t, http.MethodGet, readyz, "", nil)
		return code == http.StatusServiceUnavailable
	})
	if up, _ := servertest.Value(servertest.Scrape(t, s.Server), servermetrics.NameServerUp, ""); up != 0 {
		t.Fatalf("server_up = %v while draining", up)
	}
	// New calls are refused while the old one finishes.
	select {
	case <-s.Done():
		t.Fatalf("Run returned with a call in flight: %v", s.Err())
	default:
	}
	close(slow.release)
	wg.Wait()
	if callErr != nil || reason != rpc.ReasonNoHint {
		t.Fatalf("in-flight call: %q, %v; want it to finish normally", reason, callErr)
	}
	select {
	case <-s.Done():
		if s.Err() != nil {
			t.Fatalf("Run: %v", s.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the drain")
	}
}

// TestDrainTimeout: a producer stream that never half-closes holds
// GracefulStop; after DrainTimeout the server stops hard and Run returns.
func TestDrainTimeout(t *testing.T) {
	cfg := testConfig()
	cfg.DrainTimeout = 200 * time.Millisecond
	s := start(t, cfg)
	st, err := s.cli.ReportCacheState(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.CacheStateUpdate{TenantId: "t", ModelId: "m", HashScheme: "vllm", ReplicaId: "r"}); err != nil {
		t.Fatal(err)
	}
	// The update is applied once the handler runs; wait for it through
	// GetCacheState so the stream is known to be open server-side.
	waitFor(t, "the stream to be served", func() bool {
		r, err := s.cli.GetCacheState(tctx(t), &pb.GetCacheStateRequest{TenantId: "t", ModelId: "m"})
		return err == nil && r != nil
	})
	began := time.Now()
	s.Stop()
	select {
	case <-s.Done():
		if s.Err() != nil {
			t.Fatalf("Run: %v", s.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run outlived the drain timeout")
	}
	if d := time.Since(began); d < 200*time.Millisecond || d > 4*time.Second {
		t.Fatalf("drain took %v, want about the 200 ms timeout", d)
	}
	if _, err := st.CloseAndRecv(); status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
		t.Fatalf("cut-off stream: %v", err)
	}
}

// TestStuckHandler: a handler that ignores the hard stop does not hold Run
// beyond DrainTimeout plus the stop grace.
func TestStuckHandler(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the stop grace")
	}
	slow := &slowIndex{entered: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(slow.release)
	cfg := testConfig()
	cfg.DrainTimeout = 100 * time.Millisecond
	cfg.WrapIndex = func(ix rpc.Index) rpc.Index { slow.Index = ix; return slow }
	s := start(t, cfg)
	go func() { _, _ = s.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{ModelId: "slow"}) }()
	slow.waitEntered(t)
	s.Stop()
	select {
	case <-s.Done():
	case <-time.After(6 * time.Second):
		t.Fatal("a stuck handler held Run")
	}
}

func TestPprofFlag(t *testing.T) {
	cfg := testConfig()
	cfg.EnablePprof = true
	s := start(t, cfg)
	if code, _ := httpDo(t, http.MethodGet, "http://"+s.HTTPAddr().String()+"/debug/pprof/", "", nil); code != http.StatusOK {
		t.Fatalf("pprof: %d", code)
	}
}

// TestHealthDuringDrain: the health service turns NOT_SERVING on drain, and
// a client watching health on an open connection hears it while calls are
// still in flight. (A new Check races the drain's GOAWAY, which refuses new
// streams, so the watch opened before the drain is the deterministic probe.)
func TestHealthDuringDrain(t *testing.T) {
	slow := &slowIndex{entered: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(slow.release)
	cfg := testConfig()
	cfg.WrapIndex = func(ix rpc.Index) rpc.Index { slow.Index = ix; return slow }
	s := start(t, cfg)
	conn, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	if r, err := hc.Check(tctx(t), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("before: %v %v", r, err)
	}
	watch, err := hc.Watch(tctx(t), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch before: %v %v", r, err)
	}
	go func() { _, _ = s.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{ModelId: "slow"}) }()
	slow.waitEntered(t)
	s.Stop()
	r, err := watch.Recv()
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch during drain: %v %v", r, err)
	}
	select {
	case <-s.Done():
		t.Fatal("Run returned with a call in flight")
	default:
	}
}

// TestDrainEndsLookupStreams: a gateway's long-lived LookupRouteStream does
// not hold the drain until DrainTimeout. Once the drain begins, the stream's
// next lookup is answered and the stream ends with UNAVAILABLE, and Run
// returns long before the timeout.
func TestDrainEndsLookupStreams(t *testing.T) {
	cfg := testConfig()
	cfg.DrainTimeout = time.Minute
	s := start(t, cfg)
	stream, err := s.cli.LookupRouteStream(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	req := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", PrefixHash: []byte("12345678")}
	lookup := func() error {
		// Send reports a stream the server ended as io.EOF; Recv has the
		// status.
		if err := stream.Send(req); err != nil && err != io.EOF {
			return err
		}
		_, err := stream.Recv()
		return err
	}
	if err := lookup(); err != nil {
		t.Fatalf("before the drain: %v", err)
	}
	if v, _ := servertest.Value(servertest.Scrape(t, s.Server), "inferencecache_lookup_streams_open", ""); v != 1 {
		t.Fatalf("lookup_streams_open = %v with one stream open, want 1", v)
	}
	began := time.Now()
	s.Stop()
	// The gateway keeps looking up (bounded): the stream ends after at most
	// one answer once the drain has begun.
	var last error
	for range 1000 {
		if last = lookup(); last != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if status.Code(last) != codes.Unavailable {
		t.Fatalf("lookup stream during the drain ended with %v, want UNAVAILABLE", last)
	}
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Run still draining 10 s after the lookup stream ended (DrainTimeout is 1 min)")
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Fatalf("drain took %v", d)
	}
}
