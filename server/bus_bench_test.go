package server

import (
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// BenchmarkBusApplyUpdates: applying stream messages (4096-entry updates,
// decoded in place) through the ReportCacheState handler, as the NATS
// consumer does; one op is one message. The keys repeat after the first
// pass, so it measures steady-state upserts.
func BenchmarkBusApplyUpdates(b *testing.B) {
	cfg := DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.InternalAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.InsecureDisableAuth = true
	cfg.MaxIndexEntries = 0
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	a := &busApplier{s: s, log: s.log}
	const perMsg, msgs = 4096, 16
	batch := make([]bus.Message, msgs)
	now := time.Now()
	for m := range batch {
		u := &pb.CacheStateUpdate{ReplicaId: "r", TenantId: "t", ModelId: "m", HashScheme: "vllm", TimestampUs: now.UnixMicro()}
		for i := range perMsg {
			u.Prefixes = append(u.Prefixes, &pb.PrefixEntry{PrefixHash: fingerprint.AppendWire(nil, uint64(m*perMsg+i+1)), TokenCount: 16, Tier: pb.CacheTier_CACHE_TIER_T1})
		}
		data, err := proto.Marshal(u)
		if err != nil {
			b.Fatal(err)
		}
		batch[m] = bus.Message{Kind: bus.KindUpdate, Data: data, Time: now}
	}
	a.apply(batch) // first insert
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		a.apply(batch[i%msgs : i%msgs+1])
	}
	b.ReportMetric(float64(perMsg)*float64(b.N)/b.Elapsed().Seconds(), "entries/s")
	if e, _ := s.Engine().Counts(); e != perMsg*msgs {
		b.Fatalf("index holds %d entries, want %d", e, perMsg*msgs)
	}
}
