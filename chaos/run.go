package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/lookupclient"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Defaults of Config.
const (
	DefaultDuration = time.Minute
	DefaultServers  = 3
	DefaultEngines  = 4
	DefaultFaultMin = 5 * time.Second
	DefaultFaultMax = 10 * time.Second
	// DefaultQuietMax bounds the wait for convergence once the engines
	// stopped: generous for a loaded 2-core machine (it takes seconds).
	DefaultQuietMax = 90 * time.Second
)

// Workload of every engine: 16-token blocks, 4 per turn, a turn every
// 20 ms, a 1024-block cache (so blocks are removed all along), a replay
// ring of 5000 batches (100 s).
const (
	tenant        = "t"
	blockSize     = 16
	engineEvery   = "20ms"
	engineCap     = 1024
	engineRing    = 5000
	lookupWorkers = 2
	lookupTimeout = 2 * time.Second
)

// policyBody is what the controller pushes: one 16-token block matches,
// no affinity or tenant-hot answers, so a lookup names exactly the
// replicas holding the block.
const policyBody = `{"version":7,"policies":[{"namespace":"` + tenant + `","minimumMatchedTokens":16,"affinityRouting":false,"strategy":{"enableTenantHot":false}}]}`

// Config configures a run.
type Config struct {
	// Dir holds the stores, state files and logs; required.
	Dir  string
	Bins Binaries
	// Duration of the fault phase; 0 means DefaultDuration.
	Duration time.Duration
	// Seed of the fault schedule; 0 draws one (printed in the report).
	Seed uint64
	// Servers and Engines (each engine has its subscriber); 0 means the
	// defaults (3 and 4).
	Servers, Engines int
	// FaultMin, FaultMax bound the time between two faults.
	FaultMin, FaultMax time.Duration
	// QuietMax bounds the wait for convergence after the fault phase.
	QuietMax time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

func (c *Config) defaults() error {
	if c.Dir == "" {
		return errors.New("chaos: Config.Dir is required")
	}
	if c.Duration <= 0 {
		c.Duration = DefaultDuration
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano()%1_000_000 + 1)
	}
	if c.Servers <= 0 {
		c.Servers = DefaultServers
	}
	if c.Engines <= 0 {
		c.Engines = DefaultEngines
	}
	if c.FaultMin <= 0 {
		c.FaultMin = DefaultFaultMin
	}
	if c.FaultMax < c.FaultMin {
		c.FaultMax = max(DefaultFaultMax, c.FaultMin)
	}
	if c.QuietMax <= 0 {
		c.QuietMax = DefaultQuietMax
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return nil
}

// Fault is one scheduled kill: At after the fault phase began, Target is
// SIGKILLed and started again Down later.
type Fault struct {
	At     time.Duration
	Target string
	Kind   string
	Down   time.Duration
}

// Schedule draws the faults of a run from its seed: one every FaultMin to
// FaultMax, each on a random kind (server, subscriber, engine, NATS) and a
// random component of it, down for 0 to 2 s.
func Schedule(cfg Config) []Fault {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xc4a05))
	var out []Fault
	at := time.Duration(0)
	for {
		at += cfg.FaultMin + time.Duration(rng.Int64N(int64(cfg.FaultMax-cfg.FaultMin)+1))
		if at > cfg.Duration {
			return out
		}
		f := Fault{At: at.Round(time.Millisecond), Kind: kinds[rng.IntN(len(kinds))], Down: time.Duration(rng.Int64N(int64(2 * time.Second))).Round(time.Millisecond)}
		switch f.Kind {
		case KindServer:
			f.Target = fmt.Sprintf("server-%d", rng.IntN(cfg.Servers))
		case KindSubscriber:
			f.Target = fmt.Sprintf("subscriber-%d", rng.IntN(cfg.Engines))
		case KindEngine:
			f.Target = fmt.Sprintf("engine-%d", rng.IntN(cfg.Engines))
		default:
			f.Target = "nats"
		}
		out = append(out, f)
	}
}

// Report is the outcome of a run.
type Report struct {
	Seed     uint64
	Duration time.Duration // the fault phase
	Faults   map[string]int
	// Lookups issued by the gateway-like client, each tried on every server
	// in turn until one answered: Hinted answers name a replica, FailOpen
	// ones name none (a miss, or a server still replaying), Unanswered got
	// an error from every server. AttemptErrors counts the errors of single
	// tries (a killed server).
	Lookups, Hinted, FailOpen, Unanswered, AttemptErrors int64
	// Mismatches between the servers' indexes and the engines' truth at
	// the end; Converged is how long after the engines stopped they
	// disappeared (when they did).
	Mismatches []string
	Converged  time.Duration
	HeldBlocks int // blocks the engines held at the end, all together
	// Peaks by kind; Growth lists processes whose last third's peak is
	// far above their first third's.
	PeakRSS        map[string]int64
	PeakGoroutines map[string]int64
	Growth         []string
	// Crashes lists components that exited without being killed.
	Crashes []string
	Elapsed time.Duration
}

// Failures lists why the run failed; empty when it passed.
func (r *Report) Failures() []string {
	var out []string
	if len(r.Mismatches) > 0 {
		out = append(out, fmt.Sprintf("%d mismatches at the end: %s", len(r.Mismatches), strings.Join(r.Mismatches, "; ")))
	}
	if r.Unanswered > 0 {
		out = append(out, fmt.Sprintf("%d lookups were answered by no server", r.Unanswered))
	}
	if r.Lookups == 0 {
		out = append(out, "no lookup was made")
	}
	for _, g := range r.Growth {
		out = append(out, "grew without bound: "+g)
	}
	for _, c := range r.Crashes {
		out = append(out, "crashed: "+c)
	}
	return out
}

// Summary is the run's one line of figures.
func (r *Report) Summary() string {
	var b strings.Builder
	total := 0
	for _, n := range r.Faults {
		total += n
	}
	fmt.Fprintf(&b, "chaos: seed=%d faults=%d (server=%d subscriber=%d engine=%d nats=%d) over %v; lookups=%d answered=%d (hinted=%d fail_open=%d) unanswered=%d attempt_errors=%d; held_blocks=%d mismatches=%d",
		r.Seed, total, r.Faults[KindServer], r.Faults[KindSubscriber], r.Faults[KindEngine], r.Faults[KindNATS], r.Duration,
		r.Lookups, r.Hinted+r.FailOpen, r.Hinted, r.FailOpen, r.Unanswered, r.AttemptErrors, r.HeldBlocks, len(r.Mismatches))
	if len(r.Mismatches) == 0 {
		fmt.Fprintf(&b, " (converged %.1fs after the engines stopped)", r.Converged.Seconds())
	}
	fmt.Fprintf(&b, "; peak RSS MiB server=%d subscriber=%d engine=%d nats=%d; peak goroutines server=%d subscriber=%d; growth=%d crashes=%d; %.0fs wall",
		r.PeakRSS[KindServer]>>20, r.PeakRSS[KindSubscriber]>>20, r.PeakRSS[KindEngine]>>20, r.PeakRSS[KindNATS]>>20,
		r.PeakGoroutines[KindServer], r.PeakGoroutines[KindSubscriber], len(r.Growth), len(r.Crashes), r.Elapsed.Seconds())
	return b.String()
}

type serverComp struct {
	*component
	grpcPort, httpPort, intPort int
	// readyInc is the incarnation that turned ready and got its policy.
	readyInc atomic.Int64
}

type engineComp struct {
	*component
	idx                         int
	flavor, layout              string
	pubPort, repPort, statePort int
	keys                        atomic.Pointer[[]uint64] // last truth read, for the lookup load
	replica, model, scheme      string
}

type subComp struct {
	*component
	metricsPort int
}

// harness is one run's components and counters.
type harness struct {
	cfg     Config
	http    *http.Client
	nats    *component
	natsURL string
	servers []*serverComp
	engines []*engineComp
	subs    []*subComp
	all     []*component

	lookups, hinted, failOpen, unanswered, attemptErrs atomic.Int64

	// mu guards samples.
	mu      sync.Mutex
	samples []sample
}

type sample struct {
	at         time.Time
	name, kind string
	rss        int64
	goroutines int64 // -1: not read
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.cfg.Log, "%s chaos: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// Run runs the chaos run cfg describes. The error is for a run that could
// not be carried out (a process that cannot start); a run carried out
// returns its report, whose Failures say whether it passed.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	h := &harness{cfg: cfg, http: &http.Client{Timeout: 5 * time.Second}}
	if err := h.setup(); err != nil {
		return nil, err
	}
	defer h.stopAll()
	sched := Schedule(cfg)
	var desc []string
	for _, f := range sched {
		desc = append(desc, fmt.Sprintf("%.1fs %s (down %.1fs)", f.At.Seconds(), f.Target, f.Down.Seconds()))
	}
	h.logf("seed %d, %d faults over %v: %s", cfg.Seed, len(sched), cfg.Duration, strings.Join(desc, ", "))
	h.logf("logs, stores and state files under %s", cfg.Dir)

	for _, c := range h.all {
		if err := c.start(); err != nil {
			return nil, err
		}
		if c == h.nats {
			if err := waitListening(ctx, h.natsURL[len("nats://"):], 15*time.Second); err != nil {
				return nil, fmt.Errorf("chaos: NATS: %w", err)
			}
		}
	}
	if err := h.waitServersReady(ctx, time.Minute); err != nil {
		return nil, err
	}
	h.logf("all %d components up, every server ready", len(h.all))

	bg, stopBG := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { h.sampleLoop(bg) })
	wg.Go(func() { h.truthLoop(bg) })
	conns, err := h.dialServers()
	if err != nil {
		stopBG()
		wg.Wait()
		return nil, err
	}
	for w := range lookupWorkers {
		wg.Go(func() { h.lookupLoop(bg, conns, w) })
	}

	rep := &Report{Seed: cfg.Seed, Duration: cfg.Duration, Faults: map[string]int{}}
	t0 := time.Now()
	for _, f := range sched {
		if err := sleepUntil(ctx, t0.Add(f.At)); err != nil {
			break
		}
		c := h.find(f.Target)
		h.logf("kill -9 %s", f.Target)
		if err := c.kill(); err != nil {
			h.logf("%v", err)
		}
		rep.Faults[f.Kind]++
		_ = sleepUntil(ctx, time.Now().Add(f.Down))
		if err := c.start(); err != nil {
			stopBG()
			wg.Wait()
			return nil, err
		}
		if c == h.nats {
			if err := waitListening(ctx, h.natsURL[len("nats://"):], 15*time.Second); err != nil {
				h.logf("NATS not listening again: %v", err)
			}
		}
	}
	_ = sleepUntil(ctx, t0.Add(cfg.Duration))
	for _, c := range h.all {
		if err := c.ensureRunning(); err != nil {
			h.logf("%v", err)
		}
	}

	h.logf("fault phase over; stopping the engines and waiting for convergence (at most %v)", cfg.QuietMax)
	quiet := time.Now()
	h.pauseEngines(ctx)
	var mism []string
	for {
		var held int
		mism, held = h.check(ctx)
		rep.HeldBlocks = held
		if len(mism) == 0 {
			rep.Converged = time.Since(quiet)
			break
		}
		if time.Since(quiet) > cfg.QuietMax || ctx.Err() != nil {
			break
		}
		h.logf("not converged yet (%d mismatches, e.g. %s)", len(mism), mism[0])
		_ = sleepUntil(ctx, time.Now().Add(time.Second))
	}
	rep.Mismatches = mism
	stopBG()
	wg.Wait()
	for _, c := range conns {
		_ = c.Close()
	}

	rep.Lookups, rep.Hinted, rep.FailOpen = h.lookups.Load(), h.hinted.Load(), h.failOpen.Load()
	rep.Unanswered, rep.AttemptErrors = h.unanswered.Load(), h.attemptErrs.Load()
	rep.PeakRSS, rep.PeakGoroutines, rep.Growth = h.growth(began, time.Now())
	for _, c := range h.all {
		if n := c.crashes(); n > 0 {
			rep.Crashes = append(rep.Crashes, fmt.Sprintf("%s %d times (log %s, ending:\n%s)", c.name, n, c.logPath, tail(c.logPath, 2000)))
		}
	}
	rep.Elapsed = time.Since(began)
	return rep, nil
}

// setup lays out the components: ports, files, flags.
func (h *harness) setup() error {
	prng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
	taken := map[int]bool{}
	port := func() int {
		p, err := freePort(prng, taken)
		if err != nil {
			panic(err) // recovered below
		}
		return p
	}
	var perr error
	func() {
		defer func() {
			if r := recover(); r != nil {
				perr = fmt.Errorf("%v", r)
			}
		}()
		h.layout(port)
	}()
	return perr
}

func (h *harness) layout(port func() int) {
	d := h.cfg.Dir
	for _, sub := range []string{"logs", "nats", "state"} {
		_ = os.MkdirAll(filepath.Join(d, sub), 0o755)
	}
	logPath := func(name string) string { return filepath.Join(d, "logs", name+".log") }

	np := port()
	h.natsURL = "nats://" + addr(np)
	h.nats = &component{name: "nats", kind: KindNATS, bin: h.cfg.Bins.NATS, logPath: logPath("nats"),
		args: func(int) []string {
			return []string{"-a", "127.0.0.1", "-p", strconv.Itoa(np), "-js", "-sd", filepath.Join(d, "nats")}
		}}
	h.all = append(h.all, h.nats)

	for i := range h.cfg.Servers {
		s := &serverComp{grpcPort: port(), httpPort: port(), intPort: port()}
		s.component = &component{name: fmt.Sprintf("server-%d", i), kind: KindServer, bin: h.cfg.Bins.Server, logPath: logPath(fmt.Sprintf("server-%d", i)),
			args: func(int) []string {
				return []string{"--grpc-bind-address", addr(s.grpcPort), "--http-bind-address", addr(s.httpPort),
					"--snapshot-bind-address", addr(s.intPort), "--insecure-disable-auth", "--log-format", "text", "--nats-url", h.natsURL}
			},
			started: func(ctx context.Context, inc int) { h.serverStarted(ctx, s, inc) }}
		h.servers = append(h.servers, s)
		h.all = append(h.all, s.component)
	}
	for i := range h.cfg.Engines {
		e := &engineComp{idx: i, pubPort: port(), repPort: port(), statePort: port(),
			replica: fmt.Sprintf("pod-%d", i), model: fmt.Sprintf("m-%d", i)}
		// vLLM (array and map layouts) and SGLang shapes.
		switch i % 4 {
		case 0:
			e.flavor, e.layout = "vllm", "array"
		case 1:
			e.flavor, e.layout = "sglang", "array"
		case 2:
			e.flavor, e.layout = "vllm", "map"
		default:
			e.flavor, e.layout = "sglang", "array"
		}
		e.scheme = e.flavor
		e.component = &component{name: fmt.Sprintf("engine-%d", i), kind: KindEngine, bin: h.cfg.Bins.Engine, logPath: logPath(fmt.Sprintf("engine-%d", i)),
			args: func(inc int) []string {
				return []string{"--endpoint", "tcp://" + addr(e.pubPort), "--replay-endpoint", "tcp://" + addr(e.repPort), "--topic", "kv-events",
					"--engine", e.flavor, "--layout", e.layout, "--workload", "synthetic",
					"--seed", strconv.FormatUint(h.cfg.Seed*1000+uint64(i)*100+uint64(inc), 10),
					"--sessions", "16", "--blocks-per-turn", "4", "--block-size", strconv.Itoa(blockSize),
					"--capacity-blocks", strconv.Itoa(engineCap), "--turns", "0", "--interval", engineEvery,
					"--ring-size", strconv.Itoa(engineRing), "--wait-subscriber", "5s", "--state-bind-address", addr(e.statePort)}
			}}
		h.engines = append(h.engines, e)
		h.all = append(h.all, e.component)

		s := &subComp{metricsPort: port()}
		s.component = &component{name: fmt.Sprintf("subscriber-%d", i), kind: KindSubscriber, bin: h.cfg.Bins.Subscriber, logPath: logPath(fmt.Sprintf("subscriber-%d", i)),
			args: func(int) []string {
				return []string{"--replica-id", e.replica, "--tenant-id", tenant, "--model-id", e.model, "--hash-scheme", e.scheme,
					"--engine-endpoint", "tcp://" + addr(e.pubPort), "--engine-replay-endpoint", "tcp://" + addr(e.repPort),
					"--topic", "kv-events", "--block-size", strconv.Itoa(blockSize), "--nats-url", h.natsURL,
					"--metrics-bind-address", addr(s.metricsPort),
					"--state-file", filepath.Join(d, "state", e.replica+".state"), "--state-interval", "1s"}
			}}
		h.subs = append(h.subs, s)
		h.all = append(h.all, s.component)
	}
}

func (h *harness) find(name string) *component {
	for _, c := range h.all {
		if c.name == name {
			return c
		}
	}
	panic("chaos: BUG: no component " + name)
}

func (h *harness) stopAll() {
	for _, c := range h.all {
		_ = c.kill()
	}
}

// serverStarted waits until the incarnation is ready and pushes it the
// policy, as the controller does for every ready server pod.
func (h *harness) serverStarted(ctx context.Context, s *serverComp, inc int) {
	base := "http://" + addr(s.httpPort)
	for ctx.Err() == nil {
		if h.status(ctx, http.MethodGet, base+"/readyz", "") == http.StatusOK &&
			h.status(ctx, http.MethodPost, "http://"+addr(s.intPort)+"/policy", policyBody) == http.StatusNoContent {
			s.readyInc.Store(int64(inc))
			return
		}
		_ = sleepUntil(ctx, time.Now().Add(200*time.Millisecond))
	}
}

func (h *harness) status(ctx context.Context, method, url, body string) int {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return 0
	}
	resp, err := h.http.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func (h *harness) getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := h.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// serverReady reports whether the server's current incarnation is ready
// and has its policy.
func (s *serverComp) ready() bool {
	s.mu.Lock()
	inc := s.incarnation
	s.mu.Unlock()
	_, up := s.running()
	return up && s.readyInc.Load() == int64(inc)
}

func (h *harness) waitServersReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		n := 0
		for _, s := range h.servers {
			if s.ready() {
				n++
			}
		}
		if n == len(h.servers) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: %d of %d servers ready after %v (logs under %s)", n, len(h.servers), limit, filepath.Join(h.cfg.Dir, "logs"))
		}
		if err := sleepUntil(ctx, time.Now().Add(100*time.Millisecond)); err != nil {
			return err
		}
	}
}

// dialServers opens one gateway connection per server, reconnecting fast
// (a gateway in front of restarting pods would tune its backoff so).
func (h *harness) dialServers() ([]*grpc.ClientConn, error) {
	var out []*grpc.ClientConn
	for _, s := range h.servers {
		conn, err := grpc.NewClient(addr(s.grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
				MinConnectTimeout: time.Second}))
		if err != nil {
			for _, c := range out {
				_ = c.Close()
			}
			return nil, fmt.Errorf("chaos: cannot dial %s: %w", s.name, err)
		}
		out = append(out, conn)
	}
	return out, nil
}

// lookupLoop issues lookups until ctx ends: a held key of a random engine
// (as last read), tried on each server in turn until one answers.
func (h *harness) lookupLoop(ctx context.Context, conns []*grpc.ClientConn, worker int) {
	clients := make([]*lookupclient.Client, len(conns))
	for i, c := range conns {
		clients[i] = lookupclient.New(c, lookupclient.Options{Streams: 1})
		defer clients[i].Close()
	}
	rng := rand.New(rand.NewPCG(uint64(worker), uint64(time.Now().UnixNano())))
	next := worker
	for ctx.Err() == nil {
		e := h.engines[rng.IntN(len(h.engines))]
		key := rng.Uint64()
		if ks := e.keys.Load(); ks != nil && len(*ks) > 0 {
			key = (*ks)[rng.IntN(len(*ks))]
		}
		req := &pb.LookupRouteRequest{TenantId: tenant, ModelId: e.model, HashScheme: e.scheme, PrefixHash: fingerprint.AppendWire(nil, key)}
		h.lookups.Add(1)
		answered := false
		for range clients {
			next = (next + 1) % len(clients)
			lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
			resp, err := clients[next].LookupRoute(lctx, req)
			cancel()
			if ctx.Err() != nil {
				h.lookups.Add(-1) // ended by the run's end, not answered or failed
				return
			}
			if err != nil {
				h.attemptErrs.Add(1)
				continue
			}
			answered = true
			if len(resp.GetReplicaScores()) > 0 {
				h.hinted.Add(1)
			} else {
				h.failOpen.Add(1)
			}
			break
		}
		if !answered {
			h.unanswered.Add(1)
		}
		_ = sleepUntil(ctx, time.Now().Add(time.Millisecond))
	}
}

// truthLoop reads every engine's held keys every 2 s for the lookup load.
func (h *harness) truthLoop(ctx context.Context) {
	for ctx.Err() == nil {
		for _, e := range h.engines {
			if keys, _, err := h.engineKeys(ctx, e); err == nil {
				e.keys.Store(&keys)
			}
		}
		_ = sleepUntil(ctx, time.Now().Add(2*time.Second))
	}
}

type blocksBody struct {
	Blocks  int      `json:"blocks"`
	Unkeyed int      `json:"unkeyed"`
	Paused  bool     `json:"paused"`
	Keys    []string `json:"keys"`
}

func (h *harness) engineKeys(ctx context.Context, e *engineComp) (keys []uint64, body blocksBody, err error) {
	if err := h.getJSON(ctx, "http://"+addr(e.statePort)+"/blocks", &body); err != nil {
		return nil, body, err
	}
	keys = make([]uint64, len(body.Keys))
	for i, s := range body.Keys {
		if keys[i], err = strconv.ParseUint(s, 16, 64); err != nil {
			return nil, body, fmt.Errorf("%s: bad key %q", e.name, s)
		}
	}
	return keys, body, nil
}

// sampleLoop records every process's RSS and, where it exports them, its
// goroutines, every second.
func (h *harness) sampleLoop(ctx context.Context) {
	for ctx.Err() == nil {
		now := time.Now()
		var batch []sample
		for _, c := range h.all {
			pid, ok := c.running()
			if !ok {
				continue
			}
			rss, ok := rssBytes(pid)
			if !ok {
				continue
			}
			s := sample{at: now, name: c.name, kind: c.kind, rss: rss, goroutines: -1}
			switch c.kind {
			case KindServer:
				s.goroutines = h.goroutines(ctx, "http://"+addr(h.serverOf(c).httpPort)+"/metrics")
			case KindSubscriber:
				s.goroutines = h.goroutines(ctx, "http://"+addr(h.subOf(c).metricsPort)+"/metrics")
			}
			batch = append(batch, s)
		}
		h.mu.Lock()
		h.samples = append(h.samples, batch...)
		h.mu.Unlock()
		_ = sleepUntil(ctx, now.Add(time.Second))
	}
}

func (h *harness) serverOf(c *component) *serverComp {
	for _, s := range h.servers {
		if s.component == c {
			return s
		}
	}
	return nil
}

func (h *harness) subOf(c *component) *subComp {
	for _, s := range h.subs {
		if s.component == c {
			return s
		}
	}
	return nil
}

// goroutines reads go_goroutines from a /metrics page (-1 when it cannot).
func (h *harness) goroutines(ctx context.Context, url string) int64 {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return -1
	}
	resp, err := h.http.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return int64(f)
			}
		}
	}
	return -1
}

// Growth bounds: a process grew without bound when the peak of the last
// third of the run exceeds the first third's by both a factor and an
// absolute margin (start-up, the index filling to the engines' capacity,
// the NATS stream's retained window and the replay rings are bounded growth
// well inside them; a goroutine or buffer per message is not).
const (
	growthFactor     = 1.5
	rssMargin        = 64 << 20
	goroutinesMargin = 200
)

// growth returns the peaks by kind and the processes that grew.
func (h *harness) growth(from, to time.Time) (rss, gor map[string]int64, grew []string) {
	h.mu.Lock()
	samples := slices.Clone(h.samples)
	h.mu.Unlock()
	rss, gor = map[string]int64{}, map[string]int64{}
	third := to.Sub(from) / 3
	type peaks struct{ firstRSS, lastRSS, firstG, lastG int64 }
	by := map[string]*peaks{}
	var names []string
	for _, s := range samples {
		rss[s.kind] = max(rss[s.kind], s.rss)
		gor[s.kind] = max(gor[s.kind], s.goroutines)
		p := by[s.name]
		if p == nil {
			p = &peaks{}
			by[s.name] = p
			names = append(names, s.name)
		}
		switch {
		case s.at.Before(from.Add(third)):
			p.firstRSS, p.firstG = max(p.firstRSS, s.rss), max(p.firstG, s.goroutines)
		case !s.at.Before(from.Add(2 * third)):
			p.lastRSS, p.lastG = max(p.lastRSS, s.rss), max(p.lastG, s.goroutines)
		}
	}
	for _, n := range names {
		p := by[n]
		if p.firstRSS > 0 && float64(p.lastRSS) > growthFactor*float64(p.firstRSS) && p.lastRSS-p.firstRSS > rssMargin {
			grew = append(grew, fmt.Sprintf("%s RSS %d MiB in the first third, %d MiB in the last", n, p.firstRSS>>20, p.lastRSS>>20))
		}
		if p.firstG > 0 && float64(p.lastG) > growthFactor*float64(p.firstG) && p.lastG-p.firstG > goroutinesMargin {
			grew = append(grew, fmt.Sprintf("%s goroutines %d in the first third, %d in the last", n, p.firstG, p.lastG))
		}
	}
	return rss, gor, grew
}

// pauseEngines stops every engine's publishing (each answers once its last
// batch was published).
func (h *harness) pauseEngines(ctx context.Context) {
	for _, e := range h.engines {
		deadline := time.Now().Add(30 * time.Second)
		for h.status(ctx, http.MethodPost, "http://"+addr(e.statePort)+"/pause", "") != http.StatusNoContent {
			if time.Now().After(deadline) || ctx.Err() != nil {
				h.logf("%s did not pause", e.name)
				break
			}
			_ = sleepUntil(ctx, time.Now().Add(200*time.Millisecond))
		}
	}
}

// check compares every server's index with every engine's truth: the
// replica's entry count on /snapshot must be the engine's block count, no
// other replica may hold entries, and every held block must answer a
// lookup naming the replica. It returns the mismatches and the blocks held.
func (h *harness) check(ctx context.Context) (mism []string, held int) {
	truth := make([][]uint64, len(h.engines))
	for i, e := range h.engines {
		keys, body, err := h.engineKeys(ctx, e)
		if err != nil {
			mism = append(mism, fmt.Sprintf("%s: cannot read its blocks: %v", e.name, err))
			continue
		}
		if !body.Paused {
			mism = append(mism, e.name+": not paused")
		}
		if body.Unkeyed > 0 {
			mism = append(mism, fmt.Sprintf("%s: %d blocks without a key", e.name, body.Unkeyed))
		}
		truth[i] = keys
		held += len(keys)
	}
	if len(mism) > 0 {
		return mism, held
	}
	pods := map[string]int{}
	for i, e := range h.engines {
		pods[e.replica] = i
	}
	countsOK := true
	for _, s := range h.servers {
		if !s.ready() {
			mism = append(mism, s.name+": not ready (or no policy yet)")
			countsOK = false
			continue
		}
		var snap controlapi.CacheSnapshot
		if err := h.getJSON(ctx, "http://"+addr(s.intPort)+"/snapshot", &snap); err != nil {
			mism = append(mism, fmt.Sprintf("%s: %v", s.name, err))
			countsOK = false
			continue
		}
		counts := map[string]int64{}
		for _, r := range snap.Replicas {
			if r.Tenant != tenant {
				continue
			}
			counts[r.ReplicaID] += r.PrefixCount
			if _, ok := pods[r.ReplicaID]; !ok && r.PrefixCount > 0 {
				mism = append(mism, fmt.Sprintf("%s: replica %s holds %d entries, no engine has it", s.name, r.ReplicaID, r.PrefixCount))
				countsOK = false
			}
		}
		for i, e := range h.engines {
			if got := counts[e.replica]; got != int64(len(truth[i])) {
				mism = append(mism, fmt.Sprintf("%s %s: %d entries, its engine holds %d", s.name, e.replica, got, len(truth[i])))
				countsOK = false
			}
		}
	}
	if !countsOK {
		return mism, held
	}
	for _, s := range h.servers {
		for i, e := range h.engines {
			if missing := h.missing(ctx, s, e, truth[i]); missing > 0 {
				mism = append(mism, fmt.Sprintf("%s %s: %d of %d held blocks do not answer", s.name, e.replica, missing, len(truth[i])))
			}
		}
	}
	return mism, held
}

// missing counts the keys whose lookup on s does not name e's replica.
func (h *harness) missing(ctx context.Context, s *serverComp, e *engineComp, keys []uint64) int {
	conn, err := grpc.NewClient(addr(s.grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return len(keys)
	}
	defer conn.Close()
	c := lookupclient.New(conn, lookupclient.Options{Streams: 8})
	defer c.Close()
	var miss atomic.Int64
	work := make(chan uint64)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for k := range work {
				lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := c.LookupRoute(lctx, &pb.LookupRouteRequest{TenantId: tenant, ModelId: e.model, HashScheme: e.scheme, PrefixHash: fingerprint.AppendWire(nil, k)})
				cancel()
				if err != nil || !slices.ContainsFunc(resp.GetReplicaScores(), func(r *pb.ReplicaScore) bool { return r.GetReplicaId() == e.replica }) {
					miss.Add(1)
				}
			}
		})
	}
	for _, k := range keys {
		work <- k
	}
	close(work)
	wg.Wait()
	return int(miss.Load())
}

// waitListening waits until something accepts connections on hostport.
func waitListening(ctx context.Context, hostport string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", hostport, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on %s after %v: %w", hostport, limit, err)
		}
		if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
			return err
		}
	}
}

// sleepUntil sleeps until t or ctx ends (then it returns ctx.Err()).
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
