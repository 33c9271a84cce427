package rpc_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// env is a real gRPC server on 127.0.0.1 over one engine and policy store,
// with a client connected to it.
type env struct {
	e      *engine.Engine
	store  *policy.Store
	svc    *rpc.Service
	obs    *recObserver
	drops  *recDrops
	slow   *slowIndex
	client pb.InferenceCacheClient
}

type envOpts struct {
	tokenizer rpc.Tokenizer
	blockSize int
	// load enables load-aware routing with its defaults (the server's).
	load bool
	// now overrides the service clock.
	now func() time.Time
}

func newEnv(t testing.TB, o envOpts) *env {
	t.Helper()
	store := policy.NewStore()
	cfg := engine.Config{Policies: store}
	if o.load {
		cfg.Load = engine.DefaultLoadConfig()
	}
	e := engine.New(cfg)
	env := &env{e: e, store: store, obs: &recObserver{}, drops: &recDrops{}, slow: &slowIndex{Index: e}}
	svc, err := rpc.NewService(rpc.Config{
		Index: env.slow, Policies: store, Observer: env.obs, Drops: env.drops,
		Tokenizer: o.tokenizer, BlockSize: o.blockSize, Logger: slog.New(slog.DiscardHandler), Now: o.now,
	})
	if err != nil {
		t.Fatal(err)
	}
	env.svc = svc
	env.client = serve(t, svc)
	return env
}

// serve runs svc on a loopback listener and returns a connected client.
func serve(t testing.TB, svc pb.InferenceCacheServer, opts ...grpc.ServerOption) pb.InferenceCacheClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]grpc.ServerOption{grpc.MaxRecvMsgSize(32 << 20)}, opts...)
	// A *rpc.Service is served as the server package serves it: the pooled
	// codec and handlers.
	s, pooled := svc.(*rpc.Service)
	if pooled {
		opts = append(opts, rpc.ServerOptions()...)
	}
	gs := grpc.NewServer(opts...)
	if pooled {
		rpc.Register(gs, s)
	} else {
		pb.RegisterInferenceCacheServer(gs, svc)
	}
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(32<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
	})
	return pb.NewInferenceCacheClient(conn)
}

// ctx returns a context bounded by 10 s (every wait in these tests is).
func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// recObserver records every ObserveLookup call.
type recObserver struct {
	mu    sync.Mutex // guards calls: appended by handler goroutines, read by the test
	calls []observed
}

type observed struct {
	model, reason string
	hint          bool
	elapsed       time.Duration
}

func (o *recObserver) ObserveLookup(model, reason string, hint bool, elapsed time.Duration) {
	o.mu.Lock()
	o.calls = append(o.calls, observed{model, reason, hint, elapsed})
	o.mu.Unlock()
}

func (o *recObserver) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.calls)
}

func (o *recObserver) last() observed {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls[len(o.calls)-1]
}

// recDrops records AddDroppedReports calls.
type recDrops struct {
	mu sync.Mutex // guards n: written by handler goroutines, read by the test
	n  map[string]int
}

func (d *recDrops) AddDroppedReports(reason string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[reason] += n
}

// take returns the counts so far and resets them.
func (d *recDrops) take() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.n
	d.n = nil
	if n == nil {
		n = map[string]int{}
	}
	return n
}

// slowIndex delays lookups of the model named slowModel, and counts
// lookups, so tests can drive the TIMEOUT path and prove short-circuits.
type slowIndex struct {
	rpc.Index
	// delay is set by the test while no lookup is in flight; lookups
	// read it under mu.
	delay time.Duration
	// mu guards lookups (written by handler goroutines, read by the test)
	// and the handlers' reads of delay.
	mu      sync.Mutex
	lookups int
}

const slowModel = "slow-model"

func (s *slowIndex) LookupRoute(req *engine.LookupRequest, now int64, res *engine.LookupResult) {
	s.mu.Lock()
	s.lookups++
	d := s.delay
	s.mu.Unlock()
	if req.ModelID == slowModel && d > 0 {
		time.Sleep(d)
	}
	s.Index.LookupRoute(req, now, res)
}

func (s *slowIndex) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookups
}

// Test data: tenant-agnostic chains of 8-byte hashes.
func hashOf(chain, block int) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(chain)<<32|uint64(block)|1<<63)
}

func chainOf(chain, blocks int) ([][]byte, []int32) {
	var hs [][]byte
	var cs []int32
	for i := 0; i < blocks; i++ {
		hs = append(hs, hashOf(chain, i))
		cs = append(cs, 16)
	}
	return hs, cs
}

const (
	model  = "llama"
	scheme = "vllm"
	chainA = 1 // r1 holds 8 blocks (128 tokens), r2 the first 2 (32 tokens)
	chainB = 2 // r3 holds 8 blocks
	chainC = 3 // nobody
)

// seed reports the standard data set for tenant over gRPC: r1 and r2 on
// chain A, r3 on chain B, every replica with warm stats (hit rate 0.5).
func (env *env) seed(t testing.TB, tenant string) { env.seedModel(t, tenant, model) }

// seedModel is seed under another model.
func (env *env) seedModel(t testing.TB, tenant, model string) {
	t.Helper()
	a, ac := chainOf(chainA, 8)
	b, bc := chainOf(chainB, 8)
	now := time.Now().UnixMicro()
	stats := &pb.ReplicaStats{HitRate: 0.5, Pressure: 0}
	env.report(t,
		&pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: "r1", TimestampUs: now, Stats: stats,
			Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}},
		&pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: "r2", TimestampUs: now, Stats: stats,
			Prefixes: []*pb.PrefixEntry{{BlockHashes: a[:2], BlockTokenCounts: ac[:2]}}},
		&pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: "r3", TimestampUs: now, Stats: stats,
			Prefixes: []*pb.PrefixEntry{{BlockHashes: b, BlockTokenCounts: bc}}},
	)
}

// report sends updates on one ReportCacheState stream and checks the Ack.
func (env *env) report(t testing.TB, us ...*pb.CacheStateUpdate) {
	t.Helper()
	st, err := env.client.ReportCacheState(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range us {
		if err := st.Send(u); err != nil {
			t.Fatal(err)
		}
	}
	ack, err := st.CloseAndRecv()
	if err != nil {
		t.Fatal(err)
	}
	if !ack.GetAccepted() || ack.GetReasonCode() != "" {
		t.Fatalf("ack = %v, want accepted with no reason", ack)
	}
}

// policy pushes one v7 policy for namespace (replacing the store's state
// with the given policies).
func (env *env) policies(t testing.TB, ps ...policy.ResolvedPolicy) {
	t.Helper()
	env.store.Apply(&policy.Body{Version: policy.PropagationVersion, Policies: ps})
}

func ptr[T any](v T) *T { return &v }

// affinityPick recomputes contract §3.8 independently.
func affinityPick(replicas []string, seed []byte) string {
	rs := slices.Clone(replicas)
	slices.Sort(rs)
	sum := sha256.Sum256(seed)
	return rs[binary.BigEndian.Uint64(sum[:8])%uint64(len(rs))]
}

// chainSeed is the §3.8 seed of a chain: 4-byte BE length + bytes each.
func chainSeed(hs [][]byte) []byte {
	var out []byte
	for _, h := range hs {
		out = binary.BigEndian.AppendUint32(out, uint32(len(h)))
		out = append(out, h...)
	}
	return out
}

func replicaIDs(r *pb.LookupRouteResponse) []string {
	var ids []string
	for _, s := range r.GetReplicaScores() {
		ids = append(ids, s.GetReplicaId())
	}
	return ids
}
