// Package lookupclient is a gateway's client for LookupRoute: it sends
// lookups on a small pool of long-lived LookupRouteStream streams, which
// costs the server about half the CPU of unary calls (docs/wire.md), and
// keeps the unary call's semantics for the caller: one request, one answer,
// bounded by the call's context.
//
//	c := lookupclient.New(conn, lookupclient.Options{Streams: 8})
//	defer c.Close()
//	resp, err := c.LookupRoute(ctx, req) // safe for concurrent use
//
// A call takes an idle stream, or opens one while fewer than Streams are
// open; when every stream is busy it makes a unary call instead, so a burst
// never queues behind the pool. A stream that fails is dropped (the next
// call opens a new one). A call whose stream ends with UNAVAILABLE and no
// answer is retried once as a unary call: a draining server ends its
// streams that way right after an answer, so the request was never read,
// and the drain's GOAWAY sends the retry to a ready server. (A broken
// connection also gives UNAVAILABLE; the retry may then repeat a lookup the
// server did run, which only repeats its small side effects: an LFU credit
// and the routed-load count of load-aware routing.)
//
// A server that predates LookupRouteStream answers a stream UNIMPLEMENTED
// before it reads the request: the call is retried as a unary call, and the
// client sends unary calls only for Options.StreamBackoff (30 s) before it
// tries a stream again (a rolling upgrade may bring a newer server behind
// the same address).
package lookupclient

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Defaults of Options.
const (
	// DefaultStreams is Options.Streams when it is 0.
	DefaultStreams = 4
	// DefaultStreamBackoff is Options.StreamBackoff when it is 0.
	DefaultStreamBackoff = 30 * time.Second
)

// Options configure a Client.
type Options struct {
	// Streams bounds the lookup streams the client keeps open; 0 means
	// DefaultStreams. Calls in flight beyond it go as unary calls.
	Streams int
	// StreamBackoff is how long the client sends unary calls only after
	// the server answered a stream UNIMPLEMENTED (it has no
	// LookupRouteStream); 0 means DefaultStreamBackoff.
	StreamBackoff time.Duration
}

// Client sends LookupRoute calls on pooled lookup streams. It is safe for
// concurrent use. The connection stays the caller's: Close releases the
// streams, not the connection.
type Client struct {
	rpc     pb.InferenceCacheClient
	max     int32
	backoff time.Duration // Options.StreamBackoff

	// idle holds the open streams no call is using; its capacity is max, so
	// a put never blocks (at most max streams exist). open counts the
	// streams that exist (idle or in a call): a call reserves a slot with
	// Add(1) before opening one and releases it when a stream is dropped.
	idle chan *lookupStream
	open atomic.Int32
	// closed is set once by Close; a stream returned after it is closed
	// instead of pooled, and calls go unary.
	closed atomic.Bool

	// noStreamsUntil (unix nanos) is when the client tries a stream again
	// after the server answered one UNIMPLEMENTED; 0: streams are on.
	noStreamsUntil atomic.Int64

	// unaryFallbacks counts calls made as unary calls while the client was
	// open: every stream busy, streams off (UNIMPLEMENTED), or a retry after
	// a stream the server ended.
	unaryFallbacks atomic.Int64
}

// lookupStream is one open LookupRouteStream; cancel ends it. cancelled
// is set when a call's context cancelled it, even if the call's answer had
// arrived: such a stream is dropped, not pooled. Only the call holding the
// stream touches these fields.
type lookupStream struct {
	st        pb.InferenceCache_LookupRouteStreamClient
	cancel    context.CancelFunc
	cancelled bool
}

// New returns a client that sends lookups over conn.
func New(conn grpc.ClientConnInterface, o Options) *Client {
	n := o.Streams
	if n <= 0 {
		n = DefaultStreams
	}
	b := o.StreamBackoff
	if b <= 0 {
		b = DefaultStreamBackoff
	}
	return &Client{rpc: pb.NewInferenceCacheClient(conn), max: int32(n), backoff: b, idle: make(chan *lookupStream, n)}
}

// LookupRoute answers req as the unary LookupRoute would, bounded by ctx.
// Errors are gRPC statuses; a call that ctx ends gets its
// DEADLINE_EXCEEDED or CANCELED status. opts apply to the calls that go
// unary; a streamed lookup ignores them.
func (c *Client) LookupRoute(ctx context.Context, req *pb.LookupRouteRequest, opts ...grpc.CallOption) (*pb.LookupRouteResponse, error) {
	if c.closed.Load() {
		return c.rpc.LookupRoute(ctx, req, opts...)
	}
	if until := c.noStreamsUntil.Load(); until != 0 && time.Now().UnixNano() < until {
		c.unaryFallbacks.Add(1)
		return c.rpc.LookupRoute(ctx, req, opts...)
	}
	s := c.take()
	if s == nil {
		c.unaryFallbacks.Add(1)
		return c.rpc.LookupRoute(ctx, req, opts...)
	}
	resp, retry, err := c.lookup(ctx, s, req)
	if err == nil && !s.cancelled {
		c.put(s)
		return resp, nil
	}
	c.drop(s)
	if err == nil {
		return resp, nil // the answer came as ctx ended: keep it, not the stream
	}
	if status.Code(err) == codes.Unimplemented && ctx.Err() == nil {
		// No LookupRouteStream on the server: it refused the stream before
		// reading the request.
		c.noStreamsUntil.Store(time.Now().Add(c.backoff).UnixNano())
		retry = true
	}
	if retry && ctx.Err() == nil {
		c.unaryFallbacks.Add(1)
		return c.rpc.LookupRoute(ctx, req, opts...)
	}
	return nil, err
}

// UnaryFallbacks returns how many calls went as unary calls while the
// client was open (every stream busy, streams off, or a retry).
func (c *Client) UnaryFallbacks() int64 { return c.unaryFallbacks.Load() }

// OpenStreams returns how many lookup streams are open (idle or in a call).
func (c *Client) OpenStreams() int { return int(c.open.Load()) }

// Close ends the idle streams and makes the ones in use end when their
// call returns. Later calls go as unary calls. It does not close the
// connection.
func (c *Client) Close() {
	c.closed.Store(true)
	c.closeIdle()
}

// take returns an idle stream, a reservation for a new one (a stream with
// a nil st, opened by lookup under the call's context), or nil when Streams
// are in use.
func (c *Client) take() *lookupStream {
	select {
	case s := <-c.idle:
		return s
	default:
	}
	if c.open.Add(1) > c.max {
		c.open.Add(-1)
		return nil
	}
	return new(lookupStream)
}

// put returns a healthy stream to the pool.
func (c *Client) put(s *lookupStream) {
	c.idle <- s // never blocks: at most max streams exist
	if c.closed.Load() {
		c.closeIdle() // Close may have drained the pool before this put
	}
}

// drop ends a failed stream and frees its slot.
func (c *Client) drop(s *lookupStream) {
	if s.cancel != nil {
		s.cancel()
	}
	c.open.Add(-1)
}

func (c *Client) closeIdle() {
	for {
		select {
		case s := <-c.idle:
			c.drop(s)
		default:
			return
		}
	}
}

// lookup sends req on s (opening the stream first if s is a reservation)
// and waits for the answer. ctx ending cancels the stream, which ends the
// wait. retry reports an error a unary call may fix: the stream could not
// be opened, or ended with UNAVAILABLE (see the package comment).
func (c *Client) lookup(ctx context.Context, s *lookupStream, req *pb.LookupRouteRequest) (resp *pb.LookupRouteResponse, retry bool, err error) {
	if s.st == nil {
		sctx, cancel := context.WithCancel(context.Background())
		s.cancel = cancel
		stop := context.AfterFunc(ctx, cancel) // bound the open by the call
		s.st, err = c.rpc.LookupRouteStream(sctx)
		if s.cancelled = !stop(); s.cancelled || err != nil {
			return nil, true, ctxErr(ctx, err)
		}
	}
	stop := context.AfterFunc(ctx, s.cancel)
	defer func() { s.cancelled = !stop() }()
	// Send reports a stream that has ended as io.EOF; Recv then has its
	// status, as it does when the stream ends while req is in flight.
	if err = s.st.Send(req); err == nil || errors.Is(err, io.EOF) {
		resp, err = s.st.Recv()
	}
	if err != nil {
		return nil, status.Code(err) == codes.Unavailable, ctxErr(ctx, err)
	}
	return resp, false, nil
}

// ctxErr prefers the call context's own status once it has ended (the
// stream then reports a bare cancellation).
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	if err == nil {
		err = context.Canceled
	}
	return err
}
