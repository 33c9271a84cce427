package rpc_test

import (
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// streamLookup sends req on stream and returns its answer.
func streamLookup(t testing.TB, stream pb.InferenceCache_LookupRouteStreamClient, req *pb.LookupRouteRequest) *pb.LookupRouteResponse {
	t.Helper()
	if err := stream.Send(req); err != nil {
		t.Fatalf("LookupRouteStream Send: %v", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("LookupRouteStream Recv: %v", err)
	}
	return resp
}

// generic serves a *rpc.Service through the generated registration, so its
// LookupRouteStream method (not Register's pooled handler) answers.
type generic struct{ *rpc.Service }

// randomLookups draws n lookups over the reasonEnv data set: chains of
// every length (matching, partial, missing), exact prefix hashes, token ids,
// unbalanced chains and unknown keys, across tenants with different policies.
func randomLookups(rng *rand.Rand, n int) []*pb.LookupRouteRequest {
	tenants := []string{"team", "noaff", "reqchain", "tiny", "tinynoaff", "floor", "flooraff", "score", "optout", "nohot", "nochain", "tok", "lora", "ghost"}
	reqs := make([]*pb.LookupRouteRequest, n)
	for i := range reqs {
		r := &pb.LookupRouteRequest{TenantId: tenants[rng.IntN(len(tenants))], ModelId: model, HashScheme: scheme}
		hs, cs := chainOf(1+rng.IntN(3), 1+rng.IntN(10))
		switch rng.IntN(6) {
		case 0:
			r.PrefixHash, r.PrefixTokenCount = hs[len(hs)-1], int32(16*len(hs))
		case 1:
			r.TokenIds = tokens(rng.IntN(2)*1000, 8+rng.IntN(200))
		case 2:
			r.BlockHashes, r.BlockTokenCounts = hs, cs[:rng.IntN(len(cs))] // unbalanced
		default:
			r.BlockHashes, r.BlockTokenCounts = hs, cs
		}
		switch rng.IntN(10) {
		case 0:
			r.ModelId = "other"
		case 1:
			r.HashScheme = "sglang"
		case 2:
			r.AdapterId = "lora1"
		}
		reqs[i] = r
	}
	return reqs
}

// TestLookupRouteStreamMatchesUnary: random lookups sent pipelined on one
// stream (every request written before the first answer is read) are
// answered in order, each with exactly LookupRoute's answer, through the
// pooled handler and through the generated registration.
func TestLookupRouteStreamMatchesUnary(t *testing.T) {
	frozen := time.Now()
	env := reasonEnvAt(t, true, func() time.Time { return frozen })
	reqs := randomLookups(rand.New(rand.NewPCG(5, 11)), 600)
	want := make([]*pb.LookupRouteResponse, len(reqs))
	for i, req := range reqs {
		resp, err := env.client.LookupRoute(ctx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = withoutLatency(resp)
	}
	for _, tc := range []struct {
		name   string
		client pb.InferenceCacheClient
	}{
		{"pooled", env.client},
		{"generated", serve(t, generic{env.svc})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := tc.client.LookupRouteStream(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			sent := make(chan error, 1)
			go func() {
				for _, req := range reqs {
					if err := stream.Send(req); err != nil {
						sent <- err
						return
					}
				}
				sent <- stream.CloseSend()
			}()
			reasons := map[string]int{}
			for i := range reqs {
				got, err := stream.Recv()
				if err != nil {
					t.Fatalf("answer %d: %v", i, err)
				}
				if !proto.Equal(withoutLatency(got), want[i]) {
					t.Fatalf("answer %d to %v:\n stream %v\n unary  %v", i, reqs[i], got, want[i])
				}
				reasons[got.GetReasonCode()]++
			}
			if _, err := stream.Recv(); err != io.EOF {
				t.Fatalf("Recv after the last answer = %v, want EOF", err)
			}
			// The handler returned before the client saw the end.
			if n := env.svc.LookupStreamsOpen(); n != 0 {
				t.Fatalf("LookupStreamsOpen = %d after the stream ended, want 0", n)
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			// The draw must reach the interesting answers, or equality
			// proves little.
			for _, r := range []string{rpc.ReasonPrefixMatch, rpc.ReasonAffinityHint, rpc.ReasonNoHint, rpc.ReasonTenantHot, rpc.ReasonUnknownTenant, rpc.ReasonUnknownModel, rpc.ReasonPolicyRequiresChain} {
				if reasons[r] == 0 {
					t.Errorf("no %s answer among %d (%v)", r, len(reqs), reasons)
				}
			}
		})
	}
}

// TestLookupRouteStreamDrain: once the service drains, a stream answers the
// request it has and then ends with UNAVAILABLE; unary lookups still answer,
// and a new stream ends after its first answer too.
func TestLookupRouteStreamDrain(t *testing.T) {
	for _, tc := range []struct {
		name string
		reg  func(env *env) pb.InferenceCacheClient
	}{
		{"pooled", func(env *env) pb.InferenceCacheClient { return env.client }},
		{"generated", func(env *env) pb.InferenceCacheClient { return serve(t, generic{env.svc}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, envOpts{})
			env.seed(t, "team")
			client := tc.reg(env)
			a, ac := chainOf(chainA, 8)
			req := &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac}
			stream, err := client.LookupRouteStream(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			if r := streamLookup(t, stream, req); r.GetReasonCode() != rpc.ReasonPrefixMatch {
				t.Fatalf("before the drain: %v", r)
			}
			env.svc.Drain()
			for _, s := range []pb.InferenceCache_LookupRouteStreamClient{stream, func() pb.InferenceCache_LookupRouteStreamClient {
				s, err := client.LookupRouteStream(ctx(t))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}()} {
				if r := streamLookup(t, s, req); r.GetReasonCode() != rpc.ReasonPrefixMatch {
					t.Fatalf("the answer after the drain began: %v", r)
				}
				_, err := s.Recv()
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("after the answer: %v, want UNAVAILABLE", err)
				}
			}
			if r, err := client.LookupRoute(ctx(t), req); err != nil || r.GetReasonCode() != rpc.ReasonPrefixMatch {
				t.Fatalf("unary lookup while draining: %v, %v", r, err)
			}
		})
	}
}

// rawCodec sends and receives message bytes as they are, so a test can put
// bytes on the wire that no proto message marshals to.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// TestLookupRouteStreamMalformedMessage: a message that does not decode
// ends the stream with INVALID_ARGUMENT, as it fails a unary call; the
// answers before it were delivered and the server keeps serving.
func TestLookupRouteStreamMalformedMessage(t *testing.T) {
	env := newEnv(t, envOpts{})
	env.seed(t, "team")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(rpc.ServerOptions()...)
	rpc.Register(gs, env.svc)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	desc := &grpc.StreamDesc{StreamName: "LookupRouteStream", ClientStreams: true, ServerStreams: true}
	st, err := conn.NewStream(ctx(t), desc, pb.InferenceCache_LookupRouteStream_FullMethodName, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	a, ac := chainOf(chainA, 8)
	good, err := proto.Marshal(&pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SendMsg(&good); err != nil {
		t.Fatal(err)
	}
	var out []byte
	if err := st.RecvMsg(&out); err != nil {
		t.Fatalf("answer to the good request: %v", err)
	}
	var resp pb.LookupRouteResponse
	if err := proto.Unmarshal(out, &resp); err != nil || resp.GetReasonCode() != rpc.ReasonPrefixMatch {
		t.Fatalf("answer %v (%v), want PREFIX_MATCH", &resp, err)
	}
	bad := []byte{0x3a, 0x10, 1, 2} // block hash field claiming 16 bytes, 2 present
	if err := st.SendMsg(&bad); err != nil {
		t.Fatal(err)
	}
	if err := st.RecvMsg(&out); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("after a malformed message: %v, want INVALID_ARGUMENT", err)
	}
	// The server still answers, on a new stream.
	client := pb.NewInferenceCacheClient(conn)
	s2, err := client.LookupRouteStream(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if r := streamLookup(t, s2, &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac}); r.GetReasonCode() != rpc.ReasonPrefixMatch {
		t.Fatalf("a new stream after the malformed one: %v", r)
	}
}
