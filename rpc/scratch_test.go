package rpc

import (
	"encoding/binary"
	"reflect"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
)

// TestPutScratchDropsHugeBuffers: a lookup's pooled scratch must not keep
// the memory a huge request made it grow: neither the fingerprint buffers
// nor the engine's LookupResult scratch, which grows with the request's
// chain length (prefix sums over every block, the walked nodes) and with
// the number of replicas scored. An ordinary lookup keeps its scratch.
func TestPutScratchDropsHugeBuffers(t *testing.T) {
	store := policy.NewStore()
	e := engine.New(engine.Config{Policies: store})
	svc, err := NewService(Config{Index: e, Policies: store})
	if err != nil {
		t.Fatal(err)
	}
	hash := func(i int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(i)|1<<63) }
	chain := func(n int) ([][]byte, []int32) {
		hs, cs := make([][]byte, n), make([]int32, n)
		for i := range hs {
			hs[i], cs[i] = hash(i), 16
		}
		return hs, cs
	}
	now := time.Now().UnixMicro()
	stored, storedCounts := chain(8)
	e.Ingest(&engine.Update{TenantID: "t", ModelID: "m", HashScheme: "vllm", ReplicaID: "r1", TimestampUs: now,
		Prefixes: []engine.PrefixEntry{{BlockHashes: stored, BlockTokenCounts: storedCounts}}}, now)

	lookup := func(blocks int) *lookupScratch {
		sc := svc.getScratch()
		hs, cs := chain(blocks)
		sc.req = engine.LookupRequest{TenantID: "t", ModelID: "m", HashScheme: "vllm", BlockHashes: hs, BlockTokenCounts: cs}
		e.LookupRoute(&sc.req, now, &sc.res)
		if sc.res.Strategy != engine.StrategyPrefixMatch {
			t.Fatalf("%d-block lookup: %v, want PREFIX_MATCH", blocks, sc.res.Strategy)
		}
		svc.putScratch(sc)
		return sc
	}
	if sc := lookup(8); reflect.ValueOf(sc.res).IsZero() {
		t.Fatal("an 8-block lookup's engine scratch was dropped; it should be pooled")
	}
	// The engine's prefix sums alone hold 8 bytes per request block.
	if sc := lookup(200_000); !reflect.ValueOf(sc.res).IsZero() {
		t.Fatalf("a 200,000-block lookup's engine scratch is pooled (Scores cap %d)", cap(sc.res.Scores))
	}

	// token_ids: the fingerprint buffers. At 5,000 blocks the sums and wire
	// bytes stay under the bound, the [][]byte view (24 bytes a block) does
	// not.
	sc := svc.getScratch()
	svc.fingerprintInput(make([]uint32, 16*5_000), true, sc)
	svc.putScratch(sc)
	if sc.sums != nil || sc.wire != nil || sc.hashes != nil || sc.counts != nil {
		t.Fatalf("fingerprint buffers of 5,000 blocks are pooled: caps %d %d %d %d", cap(sc.sums), cap(sc.wire), cap(sc.hashes), cap(sc.counts))
	}
}
