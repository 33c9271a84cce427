package fakeengine_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/kvevents"
	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	"github.com/inferencecache/inferencecache/kvevents/wire"
)

func sampleBatch() fakeengine.Batch {
	parent, lora := uint64(1<<63|5), int64(3)
	return fakeengine.Batch{TS: 1700000000.125, DPRank: 1, Events: []fakeengine.Event{
		{Kind: fakeengine.BlockStored, BlockHashes: []uint64{7, 1<<64 - 1}, Parent: &parent,
			TokenIDs: fakeengine.BlockTokens(9, 32), BlockSize: 16, LoRAID: &lora, Medium: "GPU", LoRAName: "sql"},
		{Kind: fakeengine.BlockStored, BlockHashes: []uint64{8}, TokenIDs: fakeengine.BlockTokens(10, 16), BlockSize: 16},
		{Kind: fakeengine.BlockRemoved, BlockHashes: []uint64{7}, Medium: "CPU"},
		{Kind: fakeengine.AllBlocksCleared},
	}}
}

// TestEncodingRoundTrip checks every wire shape the fake engine produces
// against the subscriber's decoder.
func TestEncodingRoundTrip(t *testing.T) {
	in := sampleBatch()
	for _, layout := range []fakeengine.Layout{fakeengine.LayoutArray, fakeengine.LayoutMap} {
		for _, hb := range []bool{false, true} {
			for _, mb := range []bool{false, true} {
				enc := fakeengine.Encoding{Layout: layout, HashBytes: hb, MapBatch: mb}
				payload, err := enc.Encode(in)
				if err != nil {
					t.Fatal(err)
				}
				var out wire.Batch
				if err := wire.NewDecoder().Decode(payload, &out); err != nil {
					t.Fatalf("%+v: %v", enc, err)
				}
				if out.TS != in.TS || !out.HasDPRank || out.DPRank != 1 || len(out.Events) != len(in.Events) {
					t.Fatalf("%+v: batch %+v", enc, out)
				}
				for i, want := range in.Events {
					got := out.Events[i]
					if got.Kind.String() != want.Kind || !slices.Equal(got.BlockHashes, want.BlockHashes) ||
						!slices.Equal(got.TokenIDs, want.TokenIDs) || string(got.Medium) != want.Medium {
						t.Fatalf("%+v: event %d = %+v, want %+v", enc, i, got, want)
					}
					if want.Kind != fakeengine.BlockStored {
						continue
					}
					if got.HasParent != (want.Parent != nil) || (want.Parent != nil && got.ParentHash != *want.Parent) ||
						got.BlockSize != want.BlockSize || string(got.LoRAName) != want.LoRAName ||
						got.HasLoRAID != (want.LoRAID != nil) || (want.LoRAID != nil && got.LoRAID != *want.LoRAID) {
						t.Fatalf("%+v: event %d = %+v, want %+v", enc, i, got, want)
					}
				}
			}
		}
	}
	if _, err := fakeengine.ParseLayout("tuple"); err == nil {
		t.Fatal("bad layout accepted")
	}
}

// TestEncodingSGLang: SGLang's shapes ([ts, events, attn_dp_rank], 6-field
// BlockStored, 2-field BlockRemoved) decode to the same events minus the
// fields SGLang does not send (medium, lora_name).
func TestEncodingSGLang(t *testing.T) {
	in := sampleBatch()
	payload, err := fakeengine.Encoding{Layout: fakeengine.LayoutArray, SGLang: true}.Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	var out wire.Batch
	if err := wire.NewDecoder().Decode(payload, &out); err != nil {
		t.Fatal(err)
	}
	if out.TS != in.TS || !out.HasDPRank || out.DPRank != 1 || len(out.Events) != len(in.Events) {
		t.Fatalf("batch %+v", out)
	}
	for i, want := range in.Events {
		got := out.Events[i]
		if got.Kind.String() != want.Kind || !slices.Equal(got.BlockHashes, want.BlockHashes) || !slices.Equal(got.TokenIDs, want.TokenIDs) ||
			len(got.Medium) != 0 || len(got.LoRAName) != 0 {
			t.Fatalf("event %d = %+v, want %+v without medium and lora_name", i, got, want)
		}
		if want.Kind == fakeengine.BlockStored && (got.HasLoRAID != (want.LoRAID != nil) || got.BlockSize != want.BlockSize) {
			t.Fatalf("event %d = %+v, want %+v", i, got, want)
		}
	}
	for _, bad := range []fakeengine.Encoding{{Layout: fakeengine.LayoutMap, SGLang: true}, {Layout: fakeengine.LayoutArray, MapBatch: true, SGLang: true}} {
		if _, err := bad.Encode(in); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func traceFile(t *testing.T) string {
	p := filepath.Join("..", "..", "..", "shared", "traces", "mooncake_conversation_trace.jsonl")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Mooncake trace missing: %v", err)
		}
		t.Skipf("Mooncake trace missing: %v", err)
	}
	return p
}

// TestMooncakeKeysAreStable replays the head of the trace through the
// positional index and checks that each request's blocks get the keys a
// gateway computes by fingerprinting the request's whole prefix: the
// synthesized tokens make the trace's prefix ids and our chain agree.
func TestMooncakeKeysAreStable(t *testing.T) {
	reqs, err := fakeengine.LoadTrace(traceFile(t), 400)
	if err != nil {
		t.Fatal(err)
	}
	w := fakeengine.NewMooncake(reqs, fakeengine.MooncakeConfig{CapacityBlocks: 1500})
	idx := kvevents.NewIndex(16, 0, nil)
	keyOf := map[uint64]uint64{} // trace block id → our key, from the index
	evictions := 0
	for i := 0; ; i++ {
		b, _, ok := w.Next()
		if !ok {
			break
		}
		r := reqs[i]
		for _, ev := range b.Events {
			switch ev.Kind {
			case fakeengine.BlockStored:
				kev := &wire.Event{Kind: wire.KindBlockStored, BlockHashes: ev.BlockHashes, TokenIDs: ev.TokenIDs, BlockSize: ev.BlockSize}
				if ev.Parent != nil {
					kev.ParentHash, kev.HasParent = *ev.Parent, true
				}
				ps, reason := idx.Store(kev, nil)
				if reason != "" {
					t.Fatalf("request %d: dropped: %s", i, reason)
				}
				for j, p := range ps {
					keyOf[ev.BlockHashes[j]] = p.Key
				}
			case fakeengine.BlockRemoved:
				evictions += len(ev.BlockHashes)
				idx.Remove(&wire.Event{Kind: wire.KindBlockRemoved, BlockHashes: ev.BlockHashes}, false, nil, nil)
			}
		}
		full := min(len(r.HashIDs), r.InputLength/fakeengine.MooncakeBlockSize)
		var prompt []uint32
		for _, id := range r.HashIDs[:full] {
			prompt = append(prompt, fakeengine.BlockTokens(id, fakeengine.MooncakeBlockSize)...)
		}
		want := fingerprint.AppendChain(nil, prompt, fakeengine.MooncakeBlockSize, 0, false)
		for j, id := range r.HashIDs[:full] {
			if keyOf[id] != want[j] {
				t.Fatalf("request %d block %d (id %d): key %x, gateway computes %x", i, j, id, keyOf[id], want[j])
			}
		}
	}
	if w.CachedBlocks() != idx.Len() || evictions == 0 {
		t.Fatalf("engine %d blocks, index %d, evictions %d", w.CachedBlocks(), idx.Len(), evictions)
	}

	// Deterministic: a second replay produces the same batches.
	w1, w2 := fakeengine.NewMooncake(reqs[:50], fakeengine.MooncakeConfig{}), fakeengine.NewMooncake(reqs[:50], fakeengine.MooncakeConfig{})
	for {
		b1, d1, ok1 := w1.Next()
		b2, d2, ok2 := w2.Next()
		if ok1 != ok2 || d1 != d2 || !reflect.DeepEqual(b1, b2) {
			t.Fatal("mooncake replay is not deterministic")
		}
		if !ok1 {
			break
		}
	}
}

func TestPublisherReplayRing(t *testing.T) {
	p, err := fakeengine.NewPublisher(fakeengine.Config{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv", RingSize: 4,
		Encoding: fakeengine.Encoding{Layout: fakeengine.LayoutMap},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Seed: 1})
	for range 6 { // nobody subscribed: PUB drops them, the ring keeps 2..5
		b, _, _ := w.Next()
		if _, err := p.Publish(b); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var seqs []uint64
	err = kvevents.Replay(ctx, p.ReplayEndpoint(), 3, func(seq uint64, payload []byte) error {
		var b wire.Batch
		if err := wire.NewDecoder().Decode(payload, &b); err != nil {
			return err
		}
		seqs = append(seqs, seq)
		return nil
	})
	if err != nil || !slices.Equal(seqs, []uint64{3, 4, 5}) {
		t.Fatalf("replay from 3: %v %v", seqs, err)
	}
	seqs = nil
	err = kvevents.Replay(ctx, p.ReplayEndpoint(), 0, func(seq uint64, _ []byte) error {
		seqs = append(seqs, seq)
		return nil
	})
	if err != nil || !slices.Equal(seqs, []uint64{2, 3, 4, 5}) {
		t.Fatalf("replay from 0: %v %v", seqs, err)
	}

	// A request without the empty delimiter frame is ignored, as vLLM's
	// ROUTER ignores anything but [identity, "", start_seq].
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial(p.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	if err := dealer.Send(zmq4.NewMsg(make([]byte, 8))); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := dealer.Recv(); got <- err }()
	select {
	case err := <-got:
		t.Fatalf("a malformed request was answered (recv err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}

	// An endpoint nobody serves fails within the deadline.
	short, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	start := time.Now()
	err = kvevents.Replay(short, "tcp://127.0.0.1:1", 0, func(uint64, []byte) error { return nil })
	if !errors.Is(err, kvevents.ErrReplayUnavailable) && !errors.Is(err, kvevents.ErrReplayTimeout) {
		t.Fatalf("dead endpoint: %v", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatalf("dead endpoint took %v", time.Since(start))
	}
}

func TestSyntheticStartAndHolds(t *testing.T) {
	start := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 2, CapacityBlocks: 8, Start: start, Seed: 4})
	held := map[uint64]bool{}
	for i := range 20 {
		b, _, ok := w.Next()
		if !ok {
			t.Fatal("exhausted")
		}
		if want := float64(start.Add(time.Duration(i+1)*10*time.Millisecond).UnixMicro()) / 1e6; math.Abs(b.TS-want) > 1e-6 {
			t.Fatalf("batch %d ts %v, want %v", i, b.TS, want)
		}
		for _, ev := range b.Events {
			for _, h := range ev.BlockHashes {
				held[h] = ev.Kind == fakeengine.BlockStored
			}
		}
	}
	n := 0
	for h, want := range held {
		if w.Holds(h) != want {
			t.Fatalf("Holds(%x) = %v, want %v", h, !want, want)
		}
		if want {
			n++
		}
	}
	if n != w.CachedBlocks() {
		t.Fatalf("%d held by the events, CachedBlocks %d", n, w.CachedBlocks())
	}
}

// TestMooncakeTimestampsFollowWallClock: a batch is stamped when the fake
// engine publishes it, Start plus the trace offset divided by Speedup, as a
// real engine stamps its events; a server ages entries by that stamp.
func TestMooncakeTimestampsFollowWallClock(t *testing.T) {
	reqs := []fakeengine.TraceRequest{
		{Timestamp: 1000, InputLength: 1024, HashIDs: []uint64{1, 2}},
		{Timestamp: 61000, InputLength: 1536, HashIDs: []uint64{1, 2, 3}},
	}
	start := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	w := fakeengine.NewMooncake(reqs, fakeengine.MooncakeConfig{Start: start, Speedup: 10})
	for i, off := range []time.Duration{100 * time.Millisecond, 6100 * time.Millisecond} {
		b, _, ok := w.Next()
		if !ok {
			t.Fatal("exhausted")
		}
		if want := float64(start.Add(off).UnixMicro()) / 1e6; math.Abs(b.TS-want) > 1e-6 {
			t.Fatalf("batch %d ts %v, want %v (%v after start)", i, b.TS, want, off)
		}
	}
}

// With Connect the PUB connects to a SUB that listens, retrying until it
// does (the engine starts first), and connects again after the SUB went
// away and came back; Close does not wait for a listener that accepted the
// connection but never speaks.
func TestPublisherConnects(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "tcp://" + ln.Addr().String()
	_ = ln.Close() // nothing listens yet
	pub, err := fakeengine.NewPublisher(fakeengine.Config{Endpoint: ep, Connect: true, Topic: "kv-events"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if pub.Endpoint() != ep {
		t.Errorf("Endpoint %q, want %q", pub.Endpoint(), ep)
	}
	for round := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		sub := zmq4.NewSub(ctx)
		if err := sub.SetOption(zmq4.OptionSubscribe, "kv-events"); err != nil {
			t.Fatal(err)
		}
		if err := sub.Listen(ep); err != nil {
			t.Fatal(err)
		}
		got := make(chan uint64, 1)
		go func() {
			if msg, err := sub.Recv(); err == nil && len(msg.Frames) == 3 && len(msg.Frames[1]) == 8 {
				got <- binary.BigEndian.Uint64(msg.Frames[1])
			}
		}()
		// Publish until one arrives: after the first round the PUB may
		// still list its dead connection as subscribed for a moment.
		tick := time.NewTicker(50 * time.Millisecond)
	wait:
		for {
			if _, err := pub.Publish(sampleBatch()); err != nil {
				t.Fatal(err)
			}
			select {
			case seq := <-got:
				t.Logf("round %d: batch %d received", round, seq)
				break wait
			case <-ctx.Done():
				t.Fatalf("round %d: the connecting PUB delivered nothing to the listening SUB", round)
			case <-tick.C:
			}
		}
		tick.Stop()
		_ = sub.Close()
		cancel()
	}

	// A listener that accepts and never answers: the PUB's handshake
	// waits on it, and Close ends it.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	stuck, err := fakeengine.NewPublisher(fakeengine.Config{Endpoint: "tcp://" + silent.Addr().String(), Connect: true, Topic: "kv-events"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := silent.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	closed := make(chan struct{})
	go func() { _ = stuck.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a handshake that never ends")
	}
}
