package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
	"github.com/inferencecache/inferencecache/engine"
)

func req(id, ms, input, output, blockSize int, blocks ...uint64) workload.Request {
	return workload.Request{ID: id, Arrival: msec(ms), Blocks: blocks, BlockSize: blockSize, InputTokens: input, OutputTokens: output}
}

// fixedRouter sends every request to one replica and records what it
// observes, interleaved with routing decisions.
type fixedRouter struct {
	to  int
	log []string
}

func (*fixedRouter) Name() string { return "fixed" }
func (r *fixedRouter) Observe(e *Event) {
	line := fmt.Sprintf("%v %s r%d %v", e.DeliveredAt, e.Kind, e.Replica, e.Blocks)
	if e.Kind == BlockStored {
		line += fmt.Sprintf(" parent=%v/%d before=%d last=%d", e.HasParent, e.Parent, e.TokensBefore, e.LastBlockTokens)
	}
	r.log = append(r.log, line)
}
func (r *fixedRouter) Route(q *workload.Request, v *View) int {
	r.log = append(r.log, fmt.Sprintf("%v route %d waiting=%d running=%d pending=%d active=%d",
		v.Now, q.ID, v.Replicas[r.to].Waiting, v.Replicas[r.to].Running, v.Replicas[r.to].PendingPrefillTokens, v.Replicas[r.to].ActiveBlocks))
	return r.to
}

func simConfig(replicas, cacheBlocks, slots int, lag time.Duration) SimConfig {
	return SimConfig{
		Replicas: replicas, CacheBlocks: cacheBlocks, Slots: slots, Lag: lag, Window: time.Minute,
		Cost: CostModel{PrefillPerToken: 100 * time.Millisecond, DecodePerToken: time.Second},
	}
}

func TestSimulateTTFT(t *testing.T) {
	reqs := []workload.Request{
		req(0, 0, 8, 2, 4, 1, 2),
		req(1, 1000, 12, 1, 4, 1, 2, 3),
	}
	f := func(slots int, wantP50, wantP99 time.Duration) {
		t.Helper()
		res, err := Simulate(reqs, simConfig(1, 0, slots, 0), &fixedRouter{})
		if err != nil {
			t.Fatal(err)
		}
		if res.TTFTP50 != wantP50 || res.TTFTP99 != wantP99 {
			t.Fatalf("slots %d: TTFT p50 %v p99 %v, want %v and %v", slots, res.TTFTP50, res.TTFTP99, wantP50, wantP99)
		}
		want := Hits{Requests: 2, Blocks: 5, HitBlocks: 2, Tokens: 20, HitTokens: 8}
		if res.Hits != want {
			t.Fatalf("slots %d: hits %+v, want %+v", slots, res.Hits, want)
		}
	}
	// One slot: request 0 prefills 8 tokens (0.8 s) and decodes 2 s, so
	// request 1 (arrived at 1 s) starts at 2.8 s, hits 2 blocks and
	// prefills 4 tokens: TTFT 2.8 + 0.4 - 1 = 2.2 s.
	f(1, 800*time.Millisecond, 2200*time.Millisecond)
	// Two slots: request 1 starts on arrival (prefill idle since 0.8 s).
	f(2, 400*time.Millisecond, 800*time.Millisecond)
}

func TestSimulateEventsAndLag(t *testing.T) {
	reqs := []workload.Request{
		req(0, 0, 6, 1, 4, 1, 2),       // prefill 0.6 s, decode 1 s; last block holds 2 tokens
		req(1, 700, 8, 0, 4, 1, 2),     // routed before the 800 ms delivery
		req(2, 5000, 4, 0, 4, 3),       // evicts 1 (capacity 2)
		req(3, 6000, 9, 0, 4, 3, 7, 8), // hits 3, then evicts 2 and 3
	}
	cfg := simConfig(1, 2, 1, 200*time.Millisecond)
	cfg.Clears = []Clear{{Replica: 0, At: 20 * time.Second}}
	r := &fixedRouter{}
	res, err := Simulate(reqs, cfg, r)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"0s route 0 waiting=0 running=0 pending=0 active=0",
		// Request 0 is decoding: no pending prefill, its 2 blocks active.
		"700ms route 1 waiting=0 running=1 pending=0 active=2",
		// Request 0 stores [1 2] at 600 ms; delivered 200 ms later.
		"800ms stored r0 [1 2] parent=false/0 before=0 last=2",
		// Request 1 starts at 1.6 s, hits both blocks, stores nothing.
		"5s route 2 waiting=0 running=0 pending=0 active=0",
		// Request 2 evicts 1 at 5 s and stores [3] at 5.4 s.
		"5.2s removed r0 [1]",
		"5.6s stored r0 [3] parent=false/0 before=0 last=4",
		"6s route 3 waiting=0 running=0 pending=0 active=0",
		// Request 3 [3 7 8] on a 2-block cache: 7 evicts 2, 8 evicts 3 (its
		// own head, cached before); [7 8] are stored after parent 3.
		"6.2s removed r0 [2 3]",
		"6.7s stored r0 [7 8] parent=true/3 before=4 last=1",
		"20.2s cleared r0 []",
	}
	if !slices.Equal(r.log, want) {
		t.Fatalf("router saw:\n%s\nwant:\n%s", strings.Join(r.log, "\n"), strings.Join(want, "\n"))
	}
	if res.Events != 6 {
		t.Fatalf("%d events delivered, want 6", res.Events)
	}
}

// TestSimulateClearDuringPrefill checks that blocks stored by a prefill
// that a clear interrupted are never announced after the AllCleared.
func TestSimulateClearDuringPrefill(t *testing.T) {
	reqs := []workload.Request{req(0, 0, 8, 0, 4, 1, 2)}
	cfg := simConfig(1, 0, 1, 0)
	cfg.Clears = []Clear{{Replica: 0, At: 500 * time.Millisecond}}
	r := &fixedRouter{}
	if _, err := Simulate(reqs, cfg, r); err != nil {
		t.Fatal(err)
	}
	want := []string{"0s route 0 waiting=0 running=0 pending=0 active=0", "500ms cleared r0 []"}
	if !slices.Equal(r.log, want) {
		t.Fatalf("router saw %q, want %q", r.log, want)
	}
}

// TestLagHidesFreshBlocks shows the router's view lagging the caches: the
// same prompt arriving after its first copy's prefill follows it to replica
// 0 when events are prompt, and goes elsewhere (least loaded) when they are
// late.
func TestLagHidesFreshBlocks(t *testing.T) {
	reqs := []workload.Request{
		req(0, 0, 8, 5, 4, 1, 2),
		req(1, 1000, 8, 5, 4, 1, 2),
	}
	f := func(lag time.Duration, want []int) {
		t.Helper()
		res, err := Simulate(reqs, simConfig(2, 0, 4, lag), LongestPrefixPolicy().New(2, 1))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.RequestsPerReplica, want) {
			t.Fatalf("lag %v: requests per replica %v, want %v", lag, res.RequestsPerReplica, want)
		}
	}
	f(0, []int{2, 0})
	f(10*time.Second, []int{1, 1})
}

type badRouter struct{}

func (badRouter) Name() string                       { return "bad" }
func (badRouter) Observe(*Event)                     {}
func (badRouter) Route(*workload.Request, *View) int { return 5 }

func TestSimulateErrors(t *testing.T) {
	reqs := []workload.Request{req(0, 0, 8, 0, 4, 1, 2)}
	if _, err := Simulate(reqs, simConfig(2, 0, 1, 0), badRouter{}); err == nil || !strings.Contains(err.Error(), "replica 5") {
		t.Fatalf("out-of-range route: %v", err)
	}
	bad := []SimConfig{
		simConfig(0, 0, 1, 0),
		simConfig(MaxReplicas+1, 0, 1, 0),
		simConfig(1, -1, 1, 0),
		simConfig(1, 0, 0, 0),
		simConfig(1, 0, 1, -time.Second),
		{Replicas: 1, Slots: 1},
		{Replicas: 1, Slots: 1, Window: time.Second, Clears: []Clear{{Replica: 1}}},
	}
	for i, c := range bad {
		if _, err := Simulate(reqs, c, &fixedRouter{}); !errors.Is(err, ErrConfig) {
			t.Fatalf("config %d: %v, want ErrConfig", i, err)
		}
	}
	unsorted := []workload.Request{req(0, 10, 8, 0, 4, 1, 2), req(1, 0, 8, 0, 4, 1, 2)}
	if _, err := Simulate(unsorted, simConfig(1, 0, 1, 0), &fixedRouter{}); !errors.Is(err, workload.ErrInvalid) {
		t.Fatalf("unsorted stream: %v", err)
	}
}

func TestImbalance(t *testing.T) {
	// Two replicas; round-robin puts request 0 (8 tokens) on replica 0 and
	// request 1 (4 tokens) on replica 1 in window 0; window 1 gets one
	// request on replica 0 only. Imbalances: 8/6 and 2.
	reqs := []workload.Request{
		req(0, 0, 8, 0, 4, 1, 2),
		req(1, 10, 4, 0, 4, 3),
		req(2, 61000, 4, 0, 4, 4),
	}
	res, err := Simulate(reqs, simConfig(2, 0, 1, 0), RoundRobinPolicy().New(2, 1))
	if err != nil {
		t.Fatal(err)
	}
	if want := (8.0/6 + 2) / 2; math.Abs(res.ImbalanceMean-want) > 1e-12 || res.ImbalanceMax != 2 {
		t.Fatalf("imbalance mean %v max %v, want %v and 2", res.ImbalanceMean, res.ImbalanceMax, want)
	}
}

func TestPercentile(t *testing.T) {
	d := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want int }{{50, 5}, {99, 10}, {10, 1}, {11, 2}, {100, 10}} {
		if got := percentile(d, c.p); got != time.Duration(c.want) {
			t.Fatalf("p%d = %v, want %v", c.p, got, c.want)
		}
	}
	if percentile(nil, 50) != 0 {
		t.Fatal("percentile of nothing is not 0")
	}
}

// finishRouter is fixedRouter that also records request ends.
type finishRouter struct{ fixedRouter }

func (r *finishRouter) Finished(q *workload.Request, replica int, now time.Duration) {
	r.log = append(r.log, fmt.Sprintf("%v finished %d r%d", now, q.ID, replica))
}

// TestSimulateFinisher: a router that implements Finisher hears each
// request's end (its decode's), once, on the replica it was routed to.
func TestSimulateFinisher(t *testing.T) {
	reqs := []workload.Request{
		req(0, 0, 8, 2, 4, 1, 2),
		req(1, 1000, 12, 1, 4, 1, 2, 3),
	}
	r := &finishRouter{}
	if _, err := Simulate(reqs, simConfig(1, 0, 1, 0), r); err != nil {
		t.Fatal(err)
	}
	var ends []string
	for _, l := range r.log {
		if strings.Contains(l, "finished") {
			ends = append(ends, l)
		}
	}
	// Request 0: prefill 0.8 s, decode 2 s. Request 1 starts when the one
	// slot frees at 2.8 s: prefill 0.4 s (2 blocks hit), decode 1 s.
	if want := []string{"2.8s finished 0 r0", "4.2s finished 1 r0"}; !slices.Equal(ends, want) {
		t.Fatalf("ends %q, want %q", ends, want)
	}
}

// TestPickerRowInFlight: the picker row tells the server each request's
// start and end, so between load reports the server's picture of its own
// requests is exact: the live counts sum to the requests routed and not yet
// ended after every routing decision, and to zero once all have ended.
func TestPickerRowInFlight(t *testing.T) {
	cfg := chatConfig(t)
	pol := EnginePolicyWith("picker", EngineOptions{Refresh: DefaultRefresh, Picker: true})
	pr := pol.New(cfg.Replicas, cfg.Seed).(*pickerRouter)
	c := &liveChecker{t: t, pickerRouter: pr}
	sc := SimConfig{Replicas: cfg.Replicas, CacheBlocks: cfg.CacheBlocks[0], Lag: cfg.Lag, Slots: cfg.Slots, Cost: cfg.Cost, Window: cfg.Window}
	if _, err := Simulate(cfg.Requests, sc, c); err != nil {
		t.Fatal(err)
	}
	if c.checked < len(cfg.Requests)/2 {
		t.Fatalf("checked %d of %d decisions", c.checked, len(cfg.Requests))
	}
	if c.open != 0 {
		t.Fatalf("%d requests never ended", c.open)
	}
	if live, _ := c.live(); live != 0 {
		t.Fatalf("live counts sum to %d after every request ended", live)
	}
}

// liveChecker wraps the picker row, counting what it started and saw end
// and comparing the engine's live counts with it after every decision.
type liveChecker struct {
	*pickerRouter
	t       *testing.T
	open    int
	checked int
}

func (c *liveChecker) live() (sum int64, listed int) {
	c.eng.Loads(c.micros(), func(v engine.LoadView) {
		sum += v.Live
		listed++
		if v.InFlight < float64(v.Live) {
			c.t.Fatalf("%s: in flight %v below the live count %d", v.Replica, v.InFlight, v.Live)
		}
	})
	return sum, listed
}

func (c *liveChecker) Route(q *workload.Request, v *View) int {
	i := c.pickerRouter.Route(q, v)
	c.open++
	// Once every replica has reported, the engine lists them all.
	if sum, listed := c.live(); listed == len(v.Replicas) {
		if sum != int64(c.open) {
			c.t.Fatalf("at %v: live counts sum to %d, %d requests in flight", v.Now, sum, c.open)
		}
		c.checked++
	}
	return i
}

func (c *liveChecker) Finished(q *workload.Request, replica int, now time.Duration) {
	c.pickerRouter.Finished(q, replica, now)
	c.open--
}

// TestSimModelEngine pins each part of EngineSimModel against the legacy
// model on hand-computed cases.
func TestSimModelEngine(t *testing.T) {
	run := func(m SimModel, cacheBlocks, slots int, reqs []workload.Request) Result {
		t.Helper()
		cfg := simConfig(1, cacheBlocks, slots, 0)
		cfg.Model = m
		res, err := Simulate(reqs, cfg, &fixedRouter{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	t.Run("partial last block", func(t *testing.T) {
		// 6 tokens in blocks of 4: block 2 is partial.
		reqs := []workload.Request{req(0, 0, 6, 0, 4, 1, 2), req(1, 10_000, 6, 0, 4, 1, 2)}
		if got := run(LegacySimModel(), 0, 1, reqs).HitBlocks; got != 2 {
			t.Fatalf("legacy: %d hit blocks, want 2 (the partial block is cached)", got)
		}
		if got := run(SimModel{FullBlocksOnly: true}, 0, 1, reqs).HitBlocks; got != 1 {
			t.Fatalf("full blocks only: %d hit blocks, want 1", got)
		}
		if h := PooledHitsModel(reqs, 0, SimModel{FullBlocksOnly: true}); h.HitBlocks != 1 || h.Blocks != 4 {
			t.Fatalf("pooled, full blocks only: %+v, want 1 of 4 blocks hit", h)
		}
	})
	t.Run("tail first free", func(t *testing.T) {
		// A = [1 2] finishes; B and C insert one block each into a
		// 3-block cache, so C evicts one of A's. Legacy evicts A's head
		// (inserted first), tail-first freeing evicts A's tail, so D = A's
		// chain hits its first block.
		reqs := []workload.Request{
			req(0, 0, 8, 0, 4, 1, 2), req(1, 10_000, 4, 0, 4, 3),
			req(2, 20_000, 4, 0, 4, 4), req(3, 30_000, 8, 0, 4, 1, 2),
		}
		if got := run(LegacySimModel(), 3, 1, reqs).HitBlocks; got != 0 {
			t.Fatalf("legacy: %d hit blocks, want 0", got)
		}
		if got := run(SimModel{TailFirstFree: true}, 3, 1, reqs).HitBlocks; got != 1 {
			t.Fatalf("tail first free: %d hit blocks, want 1", got)
		}
	})
	t.Run("decode interference", func(t *testing.T) {
		// Request 0 decodes for 100 s; request 1 (8 tokens at 100 ms)
		// prefills while it runs: 0.8 s × (1 + 0.5 × 1 decode) = 1.2 s.
		reqs := []workload.Request{req(0, 0, 4, 100, 4, 1), req(1, 1000, 8, 0, 4, 2, 3)}
		res := run(SimModel{DecodeInterference: 0.5}, 0, 2, reqs)
		if res.TTFTP99 != 1200*time.Millisecond {
			t.Fatalf("TTFT p99 %v, want 1.2s", res.TTFTP99)
		}
		if res := run(LegacySimModel(), 0, 2, reqs); res.TTFTP99 != 800*time.Millisecond {
			t.Fatalf("legacy TTFT p99 %v, want 800ms", res.TTFTP99)
		}
	})
	if _, err := ParseSimModel("gpu"); !errors.Is(err, ErrConfig) {
		t.Fatalf("ParseSimModel(gpu) = %v, want ErrConfig", err)
	}
	if m, err := ParseSimModel("engine"); err != nil || m != EngineSimModel() {
		t.Fatalf("ParseSimModel(engine) = %v, %v", m, err)
	}
}
