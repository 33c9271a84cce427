package rpc_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// TestIDRuleEveryMethod pins the one id rule of docs/wire.md on every
// method, over a real gRPC server: the lookups (LookupRoute and its stream,
// LookupPDRoute) fail open with NO_HINT; RenderTemplate answers
// TEMPLATE_NOT_FOUND naming the limit; every other method (StreamCacheEvents,
// GetCacheState, ReportCacheState, PublishEvent) refuses it with
// InvalidArgument.
func TestIDRuleEveryMethod(t *testing.T) {
	env := newEnv(t, envOpts{})
	env.seed(t, "team")
	a, ac := chainOf(chainA, 8)

	t.Run("GetCacheState refuses", func(t *testing.T) {
		for _, c := range []struct {
			field string
			req   *pb.GetCacheStateRequest
		}{
			{"tenant_id", &pb.GetCacheStateRequest{TenantId: huge, ModelId: model}},
			{"model_id", &pb.GetCacheStateRequest{TenantId: "team", ModelId: huge}},
		} {
			_, err := env.client.GetCacheState(ctx(t), c.req)
			wantInvalidID(t, err, c.field)
		}
		// At the limit is fine.
		resp, err := env.client.GetCacheState(ctx(t), &pb.GetCacheStateRequest{TenantId: "team", ModelId: strings.Repeat("m", rpc.MaxIDBytes)})
		if err != nil || resp.GetSummary().GetTotalPrefixes() != 0 {
			t.Fatalf("id at the limit: %v, %v; want an empty state", resp, err)
		}
	})
	t.Run("PublishEvent refuses", func(t *testing.T) {
		_, err := env.client.PublishEvent(ctx(t), &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, TenantId: huge, ModelId: model, ReplicaId: "r1"})
		wantInvalidID(t, err, "tenant_id")
	})
	t.Run("ReportCacheState refuses", func(t *testing.T) {
		st, err := env.client.ReportCacheState(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&pb.CacheStateUpdate{TenantId: huge, ModelId: model, HashScheme: scheme, ReplicaId: "r9",
			Prefixes: []*pb.PrefixEntry{{BlockHashes: a, BlockTokenCounts: ac}}}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		_, err = st.CloseAndRecv()
		wantInvalidID(t, err, "tenant_id")
	})
	t.Run("LookupRoute fails open", func(t *testing.T) {
		resp, err := env.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: huge, ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac})
		if err != nil || resp.GetReasonCode() != rpc.ReasonNoHint || len(resp.GetReplicaScores()) != 0 {
			t.Fatalf("LookupRoute: %v, %v; want NO_HINT", resp, err)
		}
	})
	t.Run("LookupRouteStream fails open", func(t *testing.T) {
		st, err := env.client.LookupRouteStream(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		r := streamLookup(t, st, &pb.LookupRouteRequest{TenantId: "team", ModelId: huge, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac})
		if r.GetReasonCode() != rpc.ReasonNoHint || len(r.GetReplicaScores()) != 0 {
			t.Fatalf("LookupRouteStream: %v; want NO_HINT", r)
		}
		// The stream goes on.
		if r := streamLookup(t, st, &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac}); r.GetReasonCode() != rpc.ReasonPrefixMatch {
			t.Fatalf("next lookup on the stream: %v", r)
		}
	})
	t.Run("LookupPDRoute fails open", func(t *testing.T) {
		resp, err := env.client.LookupPDRoute(ctx(t), &pb.LookupPDRouteRequest{TenantId: huge, ModelId: huge, PrefixHash: a[0]})
		if err != nil || resp.GetReasonCode() != rpc.ReasonNoHint {
			t.Fatalf("LookupPDRoute: %v, %v; want NO_HINT", resp, err)
		}
	})
	t.Run("RenderTemplate: not found, the limit named", func(t *testing.T) {
		resp, err := env.client.RenderTemplate(ctx(t), &pb.RenderTemplateRequest{TenantId: huge, TemplateRef: "ns/t"})
		if err != nil || resp.GetReasonCode() != rpc.ReasonTemplateNotFound || !strings.Contains(resp.GetMessage(), "id limit") || strings.Contains(resp.GetMessage(), huge) {
			t.Fatalf("RenderTemplate: %v, %v; want TEMPLATE_NOT_FOUND naming the limit, not the id", resp, err)
		}
	})
	t.Run("StreamCacheEvents: InvalidArgument before the stream starts", func(t *testing.T) {
		st, err := env.client.StreamCacheEvents(ctx(t), &pb.StreamEventsRequest{TenantId: huge, ModelId: huge})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("StreamCacheEvents: %v; want InvalidArgument", err)
		}
	})
}

// TestUndecodableRequestInvalidArgument: a request whose bytes do not decode
// as its message is answered InvalidArgument, on unary calls and streams
// alike (grpc-go's own answer would be Internal: it wraps any codec error in
// it). Over a real gRPC server on 127.0.0.1 with the server's codec and
// handlers; the server keeps serving afterwards.
func TestUndecodableRequestInvalidArgument(t *testing.T) {
	env := newEnv(t, envOpts{})
	env.seed(t, "team")
	conn := rawConn(t, env)
	// Two undecodable payloads: a length-delimited field claiming more
	// bytes than follow, and a string field (tenant_id or model_id in
	// every request here, field 2) that is not UTF-8, which the fast
	// paths hand to proto.Unmarshal, which refuses it.
	payloads := map[string][]byte{
		"truncated": {0x12, 0x10, 'a', 'b'},
		"not utf-8": {0x12, 0x02, 0xff, 0xfe},
	}
	unary := []string{
		pb.InferenceCache_LookupRoute_FullMethodName,
		pb.InferenceCache_GetCacheState_FullMethodName,
		pb.InferenceCache_PublishEvent_FullMethodName,
		pb.InferenceCache_LookupPDRoute_FullMethodName,
		pb.InferenceCache_RenderTemplate_FullMethodName,
	}
	streams := []struct {
		method         string
		client, server bool
	}{
		{pb.InferenceCache_LookupRouteStream_FullMethodName, true, true},
		{pb.InferenceCache_ReportCacheState_FullMethodName, true, false},
		{pb.InferenceCache_StreamCacheEvents_FullMethodName, false, true},
	}
	for name, bad := range payloads {
		for _, method := range unary {
			t.Run(name+" "+method, func(t *testing.T) {
				var out []byte
				err := conn.Invoke(ctx(t), method, &bad, &out, grpc.ForceCodec(rawCodec{}))
				wantUndecodable(t, err)
			})
		}
		for _, s := range streams {
			t.Run(name+" "+s.method, func(t *testing.T) {
				desc := &grpc.StreamDesc{ClientStreams: s.client, ServerStreams: s.server}
				st, err := conn.NewStream(ctx(t), desc, s.method, grpc.ForceCodec(rawCodec{}))
				if err != nil {
					t.Fatal(err)
				}
				if err := st.SendMsg(&bad); err != nil && !errors.Is(err, io.EOF) {
					t.Fatal(err)
				}
				if err := st.CloseSend(); err != nil {
					t.Fatal(err)
				}
				var out []byte
				wantUndecodable(t, st.RecvMsg(&out))
			})
		}
	}
	// A ReportCacheState stream applies the updates before the bad one.
	t.Run("ReportCacheState applies what came before", func(t *testing.T) {
		desc := &grpc.StreamDesc{ClientStreams: true}
		st, err := conn.NewStream(ctx(t), desc, pb.InferenceCache_ReportCacheState_FullMethodName, grpc.ForceCodec(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		c, cc := chainOf(chainC, 2)
		good, err := proto.Marshal(&pb.CacheStateUpdate{TenantId: "team", ModelId: model, HashScheme: scheme, ReplicaId: "r7",
			Prefixes: []*pb.PrefixEntry{{BlockHashes: c, BlockTokenCounts: cc}}})
		if err != nil {
			t.Fatal(err)
		}
		bad := payloads["truncated"]
		for _, m := range [][]byte{good, bad} {
			if err := st.SendMsg(&m); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
		}
		_ = st.CloseSend()
		var out []byte
		wantUndecodable(t, st.RecvMsg(&out))
		if got := replicaIDs(lookupChain(t, env, "team", c, cc)); strings.Join(got, ",") != "r7" {
			t.Fatalf("holders of the good update's chain: %v, want r7", got)
		}
	})
	// The server still answers.
	a, ac := chainOf(chainA, 8)
	if r := lookupChain(t, env, "team", a, ac); r.GetReasonCode() != rpc.ReasonPrefixMatch {
		t.Fatalf("after undecodable requests: %v", r)
	}
}

func wantUndecodable(t *testing.T, err error) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "cannot decode") {
		t.Fatalf("err = %v, want InvalidArgument (cannot decode the request)", err)
	}
}

// rawConn serves env's service as the server package does (the pooled
// codec and handlers) on another loopback listener and returns a client
// connection to it, for calls with raw message bytes.
func rawConn(t *testing.T, env *env) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(rpc.ServerOptions()...)
	rpc.Register(gs, env.svc)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
	})
	return conn
}
