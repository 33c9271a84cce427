package tokenizer

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// adversarialJSON has added tokens built to break unsafe cuts: one that
// contains another with more text after it, lstrip, rstrip, single_word, a
// normalized one, and a plain one.
func adversarialJSON(t testing.TB) []byte {
	return byteLevelJSON(t, [][2]string{{"a", "b"}, {"Ċ", "Ċ"}, {"Ġ", "a"}}, false, false, []map[string]any{
		{"id": 300, "content": "<a>", "special": true},
		{"id": 301, "content": "<a>b", "special": true},
		{"id": 302, "content": "<l>", "special": true, "lstrip": true},
		{"id": 303, "content": "<r>", "special": true, "rstrip": true},
		{"id": 304, "content": "<w>", "special": true, "single_word": true},
		{"id": 305, "content": "<n>", "special": false, "normalized": true},
		{"id": 306, "content": "<|eot|>", "special": true},
		{"id": 307, "content": "x<|eot|>", "special": true},
		{"id": 308, "content": "<|s|>", "special": true},
	}, nil)
}

var cutPieces = []string{"<a>", "<a>b", "<l>", "<r>", "<w>", "<n>", "<|eot|>", "x<|eot|>", "<|s|>", "<|s|", "<a", "a", "b", "ab", "x",
	" ", "  ", "\n", "\n\n", "word", "Hello", "'s", "1234", "é", "🙂", "\t"}

func randomCutText(r *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		b.WriteString(cutPieces[r.IntN(len(cutPieces))])
	}
	return b.String()
}

func TestCutSafeTokens(t *testing.T) {
	tk := mustLoad(t, adversarialJSON(t))
	want := map[string]bool{"<a>": false, "<a>b": true, "<l>": true, "<r>": false, "<w>": false, "<n>": false,
		"<|eot|>": true, "x<|eot|>": true, "<|s|>": true}
	for _, tok := range tk.added.tokens {
		if tok.cutSafe != want[tok.content] {
			t.Errorf("%q: cutSafe %v, want %v", tok.content, tok.cutSafe, want[tok.content])
		}
	}
}

// checkIncremental: for texts sharing a prefix, the ids of the prefix up to
// the last cut of the first text plus EncodeFrom of the second from that
// cut are the ids of the second, and the cuts agree too.
func checkIncremental(t *testing.T, tk *Tokenizer, prev, next string) bool {
	t.Helper()
	ctx := context.Background()
	prevIDs, prevCuts, err := tk.EncodeFrom(ctx, nil, prev, Cut{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if full, _ := tk.Encode(ctx, nil, prev); !slices.Equal(full, prevIDs) {
		t.Fatalf("EncodeFrom from 0 differs from Encode for %q", prev)
	}
	lcp := 0
	for lcp < len(prev) && lcp < len(next) && prev[lcp] == next[lcp] {
		lcp++
	}
	var from Cut
	for _, c := range prevCuts {
		if c.Offset <= lcp {
			from = c
		}
	}
	want, wantCuts, err := tk.EncodeFrom(ctx, nil, next, Cut{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Clone(prevIDs[:from.Tokens])
	got, gotCuts, err := tk.EncodeFrom(ctx, got, next, from, nil)
	if err != nil {
		t.Fatalf("EncodeFrom(%q, %+v): %v", next, from, err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("prev %q\nnext %q\ncut %+v: incremental %v\nwant %v", prev, next, from, got, want)
		return false
	}
	var after []Cut
	for _, c := range wantCuts {
		if c.Offset > from.Offset {
			after = append(after, c)
		}
	}
	if !slices.Equal(gotCuts, after) {
		t.Errorf("next %q from %+v: cuts %v, want %v", next, from, gotCuts, after)
		return false
	}
	return true
}

func TestIncrementalRandom(t *testing.T) {
	tk := mustLoad(t, adversarialJSON(t))
	r := rand.New(rand.NewPCG(1, 2))
	n := 3000
	if testing.Short() || raceEnabled {
		n = 300
	}
	for range n {
		prev := randomCutText(r, 1+r.IntN(30))
		// next keeps a random prefix of prev (cut anywhere, even inside
		// a token) and goes on with other text.
		keep := r.IntN(len(prev) + 1)
		next := prev[:keep] + randomCutText(r, r.IntN(20))
		if !checkIncremental(t, tk, prev, next) {
			return
		}
	}
}

// TestIncrementalAdversarial: the cases each unsafe token would break.
func TestIncrementalAdversarial(t *testing.T) {
	tk := mustLoad(t, adversarialJSON(t))
	for _, c := range [][2]string{
		{"hi<a>", "hi<a>b"},            // <a> is a prefix of <a>b
		{"hi<|eot|>", "hi<|eot|>"},     // identical
		{"hix<|eot|>", "hix<|eot|>yo"}, // x<|eot|> is longest, and safe
		{"hi<r>", "hi<r>   there"},     // rstrip eats what follows
		{"hi<w>", "hi<w>word"},         // single_word depends on what follows
		{"a<|s|>", "a<|s|>  <l>x"},     // lstrip stops at the cut
		{"a<|s|>", "a<|s|><w> b"},      // single_word looks before the cut
		{"a<|s|>\n", "a<|s|>\n\nb"},    // whitespace joins across the end of prev
		{"ab<|s|>a", "ab<|s|>ab"},      // a merge across the end of prev
		{"<n>a<|s|>", "<n>a<|s|><n>b"}, // normalized tokens after the cut
	} {
		checkIncremental(t, tk, c[0], c[1])
	}
}

func TestEncodeFromRejectsBadCut(t *testing.T) {
	tk := mustLoad(t, adversarialJSON(t))
	ctx := context.Background()
	ids, cuts, err := tk.EncodeFrom(ctx, nil, "hi<|s|>yo", Cut{}, nil)
	if err != nil || len(cuts) != 1 {
		t.Fatalf("cuts %v, %v", cuts, err)
	}
	for _, bad := range []Cut{
		{Offset: cuts[0].Offset - 1, Tokens: cuts[0].Tokens, ID: cuts[0].ID}, // not at the token's end
		{Offset: cuts[0].Offset, Tokens: cuts[0].Tokens, ID: 303},            // another (unsafe) token
		{Offset: 100, Tokens: cuts[0].Tokens, ID: cuts[0].ID},                // past the text
	} {
		if _, _, err := tk.EncodeFrom(ctx, slices.Clone(ids[:cuts[0].Tokens]), "hi<|s|>yo", bad, nil); err != ErrBadCut {
			t.Errorf("%+v: got %v, want ErrBadCut", bad, err)
		}
	}
	if _, _, err := tk.EncodeFrom(ctx, nil, "hi<|s|>yo", cuts[0], nil); err != ErrBadCut {
		t.Errorf("dst without the prefix ids: got %v, want ErrBadCut", err)
	}
}
