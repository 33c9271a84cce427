package kvevents

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
)

// TestReconnectDuringSyncIsNotARestart: when the SUB socket reconnects
// (connection 2) while the sync of connection 1 runs, connection 1's
// batches that the replay already covered are late duplicates, not an
// engine restart (the sync used to mark the newest connection as synced).
func TestReconnectDuringSyncIsNotARestart(t *testing.T) {
	pub := newEngine(t, 100)
	enc := fakeengine.Encoding{Layout: fakeengine.LayoutArray}
	var payloads [][]byte
	for i := 0; i < 3; i++ {
		toks := make([]uint32, 16)
		for j := range toks {
			toks[j] = uint32(100*i + j)
		}
		b := fakeengine.Batch{TS: 1, Events: []fakeengine.Event{{Kind: "BlockStored", BlockHashes: []uint64{uint64(1000 + i)}, TokenIDs: toks, BlockSize: 16}}}
		p, err := enc.Encode(b)
		if err != nil {
			t.Fatal(err)
		}
		payloads = append(payloads, p)
		if _, err := pub.PublishRaw(p); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	sub, err := New(Config{ReplicaID: "r1", ModelID: "m", TenantID: "t", HashScheme: "vllm",
		Endpoint: pub.Endpoint(), ReplayEndpoint: pub.ReplayEndpoint(), Topic: "kv-events",
		ReplayTimeout: 2 * time.Second, Heartbeat: -1, Registerer: reg}, &recSink{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The receive goroutine already reconnected (connection 2) when the
	// Run goroutine handles connection 1's connect marker.
	sub.connNow.Store(2)
	sub.handle(ctx, message{conn: 1, connected: true})
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], 1)
	sub.handle(ctx, message{conn: 1, frames: [][]byte{[]byte("kv-events"), seqb[:], payloads[1]}})
	if n := testutil.ToFloat64(sub.metrics.restarts); n != 0 {
		t.Fatalf("a late duplicate of the synced connection counted as an engine restart (%v)", n)
	}
}

// TestSyncEvictionsKeepBufferedExact: a sync's evictions (a snapshot op,
// never counted in the buffered total) that fail part-way do not drive the
// total negative.
func TestSyncEvictionsKeepBufferedExact(t *testing.T) {
	s := &recSink{}
	var n int
	s.hook = func(string) {
		n++
		if n == 2 {
			s.mu.Lock()
			s.failNext = 1
			s.mu.Unlock()
		}
	}
	f := NewForwarder(baseConfig(), s, nil)
	f.QueueSync(false, []Prefix{pfx(1, 16), pfx(2, 16), pfx(3, 16), pfx(4, 16)}, nil, nil, 5)
	startForwarder(t, f)
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if b := f.Buffered(); b != 0 {
		t.Fatalf("buffered %d after the sync's evictions were delivered", b)
	}
}
