package bus

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// FuzzDecodeToken: any input either fails with ErrBadToken/ErrHashed or
// decodes to an id that encodes back to the same token.
func FuzzDecodeToken(f *testing.F) {
	for _, s := range []string{"~", "abc", "meta-llama~2FLlama-3~2E1-8B", "~h00", "~2", "~zz", "a.b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		id, err := DecodeToken(tok)
		if err != nil {
			if !errors.Is(err, ErrBadToken) && !errors.Is(err, ErrHashed) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if back := EncodeToken(id); back != tok {
			t.Fatalf("DecodeToken(%q) = %q, which encodes to %q", tok, id, back)
		}
	})
}

// FuzzDecodeMessage: payloads from the stream never panic the decoders; a
// decoded message re-encodes and decodes to an equal one.
func FuzzDecodeMessage(f *testing.F) {
	u, _ := proto.Marshal(&pb.CacheStateUpdate{ReplicaId: "r", ModelId: "m", TenantId: "t", HashScheme: "vllm", TimestampUs: 1,
		Prefixes: []*pb.PrefixEntry{{PrefixHash: []byte{1, 2, 3, 4, 5, 6, 7, 8}, TokenCount: 16, Tier: pb.CacheTier_CACHE_TIER_T1}}})
	e, _ := proto.Marshal(&pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, ReplicaId: "r", PrefixHash: []byte{1}})
	f.Add(u, true)
	f.Add(e, false)
	f.Add([]byte{0xff, 0xff}, true)
	f.Fuzz(func(t *testing.T, data []byte, update bool) {
		var m proto.Message
		var err error
		if update {
			var u pb.CacheStateUpdate
			err, m = DecodeUpdate(data, &u), &u
		} else {
			var e pb.CacheEvent
			err, m = DecodeEvent(data, &e), &e
		}
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		again, err := proto.Marshal(m)
		if err != nil {
			t.Fatalf("cannot re-encode: %v", err)
		}
		m2 := m.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(again, m2); err != nil || !proto.Equal(m, m2) {
			t.Fatalf("re-decode differs: %v", err)
		}
	})
}
