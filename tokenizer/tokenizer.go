// Package tokenizer is an exact, pure-Go implementation of the Hugging Face
// tokenizer.json formats that common served models use: byte-level BPE with
// regex pre-tokenizers (Llama 3, Qwen 2/3, DeepSeek V3) and
// SentencePiece-style BPE with byte fallback (Llama 2, Gemma). It encodes
// only (no offsets, no decoding). Encode adds no special tokens (a chat
// template writes them; engines tokenize a rendered chat prompt with
// add_special_tokens=false); EncodeSpecial adds the post-processor's, as
// engines do for a completion prompt. EncodeFrom tokenizes a text from a
// Cut of a text that shares its prefix, with the same ids as Encode.
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
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	post  postProcessor

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
	t.post = buildPostProcessor(f.PostProcessor)
	t.vocabSize = len(t.model.rawVocab)
	for _, a := range t.added.tokens {
		if int(a.id) >= t.vocabSize {
			t.vocabSize = int(a.id) + 1
		}
	}
	return t, nil
}

type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	Model         json.RawMessage  `json:"model"`
	PostProcessor json.RawMessage  `json:"post_processor"`
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
	// firstSection is set while the text at original offset 0 is
	// pre-tokenized (Metaspace prepend_scheme "first").
	firstSection bool
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// ctxCheckEvery is how many bytes of input are encoded between two checks
// of the context.
const ctxCheckEvery = 64 << 10

// Encode appends the ids of text to dst. It honors ctx between segments of
// about 64 KiB.
func (t *Tokenizer) Encode(ctx context.Context, dst []uint32, text string) ([]uint32, error) {
	dst, _, err := t.encodeFrom(ctx, dst, text, 0, nil, false)
	return dst, err
}

// Cut is a point of a text where its tokenization splits cleanly: the end
// of an added token that no tokenizer stage can join with what follows
// (see CutSafe). The ids of text[:Offset] are the first Tokens ids of the
// text's tokenization, whatever text follows Offset.
type Cut struct {
	// Offset is the byte offset in the text, just past the token.
	Offset int
	// Tokens is the number of ids before Offset.
	Tokens int
	// ID is the added token that ends at Offset.
	ID uint32
}

// ErrBadCut is returned by EncodeFrom for a cut that is not the end of a
// cut-safe added token in the text.
var ErrBadCut = errors.New("tokenizer: the cut is not at the end of a cut-safe added token of the text")

// EncodeFrom tokenizes text from a cut on and reports the text's cuts.
//
// With from the zero Cut it is Encode, and it appends every cut of text to
// cuts. Otherwise from must be a cut that an earlier EncodeFrom reported
// for a text sharing text[:from.Offset], and dst must hold that text's
// first from.Tokens ids (then len(dst) == from.Tokens): EncodeFrom appends
// the ids of the rest and the cuts after from, so that dst ends up equal
// to Encode(text), id for id (the proof is in docs/tokenizers.md).
// EncodeFrom checks that text[:from.Offset] ends with from's token and
// that the token is cut-safe; the caller guarantees the shared prefix.
func (t *Tokenizer) EncodeFrom(ctx context.Context, dst []uint32, text string, from Cut, cuts []Cut) ([]uint32, []Cut, error) {
	if from.Offset != 0 {
		i, ok := t.added.byID[from.ID]
		if !ok || !t.added.tokens[i].cutSafe || from.Offset > len(text) ||
			!strings.HasSuffix(text[:from.Offset], t.added.tokens[i].content) || len(dst) != from.Tokens {
			return dst, cuts, ErrBadCut
		}
	}
	return t.encodeFrom(ctx, dst, text, from.Offset, cuts, true)
}

func (t *Tokenizer) encodeFrom(ctx context.Context, dst []uint32, text string, from int, cuts []Cut, wantCuts bool) ([]uint32, []Cut, error) {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	sc.segs = t.added.split(sc.segs[:0], text, 0, from)
	done := 0
	for _, seg := range sc.segs {
		if seg.id >= 0 {
			dst = append(dst, uint32(seg.id))
			if wantCuts && seg.cut {
				cuts = append(cuts, Cut{Offset: seg.end, Tokens: len(dst), ID: uint32(seg.id)})
			}
			continue
		}
		s := text[seg.start:seg.end]
		sc.firstSection = seg.start == 0
		if t.norm != nil {
			s = t.norm.normalize(s)
		}
		if t.added.has[1] {
			first := sc.firstSection
			sc.segs2 = t.added.split(sc.segs2[:0], s, 1, 0)
			for _, seg2 := range sc.segs2 {
				if seg2.id >= 0 {
					dst = append(dst, uint32(seg2.id))
					continue
				}
				// Only the text at original offset 0 is first: not
				// the text after a token matched in this pass.
				sc.firstSection = first && seg2.start == 0
				var err error
				if dst, err = t.encodeNormalized(ctx, dst, s[seg2.start:seg2.end], sc, &done); err != nil {
					return dst, cuts, err
				}
			}
			continue
		}
		var err error
		if dst, err = t.encodeNormalized(ctx, dst, s, sc, &done); err != nil {
			return dst, cuts, err
		}
	}
	return dst, cuts, nil
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
	// cutSafe: the end of this token is a Cut (see CutSafe).
	cutSafe bool
}

// addedVocab splits text on the added tokens, leftmost-longest, like the
// Aho-Corasick automata of Hugging Face tokenizers (one for the raw text,
// one for normalized text). Each pass is a byte trie: at every scan
// position the longest token is found by one walk no deeper than the
// longest token, so a split costs O(len(text) × longest token) whatever the
// number of tokens sharing a prefix.
type addedVocab struct {
	tokens []addedToken
	byID   map[uint32]int
	// tries[p] holds the tokens of pass p: 0 matches the raw text (tokens
	// with normalized=false), 1 the normalized text.
	tries [2]trie
	has   [2]bool
}

// trie is a radix tree over bytes: every edge carries a label (a run of
// bytes no token ends inside), so a walk does one string compare per
// branch point. The root dispatches on the first byte through a table.
type trie struct {
	nodes []trieNode
	// root[b] is the child of the root whose label starts with b, or 0.
	root [256]int32
	// first marks the bytes a token of the trie starts with.
	first [256]bool
	// onlyFirst is the one first byte of every token when they share it
	// (e.g. '<'), for a strings.IndexByte scan; -1 otherwise.
	onlyFirst int
}

type trieNode struct {
	// label is the edge from the parent (empty for the root).
	label string
	// tok is the index (in addedVocab.tokens) of the token ending here, or
	// -1.
	tok int32
	// heads[i] is the first byte of children[i]'s label.
	heads    []byte
	children []int32
}

// buildTrie makes the radix tree of the given token strings (tokens[i] is
// the string of token index idx[i]); the first of equal strings wins.
func buildTrie(strs []string, idx []int) trie {
	// A plain byte trie first, then its single-child chains are folded
	// into labels.
	type bnode struct {
		tok  int32
		next map[byte]int32
	}
	bt := []bnode{{tok: -1}}
	for k, str := range strs {
		n := int32(0)
		for i := 0; i < len(str); i++ {
			if bt[n].next == nil {
				bt[n].next = map[byte]int32{}
			}
			nx, ok := bt[n].next[str[i]]
			if !ok {
				bt = append(bt, bnode{tok: -1})
				nx = int32(len(bt) - 1)
				bt[n].next[str[i]] = nx
			}
			n = nx
		}
		if bt[n].tok < 0 {
			bt[n].tok = int32(idx[k])
		}
	}
	tr := trie{nodes: []trieNode{{tok: bt[0].tok}}, onlyFirst: -1}
	var fold func(parent int32, from int32, label []byte)
	fold = func(parent int32, from int32, label []byte) {
		// Follow the chain while a node has one child and ends no token.
		n := from
		for bt[n].tok < 0 && len(bt[n].next) == 1 {
			for b, nx := range bt[n].next {
				label = append(label, b)
				n = nx
			}
		}
		tr.nodes = append(tr.nodes, trieNode{label: string(label), tok: bt[n].tok})
		me := int32(len(tr.nodes) - 1)
		p := &tr.nodes[parent]
		p.heads = append(p.heads, label[0])
		p.children = append(p.children, me)
		keys := make([]int, 0, len(bt[n].next))
		for b := range bt[n].next {
			keys = append(keys, int(b))
		}
		slices.Sort(keys)
		for _, b := range keys {
			fold(me, bt[n].next[byte(b)], []byte{byte(b)})
		}
	}
	keys := make([]int, 0, len(bt[0].next))
	for b := range bt[0].next {
		keys = append(keys, int(b))
	}
	slices.Sort(keys)
	for _, b := range keys {
		fold(0, bt[0].next[byte(b)], []byte{byte(b)})
	}
	for i, h := range tr.nodes[0].heads {
		tr.root[h] = tr.nodes[0].children[i]
		tr.first[h] = true
	}
	if len(tr.nodes[0].heads) == 1 {
		tr.onlyFirst = int(tr.nodes[0].heads[0])
	}
	return tr
}

// longest returns the longest token that s starts with (index in tokens)
// and its length, or -1.
func (tr *trie) longest(s string) (int, int) {
	if len(s) == 0 || len(tr.nodes) == 0 {
		return -1, 0
	}
	n := tr.root[s[0]]
	best, bestLen, off := -1, 0, 0
	for n != 0 {
		nd := &tr.nodes[n]
		if !strings.HasPrefix(s[off:], nd.label) {
			break
		}
		off += len(nd.label)
		if nd.tok >= 0 {
			best, bestLen = int(nd.tok), off
		}
		if off >= len(s) {
			break
		}
		i := bytes.IndexByte(nd.heads, s[off])
		if i < 0 {
			break
		}
		n = nd.children[i]
	}
	return best, bestLen
}

// segment is a piece of text: an added token (id >= 0) or text to encode.
type segment struct {
	start, end int
	id         int64
	// cut: the segment is a cut-safe token.
	cut bool
}

func (a *addedVocab) build(toks []addedTokenJSON, norm normalizer) error {
	a.byID = make(map[uint32]int, len(toks))
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
	var strs [2][]string
	var idx [2][]int
	for i, tok := range a.tokens {
		if _, dup := a.byID[tok.id]; !dup {
			a.byID[tok.id] = i
		}
		// As in Hugging Face tokenizers, the passes partition the tokens
		// by their normalized flag alone.
		pass := 0
		if tok.normalized {
			pass = 1
		}
		a.has[pass] = true
		strs[pass] = append(strs[pass], tok.match)
		idx[pass] = append(idx[pass], i)
	}
	for p := range a.tries {
		a.tries[p] = buildTrie(strs[p], idx[p])
	}
	a.markCutSafe()
	return nil
}

// markCutSafe decides which tokens end a Cut: a raw-text (pass 0) token
// without rstrip or single_word, that no other pass-0 token contains with
// more text after it (so no match can start before its end and reach past
// it). docs/tokenizers.md has the argument.
func (a *addedVocab) markCutSafe() {
	for i := range a.tokens {
		tok := &a.tokens[i]
		if tok.normalized || tok.rstrip || tok.singleWord {
			continue
		}
		safe := true
		for j := range a.tokens {
			o := &a.tokens[j]
			if j == i || o.normalized {
				continue
			}
			// The first occurrence is the only one if it ends o.
			if k := strings.Index(o.match, tok.match); k >= 0 && k+len(tok.match) < len(o.match) {
				safe = false
				break
			}
		}
		tok.cutSafe = safe
	}
}

// split appends the segments of s[from:] for a pass: added tokens and the
// text between them, leftmost-longest as Hugging Face's
// AddedVocabulary::find_matches (lstrip never reaches before the end of the
// previous segment, nor before from; single_word looks at the text around
// the match, s[:from] included).
func (a *addedVocab) split(dst []segment, s string, pass, from int) []segment {
	if !a.has[pass] {
		if from < len(s) {
			dst = append(dst, segment{start: from, end: len(s), id: -1})
		}
		return dst
	}
	tr := &a.tries[pass]
	only := tr.onlyFirst
	startOffset := from
	for pos := from; pos < len(s); {
		if only >= 0 {
			i := strings.IndexByte(s[pos:], byte(only))
			if i < 0 {
				break
			}
			pos += i
		} else if !tr.first[s[pos]] {
			pos++
			continue
		}
		best, n := tr.longest(s[pos:])
		if best < 0 {
			pos++
			continue
		}
		tok := &a.tokens[best]
		start, stop := pos, pos+n
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
			dst = append(dst, segment{start: startOffset, end: start, id: -1})
		}
		dst = append(dst, segment{start: start, end: stop, id: int64(tok.id), cut: pass == 0 && tok.cutSafe})
		startOffset = stop
	}
	if startOffset < len(s) {
		dst = append(dst, segment{start: startOffset, end: len(s), id: -1})
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

// CutOffsets appends the offsets of text's cuts (the Offset of each Cut
// EncodeFrom would report) without encoding: one added-token scan.
func (t *Tokenizer) CutOffsets(dst []int, text string) []int {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	sc.segs = t.added.split(sc.segs[:0], text, 0, 0)
	for _, seg := range sc.segs {
		if seg.id >= 0 && seg.cut {
			dst = append(dst, seg.end)
		}
	}
	return dst
}
