package rpc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// codecSeeds are the kept seeds of FuzzCodecDifferential (also under
// testdata/fuzz): each hot message in the shapes producers and gateways
// send, plus the cases the fast paths hand to proto (unknown fields, a
// repeated singular message, unpacked counts, invalid UTF-8, truncation).
func codecSeeds() [][]byte {
	h := func(i int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(i)*0x9e3779b97f4a7c15) }
	chain := [][]byte{h(1), h(2), h(3), {}, []byte("a longer hash of 32 bytes.......")}
	counts := []int32{16, 16, 16, -1, 7}
	w, r, q := int32(3), int32(-2), int64(1<<40)
	msgs := []proto.Message{
		&pb.LookupRouteRequest{TenantId: "team", ModelId: "llama", HashScheme: "vllm", BlockHashes: chain, BlockTokenCounts: counts, AdapterId: "lora-1", Slo: &pb.SLO{TtftMs: 200, TbtMs: -1}},
		&pb.LookupRouteRequest{TenantId: "team", ModelId: "llama", PrefixHash: h(9), PrefixTokenCount: -5, TokenIds: []uint32{1, 2, 3, math.MaxUint32}, PromptText: "héllo", FollowsAnswer: true},
		&pb.CacheStateUpdate{ReplicaId: "r1", ModelId: "llama", TenantId: "team", HashScheme: "vllm", TimestampUs: -7, AdapterId: "a",
			Prefixes: []*pb.PrefixEntry{
				{BlockHashes: chain, BlockTokenCounts: counts, Tier: pb.CacheTier(2)},
				{PrefixHash: h(4), TokenCount: 64, Tier: pb.CacheTier(-3), AdapterId: "b"},
				{},
			},
			Stats: &pb.ReplicaStats{ReplicaId: "x", CacheMemoryBytes: 1 << 33, HitRate: float32(math.NaN()), Pressure: float32(math.Copysign(0, -1)), ClientVersion: "v1",
				T2HitTokens: 5, T2QueryTokens: -6, WaitingRequests: &w, RunningRequests: &r, QueuedPrefillTokens: &q}},
		&pb.CacheStateUpdate{ReplicaId: "r2", Stats: &pb.ReplicaStats{}},
		&pb.LookupRouteResponse{ReasonCode: "PREFIX_MATCH", LookupLatencyUs: 12, AdapterId: "lora", TokenIds: []uint32{0, 300, 1 << 31},
			ReplicaScores: []*pb.ReplicaScore{{ReplicaId: "r1", Score: 0.5, MatchedTokens: 128, EstimatedCacheHitProb: 1, Tier: 1}, {ReplicaId: "r2", Score: float32(math.Copysign(0, -1)), MatchedTokens: -3, Tier: -1}, {}}},
	}
	var out [][]byte
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil {
			panic(err)
		}
		out = append(out, b)
	}
	lk := out[0]
	out = append(out,
		protowire.AppendString(protowire.AppendTag(append([]byte(nil), lk...), 99, protowire.BytesType), "unknown"), // unknown field
		protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), lk...), 1, protowire.VarintType), 5),         // known field, wrong type
		append(append([]byte(nil), lk...), lk...), // repeated slo: merged
		protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), lk...), 8, protowire.VarintType), 1<<35), // unpacked count
		protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "\xff\xfe"),                    // invalid UTF-8
		lk[:len(lk)-3], // truncated
		nil,
		// A block hash past the one-byte-length fast path, and one cut
		// short inside the fast path.
		protowire.AppendBytes(protowire.AppendTag(nil, 7, protowire.BytesType), bytes.Repeat([]byte{7}, 200)),
		protowire.AppendBytes(protowire.AppendTag(nil, 7, protowire.BytesType), h(5))[:6],
	)
	// Placement for disaggregated serving (docs/pd.md), a role this server
	// does not know among them (seeds 14 and 15).
	for _, m := range []proto.Message{
		&pb.CacheStateUpdate{ReplicaId: "r3", ModelId: "llama", TenantId: "team", Role: pb.ReplicaRole_REPLICA_ROLE_PREFILL, PdPool: "prefill", NodeName: "node-1", Zone: "zone-a"},
		&pb.CacheStateUpdate{ReplicaId: "r4", Role: pb.ReplicaRole(-9), Stats: &pb.ReplicaStats{}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			panic(err)
		}
		out = append(out, b)
	}
	return out
}

func FuzzCodecDifferential(f *testing.F) {
	for _, s := range codecSeeds() {
		f.Add(s)
	}
	// One call and one stream message, reused across inputs as the server
	// reuses them: a decode must not keep anything of the previous one.
	call, upd := new(lookupCall), new(updateMsg)
	call.reply.call = call
	f.Fuzz(func(t *testing.T, data []byte) {
		checkLookupDecode(t, call, data)
		checkUpdateDecode(t, upd, data)
		checkLookupMarshal(t, data)
	})
}

// split hands data to the codec in up to three buffers, as grpc may.
func split(data []byte) mem.BufferSlice {
	a, b := len(data)/3, 2*len(data)/3
	return mem.BufferSlice{mem.SliceBuffer(data[:a]), mem.SliceBuffer(data[a:b]), mem.SliceBuffer(data[b:])}
}

func checkLookupDecode(t *testing.T, call *lookupCall, data []byte) {
	want := new(pb.LookupRouteRequest)
	errW := proto.Unmarshal(data, want)
	errG := Codec{}.Unmarshal(split(data), call)
	if errG == nil {
		errG = call.decodeErr // how the codec reports it to the handler
	}
	if (errW == nil) != (errG == nil) {
		t.Fatalf("LookupRouteRequest %x: proto error %v, codec error %v", data, errW, errG)
	}
	if errW == nil && !proto.Equal(want, &call.LookupRouteRequest) {
		t.Fatalf("LookupRouteRequest %x:\nproto %v\ncodec %v", data, want, &call.LookupRouteRequest)
	}
}

func checkUpdateDecode(t *testing.T, upd *updateMsg, data []byte) {
	want := new(pb.CacheStateUpdate)
	errW := proto.Unmarshal(data, want)
	errG := Codec{}.Unmarshal(split(data), upd)
	if errG == nil {
		errG = upd.decodeErr // how the codec reports it to the handler
	}
	if (errW == nil) != (errG == nil) {
		t.Fatalf("CacheStateUpdate %x: proto error %v, codec error %v", data, errW, errG)
	}
	if errW == nil && !proto.Equal(want, &upd.CacheStateUpdate) {
		t.Fatalf("CacheStateUpdate %x:\nproto %v\ncodec %v", data, want, &upd.CacheStateUpdate)
	}
}

// checkLookupMarshal: a response (any message data decodes to) marshals
// to proto.Marshal's bytes through a pooled reply.
func checkLookupMarshal(t *testing.T, data []byte) {
	c := getLookupCall()
	r := &c.reply
	if err := proto.Unmarshal(data, &r.LookupRouteResponse); err != nil {
		return
	}
	want, err := proto.Marshal(&r.LookupRouteResponse)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Codec{}.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Free()
	if g := got.Materialize(); !bytes.Equal(g, want) {
		t.Fatalf("LookupRouteResponse %x: proto %x, codec %x", data, want, g)
	}
}

// TestCodecFallsBackToProto pins which inputs take the fast paths: every
// seed of the two requests that proto decodes cleanly and has nothing
// unusual is decoded without proto (decode reports true), and the unusual
// seeds are handed to proto.
func TestCodecFallsBackToProto(t *testing.T) {
	seeds := codecSeeds()
	call, upd := new(lookupCall), new(updateMsg)
	for i, fast := range map[int]bool{0: true, 1: true, 5: false, 6: false, 7: false, 8: true, 9: false, 10: false, 11: true} {
		call.buf = seeds[i]
		if got := call.decode(); got != fast {
			t.Errorf("LookupRouteRequest seed %d: fast path %v, want %v", i, got, fast)
		}
	}
	for i, fast := range map[int]bool{2: true, 3: true, 14: true, 15: true} {
		upd.buf = seeds[i]
		if got := upd.decode(); got != fast {
			t.Errorf("CacheStateUpdate seed %d: fast path %v, want %v", i, got, fast)
		}
	}
}

// TestCodecAllocs pins the codec's steady state: decoding a 64-block
// lookup or update into reused memory allocates nothing, and marshaling a
// 32-score response into a pooled buffer allocates only the one-element
// mem.BufferSlice that carries it to grpc.
func TestCodecAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; counts are pinned without it")
	}
	chain := make([][]byte, 64)
	counts := make([]int32, 64)
	for i := range chain {
		chain[i] = binary.BigEndian.AppendUint64(nil, uint64(i))
		counts[i] = 16
	}
	lk, _ := proto.Marshal(&pb.LookupRouteRequest{TenantId: "team", ModelId: "llama", HashScheme: "vllm", BlockHashes: chain, BlockTokenCounts: counts})
	up, _ := proto.Marshal(&pb.CacheStateUpdate{ReplicaId: "r1", TenantId: "team", ModelId: "llama", HashScheme: "vllm",
		Prefixes: []*pb.PrefixEntry{{BlockHashes: chain, BlockTokenCounts: counts}}, Stats: &pb.ReplicaStats{HitRate: 0.5}})
	call, upd := new(lookupCall), new(updateMsg)
	lkData, upData := split(lk), split(up)
	if n := testing.AllocsPerRun(100, func() {
		if err := (Codec{}).Unmarshal(lkData, call); err != nil || len(call.BlockHashes) != 64 {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("LookupRouteRequest decode: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := (Codec{}).Unmarshal(upData, upd); err != nil || len(upd.Prefixes) != 1 {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("CacheStateUpdate decode: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() {
		c := getLookupCall()
		r := &c.reply
		r.ReasonCode, r.LookupLatencyUs = ReasonPrefixMatch, 9
		ps := r.scores.take(32)
		for i, p := range ps {
			p.ReplicaId, p.Score, p.MatchedTokens = "vllm-00", float32(i), 1024
		}
		r.ReplicaScores = ps
		out, err := Codec{}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		out.Free()
	}); n != 1 {
		t.Errorf("LookupRouteResponse marshal: %v allocs, want 1", n)
	}
}

func BenchmarkCodecLookupRequest(b *testing.B) {
	chain := make([][]byte, 64)
	counts := make([]int32, 64)
	for i := range chain {
		chain[i] = binary.BigEndian.AppendUint64(nil, uint64(i))
		counts[i] = 16
	}
	lk, _ := proto.Marshal(&pb.LookupRouteRequest{TenantId: "team", ModelId: "llama", HashScheme: "vllm", BlockHashes: chain, BlockTokenCounts: counts})
	data := mem.BufferSlice{mem.SliceBuffer(lk)}
	b.Run("codec", func(b *testing.B) {
		b.ReportAllocs()
		call := new(lookupCall)
		for b.Loop() {
			_ = Codec{}.Unmarshal(data, call)
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = protoCodec.Unmarshal(data, new(pb.LookupRouteRequest))
		}
	})
}

// TestInternCollisionAllocs pins the intern table's two-slot sets: two ids
// that hash to one set (under a random seed about one pair in 2,048, for the
// life of the process) both stay interned, so alternating between them
// allocates nothing; a third id in the set still decodes to itself.
func TestInternCollisionAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are pinned without the race detector")
	}
	tab := &internTable{seed: maphash.MakeSeed()}
	set := func(s string) uint64 { return maphash.String(tab.seed, s) & (internSets - 1) }
	colliding := []string{"team"}
	for i := 0; len(colliding) < 3 && i < 1<<22; i++ {
		if id := fmt.Sprintf("tenant-%d", i); set(id) == set("team") {
			colliding = append(colliding, id)
		}
	}
	if len(colliding) < 3 {
		t.Fatal("no colliding ids found")
	}
	a, b, c := []byte(colliding[0]), []byte(colliding[1]), []byte(colliding[2])
	if n := testing.AllocsPerRun(100, func() {
		if s, _ := tab.intern(a); s != colliding[0] {
			t.Fatalf("intern(%q) = %q", a, s)
		}
		if s, _ := tab.intern(b); s != colliding[1] {
			t.Fatalf("intern(%q) = %q", b, s)
		}
	}); n != 0 {
		t.Errorf("two ids in one set: %v allocs per pair, want 0", n)
	}
	for range 3 {
		for i, id := range [][]byte{a, b, c} {
			if s, ok := tab.intern(id); !ok || s != colliding[i] {
				t.Fatalf("intern(%q) = %q, %v", id, s, ok)
			}
		}
	}
}
