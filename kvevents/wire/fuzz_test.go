package wire

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "regenerate the seeds under testdata/fuzz (FuzzDecode)")

// fuzzSeeds are the kept seed corpus: both event layouts, both envelopes,
// int and byte hashes, unknown events and fields, and broken inputs.
func fuzzSeeds(t testing.TB) map[string][]byte {
	seeds := map[string][]byte{
		"array_batch_array_events": benchPayload(t, 2, 2, false),
		"array_batch_map_events":   benchPayload(t, 2, 2, true),
		"map_batch": newMP(t).mapn(3).str("ts").f(1).str("events").arr(2).
			arr(3).str("BlockRemoved").ints(1, 2).str("CPU").
			mapn(1).str("type").str("AllBlocksCleared").
			str("data_parallel_rank").u(0).bytes(),
		"byte_hashes": newMP(t).arr(2).f(0).arr(1).arr(5).str("BlockStored").
			arr(1).bin([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}).bin([]byte{9, 9}).ints(seqTokens(16, 0)...).u(16).bytes(),
		"negative_hash_lora": newMP(t).arr(2).f(0).arr(1).arr(7).str("BlockStored").
			arr(1).i(-42).null().ints(seqTokens(16, 3)...).u(16).u(1).null().bytes(),
		"unknown_event": newMP(t).arr(2).f(0).arr(2).arr(2).str("Nope").arr(1).arr(0).
			mapn(2).str("type").u(7).str("x").mapn(1).str("y").null().bytes(),
		"truncated":   benchPayload(t, 1, 1, false)[:20],
		"not_a_batch": []byte{0xc1, 0x00},
	}
	return seeds
}

// FuzzDecode: no input may panic the decoder, and a successful decode is
// reproducible with a reused Batch. (kvevents' FuzzApply feeds the same
// seeds through the stages behind it.)
func FuzzDecode(f *testing.F) {
	if *rewrite {
		dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			f.Fatal(err)
		}
		for name, p := range fuzzSeeds(f) {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", p)
			if err := os.WriteFile(filepath.Join(dir, "seed_"+name), []byte(body), 0o644); err != nil {
				f.Fatal(err)
			}
		}
	}
	for _, p := range fuzzSeeds(f) {
		f.Add(p)
	}
	d1, d2 := NewDecoder(), NewDecoder()
	var b1, b2 Batch
	f.Fuzz(func(t *testing.T, payload []byte) {
		err := d1.Decode(payload, &b1)
		if err != nil {
			if DecodeReason(err) == "other" {
				t.Fatalf("error without a reason: %v", err)
			}
			return
		}
		// Decode again into a batch that held something else.
		_ = d2.Decode([]byte{0x92, 0x01, 0x91, 0x91, 0xa1, 'x'}, &b2)
		if err := d2.Decode(payload, &b2); err != nil {
			t.Fatalf("second decode failed: %v", err)
		}
		if (b1.TS != b2.TS && !(math.IsNaN(b1.TS) && math.IsNaN(b2.TS))) || len(b1.Events) != len(b2.Events) {
			t.Fatalf("decodes differ: %+v vs %+v", b1, b2)
		}
		for i := range b1.Events {
			e1, e2 := &b1.Events[i], &b2.Events[i]
			if e1.Kind != e2.Kind || !slices.Equal(e1.BlockHashes, e2.BlockHashes) || !slices.Equal(e1.TokenIDs, e2.TokenIDs) ||
				string(e1.LoRAName) != string(e2.LoRAName) || string(e1.Medium) != string(e2.Medium) {
				t.Fatalf("event %d differs: %+v vs %+v", i, e1, e2)
			}
		}
	})
}
