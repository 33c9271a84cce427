package workload

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite golden files under testdata")

func TestRequestTokens(t *testing.T) {
	f := func(blocks, blockSize, input int, wantLast int, wantPrefix []int) {
		t.Helper()
		r := Request{Blocks: make([]uint64, blocks), BlockSize: blockSize, InputTokens: input}
		if err := r.Validate(); err != nil {
			t.Fatalf("Validate: %v", err)
		}
		if got := r.BlockTokens(blocks - 1); got != wantLast {
			t.Fatalf("BlockTokens(last) = %d, want %d", got, wantLast)
		}
		for n, want := range wantPrefix {
			if got := r.PrefixTokens(n); got != want {
				t.Fatalf("PrefixTokens(%d) = %d, want %d", n, got, want)
			}
		}
	}
	f(1, 512, 1, 1, []int{0, 1})
	f(1, 512, 512, 512, []int{0, 512})
	f(3, 512, 1100, 76, []int{0, 512, 1024, 1100})
	f(3, 16, 48, 16, []int{0, 16, 32, 48})
}

func TestRequestValidate(t *testing.T) {
	f := func(r Request) {
		t.Helper()
		if err := r.Validate(); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Validate(%+v) = %v, want ErrInvalid", r, err)
		}
	}
	f(Request{Blocks: []uint64{1}, BlockSize: 0, InputTokens: 1})
	f(Request{BlockSize: 16, InputTokens: 1})
	f(Request{Blocks: []uint64{1, 2}, BlockSize: 16, InputTokens: 16}) // second block empty
	f(Request{Blocks: []uint64{1}, BlockSize: 16, InputTokens: 17})    // overflows
	f(Request{Blocks: []uint64{1}, BlockSize: 16, InputTokens: 0})
	f(Request{Blocks: []uint64{1}, BlockSize: 16, InputTokens: 5, OutputTokens: -1})
	f(Request{Blocks: []uint64{1}, BlockSize: 16, InputTokens: 5, Arrival: -time.Second})

	ok := Request{Blocks: []uint64{1}, BlockSize: 16, InputTokens: 5}
	late := ok
	late.Arrival = time.Second
	if err := ValidateStream([]Request{late, ok}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ValidateStream accepted decreasing arrivals: %v", err)
	}
	if err := ValidateStream([]Request{ok, late, late}); err != nil {
		t.Fatalf("ValidateStream: %v", err)
	}
}

func TestReadTraceTiny(t *testing.T) {
	reqs, err := LoadTrace(filepath.Join("testdata", "tiny_trace.jsonl"), MooncakeBlockSize, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{ID: 0, Arrival: 0, Blocks: []uint64{0, 1}, BlockSize: 512, InputTokens: 1000, OutputTokens: 10},
		{ID: 1, Arrival: 5 * time.Millisecond, Blocks: []uint64{0, 1, 2}, BlockSize: 512, InputTokens: 1536, OutputTokens: 20},
		{ID: 2, Arrival: 5 * time.Millisecond, Blocks: []uint64{0, 3}, BlockSize: 512, InputTokens: 600, OutputTokens: 0},
		{ID: 3, Arrival: 1200 * time.Millisecond, Blocks: []uint64{4}, BlockSize: 512, InputTokens: 512, OutputTokens: 7},
	}
	if len(reqs) != len(want) {
		t.Fatalf("got %d requests, want %d", len(reqs), len(want))
	}
	for i := range want {
		if !equalRequest(reqs[i], want[i]) {
			t.Fatalf("request %d = %+v, want %+v", i, reqs[i], want[i])
		}
	}
	if got := reqs[0].BlockTokens(1); got != 488 {
		t.Fatalf("partial last block holds %d tokens, want 488", got)
	}
	if got := reqs[2].BlockTokens(1); got != 88 {
		t.Fatalf("partial last block holds %d tokens, want 88", got)
	}

	limited, err := LoadTrace(filepath.Join("testdata", "tiny_trace.jsonl"), MooncakeBlockSize, 2)
	if err != nil || len(limited) != 2 {
		t.Fatalf("limit 2: got %d requests, err %v", len(limited), err)
	}
}

func TestReadTraceErrors(t *testing.T) {
	f := func(in, wantLine string) {
		t.Helper()
		_, err := ReadTrace(strings.NewReader(in), 512, 0)
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("ReadTrace(%q) = %v, want ErrInvalid", in, err)
		}
		if !strings.Contains(err.Error(), wantLine) {
			t.Fatalf("ReadTrace(%q) = %v, want it to name %q", in, err, wantLine)
		}
	}
	good := `{"timestamp": 10, "input_length": 10, "output_length": 1, "hash_ids": [0]}` + "\n"
	f("{", "line 1")
	f(good+`{"timestamp": 11, "input_length": 513, "output_length": 1, "hash_ids": [0]}`, "line 2")
	f(good+`{"timestamp": 11, "input_length": 512, "output_length": 1, "hash_ids": [0, 1]}`, "line 2")
	f(good+`{"timestamp": 11, "input_length": 0, "output_length": 1, "hash_ids": []}`, "line 2")
	f(good+`{"timestamp": 9, "input_length": 10, "output_length": 1, "hash_ids": [0]}`, "line 2")
	f(good+`{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [0]}`, "line 2")
	f(good+`{"timestamp": 11, "input_length": 10, "output_length": -1, "hash_ids": [0]}`, "line 2")
	if _, err := ReadTrace(strings.NewReader(good), 0, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("block size 0 accepted: %v", err)
	}
	if _, err := LoadTrace(filepath.Join(t.TempDir(), "missing.jsonl"), 512, 0); err == nil {
		t.Fatal("LoadTrace of a missing file succeeded")
	}
}

func equalRequest(a, b Request) bool {
	return a.ID == b.ID && a.Arrival == b.Arrival && slices.Equal(a.Blocks, b.Blocks) &&
		a.BlockSize == b.BlockSize && a.InputTokens == b.InputTokens && a.OutputTokens == b.OutputTokens
}

func roundTrip(t *testing.T, reqs []Request) []Request {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteTrace(&buf, reqs); err != nil {
		t.Fatal(err)
	}
	bs := 1
	if len(reqs) > 0 {
		bs = reqs[0].BlockSize
	}
	got, err := ReadTrace(&buf, bs, 0)
	if err != nil {
		t.Fatalf("reading back: %v", err)
	}
	return got
}

func TestWriteReadRoundTrip(t *testing.T) {
	reqs, err := DefaultChat().Generate()
	if err != nil {
		t.Fatal(err)
	}
	for i := range reqs { // the format keeps whole milliseconds only
		reqs[i].Arrival = reqs[i].Arrival.Truncate(time.Millisecond)
	}
	got := roundTrip(t, reqs)
	if len(got) != len(reqs) {
		t.Fatalf("round trip: %d requests, want %d", len(got), len(reqs))
	}
	for i := range reqs {
		if !equalRequest(got[i], reqs[i]) {
			t.Fatalf("round trip request %d = %+v, want %+v", i, got[i], reqs[i])
		}
	}
}

// sampleChat is the generator behind testdata/sample_trace.jsonl: a small
// multi-turn workload in the Mooncake format (512-token blocks).
func sampleChat() Chat {
	return Chat{
		Seed: 7, Sessions: 40, Turns: Range{2, 6}, SessionRate: 0.5, ThinkTime: 20 * time.Second,
		SystemPromptTokens: 1500, UserTokens: Range{100, 3000}, OutputTokens: Range{20, 600}, BlockSize: 512,
	}
}

// TestSampleTraceGolden keeps testdata/sample_trace.jsonl, the small trace
// other packages' tests replay, equal to what its generator produces.
// Regenerate with: go test ./bench/workload -run SampleTrace -rewrite
func TestSampleTraceGolden(t *testing.T) {
	reqs, err := sampleChat().Generate()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteTrace(&buf, reqs); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "sample_trace.jsonl")
	if *rewrite {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("%s is stale; rerun with -rewrite", path)
	}
	got, err := LoadTrace(path, MooncakeBlockSize, 0)
	if err != nil || len(got) != len(reqs) {
		t.Fatalf("LoadTrace(sample): %d requests, err %v", len(got), err)
	}
}

func FuzzReadTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}`))
	f.Add([]byte("{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": [9]}\n\n{\"timestamp\": 1, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [9]}"))
	f.Add([]byte(`{"timestamp": 0, "input_length": 513, "hash_ids": [0]}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := ReadTrace(bytes.NewReader(data), 512, 0)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if err := ValidateStream(reqs); err != nil {
			t.Fatalf("ReadTrace returned an invalid stream: %v", err)
		}
		got := roundTrip(t, reqs)
		for i := range reqs {
			if !equalRequest(got[i], reqs[i]) {
				t.Fatalf("round trip request %d = %+v, want %+v", i, got[i], reqs[i])
			}
		}
	})
}
