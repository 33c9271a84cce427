package kvevents

import (
	"context"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	"github.com/inferencecache/inferencecache/kvevents/wire"
	"github.com/inferencecache/inferencecache/server"
)

// Shape of the end-to-end benchmark's engine traffic: every batch (one
// engine step) carries benchEventsPerBatch BlockStored events, each a
// 256-token prefill chunk (16 blocks of 16 tokens) chained on its session's
// previous chunk, the same event size as BenchmarkDecodeBatch.
const (
	benchEventsPerBatch = 4
	benchBlocksPerEvent = 16
	// benchInFlight bounds the batches published but not yet applied.
	benchInFlight = 64
)

// benchBatches pre-encodes n BlockStored events (n/benchEventsPerBatch
// batches, rounded up) from 64 synthetic sessions in the map layout, with
// nothing evicted, so every block is a distinct key on the server. It
// returns the payloads and the number of blocks they store.
func benchBatches(tb testing.TB, n int) ([][]byte, int) {
	tb.Helper()
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 64, BlocksPerTurn: benchBlocksPerEvent,
		CapacityBlocks: 1 << 40, Start: time.Now(), Seed: 1})
	enc := fakeengine.Encoding{Layout: fakeengine.LayoutMap}
	var payloads [][]byte
	blocks := 0
	for left := n; left > 0; {
		var b fakeengine.Batch
		for range min(left, benchEventsPerBatch) {
			s, _, _ := w.Next()
			b.TS = s.TS
			b.Events = append(b.Events, s.Events...)
			blocks += len(s.Events[0].BlockHashes)
			left--
		}
		p, err := enc.Encode(b)
		if err != nil {
			tb.Fatal(err)
		}
		payloads = append(payloads, p)
	}
	return payloads, blocks
}

// BenchmarkE2EEventsThroughServer measures BlockStored events per second
// from the engine's wire bytes to the real in-process server's index, on
// loopback gRPC with the production GRPCSink and forwarder defaults (100 ms
// window, 4096-entry updates). The clock stops once the server has
// acknowledged everything (Flush), and the server's own entry count is
// checked against the blocks sent.
//
// The figure is a sustained rate: the producer is paced so the forward
// buffer stays below half its bound (an unpaced burst faster than delivery
// overflows it and turns into a clear-and-resync, which the benchmark
// rejects).
//
//   - zmq: fake engine PUB → SUB socket → decode → positional index →
//     forwarder → server (the whole sidecar);
//   - processor: payload → decode → positional index → forwarder → server
//     (no ZMQ hop).
//
// One op is one event (16 blocks). Run with a fixed count, e.g.
// go test ./kvevents -run XXX -bench E2EEventsThroughServer -benchtime 40000x
func BenchmarkE2EEventsThroughServer(b *testing.B) {
	b.Run("zmq", func(b *testing.B) { benchE2E(b, true) })
	b.Run("processor", func(b *testing.B) { benchE2E(b, false) })
}

func benchE2E(b *testing.B, viaZMQ bool) {
	srv := startRealServer(b, func(c *server.Config) { c.MaxIndexEntries = 0 })
	payloads, blocks := benchBatches(b, b.N)
	conn, err := DialServer(srv.addr, TLSFiles{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	sink := NewGRPCSink(conn, nil)
	ctx := testCtx(b, 10*time.Minute)

	var fwd *Forwarder
	var metrics *Metrics
	var run func()
	if viaZMQ {
		f := startZMQSink(b, fakeengine.Config{Encoding: fakeengine.Encoding{Layout: fakeengine.LayoutMap}}, false,
			func(c *Config) {
				// Production forwarding defaults.
				c.Window, c.MinBackoff, c.MaxBackoff = 0, 0, 0
				c.LoRAAdapters = nil
			}, sink)
		fwd, metrics = f.sub.Forwarder(), f.sub.metrics
		if err := fwd.Flush(ctx); err != nil { // the startup resync
			b.Fatal(err)
		}
		run = func() {
			var last uint64
			for i, p := range payloads {
				// Pace like an engine the sidecar keeps up with: at most
				// benchInFlight batches on the ZMQ hop, half the forward
				// buffer queued.
				for i > 0 && (last+1-f.sub.NextSeq() > benchInFlight || fwd.Buffered() > DefaultMaxBuffered/2) {
					if !sleepCtx(ctx, 20*time.Microsecond) {
						b.Fatal("subscriber stalled")
					}
				}
				seq, err := f.pub.PublishRaw(p)
				if err != nil {
					b.Fatal(err)
				}
				last = seq
			}
			for f.sub.NextSeq() < last+1 {
				if !sleepCtx(ctx, 100*time.Microsecond) {
					b.Fatalf("applied %d of %d batches", f.sub.NextSeq(), last+1)
				}
			}
		}
	} else {
		metrics = NewMetrics(nil)
		idx := NewIndex(16, 0, nil)
		fwd = NewForwarder(ForwarderConfig{ReplicaID: "r1", ModelID: "m", TenantID: "t", HashScheme: "vllm",
			Metrics: metrics}, sink, idx)
		proc := NewProcessor(idx, fwd, false, nil, metrics)
		fctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = fwd.Run(fctx)
		}()
		b.Cleanup(func() {
			cancel()
			<-done
		})
		dec := wire.NewDecoder()
		var batch wire.Batch
		run = func() {
			for _, p := range payloads {
				for fwd.Buffered() > DefaultMaxBuffered/2 {
					if !sleepCtx(ctx, 20*time.Microsecond) {
						b.Fatal("forwarder stalled")
					}
				}
				if err := dec.Decode(p, &batch); err != nil {
					b.Fatal(err)
				}
				proc.Apply(&batch)
			}
		}
	}

	b.ResetTimer()
	start := time.Now()
	run()
	if err := fwd.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.StopTimer()

	entries, keys := srv.Engine().Counts()
	if entries != int64(blocks) || keys != int64(blocks) {
		b.Fatalf("server holds %d entries (%d keys), sent %d blocks", entries, keys, blocks)
	}
	if n := counter(b, metrics.eventsDropped.WithLabelValues(DropUnknownParent)); n != 0 {
		b.Fatalf("%v events dropped", n)
	}
	if n := counter(b, metrics.overflows); n != 0 {
		b.Fatalf("the forward buffer overflowed %v times: not a sustained rate", n)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(blocks)/elapsed.Seconds(), "blocks/s")
}
