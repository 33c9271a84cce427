package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// byteLevelJSON builds a small byte-level tokenizer.json: every byte, the
// given merges (in the "a b" form, or as pairs when pairs is set), the
// Llama 3 Split pattern, and the added tokens.
func byteLevelJSON(t testing.TB, merges [][2]string, pairs, ignoreMerges bool, added []map[string]any, normalizer any) []byte {
	t.Helper()
	enc := map[byte]rune{}
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			enc[byte(b)] = rune(b)
		} else {
			enc[byte(b)] = rune(256 + n)
			n++
		}
	}
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(enc[byte(b)])] = b
	}
	var ms []any
	for _, m := range merges {
		vocab[m[0]+m[1]] = len(vocab)
		if pairs {
			ms = append(ms, []string{m[0], m[1]})
		} else {
			ms = append(ms, m[0]+" "+m[1])
		}
	}
	doc := map[string]any{
		"added_tokens": added,
		"normalizer":   normalizer,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": llama3Pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": ms, "ignore_merges": ignoreMerges},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustLoad(t testing.TB, data []byte) *Tokenizer {
	t.Helper()
	tk, err := Load(data)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func encode(t testing.TB, tk *Tokenizer, s string) []uint32 {
	t.Helper()
	ids, err := tk.Encode(context.Background(), nil, s)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestMergeOrder: merges apply by rank, ties leftmost, like Hugging Face.
func TestMergeOrder(t *testing.T) {
	// ids: bytes 0-255, then 256 "aa", 257 "aaa"... in merge order.
	f := func(merges [][2]string, in string, want ...uint32) {
		t.Helper()
		for _, pairs := range []bool{false, true} {
			tk := mustLoad(t, byteLevelJSON(t, merges, pairs, false, nil, nil))
			if got := encode(t, tk, in); !slices.Equal(got, want) {
				t.Errorf("merges %v pairs=%v on %q: got %v, want %v", merges, pairs, in, got, want)
			}
		}
	}
	f([][2]string{{"a", "a"}}, "aaa", 256, 'a')
	f([][2]string{{"a", "a"}}, "aaaa", 256, 256)
	f([][2]string{{"a", "b"}, {"b", "c"}}, "abc", 256, 'c')
	f([][2]string{{"b", "c"}, {"a", "b"}}, "abc", 'a', 256)
	f([][2]string{{"a", "b"}, {"ab", "c"}, {"b", "c"}}, "abc", 257)
	f(nil, "héllo", 'h', 0xC3, 0xA9, 'l', 'l', 'o')
}

func TestIgnoreMerges(t *testing.T) {
	// "abc" is in the vocab only through the merges (b c) then (a bc);
	// with a higher-priority (a b) merge it is unreachable by merging, but
	// ignore_merges takes the whole word from the vocab.
	merges := [][2]string{{"a", "b"}, {"b", "c"}, {"a", "bc"}}
	if got := encode(t, mustLoad(t, byteLevelJSON(t, merges, false, false, nil, nil)), "abc"); !slices.Equal(got, []uint32{256, 'c'}) {
		t.Errorf("without ignore_merges: %v", got)
	}
	if got := encode(t, mustLoad(t, byteLevelJSON(t, merges, false, true, nil, nil)), "abc"); !slices.Equal(got, []uint32{258}) {
		t.Errorf("with ignore_merges: %v", got)
	}
}

func TestAddedTokens(t *testing.T) {
	added := []map[string]any{
		{"id": 300, "content": "<|x|>", "special": true},
		{"id": 301, "content": "<|x|>y", "special": true}, // longest wins
		{"id": 302, "content": "[L]", "special": true, "lstrip": true},
		{"id": 303, "content": "[R]", "special": true, "rstrip": true},
		{"id": 304, "content": "word", "special": false, "single_word": true},
		{"id": 305, "content": "NORM", "special": false, "normalized": true},
	}
	tk := mustLoad(t, byteLevelJSON(t, nil, false, false, added, map[string]any{"type": "Lowercase"}))
	f := func(in string, want ...uint32) {
		t.Helper()
		if got := encode(t, tk, in); !slices.Equal(got, want) {
			t.Errorf("%q: got %v, want %v", in, got, want)
		}
	}
	f("<|x|>", 300)
	f("<|x|>y<|x|>", 301, 300)
	f("a<|x|", 'a', '<', '|', 'x', '|')
	f("a  [L]b", 'a', 302, 'b')
	f("a[R]  b", 'a', 303, 'b')
	f("a word b", 'a', ' ', 304, ' ', 'b')
	f("swordfish", 's', 'w', 'o', 'r', 'd', 'f', 'i', 's', 'h')
	// normalized tokens match the normalized text, with their content
	// normalized too (as Hugging Face builds its second trie)
	f("NORM", 305)
	f("xnorm", 'x', 305)
	f("<|X|>", '<', '|', 'x', '|', '>')
	if id, ok := tk.Token("<|x|>"); !ok || id != 300 {
		t.Errorf("Token: %d %v", id, ok)
	}
}

func TestSplitBehaviors(t *testing.T) {
	// Matches of "-" in "a-b--c": Hugging Face's documented examples.
	spans := []span{{0, 1, false}, {1, 2, true}, {2, 3, false}, {3, 4, true}, {4, 5, true}, {5, 6, false}}
	s := "a-b--c"
	for _, tc := range []struct {
		b    splitBehavior
		want []string
	}{
		{behRemoved, []string{"a", "b", "c"}},
		{behIsolated, []string{"a", "-", "b", "-", "-", "c"}},
		{behMergedWithPrevious, []string{"a-", "b-", "-", "c"}},
		{behMergedWithNext, []string{"a", "-b", "-", "-c"}},
		{behContiguous, []string{"a", "-", "b", "--", "c"}},
	} {
		if got := applyBehavior(nil, s, spans, tc.b); !slices.Equal(got, tc.want) {
			t.Errorf("behavior %d: got %q, want %q", tc.b, got, tc.want)
		}
	}
}

// sentencePieceJSON is a Llama 2-style tokenizer: Prepend + Replace
// normalizers, no pre-tokenizer, byte fallback.
func sentencePieceJSON(t testing.TB, fallback bool, pre any) []byte {
	t.Helper()
	vocab := map[string]int{"<unk>": 0, "<s>": 1}
	for b := 0; b < 256; b++ {
		vocab[fmt.Sprintf("<0x%02X>", b)] = 2 + b
	}
	for _, s := range []string{"▁", "h", "i", "▁h", "▁hi", "1", "2"} {
		vocab[s] = len(vocab)
	}
	doc := map[string]any{
		"added_tokens": []map[string]any{{"id": 1, "content": "<s>", "special": true}},
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"},
		}},
		"pre_tokenizer": pre,
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"▁ h", "▁h i"},
			"unk_token": "<unk>", "byte_fallback": fallback, "fuse_unk": true},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSentencePiece(t *testing.T) {
	tk := mustLoad(t, sentencePieceJSON(t, true, nil))
	// ▁=258 h=259 i=260 ▁h=261 ▁hi=262; "é" is C3 A9 -> <0xC3>=2+0xC3
	if got, want := encode(t, tk, "hi hé"), []uint32{262, 261, 2 + 0xC3, 2 + 0xA9}; !slices.Equal(got, want) {
		t.Errorf("byte fallback: got %v, want %v", got, want)
	}
	// Prepend applies to each segment between added tokens.
	if got, want := encode(t, tk, "<s>hi"), []uint32{1, 262}; !slices.Equal(got, want) {
		t.Errorf("after <s>: got %v, want %v", got, want)
	}
	tk = mustLoad(t, sentencePieceJSON(t, false, nil))
	if got, want := encode(t, tk, "hééh"), []uint32{261, 0, 259}; !slices.Equal(got, want) {
		t.Errorf("fused unk: got %v, want %v", got, want)
	}
	tk = mustLoad(t, sentencePieceJSON(t, false, map[string]any{"type": "Digits", "individual_digits": true}))
	if got, want := encode(t, tk, "12"), []uint32{258, 263, 264}; !slices.Equal(got, want) {
		t.Errorf("digits: got %v, want %v", got, want)
	}
}

func TestMetaspace(t *testing.T) {
	p := &preMetaspace{replacement: "▁", prepend: "always", split: true}
	var sc scratch
	if got, want := p.preTokenize(nil, []string{"hi there  you"}, &sc), []string{"▁hi", "▁there", "▁", "▁you"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestNFC(t *testing.T) {
	tk := mustLoad(t, byteLevelJSON(t, nil, false, false, nil, map[string]any{"type": "NFC"}))
	if got, want := encode(t, tk, "e\u0301"), encode(t, tk, "é"); !slices.Equal(got, want) {
		t.Errorf("NFC: %v vs %v", got, want)
	}
}

func TestLoadErrors(t *testing.T) {
	for name, doc := range map[string]string{
		"not json":         `{`,
		"wordpiece":        `{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`,
		"empty vocab":      `{"model": {"type": "BPE", "vocab": {}}}`,
		"bad merge":        `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}}`,
		"merge not vocab":  `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a a"]}}`,
		"unk not in vocab": `{"model": {"type": "BPE", "vocab": {"a": 0}, "unk_token": "<unk>"}}`,
		"precompiled":      `{"normalizer": {"type": "Precompiled"}, "model": {"type": "BPE", "vocab": {"a": 0}}}`,
		"bad regex":        `{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated"}, "model": {"type": "BPE", "vocab": {"a": 0}}}`,
		"bad behavior":     `{"pre_tokenizer": {"type": "Split", "pattern": {"String": "x"}, "behavior": "Nope"}, "model": {"type": "BPE", "vocab": {"a": 0}}}`,
		"byte-level holes": `{"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"a": 0}}}`,
		"suffix":           `{"model": {"type": "BPE", "vocab": {"a": 0}, "end_of_word_suffix": "</w>"}}`,
		"empty added":      `{"added_tokens": [{"id": 1, "content": ""}], "model": {"type": "BPE", "vocab": {"a": 0}}}`,
	} {
		if _, err := Load([]byte(doc)); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	_, err := Load([]byte(`{"model": {"type": "Unigram", "vocab": {"a": 0}}}`))
	if !errors.Is(err, ErrUnsupported) {
		t.Errorf("Unigram: %v, want ErrUnsupported", err)
	}
}

func TestEncodeHonorsContext(t *testing.T) {
	tk := mustLoad(t, byteLevelJSON(t, nil, false, false, nil, nil))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tk.Encode(ctx, nil, strings.Repeat("word ", 1<<15)); !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
}

// FuzzLoad: any tokenizer.json either fails to load or encodes any text
// without panicking.
func FuzzLoad(f *testing.F) {
	f.Add(byteLevelJSON(f, [][2]string{{"a", "b"}}, false, false, []map[string]any{{"id": 300, "content": "<x>", "special": true}}, nil), "ab<x> c")
	f.Add(sentencePieceJSON(f, true, nil), "hi hé")
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0}, "unk_token": "a"}}`), "abc")
	f.Fuzz(func(t *testing.T, data []byte, text string) {
		tk, err := Load(data)
		if err != nil {
			return
		}
		_, _ = tk.Encode(context.Background(), nil, text)
	})
}
