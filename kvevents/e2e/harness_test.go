package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferencecache/inferencecache/bus/bustest"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/internal/testbin"
	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// buildTimeout bounds building the three binaries (a cold build of
// cmd/server on a loaded 2-core machine takes a few minutes).
const buildTimeout = 6 * time.Minute

// binaries are built once per test binary, on first use, into binDir.
var (
	binDir    string
	buildOnce sync.Once
	buildErr  error
	bins      struct{ server, subscriber, engine string }
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvevents-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binDir = dir
	code := bustest.Main(m) // it builds the NATS server nats_test.go starts
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// built builds the binaries (once) and returns their paths.
func built(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		const mod = "github.com/inferencecache/inferencecache/"
		bins.server = filepath.Join(binDir, "server")
		bins.subscriber = filepath.Join(binDir, "kvevent-subscriber")
		bins.engine = filepath.Join(binDir, "kvevent-fake-engine")
		buildErr = testbin.Build(ctx, binDir, mod+"cmd/server", mod+"cmd/kvevent-subscriber", mod+"cmd/kvevent-fake-engine")
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

// freePort returns a loopback port nobody listens on right now. It is
// drawn below Linux's default ephemeral range (32768+), so an outgoing
// connection of another process cannot take it between the kill of a
// process and its restart on the same port; it falls back to a
// kernel-chosen port.
func freePort(t *testing.T) int {
	t.Helper()
	for range 50 {
		port := 20000 + rand.IntN(12000)
		if l, err := net.Listen("tcp", addr(port)); err == nil {
			_ = l.Close()
			return port
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// bindAttempts bounds the starts of one process that lost a port race.
const bindAttempts = 5

// lostBindRace reports whether p exited because a port it was to listen
// on was taken.
func lostBindRace(p *proc) bool {
	return p.exited() && strings.Contains(p.out.String(), "address already in use")
}

// settleBind waits briefly for p to either keep running or exit having lost
// a port race (a bind is among the first things each binary does); it
// reports whether p lost one.
func settleBind(p *proc) bool {
	select {
	case <-p.done:
		return lostBindRace(p)
	case <-time.After(500 * time.Millisecond):
		return false
	}
}

// logBuffer collects a process's output.
type logBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// proc is one running binary.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *logBuffer
	done chan struct{} // closed when the process exited
}

// startProc runs bin with args. When the test ends the process is killed
// (if still running); on failure its output is logged.
func startProc(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), out: &logBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("cannot start %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t, syscall.SIGKILL)
		if t.Failed() {
			t.Logf("--- %s: %s output ---\n%s", t.Name(), name, tail(p.out.String(), 6000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// kill sends SIGKILL and waits (bounded) for the process to be gone.
func (p *proc) kill(t *testing.T) { p.stop(t, syscall.SIGKILL) }

func (p *proc) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	if sig == syscall.SIGKILL {
		_ = p.cmd.Process.Kill()
	} else {
		_ = p.cmd.Process.Signal(sig)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not exit within 10 s of %v", p.name, sig)
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// poll calls cond every 20 ms until it is true or limit passed; it returns
// how long that took and whether cond became true.
func poll(limit time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > limit {
			return time.Since(start), false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ---------------------------------------------------------------- server

// serverProc is a running cmd/server with fixed loopback ports, so a
// restarted one listens where the first one did.
type serverProc struct {
	*proc
	grpcPort, httpPort, intPort int
	extra                       []string // more flags (e.g. --nats-url)
}

func startServer(t *testing.T, ports *serverProc) *serverProc {
	t.Helper()
	built(t)
	s := ports
	fresh := s == nil
	if fresh {
		s = &serverProc{}
	}
	// A port probed free can be taken by another test binary before the
	// server binds it; such a start is retried (on new ports when the
	// caller did not fix them, else on the same ones a moment later).
	for attempt := 1; ; attempt++ {
		if fresh {
			s.grpcPort, s.httpPort, s.intPort = freePort(t), freePort(t), freePort(t)
		}
		args := append([]string{"--grpc-bind-address", addr(s.grpcPort), "--http-bind-address", addr(s.httpPort),
			"--snapshot-bind-address", addr(s.intPort), "--insecure-disable-auth", "--log-format", "text"}, s.extra...)
		s.proc = startProc(t, "server", bins.server, args...)
		_, ok := poll(15*time.Second, func() bool {
			return s.exited() || httpStatus("http://"+addr(s.httpPort)+"/readyz") == http.StatusOK
		})
		if ok && !s.exited() {
			break
		}
		if s.exited() && lostBindRace(s.proc) && attempt < bindAttempts {
			t.Logf("server start %d lost a port race, retrying", attempt)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		t.Fatalf("server not ready within 15 s")
	}
	// What the controller pushes: crisp answers for tenant "t" (a miss is
	// NO_HINT, one 16-token block is enough to match).
	body := `{"version":7,"policies":[{"namespace":"t","minimumMatchedTokens":16,"affinityRouting":false,"strategy":{"enableTenantHot":false}}]}`
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr(s.intPort)+"/policy", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("/policy: %d", resp.StatusCode)
	}
	return s
}

// restart SIGKILLs the server and starts a new one on the same ports; it
// returns when the new one is ready and has its policy.
func (s *serverProc) restart(t *testing.T) {
	t.Helper()
	s.kill(t)
	startServer(t, s)
}

func httpStatus(url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// client is a gateway-side gRPC client of the server.
func (s *serverProc) client(t *testing.T) icv1.InferenceCacheClient {
	t.Helper()
	conn, err := grpc.NewClient(addr(s.grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return icv1.NewInferenceCacheClient(conn)
}

// ---------------------------------------------------------------- engine

// engineSpec is a fake engine's workload: the test rebuilds the same
// synthetic workload in process to know what the engine holds.
type engineSpec struct {
	flavor   string // vllm or sglang
	seed     uint64
	turns    int
	sessions int
	capacity int
	ring     int
}

func (e engineSpec) synthetic() fakeengine.SyntheticConfig {
	return fakeengine.SyntheticConfig{Sessions: e.sessions, BlocksPerTurn: 4, BlockSize: 16, CapacityBlocks: e.capacity,
		Turns: e.turns, Seed: e.seed}
}

type engineProc struct {
	*proc
	spec             engineSpec
	pubPort, repPort int
}

// startEngine runs the fake engine; it publishes its turns once a
// subscriber is connected (or after waitSub), then idles serving replay.
// extra flags are appended.
func startEngine(t *testing.T, spec engineSpec, pubPort, repPort int, waitSub time.Duration, extra ...string) *engineProc {
	t.Helper()
	built(t)
	fresh := pubPort == 0
	for attempt := 1; ; attempt++ {
		if fresh {
			pubPort, repPort = freePort(t), freePort(t)
		}
		e := &engineProc{spec: spec, pubPort: pubPort, repPort: repPort}
		args := []string{
			"--endpoint", "tcp://" + addr(pubPort), "--replay-endpoint", "tcp://" + addr(repPort), "--topic", "kv-events",
			"--engine", spec.flavor, "--workload", "synthetic", "--seed", strconv.FormatUint(spec.seed, 10),
			"--sessions", strconv.Itoa(spec.sessions), "--blocks-per-turn", "4", "--block-size", "16",
			"--capacity-blocks", strconv.Itoa(spec.capacity), "--turns", strconv.Itoa(spec.turns), "--interval", "2ms",
			"--ring-size", strconv.Itoa(spec.ring), "--wait-subscriber", waitSub.String(), "--linger"}
		e.proc = startProc(t, "engine", bins.engine, append(args, extra...)...)
		if !settleBind(e.proc) || attempt == bindAttempts {
			return e
		}
		t.Logf("engine start %d lost a port race, retrying", attempt)
		time.Sleep(200 * time.Millisecond)
	}
}

// waitIdle waits until the engine published its whole workload.
func (e *engineProc) waitIdle(t *testing.T) {
	t.Helper()
	if _, ok := poll(20*time.Second, func() bool { return strings.Contains(e.out.String(), "workload done") }); !ok {
		t.Fatal("the fake engine did not finish its workload within 20 s")
	}
}

// heldKeys replays the engine's workload in process and returns the keys
// (our fingerprint, as a gateway computes it from the token ids) of every
// block the engine holds once its workload is done.
func (e *engineProc) heldKeys(t *testing.T) []uint64 {
	t.Helper()
	w := fakeengine.NewSynthetic(e.spec.synthetic())
	keys := map[uint64]uint64{} // engine hash → key
	for {
		b, _, ok := w.Next()
		if !ok {
			break
		}
		for _, ev := range b.Events {
			if ev.Kind != fakeengine.BlockStored {
				continue
			}
			var parent uint64
			if ev.Parent != nil {
				p, ok := keys[*ev.Parent]
				if !ok {
					t.Fatalf("BUG: test model: parent %x never stored", *ev.Parent)
				}
				parent = p
			}
			ks := fingerprint.AppendChain(nil, ev.TokenIDs, ev.BlockSize, parent, ev.Parent != nil)
			for i, h := range ev.BlockHashes {
				keys[h] = ks[i]
			}
		}
	}
	var held []uint64
	for h, k := range keys {
		if w.Holds(h) {
			held = append(held, k)
		}
	}
	if len(held) == 0 {
		t.Fatal("BUG: the engine holds nothing")
	}
	return held
}

// ---------------------------------------------------------------- subscriber

type subProc struct {
	*proc
	metricsPort int
	args        []string
}

// subArgs are a subscriber's flags for replica id following e, reporting to
// srv; extra are appended.
func subArgs(id string, e *engineProc, srv *serverProc, metricsPort int, extra ...string) []string {
	scheme := e.spec.flavor
	return append([]string{"--replica-id", id, "--tenant-id", "t", "--model-id", "m", "--hash-scheme", scheme,
		"--engine-endpoint", "tcp://" + addr(e.pubPort), "--engine-replay-endpoint", "tcp://" + addr(e.repPort),
		"--topic", "kv-events", "--block-size", "16", "--server-address", addr(srv.grpcPort),
		"--metrics-bind-address", addr(metricsPort), "--log-level", "debug"}, extra...)
}

func startSubscriber(t *testing.T, id string, e *engineProc, srv *serverProc, extra ...string) *subProc {
	t.Helper()
	built(t)
	for attempt := 1; ; attempt++ {
		mp := freePort(t)
		s := &subProc{metricsPort: mp, args: subArgs(id, e, srv, mp, extra...)}
		s.proc = startProc(t, "subscriber "+id, bins.subscriber, s.args...)
		if !settleBind(s.proc) || attempt == bindAttempts {
			return s
		}
		t.Logf("subscriber start %d lost a port race, retrying", attempt)
	}
}

// restart starts the subscriber again with the same flags (the previous
// process must be gone).
func (s *subProc) restart(t *testing.T) {
	t.Helper()
	if !s.exited() {
		t.Fatal("BUG: restart of a running subscriber")
	}
	s.proc = startProc(t, s.name, bins.subscriber, s.args...)
}

// metric returns the value of the series written name (with its labels,
// as exposed, e.g. `x_total{reason="sync"}`) on the subscriber's /metrics
// (-1 when it cannot be read).
func (s *subProc) metric(name string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr(s.metricsPort)+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return -1
			}
			return f
		}
	}
	return -1
}

// ---------------------------------------------------------------- lookups

// answering counts the keys whose exact lookup is a PREFIX_MATCH naming
// replica. A failed call counts as not answering. Lookups run 8 at a time,
// so one pass stays short next to the recovery times it measures.
func answering(cli icv1.InferenceCacheClient, scheme, replica string, keys []uint64) int {
	var n atomic.Int64
	work := make(chan uint64)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for k := range work {
				if answers(cli, scheme, replica, k) {
					n.Add(1)
				}
			}
		})
	}
	for _, k := range keys {
		work <- k
	}
	close(work)
	wg.Wait()
	return int(n.Load())
}

func answers(cli icv1.InferenceCacheClient, scheme, replica string, k uint64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := cli.LookupRoute(ctx, &icv1.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: scheme,
		PrefixHash: fingerprint.AppendWire(nil, k)})
	if err != nil || resp.GetReasonCode() != "PREFIX_MATCH" {
		return false
	}
	for _, sc := range resp.GetReplicaScores() {
		if sc.GetReplicaId() == replica {
			return true
		}
	}
	return false
}

// clearReplica sends ALL_CLEARED for replica, as the seed subscriber did at
// every start.
func clearReplica(t *testing.T, cli icv1.InferenceCacheClient, replica string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.PublishEvent(ctx, &icv1.CacheEvent{Type: icv1.CacheEvent_ALL_CLEARED, TenantId: "t", ModelId: "m", ReplicaId: replica}); err != nil {
		t.Fatal(err)
	}
}

var errTimeout = errors.New("timeout")

// waitAnswering waits (at most limit) until every key answers for replica
// and returns how long that took.
func waitAnswering(t *testing.T, cli icv1.InferenceCacheClient, scheme, replica string, keys []uint64, limit time.Duration) (time.Duration, error) {
	t.Helper()
	last := 0
	d, ok := poll(limit, func() bool {
		last = answering(cli, scheme, replica, keys)
		return last == len(keys)
	})
	if !ok {
		return d, fmt.Errorf("%w: %d of %d blocks of %s answer after %v", errTimeout, last, len(keys), replica, d.Round(time.Millisecond))
	}
	return d, nil
}
