package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// matches runs findAll and returns the matched substrings.
func matches(re *Regex, s string) []string {
	var m matcher
	var out []string
	m.findAll(re, s, func(a, z int) { out = append(out, s[a:z]) })
	return out
}

func TestRegex(t *testing.T) {
	f := func(pattern, in string, want ...string) {
		t.Helper()
		re, err := CompileRegex(pattern)
		if err != nil {
			t.Fatalf("%q: %v", pattern, err)
		}
		got := matches(re, in)
		if strings.Join(got, "|") != strings.Join(want, "|") || len(got) != len(want) {
			t.Errorf("%q on %q: got %q, want %q", pattern, in, got, want)
		}
	}
	// lookahead: the last space before a word is left for the word
	f(`\s+(?!\S)|\s+`, "a   b", "  ", " ")
	f(`\s+(?!\S)`, "   ", "   ")
	f(`a(?=b)`, "ab ac ab", "a", "a")
	// leftmost-first alternation, greedy and lazy quantifiers
	f(`a|ab`, "ab", "a")
	f(`ab|a`, "ab", "ab")
	f(`a+?`, "aaa", "a", "a", "a")
	f(`\p{N}{1,3}`, "1234567", "123", "456", "7")
	f(`\p{N}{2}`, "12345", "12", "34")
	f(`\p{N}{2,}`, "1 12 123", "12", "123")
	f(`[^\r\n\p{L}\p{N}]?\p{L}+`, " hello,world", " hello", ",world")
	f(`(?i:'s|'ll)`, "'S 'Ll 'x", "'S", "'Ll")
	f(`[\p{L}\p{M}]+`, "e\u0301x y", "e\u0301x", "y")
	f(`[A-Za-z]+`, "ab-CD", "ab", "CD")
	f(`[\-.]`, "a-b.c", "-", ".")
	f(`[\x41-\x43]+`, "ABCD", "ABC")
	f(`[一-龥]+`, "中文abc字", "中文", "字")
	f(`^a`, "aa", "a")
	f(`a$`, "aa", "a")
	f(`\d+`, "a12b٣", "12", "٣")
	f(`\w+`, "héllo wörld_1", "héllo", "wörld_1")
	f(`.`, "a\nb", "a", "b")
	f(`(?:ab)+`, "ababa", "abab")
	f(`\s`, "a\u0085b\u00a0c\ufeffd", "\u0085", "\u00a0") // Oniguruma: White_Space, not U+FEFF
}

func TestRegexErrors(t *testing.T) {
	for _, p := range []string{`(`, `)`, `[a`, `a{2`, `\p{Nope}`, `(?<n>a)`, `*a`, `a**`, `a++`, `\`, `[z-a]`, `(?=a)*`, `\q`, `a{3,2}`, `a{99999}`, `(ab{1000}){1000}`} {
		if _, err := CompileRegex(p); err == nil {
			t.Errorf("%q compiled", p)
		}
	}
}

// randomText draws from the characters the pre-tokenizer patterns care
// about: letters, marks, digits, punctuation, every kind of space and line
// break, apostrophe contractions, multi-byte runes.
func randomText(r *rand.Rand, n int) string {
	alphabet := []string{"a", "Z", "é", "ß", "中", "ſ", "\u0301", "1", "٣", "½", "'", "'s", "'LL", "'re", "'d", "!", ".", "-", "_",
		"😀", "\u200d", " ", "  ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u0085", "\ufeff", "\u2028", "<", "|", "\x00", "\xff"}
	var b strings.Builder
	for range n {
		b.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

// TestFastMatcherEquivalence: the hand-written matchers agree with the
// regex engine at every position of random texts.
func TestFastMatcherEquivalence(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 1))
	for _, pattern := range []string{llama3Pattern, qwen2Pattern} {
		re, err := CompileRegex(pattern)
		if err != nil {
			t.Fatal(err)
		}
		fast := fastMatcher(pattern)
		var m matcher
		for range 2000 {
			s := randomText(r, r.IntN(24))
			for pos := 0; pos < len(s); pos++ {
				if want, got := m.matchAt(re, s, pos), fast(s, pos); got != want {
					t.Fatalf("%q at %d: fast %d, regex %d", s, pos, got, want)
				}
			}
		}
	}
}

func FuzzFastMatcher(f *testing.F) {
	for _, s := range []string{"Hello world", "  \n\n  x", "I'm 12345 ſ'ſ", "a\r\n\r\nb", "😀\u200d😀", "\u0085\ufeff"} {
		f.Add(s)
	}
	reL, _ := CompileRegex(llama3Pattern)
	reQ, _ := CompileRegex(qwen2Pattern)
	fastL, fastQ := fastMatcher(llama3Pattern), fastMatcher(qwen2Pattern)
	f.Fuzz(func(t *testing.T, s string) {
		var m matcher
		for pos := 0; pos < len(s); {
			if got, want := fastL(s, pos), m.matchAt(reL, s, pos); got != want {
				t.Fatalf("llama3 %q at %d: fast %d, regex %d", s, pos, got, want)
			}
			if got, want := fastQ(s, pos), m.matchAt(reQ, s, pos); got != want {
				t.Fatalf("qwen2 %q at %d: fast %d, regex %d", s, pos, got, want)
			}
			_, n := utf8.DecodeRuneInString(s[pos:])
			pos += n
		}
	})
}

// FuzzRegex compiles arbitrary patterns and runs them: errors are fine,
// panics and non-termination are not.
func FuzzRegex(f *testing.F) {
	for _, p := range []string{llama3Pattern, qwen2Pattern, gpt2Pattern, `(a|b)*c`, `[^\s\p{L}]+`, `(?i:ab)`} {
		f.Add(p, "Hello, world 123 'S")
	}
	f.Fuzz(func(t *testing.T, pattern, s string) {
		if len(pattern) > 256 || len(s) > 1024 {
			return
		}
		re, err := CompileRegex(pattern)
		if err != nil {
			return
		}
		var m matcher
		m.findAll(re, s, func(a, z int) {
			if a < 0 || z > len(s) || a > z {
				t.Fatalf("bad match [%d,%d) of %d", a, z, len(s))
			}
		})
	})
}
