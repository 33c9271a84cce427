package kvevents

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
)

// TestShutdownDuringGapReplayKeepsReplica: SIGTERM (ctx cancelled) while a
// gap is being repaired through the replay endpoint is not an unrepairable
// gap. The subscriber must not clear the replica (no ALL_CLEARED, no reset
// index in the state file): it leaves the gap to the next start, whose sync
// replays the missing batches from the state file's sequence.
func TestShutdownDuringGapReplayKeepsReplica(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	withState := func(c *Config) { c.StateFile = path; c.ReplayTimeout = time.Minute }
	pub := newEngine(t, 1000)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 4, CapacityBlocks: 200, Seed: 31})
	r1 := runSub(t, pub, withState)
	last := publishN(t, pub, w, 20)
	r1.settle(t, last+1)
	held := r1.Index().Len()

	// The engine stops answering replays; one batch misses the PUB socket,
	// so the next one opens a gap whose replay hangs.
	pub.PauseReplay(true)
	pub.Drop(1)
	last = publishN(t, pub, w, 2)
	ctx := testCtx(t, 10*time.Second)
	for counter(t, r1.metrics.gaps) == 0 {
		if !sleepCtx(ctx, 2*time.Millisecond) {
			t.Fatal("no gap seen")
		}
	}
	r1.stop() // SIGTERM while the gap's replay waits
	if n := r1.clears(); n != 0 {
		t.Fatalf("a shutdown during a gap replay sent ALL_CLEARED %d times", n)
	}
	st, err := ReadStateFile(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Next != last-1 || len(st.Entries) != held {
		t.Fatalf("state file: next %d with %d entries; want the gap left open at %d with the %d blocks held before it",
			st.Next, len(st.Entries), last-1, held)
	}

	// The next start repairs the gap from the replay.
	pub.PauseReplay(false)
	r2 := runSub(t, pub, withState)
	r2.settle(t, last+1)
	checkMatches(t, r2, w)
	if n := r2.clears(); n != 0 {
		t.Fatalf("the next start sent ALL_CLEARED %d times", n)
	}
}

// TestShutdownDuringConnectSyncKeepsState: SIGTERM while the connect sync
// of a restarted subscriber is under way (it applied the batches published
// while it was down, unforwarded, and waits for the replay's end) neither
// clears the replica nor saves the half-synced index: the state file stays
// as saved, and the next start syncs from it again.
func TestShutdownDuringConnectSyncKeepsState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	cfg := fakeengine.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv-events",
		RingSize: 1000, ReplayNoEnd: true} // every replay stalls after its last batch
	pub, err := fakeengine.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	quick := func(c *Config) { c.StateFile = path; c.ReplayTimeout = 300 * time.Millisecond }
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 4, CapacityBlocks: 60, Seed: 32})
	r1 := runSub(t, pub, quick)
	last := publishN(t, pub, w, 40)
	r1.settle(t, last+1)
	r1.stop()
	saved, err := ReadStateFile(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	last = publishN(t, pub, w, 10) // while no subscriber runs

	rec := &recSink{}
	sub, err := New(Config{ReplicaID: "r1", ModelID: "m", TenantID: "t", HashScheme: "vllm",
		Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Topic: "kv-events",
		ReplayTimeout: time.Minute, Heartbeat: -1, StateFile: path, StateInterval: 20 * time.Millisecond,
		Registerer: prometheus.NewRegistry()}, rec)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx) }()
	// The sync applies the 10 batches and then waits for the end marker.
	ctx := testCtx(t, 10*time.Second)
	for counter(t, sub.metrics.batchesDecoded) < 10 {
		if !sleepCtx(ctx, 2*time.Millisecond) {
			t.Fatal("the connect sync did not apply the missed batches")
		}
	}
	cancel() // SIGTERM mid-sync
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	r := &runningSub{Subscriber: sub, sink: rec}
	if n := r.clears(); n != 0 {
		t.Fatalf("a shutdown during the connect sync sent ALL_CLEARED %d times", n)
	}
	st, err := ReadStateFile(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Next != saved.Next || st.LastSum != saved.LastSum || len(st.Entries) != len(saved.Entries) {
		t.Fatalf("state file after an interrupted sync: next %d (%d entries); saved before it: %d (%d entries)",
			st.Next, len(st.Entries), saved.Next, len(saved.Entries))
	}

	// This replay also ends by its timeout (no end marker): give it time
	// to deliver the batches on a loaded machine.
	r2 := runSub(t, pub, func(c *Config) { c.StateFile = path; c.ReplayTimeout = 3 * time.Second })
	r2.settle(t, last+1)
	checkMatches(t, r2, w)
	if n := r2.clears(); n != 0 {
		t.Fatalf("the next start sent ALL_CLEARED %d times", n)
	}
}

// TestStaleStateTempFilesRemovedAtStart: a crash during a state write
// leaves its temporary file (.<name>.tmp-<digits>) behind; the next start
// removes them, and only them.
func TestStaleStateTempFilesRemovedAtStart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	stale := []string{".state.tmp-123", ".state.tmp-4294967295"}
	kept := []string{".state.tmp-", ".state.tmp-12x", ".other.tmp-1", "state.bak", ".state.tmp"}
	for _, name := range append(slices.Clone(stale), kept...) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pub := newEngine(t, 100)
	r := runSub(t, pub, func(c *Config) { c.StateFile = path })
	for _, name := range stale {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("stale temporary state file %s still there (err %v)", name, err)
		}
	}
	for _, name := range kept {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("%s was removed: %v", name, err)
		}
	}
	r.stop()
}
