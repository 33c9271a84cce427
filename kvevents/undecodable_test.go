package kvevents

import (
	"context"
	"maps"
	"path/filepath"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	"github.com/inferencecache/inferencecache/kvevents/wire"
)

// undecodable is a payload no decoder accepts (msgpack's never-used byte):
// it stands for a batch that, say, removed blocks the index holds.
var undecodable = []byte{0xc1, 0x00}

// rootBatch stores one root block (engine hash h) of 16 tokens.
func rootBatch(h uint64) fakeengine.Batch {
	return fakeengine.Batch{TS: 1, Events: []fakeengine.Event{{Kind: fakeengine.BlockStored,
		BlockHashes: []uint64{h}, TokenIDs: toks(16, uint32(h)*100), BlockSize: 16}}}
}

func publish(t *testing.T, pub *fakeengine.Publisher, bs ...fakeengine.Batch) uint64 {
	t.Helper()
	var last uint64
	for _, b := range bs {
		seq, err := pub.Publish(b)
		if err != nil {
			t.Fatal(err)
		}
		last = seq
	}
	return last
}

func publishRaw(t *testing.T, pub *fakeengine.Publisher, p []byte) uint64 {
	t.Helper()
	seq, err := pub.PublishRaw(p)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// holdsEngine reports whether the positional index maps engine hash h.
func holdsEngine(x *Index, h uint64) bool {
	for _, e := range x.AppendState(nil) {
		if e.Engine == h {
			return true
		}
	}
	return false
}

// checkAgrees: the recorded server state equals the positional index.
func checkAgrees(t *testing.T, r *runningSub) {
	t.Helper()
	if server, index := serverModel(r.sink), indexModel(r.Index()); !maps.Equal(server, index) {
		t.Fatalf("server state (%d keys) != positional index (%d keys)", len(server), len(index))
	}
}

// TestUndecodableLiveBatchIsAGap: a live batch the subscriber cannot decode
// is a batch it did not get. Its replay (the engine's copy is the same
// bytes) cannot fill it either, so the replica is cleared, as for an
// unrepairable gap: the blocks stored before it are neither kept in the
// index nor on the server, so no refresh re-reports a block the lost batch
// may have removed. With and without a replay endpoint.
func TestUndecodableLiveBatchIsAGap(t *testing.T) {
	for _, replay := range []bool{true, false} {
		t.Run(map[bool]string{true: "replay", false: "no replay"}[replay], func(t *testing.T) {
			pub := newEngine(t, 100)
			r := runSub(t, pub, func(c *Config) {
				if !replay {
					c.ReplayEndpoint = ""
				}
			})
			last := publish(t, pub, rootBatch(1), rootBatch(2))
			r.settle(t, last+1)
			if r.Index().Len() != 2 {
				t.Fatalf("index holds %d blocks, want 2", r.Index().Len())
			}
			publishRaw(t, pub, undecodable)
			last = publish(t, pub, rootBatch(3))
			r.settle(t, last+1)
			if n := r.clears(); n != 1 {
				t.Fatalf("ALL_CLEARED %d times after an undecodable batch, want 1", n)
			}
			if holdsEngine(r.Index(), 1) || holdsEngine(r.Index(), 2) || !holdsEngine(r.Index(), 3) {
				t.Fatalf("index after the undecodable batch: %v; want only the block stored after it", r.Index().AppendState(nil))
			}
			checkAgrees(t, r)
			var dropped float64
			for _, reason := range []string{wire.ReasonTruncated, wire.ReasonEnvelope, wire.ReasonEvent, wire.ReasonFieldType, wire.ReasonTooLarge, wire.ReasonTrailing} {
				dropped += counter(t, r.metrics.batchesDropped.WithLabelValues(reason))
			}
			if dropped == 0 {
				t.Fatal("the undecodable batch was not counted")
			}
		})
	}
}

// TestUndecodableReplayedBatchClearsAndRebuilds: a restarted subscriber's
// sync meets an undecodable batch among those published while it was down:
// the replica is cleared and rebuilt from the batches after it.
func TestUndecodableReplayedBatchClearsAndRebuilds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	withState := func(c *Config) { c.StateFile = path }
	pub := newEngine(t, 100)
	r1 := runSub(t, pub, withState)
	last := publish(t, pub, rootBatch(1), rootBatch(2))
	r1.settle(t, last+1)
	r1.stop()
	publishRaw(t, pub, undecodable) // while no subscriber runs
	last = publish(t, pub, rootBatch(3))

	r2 := runSub(t, pub, withState)
	r2.settle(t, last+1)
	if n := r2.clears(); n != 1 {
		t.Fatalf("ALL_CLEARED %d times after a sync over an undecodable batch, want 1", n)
	}
	if holdsEngine(r2.Index(), 1) || holdsEngine(r2.Index(), 2) || !holdsEngine(r2.Index(), 3) {
		t.Fatalf("index after the sync: %v; want only the block stored after the undecodable batch", r2.Index().AppendState(nil))
	}
	checkAgrees(t, r2)
}

// TestUndecodableUntrackedBatchClears: a message without a sequence number
// cannot be replayed; when it does not decode, the replica is cleared.
func TestUndecodableUntrackedBatchClears(t *testing.T) {
	rec := &recSink{}
	sub, err := New(Config{ReplicaID: "r1", ModelID: "m", TenantID: "t", HashScheme: "vllm", Heartbeat: -1}, rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); _ = sub.fwd.Run(ctx) }()
	defer func() { cancel(); <-done }()
	enc := fakeengine.Encoding{Layout: fakeengine.LayoutArray}
	p, err := enc.Encode(rootBatch(1))
	if err != nil {
		t.Fatal(err)
	}
	sub.handle(ctx, message{frames: [][]byte{[]byte("kv-events"), p}})
	if sub.Index().Len() != 1 {
		t.Fatalf("index holds %d blocks, want 1", sub.Index().Len())
	}
	sub.handle(ctx, message{frames: [][]byte{[]byte("kv-events"), undecodable}})
	if sub.Index().Len() != 0 {
		t.Fatalf("index holds %d blocks after an undecodable untracked batch, want 0", sub.Index().Len())
	}
	if err := sub.fwd.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	r := &runningSub{Subscriber: sub, sink: rec}
	if n := r.clears(); n != 1 {
		t.Fatalf("ALL_CLEARED %d times, want 1", n)
	}
}
