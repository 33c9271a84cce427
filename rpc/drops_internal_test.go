package rpc

import (
	"encoding/binary"
	"testing"

	"github.com/inferencecache/inferencecache/engine"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// producerFixture is a subscriber-shaped update: one 64-block chain and 8
// legacy entries.
func producerFixture() (*pb.CacheStateUpdate, *engine.Update) {
	m := &pb.CacheStateUpdate{TenantId: "team", ModelId: "llama-3-8b", HashScheme: "vllm", ReplicaId: "pod-7f9c", AdapterId: "lora-a"}
	chain := &pb.PrefixEntry{}
	for i := range 64 {
		chain.BlockHashes = append(chain.BlockHashes, binary.BigEndian.AppendUint64(nil, uint64(i)|1<<63))
		chain.BlockTokenCounts = append(chain.BlockTokenCounts, 16)
	}
	m.Prefixes = append(m.Prefixes, chain)
	for i := range 8 {
		m.Prefixes = append(m.Prefixes, &pb.PrefixEntry{PrefixHash: binary.BigEndian.AppendUint64(nil, uint64(i)), TokenCount: 16})
	}
	var cv updateConverter
	return m, cv.convert(m)
}

// TestProducerChecksAllocs: the id check and the drop attribution of an
// update allocate nothing, whether or not the index dropped entries.
func TestProducerChecksAllocs(t *testing.T) {
	m, u := producerFixture()
	if n := testing.AllocsPerRun(1000, func() {
		if updateOversizedID(m).found() {
			t.Fatal("fixture refused")
		}
		_ = updateDrops(u, engine.IngestResult{Entries: 72})
		_ = updateDrops(u, engine.IngestResult{Entries: 70, Dropped: 2})
	}); n != 0 {
		t.Fatalf("allocs/op = %v, want 0", n)
	}
}

// BenchmarkProducerChecks: what ReportCacheState adds per update: the id
// check, and the drop attribution (run only when the index dropped
// something).
func BenchmarkProducerChecks(b *testing.B) {
	m, u := producerFixture()
	b.Run("ids", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = updateOversizedID(m)
		}
	})
	b.Run("attribute-drops", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = updateDrops(u, engine.IngestResult{Entries: 70, Dropped: 2})
		}
	})
}
