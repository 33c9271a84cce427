package rpc_test

import (
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// TestRegisterUnderStandardCodec: the pooled handlers registered on a server
// without rpc.ServerOptions (grpc's own proto codec) still decode requests
// and encode answers: a lookup answers exactly as through the pooled codec,
// and a report stream is applied and acknowledged.
func TestRegisterUnderStandardCodec(t *testing.T) {
	env := reasonEnv(t, false)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rpc.Register(gs, env.svc)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(); gs.Stop() })
	plain := pb.NewInferenceCacheClient(conn)

	a, ac := chainOf(chainA, 8)
	req := &pb.LookupRouteRequest{TenantId: "optout", ModelId: model, HashScheme: scheme, BlockHashes: a, BlockTokenCounts: ac}
	got, err := plain.LookupRoute(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	want, err := env.client.LookupRoute(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	// Scores and probabilities decay with time between the two calls.
	for _, r := range []*pb.LookupRouteResponse{got, want} {
		r.LookupLatencyUs = 0
		for _, s := range r.ReplicaScores {
			s.Score, s.EstimatedCacheHitProb = 0, 0
		}
	}
	if got.GetReasonCode() != rpc.ReasonPrefixMatch || !proto.Equal(got, want) {
		t.Fatalf("standard codec answered %v, pooled codec %v", got, want)
	}

	st, err := plain.ReportCacheState(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	c, cc := chainOf(chainC, 2)
	if err := st.Send(&pb.CacheStateUpdate{TenantId: "optout", ModelId: model, HashScheme: scheme, ReplicaId: "r9",
		Prefixes: []*pb.PrefixEntry{{BlockHashes: c, BlockTokenCounts: cc}}}); err != nil {
		t.Fatal(err)
	}
	ack, err := st.CloseAndRecv()
	if err != nil || !ack.GetAccepted() {
		t.Fatalf("ack %v, %v", ack, err)
	}
	resp, err := plain.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: "optout", ModelId: model, HashScheme: scheme, BlockHashes: c, BlockTokenCounts: cc})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range resp.GetReplicaScores() {
		found = found || s.GetReplicaId() == "r9"
	}
	if !found {
		t.Fatalf("the reported chain is not answered with r9: %v", resp)
	}
}
