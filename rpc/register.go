package rpc

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

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
// except that LookupRoute, LookupRouteStream and ReportCacheState decode
// into reused memory (lookupCall, updateMsg), and that a request the codec
// cannot decode is answered InvalidArgument, on every method, rather than
// grpc-go's Internal (decodeError). gs must have been built with
// ServerOptions; the handlers stay correct under the standard codec (the
// pooled types are proto messages), only slower, and an undecodable
// request is then Internal.
func Register(gs grpc.ServiceRegistrar, svc *Service) {
	desc := pb.InferenceCache_ServiceDesc
	desc.Methods = append([]grpc.MethodDesc(nil), desc.Methods...)
	desc.Streams = append([]grpc.StreamDesc(nil), desc.Streams...)
	for i := range desc.Methods {
		if desc.Methods[i].MethodName == "LookupRoute" {
			desc.Methods[i].Handler = lookupRouteHandler
		} else {
			desc.Methods[i].Handler = decodingUnary(desc.Methods[i].Handler)
		}
	}
	for i := range desc.Streams {
		switch desc.Streams[i].StreamName {
		case "ReportCacheState":
			desc.Streams[i].Handler = reportCacheStateHandler
		case "LookupRouteStream":
			desc.Streams[i].Handler = lookupRouteStreamHandler
		default:
			desc.Streams[i].Handler = decodingStream(desc.Streams[i].Handler)
		}
	}
	gs.RegisterService(&desc, svc)
}

// decodingUnary wraps a generated unary handler so that its request is
// decoded through a decodeTarget: a request the codec refuses is answered
// InvalidArgument. It costs the call one small allocation (cold methods
// only; LookupRoute has its own handler).
func decodingUnary(h grpc.MethodHandler) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		return h(srv, ctx, func(v any) error {
			m, ok := v.(proto.Message)
			if !ok {
				return dec(v)
			}
			t := &decodeTarget{Message: m}
			if err := dec(t); err != nil {
				return err
			}
			return decodeError(t)
		}, interceptor)
	}
}

// decodingStream wraps a generated stream handler so that every message it
// receives goes through a decodeTarget (see decodingUnary).
func decodingStream(h grpc.StreamHandler) grpc.StreamHandler {
	return func(srv any, stream grpc.ServerStream) error {
		return h(srv, decodingServerStream{stream})
	}
}

// decodingServerStream is a ServerStream whose RecvMsg answers a message
// the codec refuses with InvalidArgument.
type decodingServerStream struct{ grpc.ServerStream }

func (s decodingServerStream) RecvMsg(v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return s.ServerStream.RecvMsg(v)
	}
	t := &decodeTarget{Message: m}
	if err := s.ServerStream.RecvMsg(t); err != nil {
		return err
	}
	return decodeError(t)
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
	if err := decodeError(c); err != nil {
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

// lookupRouteStreamHandler is the LookupRouteStream handler: each request is
// decoded into a pooled call and answered from the call's response, which
// Codec.Marshal releases, exactly as lookupRouteHandler does for one unary
// call. It answers in order, one request at a time, and ends the stream
// after an answer once the service drains (see Service.Drain).
func lookupRouteStreamHandler(srv any, stream grpc.ServerStream) error {
	s := srv.(*Service)
	s.lookupStreams.Add(1)
	defer s.lookupStreams.Add(-1)
	ctx := stream.Context()
	for {
		c := getLookupCall()
		if err := stream.RecvMsg(c); err != nil {
			putLookupCall(c)
			if errors.Is(err, io.EOF) {
				return nil // the client closed its side: the stream ends OK
			}
			return err
		}
		if err := decodeError(c); err != nil {
			putLookupCall(c)
			return err
		}
		if err := stream.SendMsg(s.serveLookup(ctx, c)); err != nil {
			return err // c was not marshaled: the GC takes it
		}
		if s.draining.Load() {
			return errDrainingStream
		}
	}
}
