package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMetaspaceFirstOnlyAtOffsetZero: with prepend_scheme "first", only the
// text at original offset 0 gets the replacement prepended, as in Hugging
// Face (NormalizedString::offsets_original().0 == 0): the text after an
// added token does not, whichever pass matched the token.
func TestMetaspaceFirstOnlyAtOffsetZero(t *testing.T) {
	vocab := map[string]int{"<unk>": 0, "▁": 1, "a": 2, "b": 3, "▁a": 4, "▁b": 5, "<x>": 6, "<y>": 7}
	doc := map[string]any{
		"added_tokens": []map[string]any{
			{"id": 6, "content": "<x>", "special": true, "normalized": false},
			{"id": 7, "content": "<y>", "special": false, "normalized": true},
		},
		"normalizer":    nil,
		"pre_tokenizer": map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"▁ a", "▁ b"}, "unk_token": "<unk>"},
	}
	data, _ := json.Marshal(doc)
	tk := mustLoad(t, data)
	for _, c := range []struct {
		text string
		want []uint32
	}{
		{"a", []uint32{4}},
		{"a<x>b", []uint32{4, 6, 3}}, // raw-text (pass 0) token
		{"a<y>b", []uint32{4, 7, 3}}, // normalized (pass 1) token
		{"<y>b", []uint32{7, 3}},     // the token is at 0, "b" is not
		{"a<y>b<y>a", []uint32{4, 7, 3, 7, 2}},
	} {
		if got := encode(t, tk, c.text); !slices.Equal(got, c.want) {
			t.Errorf("%q: got %v, want %v", c.text, got, c.want)
		}
	}
}

// TestUnsupportedModelNamed: a model this package does not implement is
// refused with ErrUnsupported and an error naming its type, whatever the
// shape of its vocab; a model without a type is refused as such.
func TestUnsupportedModelNamed(t *testing.T) {
	for _, c := range []struct{ doc, name string }{
		{`{"model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.5]]}}`, `"Unigram"`},
		{`{"model": {"type": "WordLevel", "vocab": {"a": 0, "<unk>": 1}, "unk_token": "<unk>"}}`, `"WordLevel"`},
		{`{"model": {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "a"}}`, `"WordPiece"`},
		{`{"model": {"vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}`, "no type"},
		{`{"model": {"vocab": [["a", 0.0]]}}`, "no type"},
	} {
		_, err := Load([]byte(c.doc))
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s: got %v, want ErrUnsupported naming %s", c.doc, err, c.name)
		}
	}
}

// manyTokensJSON is a byte-level tokenizer with n special tokens sharing a
// long prefix, as DeepSeek V3's 800 "<｜...｜>" tokens or Llama 3's
// "<|reserved_special_token_N|>" do.
func manyTokensJSON(t testing.TB, n int) []byte {
	var added []map[string]any
	for i := range n {
		added = append(added, map[string]any{"id": 256 + i, "content": fmt.Sprintf("<|reserved_special_token_%d|>", i), "special": true})
	}
	return byteLevelJSON(t, nil, false, false, added, nil)
}

// nearMatches is text full of prefixes of the added tokens that never
// complete one.
func nearMatches(size int) string {
	var b strings.Builder
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, "<|reserved_special_token_%d| x", i%1000)
	}
	return b.String()
}

// TestAddedTokenSplitLinear: splitting text on added tokens costs time
// linear in the text, independent of how many tokens share a prefix: text
// full of near-matches splits about as fast with 1000 tokens sharing a
// 25-byte prefix as with one of them. The bound is a ratio within one run,
// so a loaded machine does not make it flaky: a scan that tries every
// candidate at every '<' is about a thousand times slower here.
func TestAddedTokenSplitLinear(t *testing.T) {
	one, many := mustLoad(t, manyTokensJSON(t, 1)), mustLoad(t, manyTokensJSON(t, 1000))
	near := nearMatches(256 << 10)
	measure := func(tk *Tokenizer) time.Duration {
		best := time.Duration(1 << 62)
		for range 5 {
			start := time.Now()
			segs := tk.added.split(nil, near, 0, 0)
			if d := time.Since(start); d < best {
				best = d
			}
			if len(segs) != 1 {
				t.Fatalf("%d segments, want 1 (no match)", len(segs))
			}
		}
		return best
	}
	measure(one) // warm up
	t1, tn := measure(one), measure(many)
	t.Logf("1 token %v, 1000 tokens %v (ratio %.1f)", t1, tn, float64(tn)/float64(t1))
	if tn > 20*t1+time.Millisecond {
		t.Errorf("1000 tokens took %v, 1 token %v: splitting is not linear in the text alone", tn, t1)
	}
}

// BenchmarkAddedTokenSplit: the added-token split of 256 KiB with 1000
// tokens sharing a 25-byte prefix, on near-matches and on plain text.
func BenchmarkAddedTokenSplit(b *testing.B) {
	tk := mustLoad(b, manyTokensJSON(b, 1000))
	near := nearMatches(256 << 10)
	for _, c := range []struct{ name, text string }{
		{"near-matches", near},
		{"plain", strings.Repeat("ab cd efgh ", len(near)/11+1)[:len(near)]},
		{"matches", strings.Repeat("<|reserved_special_token_7|> hi ", len(near)/32)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.text)))
			var segs []segment
			for b.Loop() {
				segs = tk.added.split(segs[:0], c.text, 0, 0)
			}
		})
	}
}

func TestEncodeNearMatchesExact(t *testing.T) {
	tk := mustLoad(t, manyTokensJSON(t, 1000))
	got := encode(t, tk, "<|reserved_special_token_12|><|reserved_special_token_1|>x<|reserved_special_token_999|")
	if got[0] != 256+12 || got[1] != 256+1 || len(got) < 4 {
		t.Fatalf("got %v", got)
	}
}
