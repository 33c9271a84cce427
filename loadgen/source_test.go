package loadgen

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/inferencecache/inferencecache/bench/workload"
)

func TestSourceKinds(t *testing.T) {
	for _, kind := range []string{WorkloadChat, WorkloadRAG, WorkloadSharedPrompt} {
		a, err := newSource(WorkloadConfig{Kind: kind, Size: 200}, 5)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		b, _ := newSource(WorkloadConfig{Kind: kind, Size: 200}, 5)
		if len(a.reqs) < 150 || len(a.reqs) != len(b.reqs) {
			t.Fatalf("%s: %d and %d requests for size 200", kind, len(a.reqs), len(b.reqs))
		}
		if err := workload.ValidateStream(a.reqs); err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		for i := range a.reqs {
			if a.hash(0, a.reqs[i].Blocks[0]) != b.hash(0, b.reqs[i].Blocks[0]) {
				t.Fatalf("%s: request %d hashes differently for the same seed", kind, i)
			}
		}
	}
	tr, err := newSource(WorkloadConfig{Kind: WorkloadTrace, TracePath: "../bench/workload/testdata/sample_trace.jsonl"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.reqs) != 164 || tr.reqs[0].BlockSize != workload.MooncakeBlockSize {
		t.Fatalf("sample trace: %d requests of block size %d", len(tr.reqs), tr.reqs[0].BlockSize)
	}
	for _, c := range []WorkloadConfig{{Kind: "bursty"}, {Kind: WorkloadTrace}, {Kind: WorkloadChat, Size: -1},
		{Kind: WorkloadTrace, TracePath: "testdata/does-not-exist.jsonl"}} {
		if _, err := newSource(c, 1); err == nil {
			t.Errorf("newSource(%+v) succeeded", c)
		} else if c.TracePath == "" && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("newSource(%+v) error %v, want ErrInvalidConfig", c, err)
		}
	}
}

func TestSourceHashing(t *testing.T) {
	s := &source{salt: mix64(9)}
	seen := make(map[uint64]uint64, 200_000)
	for id := uint64(0); id < 100_000; id++ {
		for epoch := uint64(0); epoch < 2; epoch++ {
			h := s.hash(epoch, id)
			if prev, dup := seen[h]; dup {
				t.Fatalf("hash collision: (%d, %d) and %d", epoch, id, prev)
			}
			seen[h] = id
		}
	}
	other := &source{salt: mix64(10)}
	if s.hash(0, 1) == other.hash(0, 1) {
		t.Fatal("different seeds give the same hash")
	}
}

func TestChainBuf(t *testing.T) {
	s := &source{salt: 1}
	full := workload.Request{Blocks: []uint64{7, 8, 9}, BlockSize: 16, InputTokens: 48}
	partial := workload.Request{Blocks: []uint64{7, 8, 9}, BlockSize: 16, InputTokens: 40}
	tiny := workload.Request{Blocks: []uint64{7}, BlockSize: 16, InputTokens: 5}
	var b chainBuf
	for _, c := range []struct {
		req  *workload.Request
		want int
	}{{&full, 3}, {&partial, 2}, {&tiny, 0}, {&full, 3}} {
		hashes, counts, keys := b.build(s, c.req, 3)
		if len(hashes) != c.want || len(counts) != c.want || len(keys) != c.want {
			t.Fatalf("%d blocks, want %d", len(hashes), c.want)
		}
		for j := range hashes {
			if got := binary.BigEndian.Uint64(hashes[j]); got != s.hash(3, c.req.Blocks[j]) || got != keys[j] {
				t.Fatalf("block %d: wire %x, key %x, want %x", j, got, keys[j], s.hash(3, c.req.Blocks[j]))
			}
			if counts[j] != 16 || cap(hashes[j]) != 8 {
				t.Fatalf("block %d: count %d, cap %d", j, counts[j], cap(hashes[j]))
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { b.build(s, &full, 1) }); n != 0 {
		t.Fatalf("a warm chainBuf.build allocates %v times", n)
	}
	hashes, counts := wireChain([]uint64{1, 2}, 512)
	if binary.BigEndian.Uint64(hashes[1]) != 2 || counts[0] != 512 {
		t.Fatalf("wireChain = %x %v", hashes, counts)
	}
}
