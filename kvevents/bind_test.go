package kvevents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4/transport"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
)

func TestCheckBindEndpoint(t *testing.T) {
	for _, ep := range []string{"tcp://127.0.0.1:5557", "tcp://127.0.0.2:0", "tcp://127.255.0.1:65535"} {
		if _, err := checkBindEndpoint(ep); err != nil {
			t.Errorf("%s: %v", ep, err)
		}
	}
	for ep, why := range map[string]string{
		"tcp://*:5557":         "wildcard",
		"tcp://0.0.0.0:5557":   "all interfaces",
		"tcp://10.0.0.7:5557":  "the pod network",
		"tcp://[::1]:5557":     "IPv6: the engine binds an endpoint with ::",
		"tcp://localhost:5557": "a name, not an address",
		"tcp://127.0.0.1":      "no port",
		"ipc:///tmp/kv":        "not tcp",
		"127.0.0.1:5557":       "no scheme",
	} {
		if _, err := checkBindEndpoint(ep); !errors.Is(err, ErrBindEndpoint) {
			t.Errorf("%s (%s): %v, want ErrBindEndpoint", ep, why, err)
		}
		if _, err := New(Config{ReplicaID: "r", ModelID: "m", Endpoint: ep, EndpointMode: EndpointBind}, &recSink{}); !errors.Is(err, ErrBindEndpoint) {
			t.Errorf("New with %s (%s): %v, want ErrBindEndpoint", ep, why, err)
		}
	}
	if _, err := New(Config{ReplicaID: "r", ModelID: "m", EndpointMode: "listen"}, &recSink{}); err == nil {
		t.Error("unknown endpoint mode accepted")
	}
	for in, want := range map[string]EndpointMode{"": EndpointConnect, "connect": EndpointConnect, "bind": EndpointBind} {
		if got, err := ParseEndpointMode(in); err != nil || got != want {
			t.Errorf("ParseEndpointMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseEndpointMode("Bind"); err == nil {
		t.Error(`ParseEndpointMode("Bind") accepted`)
	}
}

// freePort returns a loopback port nothing listens on (a listener on port 0,
// closed).
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// connectingEngine is a fake engine whose PUB connects to ep (as vLLM's and
// SGLang's does for an endpoint without a wildcard), its replay ROUTER bound
// on replay.
func connectingEngine(t *testing.T, ep, replay string) *fakeengine.Publisher {
	t.Helper()
	pub, err := fakeengine.NewPublisher(fakeengine.Config{Endpoint: ep, Connect: true, ReplayEndpoint: replay,
		Topic: "kv-events", RingSize: 1000})
	if err != nil {
		t.Skipf("cannot bind the engine's replay endpoint %s: %v", replay, err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// startBound runs a subscriber whose SUB binds ep until the test ends; mut
// may adjust its config.
func startBound(t *testing.T, ep, replay string, mut func(*Config)) (*Subscriber, *recSink) {
	t.Helper()
	sub, sink, _ := startBoundStop(t, ep, replay, mut)
	return sub, sink
}

// startBoundStop is startBound that also returns a stop that ends Run
// (once; the test's end calls it too).
func startBoundStop(t *testing.T, ep, replay string, mut func(*Config)) (*Subscriber, *recSink, func()) {
	t.Helper()
	sink := &recSink{}
	cfg := Config{ReplicaID: "r1", ModelID: "m", TenantID: "t", HashScheme: "vllm",
		Endpoint: ep, EndpointMode: EndpointBind, ReplayEndpoint: replay, Topic: "kv-events",
		Window: 10 * time.Millisecond, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		ReconnectBackoff: 50 * time.Millisecond, ReplayTimeout: 2 * time.Second, Heartbeat: -1,
		Registerer: prometheus.NewRegistry()}
	if mut != nil {
		mut(&cfg)
	}
	sub, err := New(cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Error("Run did not return")
			}
		})
	}
	t.Cleanup(stop)
	return sub, sink, stop
}

func waitUntil(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	ctx := testCtx(t, d)
	for !ok() {
		if !sleepCtx(ctx, 5*time.Millisecond) {
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

// The engine's PUB connects to the subscriber's bound SUB. The engine starts
// first and publishes before anything listens (those live events are
// lost: the connect sync takes them from the replay); live events follow;
// a restarted engine, connecting again with its numbering at 0, is
// recognized and its replica rebuilt.
func TestBindModeEngineConnects(t *testing.T) {
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	replay := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	pub := connectingEngine(t, ep, replay)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 4, CapacityBlocks: 64, Seed: 11})
	early := publishN(t, pub, w, 20) // nobody listens yet

	sub, _ := startBound(t, ep, replay, nil)
	if got := sub.BoundEndpoint(); got != "" && got != ep {
		t.Fatalf("BoundEndpoint %q, want %q", got, ep)
	}
	waitUntil(t, 10*time.Second, "the sync of the engine's first connection", func() bool {
		return sub.connects.Load() >= 1 && sub.NextSeq() == early+1
	})
	if got := sub.BoundEndpoint(); got != ep {
		t.Fatalf("BoundEndpoint %q, want %q", got, ep)
	}
	if got, want := sub.Index().Len(), w.CachedBlocks(); got != want {
		t.Fatalf("after the sync the index holds %d blocks, the engine %d", got, want)
	}
	if err := pub.WaitSubscribed(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	live := publishN(t, pub, w, 30)
	waitUntil(t, 10*time.Second, "the live batches", func() bool { return sub.NextSeq() == live+1 })
	if got, want := sub.Index().Len(), w.CachedBlocks(); got != want {
		t.Fatalf("index holds %d blocks, the engine %d", got, want)
	}
	if n := counter(t, sub.metrics.replays.WithLabelValues(ReplayOK)); n < 1 {
		t.Errorf("replays ok %v: the first connection was not synced through the replay", n)
	}

	// The engine restarts: the new process connects again, its sequence
	// starting at 0 and its cache empty.
	_ = pub.Close()
	pub2 := connectingEngine(t, ep, replay)
	w2 := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 2, CapacityBlocks: 64, Seed: 12})
	if err := pub2.WaitSubscribed(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	last := publishN(t, pub2, w2, 5)
	waitUntil(t, 10*time.Second, "the restarted engine's batches", func() bool {
		return sub.NextSeq() == last+1 && sub.Index().Len() == w2.CachedBlocks()
	})
	if n := counter(t, sub.metrics.restarts); n < 1 {
		t.Errorf("engine_restarts_total %v, want the restart recognized", n)
	}
}

// The subscriber restarts while the engine runs (a sidecar restart): the
// engine's PUB connects again to the new process once it binds, and the
// connect sync rebuilds what it missed, the batches published while
// nothing listened included.
func TestBindModeSubscriberRestarts(t *testing.T) {
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	replay := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	pub := connectingEngine(t, ep, replay)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 4, CapacityBlocks: 64, Seed: 15})
	sub, _, stop := startBoundStop(t, ep, replay, nil)
	if err := pub.WaitSubscribed(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	last := publishN(t, pub, w, 20)
	waitUntil(t, 10*time.Second, "the first subscriber's batches", func() bool { return sub.NextSeq() == last+1 })
	stop()
	last = publishN(t, pub, w, 20) // nobody listens

	sub2, _ := startBound(t, ep, replay, nil)
	waitUntil(t, 15*time.Second, "the engine connected to the new subscriber and its sync", func() bool {
		return sub2.connects.Load() >= 1 && sub2.NextSeq() == last+1
	})
	if err := pub.WaitSubscribed(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	last = publishN(t, pub, w, 10)
	waitUntil(t, 10*time.Second, "live batches after the restart", func() bool { return sub2.NextSeq() == last+1 })
	if got, want := sub2.Index().Len(), w.CachedBlocks(); got != want {
		t.Fatalf("the new subscriber's index holds %d blocks, the engine %d", got, want)
	}
}

// nonLoopbackIPv4 is an address of this machine outside 127.0.0.0/8, or
// nil.
func nonLoopbackIPv4() net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP
		}
	}
	return nil
}

// The bound SUB listens on loopback only: a connection to the same port on
// another address of the machine (the pod network, for a pod) is refused.
func TestBindModeListensOnLoopbackOnly(t *testing.T) {
	sub, _ := startBound(t, "tcp://127.0.0.1:0", "", nil)
	waitUntil(t, 10*time.Second, "the bind", func() bool { return sub.BoundEndpoint() != "" })
	_, port, err := net.SplitHostPort(strings.TrimPrefix(sub.BoundEndpoint(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), 5*time.Second)
	if err != nil {
		t.Fatalf("loopback dial to the bound SUB: %v", err)
	}
	_ = c.Close()
	ip := nonLoopbackIPv4()
	if ip == nil {
		t.Skip("the machine has no non-loopback IPv4 address to try")
	}
	// Stays on this machine: the address is one of its own interfaces.
	c, err = net.DialTimeout("tcp", net.JoinHostPort(ip.String(), port), 5*time.Second)
	if err == nil {
		_ = c.Close()
		t.Fatalf("a peer reached the bound SUB through %s:%s", ip, port)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Logf("dial %s:%s: %v", ip, port, err)
	}
}

// dialRawZMTP connects to ep and speaks as rawZMTPPeer does (a PUB that
// declares a 1 TiB frame at stage), until the subscriber drops it.
func dialRawZMTP(t *testing.T, ep, stage string) chan struct{} {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(ep, "tcp://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&rawZMTPPeer{sockType: "PUB", stage: stage}).serve(c)
	}()
	t.Cleanup(func() { _ = c.Close(); <-done })
	return done
}

// The frame cap applies to the connections the bound SUB accepts: a peer
// declaring a 1 TiB frame (in the handshake or as a message) is dropped,
// logged, and the memory does not grow; the engine connecting next is
// served.
func TestBindModeRefusesHugeFrame(t *testing.T) {
	for _, stage := range []string{"handshake", "message"} {
		t.Run(stage, func(t *testing.T) {
			logs := &syncBuffer{}
			ep := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
			replay := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
			sub, _ := startBound(t, ep, replay, func(c *Config) {
				c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			})
			waitUntil(t, 10*time.Second, "the bind", func() bool { return sub.BoundEndpoint() != "" })
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			dropped := dialRawZMTP(t, ep, stage)
			select {
			case <-dropped:
			case <-time.After(10 * time.Second):
				t.Fatal("the subscriber did not drop the connection that declared a 1 TiB frame")
			}
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if grew := int64(after.Sys) - int64(before.Sys); grew > 256<<20 {
				t.Fatalf("memory obtained from the OS grew by %d MiB", grew>>20)
			}
			waitUntil(t, 10*time.Second, "the refusal logged", func() bool { return strings.Contains(logs.String(), "ZMTP frame") })

			pub := connectingEngine(t, ep, replay)
			w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 2, CapacityBlocks: 64, Seed: 13})
			if err := pub.WaitSubscribed(testCtx(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			last := publishN(t, pub, w, 10)
			waitUntil(t, 10*time.Second, "the engine's batches after the refused peer", func() bool {
				return sub.NextSeq() == last+1 && sub.Index().Len() == w.CachedBlocks()
			})
		})
	}
}

// A peer that connects to the bound SUB first and never speaks does not
// hold the engine's place: its handshake times out and the engine, which
// connected meanwhile, is served.
func TestBindModeSilentPeerTimesOut(t *testing.T) {
	old := handshakeTimeout
	handshakeTimeout = 300 * time.Millisecond
	t.Cleanup(func() { handshakeTimeout = old })
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	replay := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	sub, _ := startBound(t, ep, replay, nil)
	waitUntil(t, 10*time.Second, "the bind", func() bool { return sub.BoundEndpoint() != "" })
	silent, err := net.DialTimeout("tcp", strings.TrimPrefix(ep, "tcp://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = silent.Close() })

	pub := connectingEngine(t, ep, replay)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 2, CapacityBlocks: 64, Seed: 14})
	if err := pub.WaitSubscribed(testCtx(t, 15*time.Second)); err != nil {
		t.Fatalf("the engine was not served after the silent peer: %v", err)
	}
	last := publishN(t, pub, w, 5)
	waitUntil(t, 10*time.Second, "the engine's batches", func() bool { return sub.NextSeq() == last+1 })
	// The subscriber closed the silent peer's connection (after its
	// greeting): the copy ends at EOF, not at the deadline.
	_ = silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, silent); err != nil {
		t.Errorf("the silent peer's connection was not closed: %v", err)
	}
}

// The SUB's own zmq4 transport caps the connections it accepts too, should
// anything listen through it.
func TestLimitTransportListenCaps(t *testing.T) {
	l, err := limitTransport{base: transport.New("tcp")}.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write(zmtpGreeting())
		_, _ = c.Write(zmtpFrameHeader(0x00, hugeFrame))
		time.Sleep(time.Second) // bounded: hold the connection while it is read
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*frameLimitConn); !ok {
		t.Fatalf("accepted %T, want a *frameLimitConn", c)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 128)
	var rerr error
	for rerr == nil {
		_, rerr = c.Read(buf)
	}
	if !errors.Is(rerr, ErrFrameTooLarge) {
		t.Fatalf("read error %v, want ErrFrameTooLarge", rerr)
	}
}
