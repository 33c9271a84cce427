package lookupclient_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/lookupclient"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// unaryOnly is a server that predates LookupRouteStream: it registers the
// unary LookupRoute alone, and counts the streams clients tried to open
// (each answered UNIMPLEMENTED, as grpc-go answers an unknown method).
type unaryOnly struct {
	pb.UnimplementedInferenceCacheServer
	unary, streams atomic.Int64
}

func (u *unaryOnly) LookupRoute(_ context.Context, req *pb.LookupRouteRequest) (*pb.LookupRouteResponse, error) {
	u.unary.Add(1)
	return &pb.LookupRouteResponse{ReasonCode: "NO_HINT", AdapterId: req.GetAdapterId()}, nil
}

func startUnaryOnly(t *testing.T) (*unaryOnly, *grpc.ClientConn) {
	t.Helper()
	u := &unaryOnly{}
	desc := grpc.ServiceDesc{ServiceName: pb.InferenceCache_ServiceDesc.ServiceName, HandlerType: pb.InferenceCache_ServiceDesc.HandlerType,
		Metadata: pb.InferenceCache_ServiceDesc.Metadata}
	for _, m := range pb.InferenceCache_ServiceDesc.Methods {
		if m.MethodName == "LookupRoute" {
			desc.Methods = append(desc.Methods, m)
		}
	}
	gs := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(st)
		if method == pb.InferenceCache_LookupRouteStream_FullMethodName {
			u.streams.Add(1)
		}
		return status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}))
	gs.RegisterService(&desc, u)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
	})
	return u, conn
}

// A server without LookupRouteStream (UNIMPLEMENTED) is served by unary
// calls, and the client stops opening streams to it for a while.
func TestServerWithoutStreamsIsServedUnary(t *testing.T) {
	u, conn := startUnaryOnly(t)
	c := lookupclient.New(conn, lookupclient.Options{Streams: 4})
	defer c.Close()
	req := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", PrefixHash: hashOf(1, 1), AdapterId: "a"}
	for i := range 20 {
		resp, err := c.LookupRoute(ctxT(t), req)
		if err != nil || resp.GetReasonCode() != "NO_HINT" || resp.GetAdapterId() != "a" {
			t.Fatalf("call %d: %v, %v", i, resp, err)
		}
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				if _, err := c.LookupRoute(ctxT(t), req); err != nil {
					t.Errorf("concurrent call: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := u.unary.Load(); got != 100 {
		t.Fatalf("%d unary calls answered, want all 100", got)
	}
	if got := u.streams.Load(); got != 1 {
		t.Fatalf("%d streams opened to a server without LookupRouteStream, want 1 (then unary calls only)", got)
	}
	if n := c.OpenStreams(); n != 0 {
		t.Fatalf("%d streams still open", n)
	}
	if got := c.UnaryFallbacks(); got != 100 {
		t.Fatalf("%d unary fallbacks counted, want 100", got)
	}
}

// After the backoff the client tries a stream again (an upgraded server
// behind the same address may have LookupRouteStream by then).
func TestStreamsTriedAgainAfterTheBackoff(t *testing.T) {
	u, conn := startUnaryOnly(t)
	const backoff = 300 * time.Millisecond
	c := lookupclient.New(conn, lookupclient.Options{Streams: 2, StreamBackoff: backoff})
	defer c.Close()
	req := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", PrefixHash: hashOf(1, 1)}
	call := func() {
		t.Helper()
		if _, err := c.LookupRoute(ctxT(t), req); err != nil {
			t.Fatal(err)
		}
	}
	call()
	call()
	if got := u.streams.Load(); got != 1 {
		t.Fatalf("%d streams opened within the backoff, want 1", got)
	}
	time.Sleep(backoff + 100*time.Millisecond)
	call()
	if got := u.streams.Load(); got != 2 {
		t.Fatalf("%d streams opened after the backoff, want 2", got)
	}
}
