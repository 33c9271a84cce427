package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Hand-written matchers for the two most common pre-tokenizer patterns,
// equal to the regex engine on every input (TestFastMatcherEquivalence and
// FuzzFastMatcher check it) and several times faster:
//
//	Llama 3 (and GPT-4's cl100k):
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
//	Qwen 2/3: the same with \p{N} for \p{N}{1,3}.
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// fastMatcher returns a matcher for pattern (the end of the match at pos,
// or -1), or nil when pattern has none.
func fastMatcher(pattern string) func(s string, pos int) int {
	switch pattern {
	case llama3Pattern:
		return func(s string, pos int) int { return matchCL100K(s, pos, 3) }
	case qwen2Pattern:
		return func(s string, pos int) int { return matchCL100K(s, pos, 1) }
	}
	return nil
}

// rune classes of the patterns, with ASCII fast paths.
const (
	clsL = 1 << iota
	clsN
	clsS // \s (White_Space)
)

var asciiClass = func() (t [128]uint8) {
	for r := rune(0); r < 128; r++ {
		t[r] = slowClass(r)
	}
	return t
}()

func slowClass(r rune) uint8 {
	var c uint8
	if unicode.IsLetter(r) {
		c |= clsL
	}
	if unicode.Is(unicode.N, r) {
		c |= clsN
	}
	if unicode.Is(unicode.White_Space, r) {
		c |= clsS
	}
	return c
}

// classAt returns the class of the rune at i and its width; past the end it
// returns (0, 0).
func classAt(s string, i int) (uint8, rune, int) {
	if i >= len(s) {
		return 0, -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], rune(c), 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return slowClass(r), r, n
}

func isFoldOf(b byte, lower byte) bool { return b == lower || b == lower-'a'+'A' }

func matchCL100K(s string, pos, maxDigits int) int {
	c0, r0, n0 := classAt(s, pos)
	if n0 == 0 {
		return -1
	}
	// 1. (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r0 == '\'' && pos+1 < len(s) {
		b := s[pos+1]
		switch {
		case isFoldOf(b, 's') || isFoldOf(b, 't') || isFoldOf(b, 'm') || isFoldOf(b, 'd'):
			return pos + 2
		case b == 0xC5 && pos+2 < len(s) && s[pos+2] == 0xBF: // U+017F ſ folds to s
			return pos + 3
		case pos+2 < len(s) && (isFoldOf(b, 'r') && isFoldOf(s[pos+2], 'e') ||
			isFoldOf(b, 'v') && isFoldOf(s[pos+2], 'e') ||
			isFoldOf(b, 'l') && isFoldOf(s[pos+2], 'l')):
			return pos + 3
		}
	}
	// 2. [^\r\n\p{L}\p{N}]?\p{L}+
	if c0&clsL != 0 {
		return letters(s, pos+n0)
	}
	if c0&clsN == 0 && r0 != '\r' && r0 != '\n' {
		if c1, _, n1 := classAt(s, pos+n0); c1&clsL != 0 {
			return letters(s, pos+n0+n1)
		}
	}
	// 3. \p{N}{1,maxDigits}
	if c0&clsN != 0 {
		end := pos + n0
		for k := 1; k < maxDigits; k++ {
			c, _, n := classAt(s, end)
			if c&clsN == 0 {
				break
			}
			end += n
		}
		return end
	}
	// 4. ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	punct := func(c uint8) bool { return c&(clsS|clsL|clsN) == 0 }
	p := -1
	if r0 == ' ' {
		if c1, _, n1 := classAt(s, pos+1); n1 > 0 && punct(c1) {
			p = pos + 1
		}
	} else if punct(c0) {
		p = pos
	}
	if p >= 0 {
		for {
			c, _, n := classAt(s, p)
			if n == 0 || !punct(c) {
				break
			}
			p += n
		}
		for p < len(s) && (s[p] == '\r' || s[p] == '\n') {
			p++
		}
		return p
	}
	// 5-7 need whitespace at pos.
	if c0&clsS == 0 {
		return -1
	}
	end, lastNL, lastStart := pos, -1, pos
	for {
		c, r, n := classAt(s, end)
		if n == 0 || c&clsS == 0 {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = end
		}
		lastStart = end
		end += n
	}
	// 5. \s*[\r\n]+
	if lastNL >= 0 {
		return lastNL + 1
	}
	// 6. \s+(?!\S)
	if end == len(s) {
		return end
	}
	if lastStart > pos {
		return lastStart
	}
	// 7. \s+
	return end
}

func letters(s string, i int) int {
	for {
		c, _, n := classAt(s, i)
		if n == 0 || c&clsL == 0 {
			return i
		}
		i += n
	}
}
