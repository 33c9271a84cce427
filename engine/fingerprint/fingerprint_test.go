package fingerprint

import (
	"encoding/base64"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "regenerate testdata/golden_vectors.json from this implementation")

type goldenHash struct {
	Dec   string `json:"dec"`
	B64BE string `json:"b64be"`
}

type goldenVector struct {
	Name      string       `json:"name"`
	Tokens    []uint32     `json:"tokens"`
	BlockSize int          `json:"block_size"`
	Parent    *goldenHash  `json:"parent_prefix"`
	Content   []goldenHash `json:"content_hashes"`
	Prefix    []goldenHash `json:"prefix_hashes"`
}

type goldenFile struct {
	Scheme  map[string]string `json:"scheme"`
	Vectors []goldenVector    `json:"vectors"`
}

func toGolden(h uint64) goldenHash {
	return goldenHash{Dec: strconv.FormatUint(h, 10), B64BE: base64.StdEncoding.EncodeToString(AppendWire(nil, h))}
}

func seq(from, n uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = from + uint32(i)
	}
	return out
}

// goldenInputs are the published vectors. The first five names and inputs
// match the fixtures other implementations of this contract publish, so the
// file doubles as a cross-implementation check.
func goldenInputs() []goldenVector {
	parent := toGolden(0xDEADBEEF)
	return []goldenVector{
		{Name: "single_full_block", Tokens: seq(1, 16), BlockSize: 16},
		{Name: "partial_tail_dropped", Tokens: seq(100, 20), BlockSize: 16},
		{Name: "two_block_chain", Tokens: seq(1, 32), BlockSize: 16},
		{Name: "multi_block_chain", Tokens: seq(0, 64), BlockSize: 16},
		{Name: "parent_chain", Tokens: seq(50, 32), BlockSize: 16, Parent: &parent},
		{Name: "partial_only_no_blocks", Tokens: seq(0, 10), BlockSize: 16},
		{Name: "large_block_streamed", Tokens: seq(7, 300), BlockSize: 128},
		{Name: "max_uint32_tokens", Tokens: []uint32{^uint32(0), 0, ^uint32(0), 1}, BlockSize: 2},
	}
}

func compute(v goldenVector) goldenVector {
	var parent uint64
	if v.Parent != nil {
		parent, _ = strconv.ParseUint(v.Parent.Dec, 10, 64)
	}
	v.Content, v.Prefix = []goldenHash{}, []goldenHash{}
	for i := 0; i < Blocks(len(v.Tokens), v.BlockSize); i++ {
		v.Content = append(v.Content, toGolden(Content(v.Tokens[i*v.BlockSize:(i+1)*v.BlockSize])))
	}
	for _, h := range AppendChain(nil, v.Tokens, v.BlockSize, parent, v.Parent != nil) {
		v.Prefix = append(v.Prefix, toGolden(h))
	}
	return v
}

func TestGoldenVectors(t *testing.T) {
	path := filepath.Join("testdata", "golden_vectors.json")
	if *rewrite {
		f := goldenFile{Scheme: map[string]string{
			"algorithm":      "XXH3-64",
			"seed":           "1337",
			"token_encoding": "each token id as little-endian u32",
			"prefix_chain":   "prefix[0] = content[0], or XXH3(le_u64(parent) ++ le_u64(content[0])) with a parent; prefix[i] = XXH3(le_u64(prefix[i-1]) ++ le_u64(content[i]))",
			"wire_encoding":  "8-byte big-endian; b64be is base64 of those bytes",
			"partial_blocks": "a trailing partial block is dropped",
		}}
		for _, v := range goldenInputs() {
			f.Vectors = append(f.Vectors, compute(v))
		}
		b, err := json.MarshalIndent(f, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (regenerate with -rewrite): %v", err)
	}
	var f goldenFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Vectors) != len(goldenInputs()) {
		t.Fatalf("golden file has %d vectors, want %d", len(f.Vectors), len(goldenInputs()))
	}
	for _, want := range f.Vectors {
		got := compute(want)
		if len(got.Prefix) != len(want.Prefix) || len(got.Content) != len(want.Content) {
			t.Fatalf("%s: got %d/%d hashes, want %d/%d", want.Name, len(got.Content), len(got.Prefix), len(want.Content), len(want.Prefix))
		}
		for i := range want.Prefix {
			if got.Prefix[i] != want.Prefix[i] || got.Content[i] != want.Content[i] {
				t.Errorf("%s block %d: got content %v prefix %v, want %v %v", want.Name, i, got.Content[i], got.Prefix[i], want.Content[i], want.Prefix[i])
			}
		}
	}
}

// TestCrossImplementation pins values published by other implementations of
// the same contract (decimal form), so a change here is a wire break.
func TestCrossImplementation(t *testing.T) {
	f := func(tokens []uint32, blockSize int, parent uint64, hasParent bool, want ...uint64) {
		t.Helper()
		got := AppendChain(nil, tokens, blockSize, parent, hasParent)
		if len(got) != len(want) {
			t.Fatalf("got %d hashes, want %d", len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("block %d: got %d, want %d", i, got[i], want[i])
			}
		}
	}
	f(seq(1, 16), 16, 0, false, 16863443419780771464)
	f(seq(100, 20), 16, 0, false, 10823191264391160519)
	f(seq(1, 32), 16, 0, false, 16863443419780771464, 12466389667045779788)
	f(seq(0, 64), 16, 0, false, 15310707395893867146, 13769157705258532664, 11879827756109914528, 3888788807566526800)
	f(seq(50, 32), 16, 3735928559, true, 13185224009891017151, 2998384554010166533)
	f([]uint32{14990, 1879}, 2, 0, false, 2562323614806148766)
	f(seq(0, 10), 16, 0, false)
}

func TestLargeBlockMatchesStack(t *testing.T) {
	// A block hashed through the streaming path must equal one-shot hashing
	// of the same bytes.
	tokens := seq(3, 200)
	var buf []byte
	for _, tok := range tokens {
		buf = append(buf, byte(tok), byte(tok>>8), byte(tok>>16), byte(tok>>24))
	}
	if got, want := contentLarge(tokens), hashBytes(buf); got != want {
		t.Fatalf("streamed %d, one-shot %d", got, want)
	}
}

func TestWire(t *testing.T) {
	b := AppendWire(nil, 0x0102030405060708)
	if string(b) != "\x01\x02\x03\x04\x05\x06\x07\x08" {
		t.Fatalf("wire form %x", b)
	}
	if h, ok := FromWire(b); !ok || h != 0x0102030405060708 {
		t.Fatalf("FromWire = %x, %v", h, ok)
	}
	if _, ok := FromWire(b[:7]); ok {
		t.Fatal("FromWire accepted 7 bytes")
	}
	if Blocks(31, 16) != 1 || Blocks(10, 0) != 0 || Blocks(-1, 16) != 0 {
		t.Fatal("Blocks")
	}
}

func TestAppendChainAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("alloc test")
	}
	tokens := seq(0, 64*16)
	dst := make([]uint64, 0, 64)
	allocs := testing.AllocsPerRun(100, func() {
		dst = AppendChain(dst[:0], tokens, 16, 0, false)
	})
	if allocs != 0 {
		t.Fatalf("AppendChain allocates %.1f times per call", allocs)
	}
}

func FuzzChain(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0}, uint8(1), uint64(0), false)
	f.Add([]byte{}, uint8(16), uint64(7), true)
	f.Add(make([]byte, 4*70), uint8(65), uint64(1), true)
	f.Fuzz(func(t *testing.T, raw []byte, bs uint8, parent uint64, hasParent bool) {
		tokens := make([]uint32, len(raw)/4)
		for i := range tokens {
			tokens[i] = uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24
		}
		blockSize := int(bs)
		chain := AppendChain(nil, tokens, blockSize, parent, hasParent)
		if len(chain) != Blocks(len(tokens), blockSize) {
			t.Fatalf("%d hashes for %d tokens at block size %d", len(chain), len(tokens), blockSize)
		}
		// Prefix property: hashing a prefix of the tokens yields a prefix of the chain.
		if len(chain) > 1 {
			short := AppendChain(nil, tokens[:blockSize], blockSize, parent, hasParent)
			if short[0] != chain[0] {
				t.Fatal("chain is not prefix-stable")
			}
			// Suffix events: chaining the remainder from block 0 continues the chain.
			rest := AppendChain(nil, tokens[blockSize:], blockSize, chain[0], true)
			for i := range rest {
				if rest[i] != chain[i+1] {
					t.Fatalf("suffix chain diverges at %d", i)
				}
			}
		}
		for _, h := range chain {
			if back, ok := FromWire(AppendWire(nil, h)); !ok || back != h {
				t.Fatal("wire round trip")
			}
		}
	})
}
