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
)

// DefaultRingSize is how many batches the replay ring keeps (vLLM's
// buffer_steps default).
const DefaultRingSize = 10000

// endSeq is the replay end marker: -1 as 8 signed big-endian bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Config configures a Publisher.
type Config struct {
	// Endpoint is where the PUB socket binds, e.g. tcp://127.0.0.1:5557;
	// port 0 picks a free one (see Publisher.Endpoint).
	Endpoint string
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
	cfg    Config
	pub    zmq4.Socket
	router zmq4.Socket // nil without replay
	cancel context.CancelFunc
	wg     sync.WaitGroup
	pubEP  string // resolved PUB endpoint
	repEP  string // resolved replay endpoint

	// mu guards the fields below and serializes sends on pub.
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
	p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(quietLogger))
	if err := p.pub.Listen(cfg.Endpoint); err != nil {
		cancel()
		return nil, fmt.Errorf("cannot listen on %s: %w", cfg.Endpoint, err)
	}
	p.pubEP = resolved(cfg.Endpoint, p.pub.Addr())
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
	return p, nil
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

// Endpoint returns the PUB endpoint to dial.
func (p *Publisher) Endpoint() string { return p.pubEP }

// ReplayEndpoint returns the replay endpoint to dial, "" without replay.
func (p *Publisher) ReplayEndpoint() string { return p.repEP }

// Close stops the sockets.
func (p *Publisher) Close() error {
	p.cancel()
	err := p.pub.Close()
	if p.router != nil {
		err = errors.Join(err, p.router.Close())
	}
	p.wg.Wait()
	return err
}

// WaitSubscribed waits until a subscriber for the topic is connected (ZMQ
// PUB drops what it sends before that).
func (p *Publisher) WaitSubscribed(ctx context.Context) error {
	t, ok := p.pub.(zmq4.Topics)
	if !ok {
		return errors.New("fakeengine: PUB socket does not report topics")
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
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
