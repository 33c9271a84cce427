package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/bus/bustest"
	"github.com/inferencecache/inferencecache/kvevents/wire"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// lossySink is a recSink that can report deliveries it accepted as lost.
type lossySink struct {
	recSink
	lost atomic.Uint64
}

func (s *lossySink) TakeLost() uint64 { return s.lost.Swap(0) }

// A loss reported after the calls succeeded clears and resyncs the
// replica: ALL_CLEARED, then exactly the index; queued work is dropped.
func TestForwarderLossClearsAndResyncs(t *testing.T) {
	s := &lossySink{}
	idx := NewIndex(16, 0, nil)
	cfg := baseConfig()
	cfg.MaxPending = 4
	m := NewMetrics(nil)
	cfg.Metrics = m
	f := NewForwarder(cfg, s, idx)
	p := NewProcessor(idx, f, false, nil, nil)
	startForwarder(t, f)
	ctx := testCtx(t, 5*time.Second)

	for i := range 3 {
		p.Apply(&wire.Batch{TS: float64(i + 1), Events: []wire.Event{*stored([]uint64{uint64(10 * i), uint64(10*i + 1)}, nil, toks(32, uint32(100*i)), 16)}})
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	before := len(s.snapshot())
	if before == 0 || f.Resyncing() {
		t.Fatalf("calls %d resyncing %v", before, f.Resyncing())
	}

	s.lost.Store(2) // NATS reports two of them never stored
	p.Apply(&wire.Batch{TS: 5, Events: []wire.Event{{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{21}}}})
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	calls := s.snapshot()[before:]
	i := slices.IndexFunc(calls, func(c string) bool { return strings.HasPrefix(c, "ALL_CLEARED ") })
	if i < 0 {
		t.Fatalf("no ALL_CLEARED after the loss: %q", calls)
	}
	// Everything after the clear re-reports exactly the index.
	var got []string
	for _, c := range calls[i+1:] {
		if !strings.HasPrefix(c, "report ") {
			t.Fatalf("unexpected call after the clear: %q", c)
		}
	}
	s.mu.Lock()
	for _, u := range s.updates[len(s.updates)-(len(calls)-i-1):] {
		for _, pe := range u.Prefixes {
			got = append(got, fmt.Sprintf("%x/%d", binary.BigEndian.Uint64(pe.PrefixHash), pe.TokenCount))
		}
	}
	s.mu.Unlock()
	var want []string
	for _, pe := range idx.AppendSnapshot(nil) {
		want = append(want, fmt.Sprintf("%x/%d", pe.Key, pe.Tokens))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("re-reported %q\nindex       %q", got, want)
	}
	if got := counter(t, m.lostDeliveries); got != 2 {
		t.Fatalf("forward_lost_total %v", got)
	}
}

// NATSSink publishes the forwarder's messages, protobuf-encoded, on the
// subject of their (tenant, model), with the kind header.
func TestNATSSinkPublishes(t *testing.T) {
	ns := bustest.Start(t)
	nc, err := bus.Connect(ns.URL(), "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub, err := bus.NewPublisher(nc, bus.PublisherConfig{Stream: bus.StreamConfig{Name: "S"}})
	if err != nil {
		t.Fatal(err)
	}
	sink := NewNATSSink(pub, "S")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u := &icv1.CacheStateUpdate{ReplicaId: "r", TenantId: "ns", ModelId: "org/m", TimestampUs: 7}
	if err := sink.ReportCacheState(ctx, u); err != nil {
		t.Fatal(err)
	}
	if err := sink.PublishEvent(ctx, &icv1.CacheEvent{Type: icv1.CacheEvent_ALL_CLEARED, ReplicaId: "r", TenantId: "ns", ModelId: "org/m"}); err != nil {
		t.Fatal(err)
	}
	if err := sink.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := pub.JetStream().Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := st.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Subject != "S.ns.org~2Fm" || raw.Header.Get(bus.HeaderKind) != "update" {
		t.Fatalf("subject %q kind %q", raw.Subject, raw.Header.Get(bus.HeaderKind))
	}
	var back icv1.CacheStateUpdate
	if err := bus.DecodeUpdate(raw.Data, &back); err != nil || back.GetTimestampUs() != 7 || back.GetModelId() != "org/m" {
		t.Fatalf("decoded %v %v", &back, err)
	}
	if raw, err = st.GetMsg(ctx, 2); err != nil || raw.Header.Get(bus.HeaderKind) != "event" {
		t.Fatalf("second message %v %v", raw, err)
	}
	if sink.TakeLost() != 0 {
		t.Fatal("lost")
	}
}

// An update over the NATS maximum payload (long adapter ids) is published
// in parts, in order, every entry once.
func TestNATSSinkSplitsLargeUpdates(t *testing.T) {
	ns := bustest.StartWith(t, func(o *bustest.Options) { o.MaxPayload = 16 << 10 })
	nc, err := bus.Connect(ns.URL(), "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub, err := bus.NewPublisher(nc, bus.PublisherConfig{Stream: bus.StreamConfig{Name: "S"}})
	if err != nil {
		t.Fatal(err)
	}
	sink := NewNATSSink(pub, "S")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u := &icv1.CacheStateUpdate{ReplicaId: "r", TenantId: "t", ModelId: "m", Stats: &icv1.ReplicaStats{HitRate: 0.5}}
	for i := range 100 {
		u.Prefixes = append(u.Prefixes, &icv1.PrefixEntry{PrefixHash: []byte{byte(i)}, AdapterId: strings.Repeat("a", 1000)})
	}
	if err := sink.ReportCacheState(ctx, u); err != nil {
		t.Fatal(err)
	}
	if err := sink.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := pub.JetStream().Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	n := st.CachedInfo().State.Msgs
	if n < 8 {
		t.Fatalf("%d messages: not split", n)
	}
	var got []byte
	stats := 0
	for seq := uint64(1); seq <= n; seq++ {
		raw, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var part icv1.CacheStateUpdate
		if err := bus.DecodeUpdate(raw.Data, &part); err != nil {
			t.Fatal(err)
		}
		if part.Stats != nil {
			stats++
		}
		for _, p := range part.Prefixes {
			got = append(got, p.PrefixHash[0])
		}
	}
	if len(got) != 100 || stats != 1 {
		t.Fatalf("%d entries, %d stats in %d parts", len(got), stats, n)
	}
	for i, b := range got {
		if int(b) != i {
			t.Fatalf("entry %d is %d: out of order", i, b)
		}
	}
}

// A loss reported while the forwarder is idle (no calls, no heartbeat) is
// noticed at the next window tick, not at the next engine event.
func TestForwarderLossNoticedWhileIdle(t *testing.T) {
	s := &lossySink{}
	idx := NewIndex(16, 0, nil)
	cfg := baseConfig()
	cfg.Window = 10 * time.Millisecond
	f := NewForwarder(cfg, s, idx)
	p := NewProcessor(idx, f, false, nil, nil)
	startForwarder(t, f)
	p.Apply(&wire.Batch{TS: 1, Events: []wire.Event{*stored([]uint64{1, 2}, nil, toks(32, 0), 16)}})
	if err := f.Flush(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	n := len(s.snapshot())
	s.lost.Store(1)
	calls := waitCalls(t, &s.recSink, n+2)
	if !strings.HasPrefix(calls[n], "ALL_CLEARED ") || !strings.HasPrefix(calls[n+1], "report ") {
		t.Fatalf("after an idle loss: %q", calls[n:])
	}
}
