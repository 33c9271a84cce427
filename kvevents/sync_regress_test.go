package kvevents

import (
	"context"
	"encoding/binary"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	"github.com/inferencecache/inferencecache/kvevents/wire"
	"github.com/inferencecache/inferencecache/rpc"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
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

// TestSyncEvictionsKeepBufferedExact: a sync's evictions that fail
// part-way keep the buffered total exact (it once went negative, when they
// were not counted in it).
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

// TestLongAdapterNameDropped: a lora_name longer than the server's id
// limit drops its BlockStored (counted) instead of producing an update the
// server would refuse; the limit is the server's.
func TestLongAdapterNameDropped(t *testing.T) {
	if MaxIDBytes != rpc.MaxIDBytes {
		t.Fatalf("MaxIDBytes %d, the server's rpc.MaxIDBytes %d", MaxIDBytes, rpc.MaxIDBytes)
	}
	x := NewIndex(16, 0, nil)
	toks := make([]uint32, 16)
	ev := &wire.Event{Kind: wire.KindBlockStored, BlockHashes: []uint64{1}, TokenIDs: toks, BlockSize: 16, LoRAName: []byte(strings.Repeat("a", MaxIDBytes+1))}
	if out, reason := x.Store(ev, nil); reason != DropLongAdapter || len(out) != 0 {
		t.Fatalf("Store: %d prefixes, reason %q; want dropped as %q", len(out), reason, DropLongAdapter)
	}
	ev.LoRAName = []byte(strings.Repeat("a", MaxIDBytes))
	if out, reason := x.Store(ev, nil); reason != "" || len(out) != 1 {
		t.Fatalf("a name at the limit: %d prefixes, reason %q", len(out), reason)
	}
	if _, err := New(Config{ReplicaID: strings.Repeat("r", MaxIDBytes+1), ModelID: "m"}, &recSink{}); err == nil {
		t.Fatal("an oversized replica id was accepted")
	}
}

// TestForwarderDropsRefusedUpdate: an update the server refuses as
// InvalidArgument is dropped (the queue moves on), while other errors are
// retried.
func TestForwarderDropsRefusedUpdate(t *testing.T) {
	s := &refusingSink{}
	f := NewForwarder(baseConfig(), s, nil)
	startForwarder(t, f)
	f.Add([]Prefix{pfx(1, 16)}, 1)
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatalf("Flush with a refused update: %v", err)
	}
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("refused update sent %d times, want once", n)
	}
}

type refusingSink struct{ calls atomic.Int32 }

func (s *refusingSink) ReportCacheState(context.Context, *icv1.CacheStateUpdate) error {
	s.calls.Add(1)
	return status.Error(codes.InvalidArgument, "adapter_id is 2000 bytes, over the 1024-byte limit")
}

func (s *refusingSink) PublishEvent(context.Context, *icv1.CacheEvent) error { return nil }
