package kvevents

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// newEngine starts a fake engine (replay on, ring of ringSize batches) on
// loopback; ep, when set, are the PUB and replay endpoints to bind (an
// engine restarting in place).
func newEngine(t *testing.T, ringSize int, ep ...string) *fakeengine.Publisher {
	t.Helper()
	cfg := fakeengine.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv-events",
		RingSize: ringSize, Encoding: fakeengine.Encoding{Layout: fakeengine.LayoutArray}}
	if len(ep) == 2 {
		cfg.Endpoint, cfg.ReplayEndpoint = ep[0], ep[1]
	}
	pub, err := fakeengine.NewPublisher(cfg)
	if err != nil {
		if len(ep) == 2 {
			t.Skipf("cannot rebind the engine's endpoints: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// runningSub is a subscriber started by runSub.
type runningSub struct {
	*Subscriber
	sink *recSink
	stop func() // cancels Run and waits for it (state written)
}

// runSub runs a subscriber following pub into a fresh recSink until stop
// or the test's end, and waits for its first connect sync.
func runSub(t *testing.T, pub *fakeengine.Publisher, mut func(*Config)) *runningSub {
	t.Helper()
	cfg := Config{
		ReplicaID: "r1", ModelID: "m", TenantID: "t", HashScheme: "vllm",
		Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Topic: "kv-events",
		Window: 10 * time.Millisecond, MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		ReconnectBackoff: 50 * time.Millisecond, ReplayTimeout: 2 * time.Second, Heartbeat: -1,
		StateInterval: 20 * time.Millisecond, Registerer: prometheus.NewRegistry(),
	}
	if mut != nil {
		mut(&cfg)
	}
	r := &runningSub{sink: &recSink{}}
	sub, err := New(cfg, r.sink)
	if err != nil {
		t.Fatal(err)
	}
	r.Subscriber = sub
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	stopped := false
	r.stop = func() {
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
	t.Cleanup(r.stop)
	wctx := testCtx(t, 10*time.Second)
	if err := pub.WaitSubscribed(wctx); err != nil {
		t.Fatal(err)
	}
	for sub.connects.Load() == 0 {
		if !sleepCtx(wctx, time.Millisecond) {
			t.Fatal("no connect sync within 10 s")
		}
	}
	return r
}

// settle waits until the subscriber applied every batch below n and
// delivered everything.
func (r *runningSub) settle(t *testing.T, n uint64) {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	for r.NextSeq() < n {
		if !sleepCtx(ctx, 2*time.Millisecond) {
			t.Fatalf("applied up to %d, want %d", r.NextSeq(), n)
		}
	}
	if err := r.Forwarder().Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func (r *runningSub) clears() int {
	r.sink.mu.Lock()
	defer r.sink.mu.Unlock()
	n := 0
	for _, e := range r.sink.events {
		if e.Type == icv1.CacheEvent_ALL_CLEARED {
			n++
		}
	}
	return n
}

// checkMatches: the positional index holds what the engine holds, and the
// recorded server state equals the index.
func checkMatches(t *testing.T, r *runningSub, w *fakeengine.Synthetic) {
	t.Helper()
	if got, want := r.Index().Len(), w.CachedBlocks(); got != want {
		t.Fatalf("index holds %d blocks, the engine %d", got, want)
	}
	if server, index := serverModel(r.sink), indexModel(r.Index()); !maps.Equal(server, index) {
		t.Fatalf("server state (%d keys) != positional index (%d keys)", len(server), len(index))
	}
}

// TestSubscriberSyncsFromOldestOnStart: an engine that published before
// any subscriber listened (then went idle) is synced at connect: the
// replay from the oldest buffered batch rebuilds the index, which is
// reported; nothing is cleared.
func TestSubscriberSyncsFromOldestOnStart(t *testing.T) {
	pub := newEngine(t, 1000)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 6, CapacityBlocks: 80, Seed: 21})
	last := publishN(t, pub, w, 60) // nobody listens: only the ring keeps them
	r := runSub(t, pub, nil)
	r.settle(t, last+1)
	checkMatches(t, r, w)
	if r.clears() != 0 {
		t.Fatal("ALL_CLEARED on a subscriber start")
	}
	if n := counter(t, r.metrics.rereports.WithLabelValues(RereportSync)); n != 1 {
		t.Fatalf("rereports{sync} = %v", n)
	}
}

// TestSubscriberStateFileContinues: the state file carries the index
// across a subscriber restart; batches published while it was down come
// from the replay. The ring (30) is far shorter than the history (100), so
// replay alone could not rebuild the index.
func TestSubscriberStateFileContinues(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	withState := func(c *Config) { c.StateFile = path }
	pub := newEngine(t, 30)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 6, CapacityBlocks: 200, Seed: 22})
	r1 := runSub(t, pub, withState)
	last := publishN(t, pub, w, 80)
	r1.settle(t, last+1)
	r1.stop() // writes the state file
	if counter(t, r1.metrics.stateSaves.WithLabelValues("ok")) == 0 {
		t.Fatal("no state saved")
	}
	last = publishN(t, pub, w, 20) // while no subscriber runs

	r2 := runSub(t, pub, withState)
	r2.settle(t, last+1)
	checkMatches(t, r2, w)
	if r2.clears() != 0 {
		t.Fatal("ALL_CLEARED after a subscriber restart")
	}
	if n := counter(t, r2.metrics.stateLoads.WithLabelValues("ok")); n != 1 {
		t.Fatalf("state_loads{ok} = %v", n)
	}
	// New batches chain on blocks stored before the restart.
	last = publishN(t, pub, w, 20)
	r2.settle(t, last+1)
	checkMatches(t, r2, w)
	if n := counter(t, r2.metrics.eventsDropped.WithLabelValues(DropUnknownParent)); n != 0 {
		t.Fatalf("%v events dropped as unknown_parent", n)
	}
}

// TestSubscriberStateFileEngineRestarted: the engine restarted while the
// subscriber was down. Either its numbering is below the saved one (the
// replay has no batch there) or it published as many batches (the batch
// under the saved number is another one): the replica is cleared and
// rebuilt from the new engine.
func TestSubscriberStateFileEngineRestarted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		turns int
	}{{"sequence behind", 10}, {"other batch at the saved number", 50}} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state")
			withState := func(c *Config) { c.StateFile = path }
			pub := newEngine(t, 1000)
			w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 6, CapacityBlocks: 200, Seed: 23})
			r1 := runSub(t, pub, withState)
			last := publishN(t, pub, w, 30)
			r1.settle(t, last+1)
			r1.stop()

			ep, rep := pub.Endpoint(), pub.ReplayEndpoint()
			_ = pub.Close()
			pub2 := newEngine(t, 1000, ep, rep)
			w2 := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 3, CapacityBlocks: 200, Seed: 99})
			last = publishN(t, pub2, w2, tc.turns)

			r2 := runSub(t, pub2, withState)
			r2.settle(t, last+1)
			checkMatches(t, r2, w2)
			if r2.clears() != 1 || counter(t, r2.metrics.restarts) != 1 {
				t.Fatalf("ALL_CLEARED %d, engine restarts %v: want 1 and 1", r2.clears(), counter(t, r2.metrics.restarts))
			}
		})
	}
}

// TestSubscriberStateFileBehindRing: while the subscriber was down the
// engine published more than its ring keeps: the replay proves the saved
// state cannot be caught up (batches after it are gone), so the replica is
// cleared and rebuilt from what the ring still has.
func TestSubscriberStateFileBehindRing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	withState := func(c *Config) { c.StateFile = path }
	pub := newEngine(t, 20)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 4, CapacityBlocks: 400, Seed: 24})
	r1 := runSub(t, pub, withState)
	last := publishN(t, pub, w, 10)
	r1.settle(t, last+1)
	r1.stop()
	last = publishN(t, pub, w, 40) // the ring now starts at 30

	r2 := runSub(t, pub, withState)
	r2.settle(t, last+1)
	if r2.clears() != 1 || counter(t, r2.metrics.replays.WithLabelValues(ReplayIncomplete)) != 1 {
		t.Fatalf("ALL_CLEARED %d, replays{incomplete} %v: want 1 and 1", r2.clears(),
			counter(t, r2.metrics.replays.WithLabelValues(ReplayIncomplete)))
	}
	// What the ring's batches chain from before it is lost (here all of
	// it: 4 long conversations); server and index agree.
	if server, index := serverModel(r2.sink), indexModel(r2.Index()); !maps.Equal(server, index) {
		t.Fatalf("server state (%d keys) != positional index (%d keys)", len(server), len(index))
	}
}

// TestSubscriberStateFileIgnored: a corrupt, truncated or foreign state
// file is logged, counted and ignored: the subscriber starts without
// history and rebuilds from the engine's oldest batch.
func TestSubscriberStateFileIgnored(t *testing.T) {
	good := encodeState(t, &State{ReplicaID: "r1", TenantID: "t", ModelID: "m", HashScheme: "vllm", BlockSize: 16,
		Started: true, Next: 5, Entries: []StateEntry{{Engine: 1, Key: 2, Tokens: 16, Media: mediaGPU}}})
	other := encodeState(t, &State{ReplicaID: "someone-else", TenantID: "t", ModelID: "m", HashScheme: "vllm", BlockSize: 16,
		Started: true, Next: 5, Entries: []StateEntry{{Engine: 1, Key: 2, Tokens: 16, Media: mediaGPU}}})
	for _, tc := range []struct {
		name, result string
		data         []byte
	}{
		{"corrupt", "invalid", func() []byte { b := append([]byte(nil), good...); b[30] ^= 0xff; return b }()},
		{"truncated", "invalid", good[:len(good)-3]},
		{"foreign", "foreign", other},
		{"directory", "error", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state")
			if tc.data == nil {
				if err := os.Mkdir(path, 0o755); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			pub := newEngine(t, 1000)
			w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 4, CapacityBlocks: 100, Seed: 25})
			last := publishN(t, pub, w, 20)
			r := runSub(t, pub, func(c *Config) { c.StateFile = path; c.BlockSize = 16 })
			r.settle(t, last+1)
			checkMatches(t, r, w)
			if n := counter(t, r.metrics.stateLoads.WithLabelValues(tc.result)); n != 1 {
				t.Fatalf("state_loads{%s} = %v", tc.result, n)
			}
		})
	}
}

// TestSubscriberEngineRestartWhileConnected: the engine restarts in place
// and publishes its whole (new) workload before the subscriber reconnects,
// then idles. The sync at reconnect finds the sequence went back: the
// replica is cleared and rebuilt from the new engine's ring.
func TestSubscriberEngineRestartWhileConnected(t *testing.T) {
	pub := newEngine(t, 1000)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 4, CapacityBlocks: 200, Seed: 26})
	r := runSub(t, pub, func(c *Config) { c.ReconnectBackoff = 300 * time.Millisecond })
	last := publishN(t, pub, w, 30)
	r.settle(t, last+1)

	ep, rep := pub.Endpoint(), pub.ReplayEndpoint()
	_ = pub.Close()
	pub2 := newEngine(t, 1000, ep, rep)
	w2 := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 3, CapacityBlocks: 200, Seed: 98})
	publishN(t, pub2, w2, 12) // before the subscriber is back: only the ring keeps them
	ctx := testCtx(t, 10*time.Second)
	for r.connects.Load() < 2 {
		if !sleepCtx(ctx, 2*time.Millisecond) {
			t.Fatal("no reconnect")
		}
	}
	if err := r.Forwarder().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	checkMatches(t, r, w2)
	if r.clears() != 1 || counter(t, r.metrics.restarts) != 1 {
		t.Fatalf("ALL_CLEARED %d, engine restarts %v", r.clears(), counter(t, r.metrics.restarts))
	}
}

// TestSubscriberUnknownParentRecovers: the connect sync failed (the replay
// endpoint did not answer), so the index's history starts at the first live
// batch. A BlockStored chained on an older block triggers a replay from the
// oldest batch, which rebuilds the index before the event would be dropped.
// Once the ring no longer reaches further back, an unknown parent is
// dropped and counted.
func TestSubscriberUnknownParentRecovers(t *testing.T) {
	pub := newEngine(t, 1000)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 3, CapacityBlocks: 400, Seed: 27})
	publishN(t, pub, w, 15) // before the subscriber
	pub.PauseReplay(true)
	r := runSub(t, pub, func(c *Config) { c.ReplayTimeout = 300 * time.Millisecond; c.RecoveryInterval = time.Millisecond })
	if n := counter(t, r.metrics.replays.WithLabelValues(ReplayTimeout)); n != 1 {
		t.Fatalf("connect sync: replays{timeout} = %v", n)
	}
	pub.PauseReplay(false)
	last := publishN(t, pub, w, 15)
	r.settle(t, last+1)
	checkMatches(t, r, w)
	m := r.metrics
	if counter(t, m.recoveries.WithLabelValues("adopted")) != 1 || counter(t, m.eventsDropped.WithLabelValues(DropUnknownParent)) != 0 || r.clears() != 0 {
		t.Fatalf("recoveries{adopted} %v, unknown_parent drops %v, ALL_CLEARED %d",
			counter(t, m.recoveries.WithLabelValues("adopted")), counter(t, m.eventsDropped.WithLabelValues(DropUnknownParent)), r.clears())
	}

	// A second subscriber that started late, when the ring no longer
	// reaches back: the recovery finds nothing older; the event is dropped
	// and counted.
	pub.ForgetRing()
	pub.PauseReplay(true)
	r2 := runSub(t, pub, func(c *Config) { c.ReplayTimeout = 300 * time.Millisecond; c.RecoveryInterval = time.Millisecond })
	pub.PauseReplay(false)
	// Root batches first, so the history starts after the ring's start.
	root := fakeengine.Batch{TS: 1, Events: []fakeengine.Event{{Kind: fakeengine.BlockStored, BlockHashes: []uint64{1 << 62},
		TokenIDs: toks(16, 5), BlockSize: 16}}}
	if _, err := pub.Publish(root); err != nil {
		t.Fatal(err)
	}
	last = publishN(t, pub, w, 5) // chained on blocks stored before r2 and before the ring
	r2.settle(t, last+1)
	m2 := r2.metrics
	if counter(t, m2.recoveries.WithLabelValues("no_further")) != 1 || counter(t, m2.eventsDropped.WithLabelValues(DropUnknownParent)) == 0 {
		t.Fatalf("recoveries{no_further} %v, unknown_parent drops %v",
			counter(t, m2.recoveries.WithLabelValues("no_further")), counter(t, m2.eventsDropped.WithLabelValues(DropUnknownParent)))
	}
}

// TestSubscriberStateWriteRetried: a failed state write (its directory is
// missing) is counted and retried at the next tick, even when nothing
// changed since.
func TestSubscriberStateWriteRetried(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "later")
	path := filepath.Join(dir, "state")
	pub := newEngine(t, 100)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 2, CapacityBlocks: 100, Seed: 28})
	r := runSub(t, pub, func(c *Config) { c.StateFile = path })
	last := publishN(t, pub, w, 5)
	r.settle(t, last+1)
	ctx := testCtx(t, 10*time.Second)
	for counter(t, r.metrics.stateSaves.WithLabelValues("error")) == 0 {
		if !sleepCtx(ctx, 5*time.Millisecond) {
			t.Fatal("no failed state write")
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for {
		if st, err := ReadStateFile(path, 0); err == nil {
			if st.Next != last+1 || len(st.Entries) != r.Index().Len() {
				t.Fatalf("state next %d with %d entries, want %d with %d", st.Next, len(st.Entries), last+1, r.Index().Len())
			}
			return
		}
		if !sleepCtx(ctx, 5*time.Millisecond) {
			t.Fatal("the failed write was not retried")
		}
	}
}
