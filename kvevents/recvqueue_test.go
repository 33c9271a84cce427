package kvevents

import (
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	"github.com/inferencecache/inferencecache/kvevents/wire"
)

// paddedBatch is a valid, empty batch of about n bytes: a map envelope
// whose unknown "pad" field (skipped by the decoder) carries n bytes.
func paddedBatch(n int) []byte {
	b := []byte{0x83, 0xa2, 't', 's', 0xcb}
	b = binary.BigEndian.AppendUint64(b, 0x3ff0000000000000) // 1.0
	b = append(b, 0xa6, 'e', 'v', 'e', 'n', 't', 's', 0x90, 0xa3, 'p', 'a', 'd', 0xc6)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	return append(b, make([]byte, n)...)
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// While the Run goroutine is busy (here: a replay that times out), the
// receive goroutine queues what the engine sends. That queue is bounded in
// bytes (MaxReceiveQueueBytes), not only in messages: 256 valid-sized
// messages could hold 4 GiB. Beyond the bound messages are dropped,
// counted, and repaired like a gap; the subscriber carries on.
func TestReceiveQueueBoundedInBytes(t *testing.T) {
	const (
		msgBytes = 2 << 20
		msgs     = 96 // 192 MiB, three times the bound
	)
	pad := paddedBatch(msgBytes)
	var b wire.Batch
	if err := wire.NewDecoder().Decode(pad, &b); err != nil || len(b.Events) != 0 {
		t.Fatalf("padded batch does not decode as an empty batch: %v", err)
	}
	f := startZMQWith(t, fakeengine.Config{RingSize: 4}, true, func(c *Config) { c.ReplayTimeout = 8 * time.Second })
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 2, CapacityBlocks: 64, Seed: 3})
	f.waitApplied(t, publishN(t, f.pub, w, 4)+1)
	base := liveHeap()

	// A gap the paused replay cannot fill holds the Run goroutine in the
	// replay for ReplayTimeout; meanwhile the engine sends 192 MiB.
	f.pub.PauseReplay(true)
	f.pub.Drop(1)
	first := publishN(t, f.pub, w, 2) + 1
	for range msgs {
		if _, err := f.pub.PublishRaw(pad); err != nil {
			t.Fatal(err)
		}
	}
	var peak uint64
	deadline := time.Now().Add(7 * time.Second)
	for time.Now().Before(deadline) && f.sub.NextSeq() < first {
		peak = max(peak, liveHeap())
		time.Sleep(100 * time.Millisecond)
	}
	f.pub.PauseReplay(false)
	grown := int64(peak) - int64(base)
	t.Logf("live heap grew by %d MiB while the subscriber was blocked", grown>>20)
	// The bound, zmq4's own queue (10 messages) and a message in hand,
	// with room to spare; without the bound it is all 192 MiB.
	if limit := int64(MaxReceiveQueueBytes + 32*msgBytes); grown > limit {
		t.Errorf("live heap grew by %d MiB while the subscriber was blocked, want at most %d MiB", grown>>20, limit>>20)
	}
	if n := counter(t, f.sub.metrics.batchesDropped.WithLabelValues(dropReceiveQueue)); n == 0 {
		t.Error("no batch counted as dropped by the receive queue")
	}
	// The subscriber carries on: the dropped batches were handled as gaps
	// and a later batch is applied.
	f.waitApplied(t, publishN(t, f.pub, w, 1)+1)
}

// The Run goroutine's side of a dropped message (the lost marker the
// receive goroutine queues in its place): a batch not received, taken from
// the replay; one without a sequence number clears the replica; one
// already applied changes nothing.
func TestLostMessageIsAGap(t *testing.T) {
	pub, err := fakeengine.NewPublisher(fakeengine.Config{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv-events"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 2, CapacityBlocks: 64, Seed: 5})
	last := publishN(t, pub, w, 3) // into the replay ring only: nobody subscribes
	s, err := New(Config{ReplicaID: "r", ModelID: "m", Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint()}, &recSink{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 20*time.Second)

	s.handle(ctx, message{conn: 1, lost: true, seq: 0, hasSeq: true})
	if s.seq.next != last+1 || s.idx.Len() != w.CachedBlocks() {
		t.Fatalf("after the lost first batch: next %d, %d blocks; want %d and the engine's %d (from the replay)",
			s.seq.next, s.idx.Len(), last+1, w.CachedBlocks())
	}
	if g, ok := counter(t, s.metrics.gaps), counter(t, s.metrics.replays.WithLabelValues(ReplayOK)); g != 1 || ok != 1 {
		t.Errorf("gaps %v, ok replays %v; want 1 and 1", g, ok)
	}

	s.handle(ctx, message{conn: 1, lost: true, seq: 1, hasSeq: true}) // already applied
	if s.seq.next != last+1 || s.idx.Len() != w.CachedBlocks() || counter(t, s.metrics.gaps) != 1 {
		t.Fatalf("a lost batch already applied changed the state: next %d, %d blocks", s.seq.next, s.idx.Len())
	}

	s.handle(ctx, message{conn: 1, lost: true}) // no sequence number: nothing can replay it
	if s.idx.Len() != 0 {
		t.Fatalf("a lost batch without a sequence number left %d blocks", s.idx.Len())
	}
}
