package lookupclient_test

import (
	"context"
	"encoding/binary"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/lookupclient"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// slowModel's lookups take slowDelay in the index.
const (
	slowModel = "slow"
	slowDelay = 300 * time.Millisecond
)

type slowIndex struct{ rpc.Index }

func (s slowIndex) LookupRoute(req *engine.LookupRequest, now int64, res *engine.LookupResult) {
	if req.ModelID == slowModel {
		time.Sleep(slowDelay)
	}
	s.Index.LookupRoute(req, now, res)
}

// testServer is the server package's gRPC setup (pooled codec and
// handlers) over one engine, on 127.0.0.1, with a frozen clock so that
// answers compare exactly.
type testServer struct {
	svc  *rpc.Service
	conn *grpc.ClientConn
	cli  pb.InferenceCacheClient
}

func start(t *testing.T) *testServer {
	t.Helper()
	store := policy.NewStore()
	frozen := time.Now()
	svc, err := rpc.NewService(rpc.Config{
		Index: slowIndex{engine.New(engine.Config{Policies: store})}, Policies: store,
		Logger: slog.New(slog.DiscardHandler), Now: func() time.Time { return frozen },
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(rpc.ServerOptions()...)
	rpc.Register(gs, svc)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
	})
	s := &testServer{svc: svc, conn: conn, cli: pb.NewInferenceCacheClient(conn)}
	s.seed(t, frozen.UnixMicro())
	return s
}

func hashOf(chain, block int) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(chain)<<32|uint64(block)|1<<63)
}

func chainOf(chain, blocks int) ([][]byte, []int32) {
	var hs [][]byte
	var cs []int32
	for i := range blocks {
		hs, cs = append(hs, hashOf(chain, i)), append(cs, 16)
	}
	return hs, cs
}

// seed reports chains 0..7 of up to 12 blocks on replicas r0..r4, for the
// models "m" and slowModel.
func (s *testServer) seed(t *testing.T, now int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.cli.ReportCacheState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, m := range []string{"m", slowModel} {
		for c := range 8 {
			hs, cs := chainOf(c, 4+rng.IntN(9))
			for r := range 5 {
				if rng.IntN(2) == 0 {
					continue
				}
				u := &pb.CacheStateUpdate{TenantId: "t", ModelId: m, HashScheme: "vllm", ReplicaId: "r" + string(rune('0'+r)), TimestampUs: now - int64(rng.IntN(100))*1_000_000,
					Prefixes: []*pb.PrefixEntry{{BlockHashes: hs, BlockTokenCounts: cs}}}
				if err := st.Send(u); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
}

func randomRequest(rng *rand.Rand) *pb.LookupRouteRequest {
	hs, cs := chainOf(rng.IntN(10), 1+rng.IntN(12))
	r := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", BlockHashes: hs, BlockTokenCounts: cs}
	if rng.IntN(4) == 0 {
		r.BlockHashes, r.BlockTokenCounts = nil, nil
		r.PrefixHash = hs[len(hs)-1]
	}
	return r
}

func ctxT(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func withoutLatency(r *pb.LookupRouteResponse) *pb.LookupRouteResponse {
	c := proto.Clone(r).(*pb.LookupRouteResponse)
	c.LookupLatencyUs = 0
	return c
}

// TestMatchesUnary: many goroutines share a client with fewer streams than
// callers; every answer, streamed or unary, is the unary call's.
func TestMatchesUnary(t *testing.T) {
	s := start(t)
	c := lookupclient.New(s.conn, lookupclient.Options{Streams: 2})
	defer c.Close()
	// One caller at a time: every call goes on the one stream it opened.
	rng := rand.New(rand.NewPCG(9, 9))
	for range 100 {
		if _, err := c.LookupRoute(ctxT(t), randomRequest(rng)); err != nil {
			t.Fatal(err)
		}
	}
	if c.UnaryFallbacks() != 0 || c.OpenStreams() != 1 {
		t.Fatalf("sequential calls: %d unary fallbacks, %d streams open; want 0 and 1", c.UnaryFallbacks(), c.OpenStreams())
	}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 200 {
				req := randomRequest(rng)
				got, err := c.LookupRoute(ctxT(t), req)
				if err != nil {
					t.Errorf("LookupRoute: %v", err)
					return
				}
				want, err := s.cli.LookupRoute(ctxT(t), req)
				if err != nil {
					t.Errorf("unary LookupRoute: %v", err)
					return
				}
				if !proto.Equal(withoutLatency(got), withoutLatency(want)) {
					t.Errorf("client answered %v, unary %v", got, want)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("unary fallbacks: %d of 1200", c.UnaryFallbacks())
}

// TestDeadline: a call's context bounds its wait on the stream; the stream
// it cancelled is replaced and the next call is answered.
func TestDeadline(t *testing.T) {
	s := start(t)
	c := lookupclient.New(s.conn, lookupclient.Options{Streams: 1})
	defer c.Close()
	hs, cs := chainOf(1, 4)
	fast := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", BlockHashes: hs, BlockTokenCounts: cs}
	slow := &pb.LookupRouteRequest{TenantId: "t", ModelId: slowModel, HashScheme: "vllm", BlockHashes: hs, BlockTokenCounts: cs}
	if _, err := c.LookupRoute(ctxT(t), fast); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		code codes.Code
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Millisecond)
		}, codes.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(30*time.Millisecond, cancel)
			return ctx, cancel
		}, codes.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			began := time.Now()
			_, err := c.LookupRoute(ctx, slow)
			if status.Code(err) != tc.code {
				t.Fatalf("slow lookup: %v, want %v", err, tc.code)
			}
			if d := time.Since(began); d > slowDelay/2 {
				t.Fatalf("the call returned after %v, not when its context ended", d)
			}
			if r, err := c.LookupRoute(ctxT(t), fast); err != nil || r.GetReasonCode() == "" {
				t.Fatalf("the next lookup: %v, %v", r, err)
			}
		})
	}
}

// TestDrainRetriesUnsentRequests: a draining server ends each stream after
// an answer; the client's next call on such a stream was never read, so it
// is retried as a unary call and answered. Every call is answered.
func TestDrainRetriesUnsentRequests(t *testing.T) {
	s := start(t)
	c := lookupclient.New(s.conn, lookupclient.Options{Streams: 3})
	defer c.Close()
	rng := rand.New(rand.NewPCG(3, 3))
	call := func() {
		t.Helper()
		req := randomRequest(rng)
		got, err := c.LookupRoute(ctxT(t), req)
		if err != nil {
			t.Fatalf("LookupRoute: %v", err)
		}
		want, err := s.cli.LookupRoute(ctxT(t), req)
		if err != nil || !proto.Equal(withoutLatency(got), withoutLatency(want)) {
			t.Fatalf("client answered %v, unary %v (%v)", got, want, err)
		}
	}
	for range 10 {
		call()
	}
	before := c.UnaryFallbacks()
	s.svc.Drain()
	for range 10 {
		call()
	}
	if c.UnaryFallbacks() == before {
		t.Fatal("no call was retried as a unary call after the drain")
	}
}

// TestClose: after Close, calls are still answered (as unary calls) and a
// stream in use when Close ran is not pooled again.
func TestClose(t *testing.T) {
	s := start(t)
	c := lookupclient.New(s.conn, lookupclient.Options{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(4, uint64(g)))
			for range 50 {
				if _, err := c.LookupRoute(ctxT(t), randomRequest(rng)); err != nil {
					t.Errorf("LookupRoute: %v", err)
					return
				}
			}
		})
	}
	time.Sleep(5 * time.Millisecond)
	c.Close()
	wg.Wait()
	if n := c.OpenStreams(); n != 0 {
		t.Fatalf("%d streams open after Close and the last call", n)
	}
	if _, err := c.LookupRoute(ctxT(t), randomRequest(rand.New(rand.NewPCG(5, 5)))); err != nil {
		t.Fatalf("LookupRoute after Close: %v", err)
	}
	if n := c.OpenStreams(); n != 0 {
		t.Fatalf("a call after Close opened %d streams", n)
	}
}
