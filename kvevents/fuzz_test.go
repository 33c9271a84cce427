package kvevents

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/inferencecache/inferencecache/kvevents/wire"
)

var rewrite = flag.Bool("rewrite", false, "regenerate the seeds under testdata/fuzz (FuzzApply, FuzzDecodeState, FuzzZMTPLimiter)")

// wireSeedDir holds wire's FuzzDecode corpus, which FuzzApply shares.
var wireSeedDir = filepath.Join("wire", "testdata", "fuzz", "FuzzDecode")

// applySeeds reads wire's FuzzDecode seed corpus ("go test fuzz v1" files
// of one []byte each).
func applySeeds(t testing.TB) map[string][]byte {
	entries, err := os.ReadDir(wireSeedDir)
	if err != nil {
		t.Fatal(err)
	}
	seeds := map[string][]byte{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(wireSeedDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) != 2 || lines[0] != "go test fuzz v1" || !strings.HasPrefix(lines[1], "[]byte(") {
			t.Fatalf("%s: not a one-[]byte fuzz seed", e.Name())
		}
		p, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		seeds[e.Name()] = []byte(p)
	}
	return seeds
}

// FuzzApply: whatever the engine wire format decodes, the stages behind it
// (positional index, processor, forwarder) take without panicking. Seeds:
// wire's FuzzDecode corpus, copied into testdata/fuzz/FuzzApply by
// -rewrite.
func FuzzApply(f *testing.F) {
	if *rewrite {
		dir := filepath.Join("testdata", "fuzz", "FuzzApply")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			f.Fatal(err)
		}
		for name, p := range applySeeds(f) {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", p)
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				f.Fatal(err)
			}
		}
	}
	for _, p := range applySeeds(f) {
		f.Add(p)
	}
	d := wire.NewDecoder()
	var b wire.Batch
	f.Fuzz(func(t *testing.T, payload []byte) {
		if err := d.Decode(payload, &b); err != nil {
			return
		}
		idx := NewIndex(16, 64, map[int64]string{1: "a"})
		fwd := NewForwarder(ForwarderConfig{ReplicaID: "r", MaxBuffered: 1 << 20}, &recSink{}, idx)
		NewProcessor(idx, fwd, len(payload)%2 == 0, nil, nil).Apply(&b)
	})
}

// stateFuzzSeeds are FuzzDecodeState's kept corpus: valid files (with and
// without entries), damaged ones, and ones whose fields break a bound
// behind a valid checksum (the fuzzer re-signs inputs when told to).
func stateFuzzSeeds(t testing.TB) map[string][]byte {
	good := encodeState(t, sampleState())
	empty := encodeState(t, &State{ReplicaID: "r", ModelID: "m"})
	return map[string][]byte{
		"good":          good,
		"empty_index":   empty,
		"truncated":     good[:len(good)/2],
		"bit_flip":      func() []byte { b := slices.Clone(good); b[40] ^= 0x10; return b }(),
		"not_a_state":   []byte("ICKVSTAT garbage"),
		"huge_counts":   resign(append(slices.Clone(empty[:len(empty)-8]), 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0)),
		"future_flags":  func() []byte { b := slices.Clone(good); b[10] = 0xff; return resign(b) }(),
		"bad_media_sig": func() []byte { b := slices.Clone(good); b[len(b)-4-stateEntryLen+20] = 9; return resign(b) }(),
	}
}

// FuzzDecodeState: no input may panic the state decoder; whatever decodes
// re-encodes to a file that decodes to the same state, and restores into
// an index. With resign, the input's trailing checksum is recomputed so the
// fuzzer reaches the field checks behind it.
func FuzzDecodeState(f *testing.F) {
	if *rewrite {
		dir := filepath.Join("testdata", "fuzz", "FuzzDecodeState")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			f.Fatal(err)
		}
		for name, p := range stateFuzzSeeds(f) {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\nbool(false)\n", p)
			if err := os.WriteFile(filepath.Join(dir, "seed_"+name), []byte(body), 0o644); err != nil {
				f.Fatal(err)
			}
		}
	}
	for _, p := range stateFuzzSeeds(f) {
		f.Add(p, false)
		f.Add(p, true)
	}
	f.Fuzz(func(t *testing.T, data []byte, resignIt bool) {
		if resignIt && len(data) >= 4 {
			data = resign(data)
		}
		s, err := DecodeState(data, 1<<12)
		if err != nil {
			if !errors.Is(err, ErrStateInvalid) {
				t.Fatalf("error not wrapping ErrStateInvalid: %v", err)
			}
			return
		}
		again, err := s.AppendBinary(nil)
		if err != nil {
			t.Fatalf("a decoded state does not encode: %v", err)
		}
		s2, err := DecodeState(again, 1<<12)
		if err != nil || !reflect.DeepEqual(s, s2) {
			t.Fatalf("re-encoded state differs: %v\n%+v\n%+v", err, s, s2)
		}
		x := NewIndex(16, 1<<12, nil)
		if n := x.Restore(s.Entries); n != len(s.Entries) || x.Len() != n {
			t.Fatalf("restored %d of %d entries", n, len(s.Entries))
		}
	})
}
