package rpc

import (
	"context"

	"google.golang.org/grpc"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// ServerOptions are the grpc.ServerOptions Register needs: the Codec, which
// decodes the hot messages into pooled memory and falls back to proto for
// everything else.
//
// The pooled LookupRoute response goes back to its pool as soon as the
// codec has written it, so the server must not also install something that
// keeps the response message after it is sent (a stats.Handler reading
// OutPayload.Payload, binary logging, grpc.EnableTracing).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodecV2(Codec{})}
}

// Register registers svc on gs as pb.RegisterInferenceCacheServer does,
// except that LookupRoute and ReportCacheState decode into reused memory
// (lookupCall, updateMsg). gs must have been built with ServerOptions; the
// handlers stay correct under the standard codec (the pooled types are
// proto messages), only slower.
func Register(gs grpc.ServiceRegistrar, svc *Service) {
	desc := pb.InferenceCache_ServiceDesc
	desc.Methods = append([]grpc.MethodDesc(nil), desc.Methods...)
	desc.Streams = append([]grpc.StreamDesc(nil), desc.Streams...)
	for i := range desc.Methods {
		if desc.Methods[i].MethodName == "LookupRoute" {
			desc.Methods[i].Handler = lookupRouteHandler
		}
	}
	for i := range desc.Streams {
		if desc.Streams[i].StreamName == "ReportCacheState" {
			desc.Streams[i].Handler = reportCacheStateHandler
		}
	}
	gs.RegisterService(&desc, svc)
}

// lookupInfo is the interceptors' view of the pooled LookupRoute handler.
var lookupInfo = &grpc.UnaryServerInfo{FullMethod: pb.InferenceCache_LookupRoute_FullMethodName}

// lookupRouteHandler is the LookupRoute method handler: it decodes into a
// pooled call and answers into the call's response, which Codec.Marshal
// releases. Interceptors see the call (*lookupCall, a proto message equal
// to the request) and the reply (*lookupReply, equal to the response).
func lookupRouteHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	c := getLookupCall()
	if err := dec(c); err != nil {
		putLookupCall(c)
		return nil, err
	}
	s := srv.(*Service)
	if interceptor == nil {
		return s.serveLookup(ctx, c), nil
	}
	return interceptor(ctx, c, lookupInfo, s.lookupUnary)
}

// serveLookupUnary is the grpc.UnaryHandler of a pooled call (kept as a
// method value in Service.lookupUnary, made once).
func (s *Service) serveLookupUnary(ctx context.Context, req any) (any, error) {
	return s.serveLookup(ctx, req.(*lookupCall)), nil
}

func (s *Service) serveLookup(ctx context.Context, c *lookupCall) *lookupReply {
	r := &c.reply
	r.LookupRouteResponse.Reset()
	s.lookupRoute(ctx, &c.LookupRouteRequest, &r.LookupRouteResponse, &r.scores)
	return r
}

// reportCacheStateHandler is the ReportCacheState stream handler: the
// stream receives every update into one updateMsg.
func reportCacheStateHandler(srv any, stream grpc.ServerStream) error {
	msg := new(updateMsg)
	ack := func(a *pb.Ack) error { return stream.SendMsg(a) }
	return srv.(*Service).reportCacheState(stream, msg, &msg.CacheStateUpdate, ack)
}
