package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// vLLM's and SGLang's ZmqEventPublisher bind their PUB socket only when the
// endpoint has a wildcard ("*" or "::", also ipc:// and inproc://) and
// connect it to any other. An engine configured with tcp://127.0.0.1:5557,
// the only way to keep its live events off the pod network, therefore
// connects: the subscriber must bind that address with its SUB socket
// (ZMQ lets either side bind). That is EndpointBind.

// EndpointMode says which side of the engine's KV-event stream binds.
type EndpointMode string

const (
	// EndpointConnect: the engine's PUB binds (a wildcard endpoint, e.g.
	// tcp://*:5557) and the SUB connects to Config.Endpoint. The default.
	EndpointConnect EndpointMode = "connect"
	// EndpointBind: the SUB binds Config.Endpoint, a tcp:// loopback
	// address, and the engine's PUB connects to it (an engine endpoint
	// without a wildcard, e.g. tcp://127.0.0.1:5557): nothing outside the
	// pod's network namespace reaches either side.
	EndpointBind EndpointMode = "bind"
)

// ParseEndpointMode parses --engine-endpoint-mode.
func ParseEndpointMode(s string) (EndpointMode, error) {
	switch m := EndpointMode(s); m {
	case EndpointConnect, EndpointBind:
		return m, nil
	case "":
		return EndpointConnect, nil
	}
	return "", fmt.Errorf("unknown engine endpoint mode %q (want %s or %s)", s, EndpointConnect, EndpointBind)
}

// ErrBindEndpoint is wrapped by the error for an endpoint EndpointBind
// cannot listen on.
var ErrBindEndpoint = errors.New("kvevents: the bind endpoint must be tcp://<IPv4 loopback>:<port>")

// checkBindEndpoint accepts tcp://IP:port with an IPv4 loopback literal
// (127.0.0.0/8), and returns the host:port to listen on. Whoever connects
// feeds the subscriber's index, so it must not listen beyond the pod; and
// the engine must be given the same address, which it connects to only
// without a wildcard: "::" (so [::1]) makes vLLM and SGLang bind too, and
// two binding sides never meet. Port 0 picks a free port (tests;
// Subscriber.BoundEndpoint says which).
func checkBindEndpoint(ep string) (addr string, err error) {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok || scheme != "tcp" {
		return "", fmt.Errorf("%w: %q is not a tcp endpoint", ErrBindEndpoint, ep)
	}
	ap, err := netip.ParseAddrPort(rest)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrBindEndpoint, ep, err)
	}
	switch a := ap.Addr(); {
	case !a.Is4():
		return "", fmt.Errorf("%w: %q is not IPv4 (an engine binds an endpoint with \"::\" instead of connecting to it)", ErrBindEndpoint, ep)
	case !a.IsLoopback():
		return "", fmt.Errorf("%w: %q is not a loopback address (it would accept connections from beyond the pod)", ErrBindEndpoint, ep)
	}
	return ap.String(), nil
}

// handshakeTimeout bounds the ZMTP handshake of a connection accepted in
// EndpointBind mode: a peer that connects and stays silent (or speaks
// something else) must not hold the engine's place. zmq4 takes no
// handshake deadline of its own. A variable for tests.
var handshakeTimeout = 5 * time.Second

// engineListener listens on the bound endpoint for the life of a
// Subscriber's receive loop and hands the engine's connections to its
// sessions, one at a time (next): a connection accepted while a session
// runs waits for the next session, later ones in the kernel's backlog. The
// listener stays open between sessions, so an engine reconnecting (libzmq
// retries every 100 ms) is accepted at once.
type engineListener struct {
	ln    net.Listener
	conns chan net.Conn // the accepted connection waiting for a session
	done  chan struct{} // closed by close
	wg    sync.WaitGroup
}

func listenEngine(addr string) (*engineListener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot listen for the engine on %s: %w", addr, err)
	}
	l := &engineListener{ln: ln, conns: make(chan net.Conn), done: make(chan struct{})}
	l.wg.Go(l.accept)
	return l, nil
}

func (l *engineListener) accept() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			// A transient failure (out of descriptors, ...): do not spin.
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-l.done:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		select {
		case l.conns <- c:
		case <-l.done:
			_ = c.Close()
			return
		}
	}
}

// next waits for the engine's next connection, or ctx.
func (l *engineListener) next(ctx context.Context) (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// endpoint is the bound tcp:// endpoint (the port chosen for port 0).
func (l *engineListener) endpoint() string { return "tcp://" + l.ln.Addr().String() }

func (l *engineListener) close() {
	close(l.done)
	_ = l.ln.Close()
	l.wg.Wait()
}
