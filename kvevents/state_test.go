package kvevents

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	"github.com/inferencecache/inferencecache/kvevents/wire"
)

func sampleState() *State {
	return &State{
		ReplicaID: "pod-a", TenantID: "ns", ModelID: "m", HashScheme: "vllm", BlockSize: 16,
		Started: true, Next: 1234, LastSum: 0xdeadbeef, HistoryFrom: 7,
		SavedAt: time.Date(2026, 12, 1, 6, 0, 0, 123456000, time.UTC),
		Entries: []StateEntry{
			{Engine: 1, Key: 11, Tokens: 16, Media: mediaGPU},
			{Engine: 2, Key: 22, Tokens: 32, Media: mediaGPU | mediaOther, Adapter: "sql"},
			{Engine: 1<<64 - 1, Key: 33, Tokens: 48, Media: mediaOther, Adapter: "chat"},
			{Engine: 4, Key: 44, Tokens: 16, Media: mediaGPU, Adapter: "sql"},
		},
	}
}

func encodeState(t testing.TB, s *State) []byte {
	t.Helper()
	b, err := s.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// resign recomputes the trailing checksum of an edited state file, so a
// test reaches the field checks behind it.
func resign(b []byte) []byte {
	b = slices.Clone(b)
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	return b
}

func TestStateRoundTrip(t *testing.T) {
	for _, s := range []*State{sampleState(), {ReplicaID: "r", SavedAt: time.UnixMicro(0).UTC()}} {
		b := encodeState(t, s)
		got, err := DecodeState(b, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Entries) == 0 {
			s.Entries = []StateEntry{}
		}
		if !reflect.DeepEqual(got, s) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, s)
		}
	}
}

// TestStateRejects: every damaged, truncated or out-of-bound file is an
// error wrapping ErrStateInvalid, never a panic or a partial state.
func TestStateRejects(t *testing.T) {
	good := encodeState(t, sampleState())
	// Offsets in good: header fields, then the identity strings.
	const flagsAt, entriesLen = 10, 4 * stateEntryLen
	entriesAt := len(good) - 4 - entriesLen // first entry
	edit := func(f func(b []byte)) []byte {
		b := slices.Clone(good)
		f(b)
		return resign(b)
	}
	cases := map[string][]byte{
		"empty":          nil,
		"magic":          resign(append([]byte("NOTSTATE"), good[8:]...)),
		"version 2":      edit(func(b []byte) { binary.LittleEndian.PutUint16(b[8:], 2) }),
		"unknown flag":   edit(func(b []byte) { binary.LittleEndian.PutUint16(b[flagsAt:], 0x8001) }),
		"bit flip":       func() []byte { b := slices.Clone(good); b[len(b)/2] ^= 1; return b }(),
		"trailing bytes": resign(append(slices.Clone(good[:len(good)-4]), 0, 0, 0, 0, 0)),
		"zero tokens":    edit(func(b []byte) { binary.LittleEndian.PutUint32(b[entriesAt+16:], 0) }),
		"huge tokens":    edit(func(b []byte) { binary.LittleEndian.PutUint32(b[entriesAt+16:], 1<<31) }),
		"no media":       edit(func(b []byte) { b[entriesAt+20] = 0 }),
		"unknown media":  edit(func(b []byte) { b[entriesAt+20] = 4 }),
		"adapter index":  edit(func(b []byte) { binary.LittleEndian.PutUint32(b[entriesAt+21:], 3) }),
		"duplicate hash": edit(func(b []byte) { copy(b[entriesAt+stateEntryLen:], b[entriesAt:entriesAt+8]) }),
		"entry count":    edit(func(b []byte) { binary.LittleEndian.PutUint32(b[entriesAt-4:], 5) }),
		"too many names": edit(func(b []byte) {
			// The adapter count precedes the names "", "sql", "chat".
			at := entriesAt - 4 - (2 + 0) - (2 + 3) - (2 + 4) - 4
			binary.LittleEndian.PutUint32(b[at:], maxStateNames+1)
		}),
	}
	for name, b := range cases {
		if _, err := DecodeState(b, 0); !errors.Is(err, ErrStateInvalid) {
			t.Errorf("%s: err %v, want ErrStateInvalid", name, err)
		}
	}
	for n := range len(good) {
		if _, err := DecodeState(good[:n], 0); !errors.Is(err, ErrStateInvalid) {
			t.Fatalf("truncated to %d bytes: err %v", n, err)
		}
	}
	if _, err := DecodeState(good, 3); !errors.Is(err, ErrStateInvalid) {
		t.Errorf("4 entries with a bound of 3: err %v", err)
	}
	big := &State{ReplicaID: string(make([]byte, maxStateString+1))}
	if _, err := big.AppendBinary(nil); err == nil {
		t.Error("an identity string over the bound encoded")
	}
}

// TestWriteStateFileAtomic: the file is replaced whole, no temporary file
// is left behind, and a failed write leaves the old file.
func TestWriteStateFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	if _, err := ReadStateFile(path, 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	s := sampleState()
	if err := WriteStateFile(path, encodeState(t, s)); err != nil {
		t.Fatal(err)
	}
	s.Next = 99
	if err := WriteStateFile(path, encodeState(t, s)); err != nil {
		t.Fatal(err)
	}
	got, err := ReadStateFile(path, 0)
	if err != nil || got.Next != 99 {
		t.Fatalf("read back: %+v %v", got, err)
	}
	names, _ := os.ReadDir(dir)
	if len(names) != 1 {
		t.Fatalf("files left in the directory: %v", names)
	}
	if err := WriteStateFile(filepath.Join(dir, "missing", "state"), []byte("x")); err == nil {
		t.Fatal("a write into a missing directory succeeded")
	}
	if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadStateFile(path, 0); !errors.Is(err, ErrStateInvalid) {
		t.Fatalf("garbage file: %v", err)
	}
}

// TestIndexStateRestore: AppendState then Restore gives the same index
// (content and recency order), and chaining continues from restored
// blocks; a bound keeps the most recent entries.
func TestIndexStateRestore(t *testing.T) {
	x := NewIndex(16, 0, map[int64]string{1: "sql"})
	lora := int64(1)
	x.Store(&wire.Event{Kind: wire.KindBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: toks(32, 0), BlockSize: 16}, nil)
	x.Store(&wire.Event{Kind: wire.KindBlockStored, BlockHashes: []uint64{3}, TokenIDs: toks(16, 100), BlockSize: 16, HasLoRAID: true, LoRAID: lora}, nil)
	x.Store(&wire.Event{Kind: wire.KindBlockStored, BlockHashes: []uint64{2}, TokenIDs: toks(16, 16), BlockSize: 16, Medium: []byte("CPU"),
		HasParent: true, ParentHash: 1}, nil)
	st := x.AppendState(nil)
	if len(st) != 3 || st[0].Engine != 2 || st[0].Media != mediaGPU|mediaOther {
		t.Fatalf("state %+v", st)
	}

	y := NewIndex(16, 0, map[int64]string{1: "sql"})
	if n := y.Restore(st); n != 3 {
		t.Fatalf("restored %d", n)
	}
	if !slices.Equal(y.AppendSnapshot(nil), x.AppendSnapshot(nil)) || !reflect.DeepEqual(y.AppendState(nil), st) {
		t.Fatal("restored index differs")
	}
	ev := &wire.Event{Kind: wire.KindBlockStored, BlockHashes: []uint64{9}, TokenIDs: toks(16, 32), BlockSize: 16, HasParent: true, ParentHash: 2}
	px, rx := x.Store(ev, nil)
	py, ry := y.Store(ev, nil)
	if rx != "" || ry != "" || !slices.Equal(px, py) || px[0].Tokens != 48 {
		t.Fatalf("chaining on a restored block: %v %q vs %v %q", py, ry, px, rx)
	}

	small := NewIndex(16, 2, nil)
	if n := small.Restore(st); n != 2 {
		t.Fatalf("bounded restore kept %d", n)
	}
	if got := small.AppendState(nil); got[0].Engine != st[0].Engine || got[1].Engine != st[1].Engine {
		t.Fatalf("bounded restore kept %+v, want the two most recent", got)
	}

	// Adopt moves the content over and empties the source.
	z := NewIndex(16, 0, nil)
	z.Store(&wire.Event{Kind: wire.KindBlockStored, BlockHashes: []uint64{77}, TokenIDs: toks(16, 7), BlockSize: 16}, nil)
	z.Adopt(y)
	if y.Len() != 0 || z.Len() != 4 {
		t.Fatalf("after Adopt: source %d, target %d", y.Len(), z.Len())
	}
}

// sumPayload is a batch the size of wire's BenchmarkDecodeBatch payload:
// events BlockStored events of blocks blocks each (block size 16), chained,
// with a medium and a lora_name, in the array layout.
func sumPayload(t testing.TB, events, blocks int) []byte {
	t.Helper()
	b := fakeengine.Batch{TS: 1700000000.5}
	for e := range events {
		hashes := make([]uint64, blocks)
		for i := range hashes {
			hashes[i] = uint64(e*blocks+i) * 0x9e3779b97f4a7c15
		}
		parent := uint64(e)
		b.Events = append(b.Events, fakeengine.Event{Kind: fakeengine.BlockStored, BlockHashes: hashes, Parent: &parent,
			TokenIDs: toks(blocks*16, uint32(e*1000)), BlockSize: 16, Medium: "GPU", LoRAName: "adapter-a"})
	}
	p, err := fakeengine.Encoding{Layout: fakeengine.LayoutArray}.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// BenchmarkPayloadSum: the checksum every sequenced batch now costs (kept
// to recognize the batch in a replay), next to wire's BenchmarkDecodeBatch
// payload of 32 events × 16 blocks.
func BenchmarkPayloadSum(b *testing.B) {
	payload := sumPayload(b, 32, 16)
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	var sum uint32
	for b.Loop() {
		sum ^= payloadSum(payload)
	}
	_ = sum
}

// TestPayloadSumAllocs: the per-batch checksum allocates nothing.
func TestPayloadSumAllocs(t *testing.T) {
	payload := sumPayload(t, 4, 16)
	if n := testing.AllocsPerRun(100, func() { _ = payloadSum(payload) }); n != 0 {
		t.Fatalf("payloadSum allocates %v times", n)
	}
}
