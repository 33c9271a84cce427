package fakeengine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// DefaultRingSize is how many batches the replay ring keeps (vLLM's
// buffer_steps default).
const DefaultRingSize = 10000

// endSeq is the replay end marker: -1 as 8 signed big-endian bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Config configures a Publisher.
type Config struct {
	// Endpoint is where the PUB socket binds, e.g. tcp://127.0.0.1:5557;
	// port 0 picks a free one (see Publisher.Endpoint). With Connect it is
	// where the PUB socket connects to.
	Endpoint string
	// Connect makes the PUB socket connect to Endpoint (a subscriber that
	// binds it, kvevents.EndpointBind) instead of binding it: what vLLM and
	// SGLang do for an endpoint without a wildcard, such as
	// tcp://127.0.0.1:5557. Like libzmq it keeps trying every 100 ms until
	// the subscriber listens, and connects again whenever the connection
	// is lost; what it publishes while not connected is not sent (it stays
	// in the replay ring). The replay ROUTER still binds.
	Connect bool
	// ReplayEndpoint is where the replay ROUTER binds; "" disables replay.
	ReplayEndpoint string
	// Topic is the first frame of every message.
	Topic string
	// Encoding of the payloads.
	Encoding Encoding
	// RingSize bounds the replay ring (the engine's buffer_steps): the
	// oldest batches fall out once it is full. 0 means DefaultRingSize.
	RingSize int

	// DropEvery > 0 withholds every DropEvery-th message from the PUB
	// socket (it stays in the replay ring), making a gap.
	DropEvery int
	// DropProb withholds each message with this probability.
	DropProb float64
	// ReplayNoEnd omits the end marker (seq -1) of replay answers, as a
	// replay endpoint that stalls after sending what it has.
	ReplayNoEnd bool
	// ReorderEvery > 0 holds every ReorderEvery-th message back and sends
	// it after the next one.
	ReorderEvery int
	// Seed seeds DropProb's generator.
	Seed uint64
}

type ringEntry struct {
	seq     uint64
	payload []byte
}

// Publisher is a fake engine's event publisher. Publish is safe for
// concurrent use.
type Publisher struct {
	cfg Config
	// pub is the PUB socket; with Connect, connectLoop replaces it (under
	// mu) with each new connection's.
	pub    zmq4.Socket
	router zmq4.Socket // nil without replay
	cancel context.CancelFunc
	wg     sync.WaitGroup
	pubEP  string // resolved PUB endpoint
	repEP  string // resolved replay endpoint

	// mu guards pub's replacement, the fields below, and serializes sends
	// on pub.
	mu        sync.Mutex
	seq       uint64      // next sequence number
	ring      []ringEntry // oldest first, at most cfg.RingSize
	held      *zmq4.Msg   // message held back by ReorderEvery
	dropNext  int         // messages still to withhold (Drop)
	rng       *rand.Rand
	published uint64 // messages sent on PUB
	dropped   uint64 // messages withheld from PUB
	// replayPaused makes serveReplay ignore requests (PauseReplay).
	replayPaused bool

	dialed dialedConns // Connect: the PUB sockets' connections
}

// dialScheme is the transport a connecting PUB (Config.Connect) dials tcp
// endpoints through: zmq4's own, recording each connection.
const dialScheme = "fakeengine-tcp"

func init() {
	if err := zmq4.RegisterTransport(dialScheme, dialTransport{base: transport.New("tcp")}); err != nil {
		panic(fmt.Sprintf("BUG: cannot register the %s transport: %v", dialScheme, err))
	}
}

// dialTransport dials like base and records every connection in the
// dialing socket's context (a *dialWatch): zmq4's handshake takes no
// deadline, and a subscriber that accepted the connection but serves
// another one first does not answer yet, so only closing the connection
// (Close) ends a Dial stuck there.
type dialTransport struct{ base transport.Transport }

type dialedKey struct{}

func (t dialTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.base.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	if w, ok := ctx.Value(dialedKey{}).(*dialWatch); ok {
		c = &watchedConn{Conn: c, lost: w.lost}
		w.conns.add(c)
	}
	return c, nil
}

// dialWatch rides in a connecting PUB's context: its connections are
// recorded in conns, and the loss of one closes lost.
type dialWatch struct {
	conns *dialedConns
	lost  chan struct{}
}

// watchedConn closes lost (once) when a read or write fails or it is
// closed. The PUB reads its connection all the time (subscriptions), so a
// connection the subscriber dropped is noticed at once.
type watchedConn struct {
	net.Conn
	lost chan struct{}
	once sync.Once
}

func (c *watchedConn) signal() { c.once.Do(func() { close(c.lost) }) }

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.signal()
	}
	return n, err
}

func (c *watchedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil {
		c.signal()
	}
	return n, err
}

func (c *watchedConn) Close() error {
	c.signal()
	return c.Conn.Close()
}

func (t dialTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	return t.base.Listen(ctx, addr)
}

func (t dialTransport) Addr(ep string) (string, error) { return t.base.Addr(ep) }

// dialedConns are the connections a connecting PUB made.
type dialedConns struct {
	mu    sync.Mutex // guards conns and closed
	conns []net.Conn
	// closed is set by closeAll: a connection made after it is closed at
	// once.
	closed bool
}

func (d *dialedConns) add(c net.Conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		_ = c.Close()
		return
	}
	// Forget the connections already lost (a long run reconnects often).
	d.conns = slices.DeleteFunc(d.conns, func(c net.Conn) bool {
		w, ok := c.(*watchedConn)
		if !ok {
			return false
		}
		select {
		case <-w.lost:
			return true
		default:
			return false
		}
	})
	d.conns = append(d.conns, c)
}

func (d *dialedConns) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for _, c := range d.conns {
		_ = c.Close()
	}
	d.conns = nil
}

// quietLogger silences zmq4's own logging of connection churn.
var quietLogger = log.New(io.Discard, "", 0)

// NewPublisher binds the sockets and starts serving replay requests.
func NewPublisher(cfg Config) (*Publisher, error) {
	if cfg.RingSize <= 0 {
		cfg.RingSize = DefaultRingSize
	}
	if cfg.Encoding.Layout == "" {
		cfg.Encoding.Layout = LayoutArray
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, cancel: cancel, rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed))}
	if cfg.Connect {
		// Unconnected until connectLoop's first connection: what is
		// published meanwhile reaches nobody.
		p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(quietLogger))
		p.pubEP = cfg.Endpoint
	} else {
		p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(quietLogger))
		if err := p.pub.Listen(cfg.Endpoint); err != nil {
			cancel()
			return nil, fmt.Errorf("cannot listen on %s: %w", cfg.Endpoint, err)
		}
		p.pubEP = resolved(cfg.Endpoint, p.pub.Addr())
	}
	if cfg.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx, zmq4.WithLogger(quietLogger))
		if err := p.router.Listen(cfg.ReplayEndpoint); err != nil {
			_ = p.pub.Close()
			cancel()
			return nil, fmt.Errorf("cannot listen on %s: %w", cfg.ReplayEndpoint, err)
		}
		p.repEP = resolved(cfg.ReplayEndpoint, p.router.Addr())
		p.wg.Go(func() { p.serveReplay(ctx) })
	}
	if cfg.Connect {
		// Connects in the background, as libzmq's connect does.
		p.wg.Go(func() { p.connectLoop(ctx, cfg.Endpoint) })
	}
	return p, nil
}

// connectLoop keeps the PUB connected to ep (Config.Connect): it dials a
// new PUB socket, retrying every 100 ms until something listens, puts it
// in place of the previous one, and dials again 100 ms after its
// connection is lost. (zmq4's own automatic reconnect cannot be used: a PUB that notices
// the loss while writing dials again from inside its writer, which holds
// the lock the new connection needs.)
func (p *Publisher) connectLoop(ctx context.Context, ep string) {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		ep = dialScheme + "://" + rest
	}
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			// libzmq waits its reconnect interval (100 ms) before
			// dialing again after a lost connection.
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		lost := make(chan struct{})
		dctx := context.WithValue(ctx, dialedKey{}, &dialWatch{conns: &p.dialed, lost: lost})
		sock := zmq4.NewPub(dctx, zmq4.WithLogger(quietLogger), zmq4.WithDialerMaxRetries(-1),
			zmq4.WithDialerRetry(100*time.Millisecond), zmq4.WithDialerTimeout(time.Second))
		if err := sock.Dial(ep); err != nil {
			// Closed, or a connection that failed its handshake.
			_ = sock.Close()
			continue
		}
		p.mu.Lock()
		old := p.pub
		p.pub = sock
		p.mu.Unlock()
		_ = old.Close()
		select {
		case <-lost:
		case <-ctx.Done():
			return
		}
	}
}

// resolved turns a bound listener address into a dialable tcp endpoint.
func resolved(ep string, addr net.Addr) string {
	if a, ok := addr.(*net.TCPAddr); ok {
		host := a.IP.String()
		if a.IP.IsUnspecified() {
			host = "127.0.0.1"
		}
		return "tcp://" + net.JoinHostPort(host, fmt.Sprint(a.Port))
	}
	return ep
}

// Endpoint returns the PUB endpoint to dial (with Connect: the one it
// connects to).
func (p *Publisher) Endpoint() string { return p.pubEP }

// ReplayEndpoint returns the replay endpoint to dial, "" without replay.
func (p *Publisher) ReplayEndpoint() string { return p.repEP }

// Close stops the sockets.
func (p *Publisher) Close() error {
	p.cancel()
	p.dialed.closeAll()
	p.wg.Wait() // connectLoop no longer swaps p.pub
	err := p.pub.Close()
	if p.router != nil {
		err = errors.Join(err, p.router.Close())
	}
	return err
}

// WaitSubscribed waits until a subscriber for the topic is connected (ZMQ
// PUB drops what it sends before that).
func (p *Publisher) WaitSubscribed(ctx context.Context) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		p.mu.Lock()
		t, ok := p.pub.(zmq4.Topics)
		p.mu.Unlock()
		if !ok {
			return errors.New("fakeengine: PUB socket does not report topics")
		}
		if slices.ContainsFunc(t.Topics(), func(s string) bool {
			return strings.HasPrefix(p.cfg.Topic, s)
		}) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fakeengine: no subscriber for topic %q: %w", p.cfg.Topic, ctx.Err())
		case <-tick.C:
		}
	}
}

// Drop withholds the next n messages from the PUB socket; they stay in
// the replay ring.
func (p *Publisher) Drop(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropNext += n
}

// ForgetRing empties the replay ring, so a gap that is already open can no
// longer be repaired.
func (p *Publisher) ForgetRing() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ring = nil
}

// PauseReplay makes the replay ROUTER ignore requests (paused true) as an
// overloaded or stuck engine would: clients time out. false resumes.
func (p *Publisher) PauseReplay(paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replayPaused = paused
}

// Counts returns the messages published on PUB and withheld from it.
func (p *Publisher) Counts() (published, dropped uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.published, p.dropped
}

// Publish encodes b, gives it the next sequence number, keeps it for
// replay and sends it (unless a knob withholds or delays it).
func (p *Publisher) Publish(b Batch) (uint64, error) {
	payload, err := p.cfg.Encoding.Encode(b)
	if err != nil {
		return 0, err
	}
	return p.PublishRaw(payload)
}

// PublishRaw publishes an already encoded payload (tests use it to send
// malformed batches).
func (p *Publisher) PublishRaw(payload []byte) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	p.ring = append(p.ring, ringEntry{seq: seq, payload: payload})
	if over := len(p.ring) - p.cfg.RingSize; over > 0 {
		p.ring = slices.Delete(p.ring, 0, over)
	}
	n := seq + 1 // 1-based message number for the knobs
	switch {
	case p.dropNext > 0:
		p.dropNext--
		p.dropped++
		return seq, nil
	case p.cfg.DropEvery > 0 && n%uint64(p.cfg.DropEvery) == 0,
		p.cfg.DropProb > 0 && p.rng.Float64() < p.cfg.DropProb:
		p.dropped++
		return seq, nil
	}
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], seq)
	msg := zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqb[:], payload)
	if p.cfg.ReorderEvery > 0 && n%uint64(p.cfg.ReorderEvery) == 0 && p.held == nil {
		p.held = &msg
		return seq, nil
	}
	if err := p.sendLocked(msg); err != nil {
		return seq, err
	}
	if p.held != nil {
		held := *p.held
		p.held = nil
		if err := p.sendLocked(held); err != nil {
			return seq, err
		}
	}
	return seq, nil
}

func (p *Publisher) sendLocked(msg zmq4.Msg) error {
	if err := p.pub.SendMulti(msg); err != nil {
		return fmt.Errorf("cannot publish: %w", err)
	}
	p.published++
	return nil
}

// serveReplay answers replay requests as vLLM's and SGLang's
// ZmqEventPublisher do: a request must be exactly [identity, "", start_seq
// (8 bytes BE)] (what a REQ or DEALER client sends, the ROUTER prepending
// the identity); anything else is ignored. The reply is one
// [identity, "", seq, payload] message per ringed batch with seq >=
// start_seq, oldest first (so a start older than the ring gets the whole
// ring), then the end marker [identity, "", -1, ""].
func (p *Publisher) serveReplay(ctx context.Context) {
	for ctx.Err() == nil {
		msg, err := p.router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 0 || len(msg.Frames[2]) != 8 {
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		ring, paused := slices.Clone(p.ring), p.replayPaused
		p.mu.Unlock()
		if paused {
			continue
		}
		for _, e := range ring {
			if e.seq < start {
				continue
			}
			var seqb [8]byte
			binary.BigEndian.PutUint64(seqb[:], e.seq)
			if err := p.router.SendMulti(zmq4.NewMsgFrom(id, nil, seqb[:], e.payload)); err != nil {
				break
			}
		}
		if !p.cfg.ReplayNoEnd {
			_ = p.router.SendMulti(zmq4.NewMsgFrom(id, nil, endSeq, nil))
		}
	}
}

// Run publishes w's batches until w is exhausted or ctx is done, and
// returns how many it published. With pace it waits between batches as
// the workload says; without, it publishes as fast as it can. Empty
// batches are skipped.
func Run(ctx context.Context, p *Publisher, w Workload, pace bool) (int, error) {
	n := 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for ctx.Err() == nil {
		b, after, ok := w.Next()
		if !ok {
			return n, nil
		}
		if pace && after > 0 {
			timer.Reset(after)
			select {
			case <-ctx.Done():
				return n, ctx.Err()
			case <-timer.C:
			}
		}
		if len(b.Events) == 0 {
			continue
		}
		if _, err := p.Publish(b); err != nil {
			return n, err
		}
		n++
	}
	return n, ctx.Err()
}
