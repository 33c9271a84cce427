package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// hugeFrame is the length a hostile or broken ZMTP peer declares: 1 TiB.
const hugeFrame = 1 << 40

// rawZMTPPeer is a TCP listener on 127.0.0.1 that speaks just enough
// ZMTP 3.0 (NULL mechanism) to reach the point given by stage, then
// declares a frame of hugeFrame bytes and sends nothing more.
type rawZMTPPeer struct {
	ln       net.Listener
	sockType string // Socket-Type in its READY: PUB or ROUTER
	// stage is where the huge frame comes: "handshake" (instead of the
	// READY command) or "message" (after the handshake, as a message).
	stage string
	conns atomic.Int32 // connections accepted
	wg    sync.WaitGroup
}

func startRawZMTPPeer(t *testing.T, sockType, stage string) *rawZMTPPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &rawZMTPPeer{ln: ln, sockType: sockType, stage: stage}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.conns.Add(1)
			p.wg.Go(func() { p.serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		p.wg.Wait()
	})
	return p
}

func (p *rawZMTPPeer) endpoint() string { return "tcp://" + p.ln.Addr().String() }

func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	return g
}

// zmtpFrameHeader is a long frame header: flags | LONG, 8-byte length.
func zmtpFrameHeader(flags byte, n uint64) []byte {
	h := make([]byte, 9)
	h[0] = flags | 0x02
	binary.BigEndian.PutUint64(h[1:], n)
	return h
}

func zmtpReady(sockType string) []byte {
	body := []byte{5}
	body = append(body, "READY"...)
	for _, kv := range [][2]string{{"Socket-Type", sockType}, {"Identity", ""}} {
		body = append(body, byte(len(kv[0])))
		body = append(body, kv[0]...)
		body = binary.BigEndian.AppendUint32(body, uint32(len(kv[1])))
		body = append(body, kv[1]...)
	}
	return append([]byte{0x04, byte(len(body))}, body...)
}

// readZMTPFrame reads one frame and discards it.
func readZMTPFrame(r io.Reader) error {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	n := uint64(h[1])
	if h[0]&0x02 != 0 {
		var l [8]byte
		l[0] = h[1]
		if _, err := io.ReadFull(r, l[1:]); err != nil {
			return err
		}
		n = binary.BigEndian.Uint64(l[:])
	}
	_, err := io.CopyN(io.Discard, r, int64(min(n, 1<<20)))
	return err
}

func (p *rawZMTPPeer) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(zmtpGreeting()); err != nil {
		return
	}
	if _, err := io.ReadFull(c, make([]byte, 64)); err != nil {
		return
	}
	if p.stage == "handshake" {
		_, _ = c.Write(zmtpFrameHeader(0x04, hugeFrame)) // a "command" of 1 TiB
	} else {
		if _, err := c.Write(zmtpReady(p.sockType)); err != nil {
			return
		}
		if err := readZMTPFrame(c); err != nil { // the subscriber's READY
			return
		}
		_, _ = c.Write(zmtpFrameHeader(0x00, hugeFrame)) // a message frame of 1 TiB
	}
	_, _ = io.Copy(io.Discard, c) // hold the connection until the subscriber drops it
}

// syncBuffer is an io.Writer safe for concurrent use (log capture).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestHugeZMTPFrameIsRefused: an engine endpoint (PUB or replay ROUTER)
// that declares a 1 TiB frame, during the handshake or as a message, does
// not crash the subscriber or make it allocate the frame: the connection
// is dropped with a logged error and dialed again.
func TestHugeZMTPFrameIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name, sockType, stage string
		replay                bool
	}{
		{"pub/handshake", "PUB", "handshake", false},
		{"pub/message", "PUB", "message", false},
		{"replay/handshake", "ROUTER", "handshake", true},
		{"replay/message", "ROUTER", "message", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer := startRawZMTPPeer(t, tc.sockType, tc.stage)
			logs := &syncBuffer{}
			cfg := Config{ReplicaID: "r1", ModelID: "m", TenantID: "t", HashScheme: "vllm",
				Endpoint: peer.endpoint(), Topic: "kv-events",
				ReconnectBackoff: 50 * time.Millisecond, ReplayTimeout: 2 * time.Second, Heartbeat: -1,
				Registerer: prometheus.NewRegistry(),
				Logger:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
			if tc.replay {
				// A real engine on PUB; the replay endpoint is the peer.
				pub := newEngine(t, 100)
				cfg.Endpoint, cfg.ReplayEndpoint = pub.Endpoint(), peer.endpoint()
			}
			sub, err := New(cfg, &recSink{})
			if err != nil {
				t.Fatal(err)
			}
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- sub.Run(ctx) }()
			wctx := testCtx(t, 20*time.Second)
			if tc.replay {
				// Each connect sync dials the replay endpoint once; make
				// the SUB side reconnect too, by waiting for two syncs.
				for peer.conns.Load() < 1 || sub.connects.Load() < 1 {
					if !sleepCtx(wctx, 5*time.Millisecond) {
						t.Fatalf("replay dialed %d times, %d connect syncs", peer.conns.Load(), sub.connects.Load())
					}
				}
			} else {
				for peer.conns.Load() < 3 {
					if !sleepCtx(wctx, 5*time.Millisecond) {
						t.Fatalf("the subscriber dialed %d times; want it to keep reconnecting", peer.conns.Load())
					}
				}
			}
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return")
			}
			if grew := int64(after.Sys) - int64(before.Sys); grew > 256<<20 {
				t.Fatalf("memory obtained from the OS grew by %d MiB", grew>>20)
			}
			if !strings.Contains(logs.String(), "ZMTP frame") {
				t.Fatalf("no log line names the oversized frame; logs:\n%s", logs.String())
			}
		})
	}
}

// chunkConn serves r in reads of at most chunk bytes (a net.Conn for the
// limiter; only Read and Close are used).
type chunkConn struct {
	net.Conn
	r      io.Reader
	chunk  int
	closed bool
}

func (c *chunkConn) Read(p []byte) (int, error) {
	if len(p) > c.chunk {
		p = p[:c.chunk]
	}
	return c.r.Read(p)
}

func (c *chunkConn) Close() error { c.closed = true; return nil }

// limitedRead reads everything frameLimitConn lets through from data,
// served in chunks of chunk bytes and asked for in reads of want bytes.
func limitedRead(data []byte, chunk, want int, maxFrame, maxMessage uint64, maxFrames int) ([]byte, error) {
	cc := &chunkConn{r: bytes.NewReader(data), chunk: chunk}
	c := newFrameLimitConn(cc, maxFrame, maxMessage, maxFrames)
	var got []byte
	buf := make([]byte, want)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			if !cc.closed {
				return got, errors.New("the refused connection was not closed")
			}
			return got, err
		}
	}
}

// zmtpStream builds a greeting followed by frames.
type zmtpStream []byte

func newZMTPStream() zmtpStream { return zmtpStream(zmtpGreeting()) }

func (s zmtpStream) frame(flags byte, body []byte) zmtpStream {
	if len(body) > 255 {
		s = append(s, zmtpFrameHeader(flags, uint64(len(body)))...)
	} else {
		s = append(s, flags&^0x02, byte(len(body)))
	}
	return append(s, body...)
}

// refusedAt is the reference for the limiter: the offset of the length
// byte that completes the first declaration over the limits, or -1.
func refusedAt(data []byte, maxFrame, maxMessage uint64, maxFrames int) int {
	i := zmtpGreetingLen
	var msgBytes uint64
	msgFrames := 0
	for i < len(data) {
		flags := data[i]
		i++
		lenBytes := 1
		if flags&0x02 != 0 {
			lenBytes = 8
		}
		if i+lenBytes > len(data) {
			return -1
		}
		var size uint64
		for _, b := range data[i : i+lenBytes] {
			size = size<<8 | uint64(b)
		}
		last := i + lenBytes - 1
		i += lenBytes
		msgFrames++
		if size > maxFrame || msgBytes+size > maxMessage || msgFrames > maxFrames {
			return last
		}
		msgBytes += size
		if uint64(len(data)-i) < size {
			return -1
		}
		i += int(size)
		if flags&0x01 == 0 {
			msgBytes, msgFrames = 0, 0
		}
	}
	return -1
}

func TestZMTPLimiter(t *testing.T) {
	const maxFrame, maxMessage, maxFrames = 300, 500, 4
	body := func(n int) []byte { return bytes.Repeat([]byte{0xab}, n) }
	for _, tc := range []struct {
		name    string
		data    zmtpStream
		refused bool
	}{
		{"vLLM message", newZMTPStream().frame(0x04, []byte("\x05READY")).
			frame(0x01, []byte("kv-events")).frame(0x01, body(8)).frame(0, body(200)), false},
		{"frame at the limit", newZMTPStream().frame(0, body(maxFrame)), false},
		{"empty frames", newZMTPStream().frame(1, nil).frame(1, nil).frame(0, nil).frame(0, nil), false},
		{"frame over the limit", newZMTPStream().frame(0, body(maxFrame+1)), true},
		{"command over the limit", newZMTPStream().frame(0x04, body(maxFrame+1)), true},
		{"1 TiB declared", append(newZMTPStream(), zmtpFrameHeader(0, hugeFrame)...), true},
		{"message over the limit", newZMTPStream().frame(1, body(maxFrame)).frame(0, body(maxMessage-maxFrame+1)), true},
		{"message at the limit", newZMTPStream().frame(1, body(maxFrame)).frame(0, body(maxMessage-maxFrame)), false},
		{"too many frames", newZMTPStream().frame(1, nil).frame(1, nil).frame(1, nil).frame(1, nil).frame(0, nil), true},
		{"limits are per message", newZMTPStream().frame(1, body(maxFrame)).frame(0, body(100)).
			frame(1, body(maxFrame)).frame(0, body(100)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := refusedAt(tc.data, maxFrame, maxMessage, maxFrames)
			if (at >= 0) != tc.refused {
				t.Fatalf("reference: refused at %d, want refused %v", at, tc.refused)
			}
			for _, chunk := range []int{1, 2, 7, 64, 4096} {
				for _, want := range []int{1, 2, 9, 4096} {
					got, err := limitedRead(tc.data, chunk, want, maxFrame, maxMessage, maxFrames)
					if !bytes.Equal(got, tc.data[:len(got)]) {
						t.Fatalf("chunk %d want %d: the limiter changed the stream", chunk, want)
					}
					switch {
					case !tc.refused && (err != nil || len(got) != len(tc.data)):
						t.Fatalf("chunk %d want %d: %d of %d bytes, err %v", chunk, want, len(got), len(tc.data), err)
					case tc.refused && !errors.Is(err, ErrFrameTooLarge):
						t.Fatalf("chunk %d want %d: err %v, want ErrFrameTooLarge", chunk, want, err)
					case tc.refused && len(got) > at:
						t.Fatalf("chunk %d want %d: %d bytes handed over, including the length byte at %d", chunk, want, len(got), at)
					}
				}
			}
		})
	}
	if got := limitedEndpoint("tcp://127.0.0.1:5557"); got != "kvevents-tcp://127.0.0.1:5557" {
		t.Fatalf("limitedEndpoint(tcp) = %q", got)
	}
	if got := limitedEndpoint("ipc:///tmp/kv"); got != "kvevents-ipc:///tmp/kv" {
		t.Fatalf("limitedEndpoint(ipc) = %q", got)
	}
	if got := limitedEndpoint("inproc://x"); got != "inproc://x" {
		t.Fatalf("limitedEndpoint(inproc) = %q", got)
	}
}

// zmtpFuzzSeeds are FuzzZMTPLimiter's kept corpus.
func zmtpFuzzSeeds() map[string][]byte {
	return map[string][]byte{
		"message":         newZMTPStream().frame(0x04, []byte("\x05READY")).frame(1, []byte("kv-events")).frame(0, bytes.Repeat([]byte{1}, 260)),
		"huge_declared":   append(newZMTPStream(), zmtpFrameHeader(0, hugeFrame)...),
		"many_frames":     newZMTPStream().frame(1, nil).frame(1, nil).frame(1, nil).frame(1, nil).frame(0, nil),
		"greeting_only":   zmtpGreeting()[:40],
		"truncated_frame": newZMTPStream().frame(0, bytes.Repeat([]byte{2}, 100))[:100],
	}
}

// FuzzZMTPLimiter: whatever the stream and however it is chunked, the
// limiter passes a prefix of it unchanged, refuses exactly what the
// reference refuses, and never hands over the length byte that completes a
// refused declaration.
func FuzzZMTPLimiter(f *testing.F) {
	if *rewrite {
		dir := filepath.Join("testdata", "fuzz", "FuzzZMTPLimiter")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			f.Fatal(err)
		}
		for name, p := range zmtpFuzzSeeds() {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\nuint8(3)\nuint8(9)\n", p)
			if err := os.WriteFile(filepath.Join(dir, "seed_"+name), []byte(body), 0o644); err != nil {
				f.Fatal(err)
			}
		}
	}
	for _, p := range zmtpFuzzSeeds() {
		f.Add(p, uint8(3), uint8(9))
	}
	const maxFrame, maxMessage, maxFrames = 300, 500, 4
	f.Fuzz(func(t *testing.T, data []byte, chunk, want uint8) {
		got, err := limitedRead(data, int(chunk)%64+1, int(want)%16+1, maxFrame, maxMessage, maxFrames)
		if !bytes.Equal(got, data[:len(got)]) {
			t.Fatal("the limiter changed the stream")
		}
		at := refusedAt(data, maxFrame, maxMessage, maxFrames)
		switch {
		case at < 0 && (err != nil || len(got) != len(data)):
			t.Fatalf("not refused by the reference, but %d of %d bytes, err %v", len(got), len(data), err)
		case at >= 0 && !errors.Is(err, ErrFrameTooLarge):
			t.Fatalf("refused by the reference at %d, err %v", at, err)
		case at >= 0 && len(got) > at:
			t.Fatalf("%d bytes handed over, including the length byte at %d", len(got), at)
		}
	})
}
