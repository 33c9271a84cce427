package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// ---- normalizers ----

type normalizer interface {
	normalize(s string) string
}

type normSeq []normalizer

func (n normSeq) normalize(s string) string {
	for _, x := range n {
		s = x.normalize(s)
	}
	return s
}

type normForm struct{ f norm.Form }

func (n normForm) normalize(s string) string {
	if n.f.IsNormalString(s) {
		return s
	}
	return n.f.String(s)
}

type normPrepend struct{ p string }

func (n normPrepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.p + s
}

type normReplace struct {
	lit     string // String pattern
	re      *Regex // Regex pattern
	content string
}

func (n normReplace) normalize(s string) string {
	if n.re == nil {
		if !strings.Contains(s, n.lit) {
			return s
		}
		return strings.ReplaceAll(s, n.lit, n.content)
	}
	var b strings.Builder
	last := 0
	var m matcher
	m.findAll(n.re, s, func(start, end int) {
		b.WriteString(s[last:start])
		b.WriteString(n.content)
		last = end
	})
	if last == 0 && b.Len() == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

type normLower struct{}

func (normLower) normalize(s string) string { return strings.ToLower(s) }

type normStrip struct{ left, right bool }

func (n normStrip) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

func buildNormalizer(raw json.RawMessage) (normalizer, error) {
	typ, ok, err := typed(raw)
	if err != nil || !ok {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var c struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("cannot parse Sequence normalizer: %w", err)
		}
		var seq normSeq
		for _, r := range c.Normalizers {
			n, err := buildNormalizer(r)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		switch len(seq) {
		case 0:
			return nil, nil
		case 1:
			return seq[0], nil
		}
		return seq, nil
	case "NFC":
		return normForm{norm.NFC}, nil
	case "NFD":
		return normForm{norm.NFD}, nil
	case "NFKC":
		return normForm{norm.NFKC}, nil
	case "NFKD":
		return normForm{norm.NFKD}, nil
	case "Lowercase":
		return normLower{}, nil
	case "Prepend":
		var c struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("cannot parse Prepend normalizer: %w", err)
		}
		return normPrepend{c.Prepend}, nil
	case "Strip":
		var c struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("cannot parse Strip normalizer: %w", err)
		}
		return normStrip{c.Left, c.Right}, nil
	case "Replace":
		var c struct {
			Pattern patternJSON `json:"pattern"`
			Content string      `json:"content"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("cannot parse Replace normalizer: %w", err)
		}
		n := normReplace{content: c.Content}
		switch {
		case c.Pattern.String != nil:
			if *c.Pattern.String == "" {
				return nil, fmt.Errorf("cannot load Replace normalizer: empty pattern")
			}
			n.lit = *c.Pattern.String
		case c.Pattern.Regex != nil:
			if n.re, err = CompileRegex(*c.Pattern.Regex); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("cannot load Replace normalizer: no pattern")
		}
		return n, nil
	}
	return nil, fmt.Errorf("%w: normalizer %q", ErrUnsupported, typ)
}

// ---- pre-tokenizers ----

// preTokenizer splits every input piece into pieces appended to dst.
type preTokenizer interface {
	preTokenize(dst, in []string, sc *scratch) []string
}

type preSeq []preTokenizer

func (p preSeq) preTokenize(dst, in []string, sc *scratch) []string {
	// Stages alternate between two scratch buffers; the last writes dst.
	// Sequences are flattened at load, so the buffers are not nested.
	cur := in
	for i, x := range p {
		if i == len(p)-1 {
			return x.preTokenize(dst, cur, sc)
		}
		if i%2 == 0 {
			sc.seqA = x.preTokenize(sc.seqA[:0], cur, sc)
			cur = sc.seqA
		} else {
			sc.seqB = x.preTokenize(sc.seqB[:0], cur, sc)
			cur = sc.seqB
		}
	}
	return append(dst, cur...)
}

// splitBehavior is how Split keeps the delimiters.
type splitBehavior uint8

const (
	behRemoved splitBehavior = iota
	behIsolated
	behMergedWithPrevious
	behMergedWithNext
	behContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Removed":
		return behRemoved, nil
	case "Isolated":
		return behIsolated, nil
	case "MergedWithPrevious":
		return behMergedWithPrevious, nil
	case "MergedWithNext":
		return behMergedWithNext, nil
	case "Contiguous":
		return behContiguous, nil
	}
	return 0, fmt.Errorf("%w: split behavior %q", ErrUnsupported, s)
}

type preSplit struct {
	lit      string
	re       *Regex
	fast     func(s string, pos int) int // hand-written matcher for re, or nil
	behavior splitBehavior
	invert   bool
}

// span is one piece of a split: [start,end) and whether it matched.
type span struct {
	start, end int
	match      bool
}

func (p *preSplit) preTokenize(dst, in []string, sc *scratch) []string {
	for _, s := range in {
		if p.behavior == behIsolated && !p.invert {
			dst = p.isolated(dst, s, sc)
			continue
		}
		spans := p.spans(sc.spans[:0], s, sc)
		sc.spans = spans
		dst = applyBehavior(dst, s, spans, p.behavior)
	}
	return dst
}

// isolated is the common case (every match and every gap its own piece),
// without building spans.
func (p *preSplit) isolated(dst []string, s string, sc *scratch) []string {
	last := 0
	emit := func(start, end int) {
		if last < start {
			dst = append(dst, s[last:start])
		}
		dst = append(dst, s[start:end])
		last = end
	}
	switch {
	case p.fast != nil:
		for pos := 0; pos < len(s); {
			end := p.fast(s, pos)
			if end > pos {
				emit(pos, end)
				pos = end
				continue
			}
			_, n := utf8.DecodeRuneInString(s[pos:])
			pos += n
		}
	case p.re != nil:
		sc.m.findAll(p.re, s, emit)
	default:
		findLiteral(s, p.lit, emit)
	}
	if last < len(s) {
		dst = append(dst, s[last:])
	}
	return dst
}

func findLiteral(s, lit string, fn func(start, end int)) {
	for off := 0; ; {
		i := strings.Index(s[off:], lit)
		if i < 0 {
			return
		}
		fn(off+i, off+i+len(lit))
		off += i + len(lit)
	}
}

func (p *preSplit) spans(dst []span, s string, sc *scratch) []span {
	last := 0
	emit := func(start, end int) {
		if last < start {
			dst = append(dst, span{last, start, p.invert})
		}
		dst = append(dst, span{start, end, !p.invert})
		last = end
	}
	if p.re != nil {
		sc.m.findAll(p.re, s, emit)
	} else {
		findLiteral(s, p.lit, emit)
	}
	if last < len(s) {
		dst = append(dst, span{last, len(s), p.invert})
	}
	return dst
}

// applyBehavior turns spans into pieces like Hugging Face's
// NormalizedString::split; empty pieces are dropped.
func applyBehavior(dst []string, s string, spans []span, b splitBehavior) []string {
	push := func(a, z int) {
		if a < z {
			dst = append(dst, s[a:z])
		}
	}
	switch b {
	case behRemoved:
		for _, sp := range spans {
			if !sp.match {
				push(sp.start, sp.end)
			}
		}
	case behIsolated:
		for _, sp := range spans {
			push(sp.start, sp.end)
		}
	case behMergedWithPrevious, behContiguous:
		var acc []span
		prev := false
		for _, sp := range spans {
			merge := sp.match && !prev
			if b == behContiguous {
				merge = sp.match == prev
			}
			if merge && len(acc) > 0 {
				acc[len(acc)-1].end = sp.end
			} else {
				acc = append(acc, sp)
			}
			prev = sp.match
		}
		for _, sp := range acc {
			push(sp.start, sp.end)
		}
	case behMergedWithNext:
		var acc []span
		prev := false
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.match && !prev && len(acc) > 0 {
				acc[len(acc)-1].start = sp.start
			} else {
				acc = append(acc, sp)
			}
			prev = sp.match
		}
		for i := len(acc) - 1; i >= 0; i-- {
			push(acc[i].start, acc[i].end)
		}
	}
	return dst
}

// preDigits splits digits from the rest: each digit alone
// (individual_digits) or runs of digits.
type preDigits struct{ individual bool }

func (p preDigits) preTokenize(dst, in []string, sc *scratch) []string {
	for _, s := range in {
		spans := sc.spans[:0]
		for i := 0; i < len(s); {
			r, n := utf8.DecodeRuneInString(s[i:])
			isDigit := unicode.IsDigit(r)
			spans = append(spans, span{i, i + n, isDigit})
			i += n
		}
		sc.spans = spans
		if p.individual {
			dst = applyBehavior(dst, s, mergeRuns(spans, false), behIsolated)
		} else {
			dst = applyBehavior(dst, s, mergeRuns(spans, true), behIsolated)
		}
	}
	return dst
}

// mergeRuns merges adjacent spans of equal match flag (non-matches always;
// matches when both is true).
func mergeRuns(spans []span, both bool) []span {
	out := spans[:0]
	for _, sp := range spans {
		if n := len(out); n > 0 && out[n-1].match == sp.match && (!sp.match || both) {
			out[n-1].end = sp.end
			continue
		}
		out = append(out, sp)
	}
	return out
}

// preByteLevel is ByteLevel: the optional GPT-2 split, then the byte-to-rune
// mapping, which this package folds into the model (it keys the vocabulary
// by raw bytes), so pieces stay substrings of the input.
type preByteLevel struct {
	addPrefixSpace bool
	split          *preSplit // nil unless use_regex
}

const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

func (p *preByteLevel) preTokenize(dst, in []string, sc *scratch) []string {
	if p.addPrefixSpace {
		for i, s := range in {
			if !strings.HasPrefix(s, " ") {
				in[i] = " " + s
			}
		}
	}
	if p.split == nil {
		return append(dst, in...)
	}
	return p.split.preTokenize(dst, in, sc)
}

// preMetaspace replaces spaces with the replacement rune, prepends one as
// the scheme says, and splits before each replacement.
type preMetaspace struct {
	replacement string
	prepend     string // "always", "first", "never"
	split       bool
}

func (p *preMetaspace) preTokenize(dst, in []string, sc *scratch) []string {
	for i, s := range in {
		s = strings.ReplaceAll(s, " ", p.replacement)
		if (p.prepend == "always" || (p.prepend == "first" && i == 0 && sc.firstSection)) && !strings.HasPrefix(s, p.replacement) {
			s = p.replacement + s
		}
		if !p.split {
			if s != "" {
				dst = append(dst, s)
			}
			continue
		}
		spans := sc.spans[:0]
		last := 0
		findLiteral(s, p.replacement, func(a, z int) {
			if last < a {
				spans = append(spans, span{last, a, false})
			}
			spans = append(spans, span{a, z, true})
			last = z
		})
		if last < len(s) {
			spans = append(spans, span{last, len(s), false})
		}
		sc.spans = spans
		dst = applyBehavior(dst, s, spans, behMergedWithNext)
	}
	return dst
}

// buildPreTokenizer also reports whether a ByteLevel step is present (the
// model then works on raw bytes).
func buildPreTokenizer(raw json.RawMessage) (preTokenizer, bool, error) {
	typ, ok, err := typed(raw)
	if err != nil || !ok {
		return nil, false, err
	}
	switch typ {
	case "Sequence":
		var c struct {
			Pre []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, false, fmt.Errorf("cannot parse Sequence pre-tokenizer: %w", err)
		}
		var seq preSeq
		byteLevel := false
		for _, r := range c.Pre {
			if byteLevel {
				return nil, false, fmt.Errorf("%w: a pre-tokenizer after ByteLevel", ErrUnsupported)
			}
			p, bl, err := buildPreTokenizer(r)
			if err != nil {
				return nil, false, err
			}
			byteLevel = bl
			if inner, ok := p.(preSeq); ok {
				seq = append(seq, inner...)
			} else if p != nil {
				seq = append(seq, p)
			}
		}
		switch len(seq) {
		case 0:
			return nil, byteLevel, nil
		case 1:
			return seq[0], byteLevel, nil
		}
		return seq, byteLevel, nil
	case "Split":
		var c struct {
			Pattern  patternJSON `json:"pattern"`
			Behavior string      `json:"behavior"`
			Invert   bool        `json:"invert"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, false, fmt.Errorf("cannot parse Split pre-tokenizer: %w", err)
		}
		p := &preSplit{invert: c.Invert}
		if p.behavior, err = parseBehavior(c.Behavior); err != nil {
			return nil, false, err
		}
		switch {
		case c.Pattern.String != nil:
			if *c.Pattern.String == "" {
				return nil, false, fmt.Errorf("cannot load Split pre-tokenizer: empty pattern")
			}
			p.lit = *c.Pattern.String
		case c.Pattern.Regex != nil:
			if p.re, err = CompileRegex(*c.Pattern.Regex); err != nil {
				return nil, false, err
			}
			p.fast = fastMatcher(*c.Pattern.Regex)
		default:
			return nil, false, fmt.Errorf("cannot load Split pre-tokenizer: no pattern")
		}
		return p, false, nil
	case "ByteLevel":
		var c struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, false, fmt.Errorf("cannot parse ByteLevel pre-tokenizer: %w", err)
		}
		p := &preByteLevel{addPrefixSpace: c.AddPrefixSpace}
		if c.UseRegex == nil || *c.UseRegex {
			re, err := CompileRegex(gpt2Pattern)
			if err != nil {
				panic("BUG: " + err.Error())
			}
			p.split = &preSplit{re: re, fast: fastMatcher(gpt2Pattern), behavior: behIsolated}
		}
		return p, true, nil
	case "Metaspace":
		var c struct {
			Replacement    string  `json:"replacement"`
			PrependScheme  *string `json:"prepend_scheme"`
			AddPrefixSpace *bool   `json:"add_prefix_space"`
			Split          *bool   `json:"split"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, false, fmt.Errorf("cannot parse Metaspace pre-tokenizer: %w", err)
		}
		p := &preMetaspace{replacement: c.Replacement, prepend: "always", split: c.Split == nil || *c.Split}
		if c.PrependScheme != nil {
			p.prepend = *c.PrependScheme
		} else if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
			p.prepend = "never"
		}
		if p.replacement == "" {
			return nil, false, fmt.Errorf("cannot load Metaspace pre-tokenizer: empty replacement")
		}
		return p, false, nil
	case "Digits":
		var c struct {
			Individual bool `json:"individual_digits"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, false, fmt.Errorf("cannot parse Digits pre-tokenizer: %w", err)
		}
		return preDigits{c.Individual}, false, nil
	}
	return nil, false, fmt.Errorf("%w: pre-tokenizer %q", ErrUnsupported, typ)
}
