// Package tokenizer is an exact, pure-Go implementation of the Hugging Face
// tokenizer.json formats that common served models use: byte-level BPE with
// regex pre-tokenizers (Llama 3, Qwen 2/3, DeepSeek V3) and
// SentencePiece-style BPE with byte fallback (Llama 2, Gemma). It encodes
// only (no offsets, no decoding) and never adds the post-processor's special
// tokens: a chat template already writes them, and engines tokenize the
// rendered prompt with add_special_tokens=false.
//
// Pipeline of Encode, as in Hugging Face tokenizers:
//
//  1. the text is split on added tokens (leftmost-longest, lstrip, rstrip,
//     single_word; normalized ones are matched after normalization);
//  2. every other segment is normalized (NFC, NFKC, Prepend, Replace,
//     Lowercase, Strip, Sequence) and pre-tokenized (Split with a string or
//     regex, ByteLevel, Metaspace, Digits, Sequence);
//  3. each piece is encoded by the BPE model (merge ranks, ignore_merges,
//     byte fallback, unk and fuse_unk), with a per-word cache.
//
// A Tokenizer is immutable after Load and safe for concurrent use.
// Components this package does not implement make Load fail with an error
// naming them, so an unsupported tokenizer fails open instead of producing
// wrong ids.
package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// ErrUnsupported marks a tokenizer.json that uses a component this package
// does not implement.
var ErrUnsupported = errors.New("tokenizer: unsupported component")

// Tokenizer encodes text into token ids.
type Tokenizer struct {
	added addedVocab
	norm  normalizer // nil: none
	pre   preTokenizer
	model *bpe

	// vocabSize is the number of ids (vocab plus added tokens).
	vocabSize int
}

// Token returns the id of an added token or vocabulary entry, spelled as in
// tokenizer.json.
func (t *Tokenizer) Token(content string) (uint32, bool) {
	for i := range t.added.tokens {
		if t.added.tokens[i].content == content {
			return t.added.tokens[i].id, true
		}
	}
	id, ok := t.model.rawVocab[content]
	return id, ok
}

// Load parses a tokenizer.json document.
func Load(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("cannot parse tokenizer.json: %w", err)
	}
	t := &Tokenizer{}
	var err error
	if t.norm, err = buildNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	byteLevel := false
	if t.pre, byteLevel, err = buildPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.model, err = buildBPE(f.Model, byteLevel); err != nil {
		return nil, err
	}
	if err := t.added.build(f.AddedTokens, t.norm); err != nil {
		return nil, err
	}
	t.vocabSize = len(t.model.rawVocab)
	for _, a := range t.added.tokens {
		if int(a.id) >= t.vocabSize {
			t.vocabSize = int(a.id) + 1
		}
	}
	return t, nil
}

type fileJSON struct {
	AddedTokens  []addedTokenJSON `json:"added_tokens"`
	Normalizer   json.RawMessage  `json:"normalizer"`
	PreTokenizer json.RawMessage  `json:"pre_tokenizer"`
	Model        json.RawMessage  `json:"model"`
}

type addedTokenJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// scratch is the per-call working memory, pooled.
type scratch struct {
	pieces, pieces2 []string
	m               matcher
	syms            []symbol
	heap            []mergeCand
	segs            []segment
	segs2           []segment
	spans           []span
	seqA, seqB      []string
	// firstSection is set while the text at offset 0 is pre-tokenized
	// (Metaspace prepend_scheme "first").
	firstSection bool
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// ctxCheckEvery is how many bytes of input are encoded between two checks
// of the context.
const ctxCheckEvery = 64 << 10

// Encode appends the ids of text to dst. It honors ctx between segments of
// about 64 KiB.
func (t *Tokenizer) Encode(ctx context.Context, dst []uint32, text string) ([]uint32, error) {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	sc.segs = t.added.split(sc.segs[:0], text, false)
	done := 0
	for _, seg := range sc.segs {
		if seg.id >= 0 {
			dst = append(dst, uint32(seg.id))
			continue
		}
		s := text[seg.start:seg.end]
		sc.firstSection = seg.start == 0
		if t.norm != nil {
			s = t.norm.normalize(s)
		}
		if t.added.hasNormalized {
			sc.segs2 = t.added.split(sc.segs2[:0], s, true)
			for _, seg2 := range sc.segs2 {
				if seg2.id >= 0 {
					dst = append(dst, uint32(seg2.id))
					continue
				}
				var err error
				if dst, err = t.encodeNormalized(ctx, dst, s[seg2.start:seg2.end], sc, &done); err != nil {
					return dst, err
				}
			}
			continue
		}
		var err error
		if dst, err = t.encodeNormalized(ctx, dst, s, sc, &done); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

func (t *Tokenizer) encodeNormalized(ctx context.Context, dst []uint32, s string, sc *scratch, done *int) ([]uint32, error) {
	if s == "" {
		return dst, nil
	}
	sc.pieces = append(sc.pieces[:0], s)
	if t.pre != nil {
		sc.pieces, sc.pieces2 = t.pre.preTokenize(sc.pieces2[:0], sc.pieces, sc), sc.pieces
	}
	for _, p := range sc.pieces {
		var err error
		if dst, err = t.model.encodeWord(dst, p, sc); err != nil {
			return dst, err
		}
		*done += len(p)
		if *done >= ctxCheckEvery {
			*done = 0
			if err := ctx.Err(); err != nil {
				return dst, err
			}
		}
	}
	return dst, nil
}

// ---- added tokens ----

type addedToken struct {
	id      uint32
	content string
	// match is what the text is matched against: content, normalized for
	// normalized tokens.
	match                      string
	special, normalized        bool
	lstrip, rstrip, singleWord bool
}

type addedVocab struct {
	tokens []addedToken
	// byFirst[b] lists the tokens of each pass starting with byte b, longest
	// first; pass 0 matches the raw text, pass 1 the normalized text.
	byFirst       [2][256][]int
	hasNormalized bool
	has           [2]bool
	// onlyFirst[p] is the one first byte of every token of pass p when
	// they share it (e.g. '<'), for a strings.IndexByte scan; -1 otherwise.
	onlyFirst [2]int
}

// segment is a piece of text: an added token (id >= 0) or text to encode.
type segment struct {
	start, end int
	id         int64
}

func (a *addedVocab) build(toks []addedTokenJSON, norm normalizer) error {
	for _, tj := range toks {
		if tj.Content == "" {
			return fmt.Errorf("cannot load added token %d: empty content", tj.ID)
		}
		a.tokens = append(a.tokens, addedToken{
			id: tj.ID, content: tj.Content, match: tj.Content, special: tj.Special, normalized: tj.Normalized,
			lstrip: tj.LStrip, rstrip: tj.RStrip, singleWord: tj.SingleWord,
		})
		// A normalized token is matched in normalized text by its
		// normalized content, as Hugging Face builds its second trie.
		if tok := &a.tokens[len(a.tokens)-1]; tok.normalized && norm != nil {
			if tok.match = norm.normalize(tok.content); tok.match == "" {
				return fmt.Errorf("cannot load added token %d: empty once normalized", tj.ID)
			}
		}
	}
	for i, tok := range a.tokens {
		pass := 0
		// As in Hugging Face tokenizers, the passes partition the tokens
		// by their normalized flag alone.
		if tok.normalized {
			pass = 1
			a.hasNormalized = true
		}
		a.has[pass] = true
		b := tok.match[0]
		a.byFirst[pass][b] = append(a.byFirst[pass][b], i)
	}
	for p := range a.byFirst {
		a.onlyFirst[p] = -1
		for b := range a.byFirst[p] {
			if len(a.byFirst[p][b]) == 0 {
				continue
			}
			if a.onlyFirst[p] == -1 {
				a.onlyFirst[p] = b
			} else {
				a.onlyFirst[p] = -2
			}
		}
		if a.onlyFirst[p] < 0 {
			a.onlyFirst[p] = -1
		}
		for b := range a.byFirst[p] {
			l := a.byFirst[p][b]
			// insertion sort, longest first (stable for equal lengths)
			for i := 1; i < len(l); i++ {
				for j := i; j > 0 && len(a.tokens[l[j]].match) > len(a.tokens[l[j-1]].match); j-- {
					l[j], l[j-1] = l[j-1], l[j]
				}
			}
		}
	}
	return nil
}

// split appends the segments of s: added tokens of the pass and the text
// between them (leftmost-longest matching, like the Aho-Corasick automaton
// of Hugging Face tokenizers).
func (a *addedVocab) split(dst []segment, s string, normalizedPass bool) []segment {
	pass := 0
	if normalizedPass {
		pass = 1
	}
	if !a.has[pass] {
		return append(dst, segment{0, len(s), -1})
	}
	idx := &a.byFirst[pass]
	only := a.onlyFirst[pass]
	startOffset := 0
	for pos := 0; pos < len(s); {
		if only >= 0 {
			i := strings.IndexByte(s[pos:], byte(only))
			if i < 0 {
				break
			}
			pos += i
		}
		cands := idx[s[pos]]
		if len(cands) == 0 {
			pos++
			continue
		}
		best := -1
		for _, c := range cands {
			if strings.HasPrefix(s[pos:], a.tokens[c].match) {
				best = c
				break
			}
		}
		if best < 0 {
			pos++
			continue
		}
		tok := &a.tokens[best]
		start, stop := pos, pos+len(tok.match)
		pos = stop
		if tok.singleWord {
			if (start > 0 && endsWithWord(s[:start])) || (stop < len(s) && startsWithWord(s[stop:])) {
				continue
			}
		}
		if tok.lstrip {
			ns := len(strings.TrimRightFunc(s[:start], unicode.IsSpace))
			start = max(ns, startOffset)
		}
		if tok.rstrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
			pos = stop
		}
		if startOffset < start {
			dst = append(dst, segment{startOffset, start, -1})
		}
		dst = append(dst, segment{start, stop, int64(tok.id)})
		startOffset = stop
	}
	if startOffset < len(s) {
		dst = append(dst, segment{startOffset, len(s), -1})
	}
	return dst
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return isWordRune(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return isWordRune(r)
}

// typed reads the "type" of a component.
func typed(raw json.RawMessage) (string, bool, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, nil
	}
	var h struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return "", false, fmt.Errorf("cannot parse component: %w", err)
	}
	return h.Type, true, nil
}

// patternJSON is {"String": "..."} or {"Regex": "..."}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}
