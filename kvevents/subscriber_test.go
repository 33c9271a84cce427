package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// serverModel replays recorded sink calls the way the server would apply
// them to one replica: key → tier.
func serverModel(s *recSink) map[string]icv1.CacheTier {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := map[string]icv1.CacheTier{}
	ui, ei := 0, 0
	for _, c := range s.calls {
		switch {
		case len(c) >= 6 && c[:6] == "report":
			for _, p := range s.updates[ui].Prefixes {
				held[fmt.Sprintf("%x/%s", binary.BigEndian.Uint64(p.PrefixHash), p.AdapterId)] = p.Tier
			}
			ui++
		case len(c) >= 5 && c[:5] == "stats":
			ui++
		default:
			e := s.events[ei]
			ei++
			switch e.Type {
			case icv1.CacheEvent_ALL_CLEARED:
				clear(held)
			case icv1.CacheEvent_PREFIX_EVICTED:
				delete(held, fmt.Sprintf("%x/%s", binary.BigEndian.Uint64(e.PrefixHash), e.AdapterId))
			}
		}
	}
	return held
}

func indexModel(x *Index) map[string]icv1.CacheTier {
	out := map[string]icv1.CacheTier{}
	for _, p := range x.AppendSnapshot(nil) {
		out[fmt.Sprintf("%x/%s", p.Key, p.Adapter)] = icv1.CacheTier(p.Tier)
	}
	return out
}

type zmqFixture struct {
	pub  *fakeengine.Publisher
	sub  *Subscriber
	sink *recSink
	reg  *prometheus.Registry
	stop func()
}

func startZMQ(t *testing.T, enc fakeengine.Encoding, replay bool, cfgMut func(*Config)) *zmqFixture {
	t.Helper()
	return startZMQWith(t, fakeengine.Config{Encoding: enc}, replay, cfgMut)
}

// startZMQWith starts a fake engine on loopback (pcfg's endpoints are
// overwritten) and a subscriber following it.
func startZMQWith(t *testing.T, pcfg fakeengine.Config, replay bool, cfgMut func(*Config)) *zmqFixture {
	t.Helper()
	return startZMQSink(t, pcfg, replay, cfgMut, nil)
}

// startZMQSink is startZMQWith delivering to sink; nil records into
// zmqFixture.sink.
func startZMQSink(t testing.TB, pcfg fakeengine.Config, replay bool, cfgMut func(*Config), sink Sink) *zmqFixture {
	t.Helper()
	pcfg.Endpoint, pcfg.Topic = "tcp://127.0.0.1:0", "kv-events"
	if replay {
		pcfg.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	pub, err := fakeengine.NewPublisher(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })

	rec := &recSink{}
	if sink == nil {
		sink = rec
	}
	reg := prometheus.NewRegistry()
	cfg := Config{
		ReplicaID: "r1", ModelID: "m", TenantID: "t", HashScheme: "vllm",
		Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Topic: "kv-events",
		LoRAAdapters:     map[int64]string{1: "sql", 2: "chat"},
		Window:           10 * time.Millisecond,
		MinBackoff:       time.Millisecond,
		MaxBackoff:       10 * time.Millisecond,
		ReconnectBackoff: 50 * time.Millisecond,
		ReplayTimeout:    2 * time.Second,
		Heartbeat:        -1, // deterministic call lists; heartbeat_test.go covers it
		Registerer:       reg,
	}
	if cfgMut != nil {
		cfgMut(&cfg)
	}
	sub, err := New(cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	f := &zmqFixture{pub: pub, sub: sub, sink: rec, reg: reg}
	var stopped bool
	f.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return")
		}
	}
	t.Cleanup(f.stop)
	if err := pub.WaitSubscribed(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Batches published from now on arrive live, after the sync the
	// subscriber runs when its SUB socket connects.
	wctx := testCtx(t, 10*time.Second)
	for sub.connects.Load() == 0 {
		if !sleepCtx(wctx, time.Millisecond) {
			t.Fatal("the subscriber did not finish its connect sync within 10 s")
		}
	}
	return f
}

// waitApplied waits until the subscriber applied every sequence number
// below n, then flushes the forwarder.
func (f *zmqFixture) waitApplied(t testing.TB, n uint64) {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	for f.sub.NextSeq() < n {
		if !sleepCtx(ctx, 2*time.Millisecond) {
			t.Fatalf("applied up to %d, want %d", f.sub.NextSeq(), n)
		}
	}
	if err := f.sub.Forwarder().Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func publishN(t *testing.T, pub *fakeengine.Publisher, w fakeengine.Workload, n int) uint64 {
	t.Helper()
	var last uint64
	for range n {
		b, _, ok := w.Next()
		if !ok {
			t.Fatal("workload exhausted")
		}
		seq, err := pub.Publish(b)
		if err != nil {
			t.Fatal(err)
		}
		last = seq
	}
	return last
}

func counter(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

func TestSubscriberOverZMQ(t *testing.T) {
	for _, enc := range []fakeengine.Encoding{
		{Layout: fakeengine.LayoutArray},
		{Layout: fakeengine.LayoutMap, HashBytes: true, MapBatch: true},
	} {
		t.Run(fmt.Sprintf("%s/bytes=%v/mapbatch=%v", enc.Layout, enc.HashBytes, enc.MapBatch), func(t *testing.T) {
			f := startZMQ(t, enc, true, nil)
			w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 8, CapacityBlocks: 64, LoRAIDs: []int64{1, 2}, Seed: 7})
			last := publishN(t, f.pub, w, 150)
			f.waitApplied(t, last+1)

			if got, want := f.sub.Index().Len(), w.CachedBlocks(); got != want {
				t.Fatalf("index holds %d blocks, the engine %d", got, want)
			}
			server, index := serverModel(f.sink), indexModel(f.sub.Index())
			if !maps.Equal(server, index) {
				t.Fatalf("server state (%d keys) != positional index (%d keys)", len(server), len(index))
			}
			// A fresh start does not clear the replica on the server.
			for _, e := range f.sink.events {
				if e.Type == icv1.CacheEvent_ALL_CLEARED {
					t.Fatal("ALL_CLEARED sent by a subscriber whose engine did not restart")
				}
			}
			m := f.sub.metrics
			if counter(t, m.eventsDecoded.WithLabelValues("BlockStored")) != 150 ||
				counter(t, m.eventsDecoded.WithLabelValues("BlockRemoved")) == 0 ||
				counter(t, m.gaps) != 0 {
				t.Fatal("unexpected metrics")
			}
		})
	}
}

func TestSubscriberGapRepairedByReplay(t *testing.T) {
	f := startZMQ(t, fakeengine.Encoding{Layout: fakeengine.LayoutMap}, true, nil)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 4, CapacityBlocks: 48, Seed: 3})
	publishN(t, f.pub, w, 20)
	f.pub.Drop(5) // seq 20..24 never reach the SUB socket
	last := publishN(t, f.pub, w, 30)
	f.waitApplied(t, last+1)

	m := f.sub.metrics
	// Two replays: the sync when the SUB socket connected, and the gap.
	if counter(t, m.gaps) != 1 || counter(t, m.replays.WithLabelValues(ReplayOK)) != 2 {
		t.Fatalf("gaps %v replays ok %v", counter(t, m.gaps), counter(t, m.replays.WithLabelValues(ReplayOK)))
	}
	if got, want := f.sub.Index().Len(), w.CachedBlocks(); got != want {
		t.Fatalf("index holds %d blocks, the engine %d", got, want)
	}
	if server, index := serverModel(f.sink), indexModel(f.sub.Index()); !maps.Equal(server, index) {
		t.Fatalf("server state (%d keys) != positional index (%d keys)", len(server), len(index))
	}
	clears := 0
	for _, e := range f.sink.events {
		if e.Type == icv1.CacheEvent_ALL_CLEARED {
			clears++
		}
	}
	if clears != 0 {
		t.Fatalf("%d ALL_CLEARED, want none", clears)
	}
}

// TestSubscriberReplayCoveredThenStalled: a replay that delivered every
// missing batch but never sent its end marker (so it timed out) repaired
// the gap; the replica keeps its state.
func TestSubscriberReplayCoveredThenStalled(t *testing.T) {
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 4, CapacityBlocks: 48, Seed: 3})
	f := startZMQWith(t, fakeengine.Config{Encoding: fakeengine.Encoding{Layout: fakeengine.LayoutMap}, ReplayNoEnd: true}, true,
		func(c *Config) { c.ReplayTimeout = 300 * time.Millisecond })
	publishN(t, f.pub, w, 20)
	f.pub.Drop(5)
	last := publishN(t, f.pub, w, 30)
	f.waitApplied(t, last+1)
	m := f.sub.metrics
	// The gap's replay is ok; the sync at connect, whose replay sent no
	// batch and no end marker either, timed out.
	if counter(t, m.replays.WithLabelValues(ReplayOK)) != 1 || counter(t, m.replays.WithLabelValues(ReplayTimeout)) != 1 {
		t.Fatalf("replay outcomes: ok=%v timeout=%v", counter(t, m.replays.WithLabelValues(ReplayOK)), counter(t, m.replays.WithLabelValues(ReplayTimeout)))
	}
	if got, want := f.sub.Index().Len(), w.CachedBlocks(); got != want {
		t.Fatalf("index holds %d blocks, the engine %d", got, want)
	}
	clears := 0
	for _, e := range f.sink.events {
		if e.Type == icv1.CacheEvent_ALL_CLEARED {
			clears++
		}
	}
	if clears != 0 {
		t.Fatalf("%d ALL_CLEARED, want none", clears)
	}
}

func TestSubscriberReorderedMessagesRepaired(t *testing.T) {
	// Every 7th message arrives after the next one: the early arrival opens
	// a gap that replay fills; the late one is then a duplicate.
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 4, CapacityBlocks: 48, Seed: 5})
	g := startZMQWith(t, fakeengine.Config{ReorderEvery: 7}, true, nil)
	last := publishN(t, g.pub, w, 40)
	g.waitApplied(t, last+1)
	if got, want := g.sub.Index().Len(), w.CachedBlocks(); got != want {
		t.Fatalf("index holds %d blocks, the engine %d", got, want)
	}
	if server, index := serverModel(g.sink), indexModel(g.sub.Index()); !maps.Equal(server, index) {
		t.Fatalf("server state (%d keys) != positional index (%d keys)", len(server), len(index))
	}
	if counter(t, g.sub.metrics.replays.WithLabelValues(ReplayOK)) == 0 {
		t.Fatal("no replay")
	}
}

func TestSubscriberUnrepairableGapClearsReplica(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replay  bool
		outcome string
	}{
		{"ring forgotten", true, ReplayIncomplete},
		{"no replay endpoint", false, ReplayUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startZMQ(t, fakeengine.Encoding{Layout: fakeengine.LayoutArray}, tc.replay, nil)
			w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 4, CapacityBlocks: 1000, Seed: 9})
			last := publishN(t, f.pub, w, 10)
			f.waitApplied(t, last+1)
			if f.sub.Index().Len() == 0 {
				t.Fatal("nothing indexed before the gap")
			}
			f.pub.Drop(3)
			publishN(t, f.pub, w, 3)
			f.pub.ForgetRing()
			// The next batch reveals the gap; replay cannot cover it.
			b := fakeengine.Batch{TS: 1, Events: []fakeengine.Event{{
				Kind: fakeengine.BlockStored, BlockHashes: []uint64{1 << 60}, TokenIDs: toks(16, 7), BlockSize: 16}}}
			seq, err := f.pub.Publish(b)
			if err != nil {
				t.Fatal(err)
			}
			f.waitApplied(t, seq+1)

			if got := counter(t, f.sub.metrics.replays.WithLabelValues(tc.outcome)); got != 1 {
				t.Fatalf("replays{%s} = %v", tc.outcome, got)
			}
			// Only the block stored after the gap survives, on both sides.
			if f.sub.Index().Len() != 1 {
				t.Fatalf("index holds %d blocks after the reset", f.sub.Index().Len())
			}
			if server := serverModel(f.sink); len(server) != 1 {
				t.Fatalf("server holds %d keys after the reset", len(server))
			}
			calls := f.sink.snapshot()
			if c := calls[len(calls)-2]; c[:11] != "ALL_CLEARED" {
				t.Fatalf("calls end with %q", calls[len(calls)-2:])
			}
		})
	}
}

func TestSubscriberEngineRestartResets(t *testing.T) {
	f := startZMQ(t, fakeengine.Encoding{Layout: fakeengine.LayoutArray}, true, nil)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 2, CapacityBlocks: 1000, Seed: 1})
	last := publishN(t, f.pub, w, 5)
	f.waitApplied(t, last+1)

	// A new engine process on the same endpoint starts again at seq 0.
	ep := f.pub.Endpoint()
	_ = f.pub.Close()
	pub2, err := fakeengine.NewPublisher(fakeengine.Config{Endpoint: ep, Topic: "kv-events"})
	if err != nil {
		t.Skipf("cannot rebind %s: %v", ep, err)
	}
	t.Cleanup(func() { _ = pub2.Close() })
	if err := pub2.WaitSubscribed(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	b := fakeengine.Batch{TS: 1, Events: []fakeengine.Event{{
		Kind: fakeengine.BlockStored, BlockHashes: []uint64{42}, TokenIDs: toks(16, 3), BlockSize: 16}}}
	if _, err := pub2.Publish(b); err != nil {
		t.Fatal(err)
	}
	// The restart is counted before the replica is cleared and the new
	// batch applied, so wait for the applied state itself: the new process's
	// first batch (seq 0) applied into an emptied index.
	ctx := testCtx(t, 10*time.Second)
	for counter(t, f.sub.metrics.restarts) == 0 || f.sub.NextSeq() != 1 || f.sub.Index().Len() != 1 {
		if !sleepCtx(ctx, 2*time.Millisecond) {
			t.Fatalf("restart not applied: restarts %v next seq %d index %d",
				counter(t, f.sub.metrics.restarts), f.sub.NextSeq(), f.sub.Index().Len())
		}
	}
	if err := f.sub.Forwarder().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if f.sub.Index().Len() != 1 || len(serverModel(f.sink)) != 1 {
		t.Fatalf("index %d server %d", f.sub.Index().Len(), len(serverModel(f.sink)))
	}
	if counter(t, f.sub.metrics.reconnects) == 0 {
		t.Fatal("no reconnect counted")
	}
}
