package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"

	"github.com/inferencecache/inferencecache/kvevents/wire"
)

// zmq4 (v0.17.0) allocates every frame at the length its peer declares
// before reading it: a peer that declares 1 TiB crashes the process
// (fatal "out of memory", which no recover catches), and many frames of a
// message chained with MORE grow one message without bound. zmq4 takes no
// size limit and no dialer, but it dials through registered transports, so
// the subscriber dials its engine's endpoints through transports of its
// own (limitedEndpoint) whose connections parse ZMTP 3.x framing on the
// read side and fail before zmq4 sees a declaration over the limits.

// ZMTP limits on what an engine may send the subscriber (SUB and replay
// DEALER alike).
const (
	// MaxZMTPFrameBytes bounds one frame: the payload limit of the decoder,
	// which rejects anything larger anyway.
	MaxZMTPFrameBytes = wire.DefaultMaxPayloadBytes
	// MaxZMTPMessageBytes bounds one message, all its frames: a payload at
	// the limit plus room for the topic, sequence and delimiter frames.
	MaxZMTPMessageBytes = MaxZMTPFrameBytes + 64<<10
	// MaxZMTPMessageFrames bounds the frames of one message (engines send
	// 3 or 4).
	MaxZMTPMessageFrames = 64
)

// ErrFrameTooLarge is wrapped by the read error of a connection whose peer
// declared a frame or a message over the ZMTP limits.
var ErrFrameTooLarge = errors.New("kvevents: ZMTP frame over the size limit")

// ZMTP 3.x framing (RFC 23): a 64-byte greeting, then frames, each a flags
// byte (bit 0 MORE, bit 1 LONG, bit 2 COMMAND), a length of 1 byte, or 8
// bytes big-endian when LONG, and the body.
const (
	zmtpGreetingLen = 64
	zmtpFlagMore    = 0x01
	zmtpFlagLong    = 0x02
)

// limitedSchemes maps an endpoint scheme to the transport the subscriber
// dials it through.
var limitedSchemes = map[string]string{"tcp": "kvevents-tcp", "ipc": "kvevents-ipc"}

// acceptedScheme is the transport that "dials" a connection the subscriber
// accepted itself (EndpointBind): see acceptedTransport.
const acceptedScheme = "kvevents-accepted"

func init() {
	for network, name := range map[string]string{"tcp": limitedSchemes["tcp"], "unix": limitedSchemes["ipc"]} {
		if err := zmq4.RegisterTransport(name, limitTransport{base: transport.New(network)}); err != nil {
			panic(fmt.Sprintf("BUG: cannot register the %s transport: %v", name, err))
		}
	}
	if err := zmq4.RegisterTransport(acceptedScheme, acceptedTransport{}); err != nil {
		panic(fmt.Sprintf("BUG: cannot register the %s transport: %v", acceptedScheme, err))
	}
}

// limitedEndpoint returns ep with its scheme replaced by the size-limited
// transport's (tcp://h:p → kvevents-tcp://h:p); other schemes (inproc)
// are returned as they are.
func limitedEndpoint(ep string) string {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return ep
	}
	if name, ok := limitedSchemes[scheme]; ok {
		return name + "://" + rest
	}
	return ep
}

// limitTransport dials and listens like base and wraps every connection,
// dialed or accepted, in a frameLimitConn. (The subscriber's SUB never
// listens through zmq4: in EndpointBind mode it accepts the engine's
// connection itself and hands it over through acceptedTransport, so that
// each socket has one connection, whose start the sync relies on.)
type limitTransport struct{ base transport.Transport }

func (t limitTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.base.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	fc := newFrameLimitConn(c, MaxZMTPFrameBytes, MaxZMTPMessageBytes, MaxZMTPMessageFrames)
	fc.refusal, _ = ctx.Value(frameRefusalKey{}).(*frameRefusal)
	return fc, nil
}

// frameRefusal records the first refusal of the connections a socket
// dials, for a caller that only sees zmq4's later "closed connection"
// error (a refused frame can arrive while the caller sends). zmq4 passes
// the context of NewDealer/NewSub to the transport, so the recorder rides
// in it (withFrameRefusal).
type frameRefusal struct {
	// err is the first refusal: set once (CompareAndSwap) by a
	// connection's reader goroutine, read by the socket's user.
	err atomic.Pointer[frameLimitError]
}

type frameRefusalKey struct{}

func withFrameRefusal(ctx context.Context, r *frameRefusal) context.Context {
	return context.WithValue(ctx, frameRefusalKey{}, r)
}

// Err returns the first refusal, or nil.
func (r *frameRefusal) Err() error {
	if e := r.err.Load(); e != nil {
		return e
	}
	return nil
}

func (t limitTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.base.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return limitListener{l}, nil
}

// limitListener wraps the connections it accepts in a frameLimitConn.
type limitListener struct{ net.Listener }

func (l limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newFrameLimitConn(c, MaxZMTPFrameBytes, MaxZMTPMessageBytes, MaxZMTPMessageFrames), nil
}

// acceptedTransport's Dial returns the connection riding in the dialing
// socket's context (withAccepted; zmq4 passes the context of NewSub to its
// transports), wrapped in a frameLimitConn like a dialed one, and fails
// for a second dial: the engine's connection, accepted by the
// subscriber's own listener (EndpointBind), becomes the one connection of
// a SUB socket of its own, exactly like a dialed one.
type acceptedTransport struct{}

type acceptedKey struct{}

// acceptedConn hands one accepted connection to one dial.
type acceptedConn struct {
	mu   sync.Mutex
	conn net.Conn // nil once taken
}

func withAccepted(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, acceptedKey{}, &acceptedConn{conn: c})
}

func (acceptedTransport) Dial(ctx context.Context, _ transport.Dialer, _ string) (net.Conn, error) {
	a, _ := ctx.Value(acceptedKey{}).(*acceptedConn)
	if a == nil {
		return nil, errors.New("kvevents: no accepted connection to hand over")
	}
	a.mu.Lock()
	c := a.conn
	a.conn = nil
	a.mu.Unlock()
	if c == nil {
		return nil, errors.New("kvevents: the accepted connection was handed over already")
	}
	fc := newFrameLimitConn(c, MaxZMTPFrameBytes, MaxZMTPMessageBytes, MaxZMTPMessageFrames)
	fc.refusal, _ = ctx.Value(frameRefusalKey{}).(*frameRefusal)
	return fc, nil
}

func (acceptedTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("kvevents: the accepted-connection transport does not listen")
}

func (acceptedTransport) Addr(ep string) (string, error) { return ep, nil }

func (t limitTransport) Addr(ep string) (string, error) { return t.base.Addr(ep) }

// frameLimitConn passes a ZMTP stream through unchanged while following its
// framing, and fails the read that would hand over the last length byte of
// a frame over maxFrame, or of a frame that takes its message over
// maxMessage bytes or maxFrames frames. zmq4 reads a frame header exactly
// (2 bytes, then 7 for a long length), so it never holds a complete length
// the limits refuse. Read is called by one goroutine at a time (zmq4's
// reader of the connection); the parser state is that goroutine's.
type frameLimitConn struct {
	net.Conn
	refusal *frameRefusal // nil, or told of the refusal; immutable after Dial
	p       zmtpLimiter
	err     error // sticky: once refused, every later Read fails
}

func newFrameLimitConn(c net.Conn, maxFrame, maxMessage uint64, maxFrames int) *frameLimitConn {
	return &frameLimitConn{Conn: c, p: newZMTPLimiter(maxFrame, maxMessage, maxFrames)}
}

func (c *frameLimitConn) Read(b []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(b)
	if perr := c.p.scan(b[:n]); perr != nil {
		// Nothing of this chunk is handed over: it holds the length byte
		// that completes the refused declaration. The connection is
		// useless from here on.
		c.err = perr
		if c.refusal != nil {
			c.refusal.err.CompareAndSwap(nil, perr)
		}
		_ = c.Conn.Close()
		return 0, perr
	}
	return n, err
}

// zmtpLimiter is the framing state machine of frameLimitConn.
type zmtpLimiter struct {
	maxFrame, maxMessage uint64
	maxFrames            int

	greeting  int    // greeting bytes still to pass
	state     uint8  // what the next byte is (limiter* constants)
	flags     byte   // flags of the frame being read
	size      uint64 // length bytes collected so far
	sizeLeft  int    // length bytes still to come
	body      uint64 // body bytes still to pass
	msgBytes  uint64 // bytes of the message so far, this frame included
	msgFrames int    // frames of the message so far, this frame included
}

const (
	limiterFlags uint8 = iota
	limiterSize
	limiterBody
)

func newZMTPLimiter(maxFrame, maxMessage uint64, maxFrames int) zmtpLimiter {
	return zmtpLimiter{maxFrame: maxFrame, maxMessage: maxMessage, maxFrames: maxFrames, greeting: zmtpGreetingLen}
}

// scan follows b, the next bytes of the stream, and returns an error
// wrapping ErrFrameTooLarge when a length in b completes a declaration the
// limits refuse.
func (l *zmtpLimiter) scan(b []byte) *frameLimitError {
	if l.greeting > 0 {
		k := min(l.greeting, len(b))
		l.greeting -= k
		b = b[k:]
	}
	for len(b) > 0 {
		switch l.state {
		case limiterFlags:
			l.flags = b[0]
			b = b[1:]
			l.size, l.sizeLeft = 0, 1
			if l.flags&zmtpFlagLong != 0 {
				l.sizeLeft = 8
			}
			l.state = limiterSize
		case limiterSize:
			for l.sizeLeft > 0 && len(b) > 0 {
				l.size = l.size<<8 | uint64(b[0])
				l.sizeLeft--
				b = b[1:]
			}
			if l.sizeLeft > 0 {
				return nil
			}
			if err := l.frameDeclared(); err != nil {
				return err
			}
		case limiterBody:
			k := uint64(len(b))
			if k > l.body {
				k = l.body
			}
			l.body -= k
			b = b[k:]
			if l.body == 0 {
				l.frameDone()
			}
		}
	}
	return nil
}

// frameDeclared checks the frame whose length was just read.
func (l *zmtpLimiter) frameDeclared() *frameLimitError {
	l.msgFrames++
	switch {
	case l.size > l.maxFrame:
		return &frameLimitError{fmt.Sprintf("the peer declared a ZMTP frame of %d bytes (limit %d)", l.size, l.maxFrame)}
	case l.msgBytes+l.size > l.maxMessage:
		return &frameLimitError{fmt.Sprintf("the peer's ZMTP frames add up to a message over %d bytes", l.maxMessage)}
	case l.msgFrames > l.maxFrames:
		return &frameLimitError{fmt.Sprintf("the peer sent a ZMTP message of more than %d frames", l.maxFrames)}
	}
	l.msgBytes += l.size
	l.body = l.size
	l.state = limiterBody
	if l.body == 0 {
		l.frameDone()
	}
	return nil
}

func (l *zmtpLimiter) frameDone() {
	if l.flags&zmtpFlagMore == 0 {
		l.msgBytes, l.msgFrames = 0, 0
	}
	l.state = limiterFlags
}

// frameLimitError is a net.Error that is not a timeout, so zmq4 marks the
// connection closed and drops it.
type frameLimitError struct{ msg string }

func (e *frameLimitError) Error() string   { return "kvevents: " + e.msg }
func (e *frameLimitError) Unwrap() error   { return ErrFrameTooLarge }
func (e *frameLimitError) Timeout() bool   { return false }
func (e *frameLimitError) Temporary() bool { return false }

var _ net.Error = (*frameLimitError)(nil)
