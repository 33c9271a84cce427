// Command demotokenizer writes the small, real tokenizer the demo (`make
// run`) checks in: a byte-level BPE tokenizer.json (GPT-2's pre-tokenizer
// and byte alphabet) whose merges it learns from corpus.txt, and a
// tokenizer_config.json with a ChatML chat template. The endpoint picker
// loads them through --tokenizer-dir like any model's files, so the demo
// runs the real chat-template and tokenization path without downloading a
// 2-35 MB tokenizer.
//
//	go run ./hack/demotokenizer -out cmd/demo/tokenizer/demo-model
//
// The output is a pure function of the corpus and -merges: the golden test
// (main_test.go) regenerates it and compares with the checked-in files.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultMerges is how many merges the demo tokenizer learns.
const DefaultMerges = 600

// Special tokens (ChatML), after the learned vocabulary.
var specials = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// chatTemplate is the ChatML template: every message framed by
// <|im_start|>role\n ... <|im_end|>\n, then the assistant's header.
const chatTemplate = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}" +
	"{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

func main() {
	out := flag.String("out", "cmd/demo/tokenizer/demo-model", "folder to write tokenizer.json and tokenizer_config.json into")
	corpus := flag.String("corpus", "hack/demotokenizer/corpus.txt", "training text")
	merges := flag.Int("merges", DefaultMerges, "merges to learn")
	flag.Parse()
	text, err := os.ReadFile(*corpus)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demotokenizer:", err)
		os.Exit(1)
	}
	tok, cfg, err := Build(string(text), *merges)
	if err == nil {
		err = os.MkdirAll(*out, 0o755)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(*out, "tokenizer.json"), tok, 0o644)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(*out, "tokenizer_config.json"), cfg, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demotokenizer:", err)
		os.Exit(1)
	}
}

// Build learns merges BPE merges from text and returns the tokenizer.json
// and tokenizer_config.json contents.
func Build(text string, merges int) (tokenizerJSON, configJSON []byte, err error) {
	alphabet, byteChar := byteAlphabet()
	vocab := map[string]int{}
	var order []string
	add := func(s string) {
		if _, ok := vocab[s]; !ok {
			vocab[s] = len(order)
			order = append(order, s)
		}
	}
	for _, c := range alphabet {
		add(string(c))
	}
	learned := learn(pieces(text, byteChar), merges)
	for _, m := range learned {
		add(m[0] + m[1])
	}

	var buf bytes.Buffer
	buf.WriteString("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [\n")
	for i, s := range specials {
		fmt.Fprintf(&buf, "    {\"id\": %d, \"content\": %s, \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}",
			len(order)+i, quote(s))
		buf.WriteString(map[bool]string{true: "\n", false: ",\n"}[i == len(specials)-1])
	}
	buf.WriteString("  ],\n  \"normalizer\": null,\n")
	buf.WriteString("  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true},\n")
	buf.WriteString("  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": true},\n")
	buf.WriteString("  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true},\n")
	buf.WriteString("  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n    \"continuing_subword_prefix\": null,\n" +
		"    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n    \"vocab\": {\n")
	for i, s := range order {
		fmt.Fprintf(&buf, "      %s: %d", quote(s), i)
		buf.WriteString(map[bool]string{true: "\n", false: ",\n"}[i == len(order)-1])
	}
	buf.WriteString("    },\n    \"merges\": [\n")
	for i, m := range learned {
		fmt.Fprintf(&buf, "      %s", quote(m[0]+" "+m[1]))
		buf.WriteString(map[bool]string{true: "\n", false: ",\n"}[i == len(learned)-1])
	}
	buf.WriteString("    ]\n  }\n}\n")

	cfg := map[string]any{
		"add_bos_token":                false,
		"add_eos_token":                false,
		"bos_token":                    nil,
		"chat_template":                chatTemplate,
		"clean_up_tokenization_spaces": false,
		"eos_token":                    "<|im_end|>",
		"model_max_length":             32768,
		"pad_token":                    "<|endoftext|>",
		"tokenizer_class":              "PreTrainedTokenizerFast",
		"unk_token":                    nil,
	}
	var c bytes.Buffer
	enc := json.NewEncoder(&c)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(cfg); err != nil {
		return nil, nil, err
	}
	return buf.Bytes(), c.Bytes(), nil
}

func quote(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

// byteAlphabet is GPT-2's byte-to-character map: printable bytes stand
// for themselves, the others for the characters from U+0100 on, in
// GPT-2's order (its vocabulary's first 256 ids).
func byteAlphabet() ([]rune, [256]rune) {
	var bs []int
	for _, r := range [][2]int{{'!', '~'}, {0xA1, 0xAC}, {0xAE, 0xFF}} {
		for b := r[0]; b <= r[1]; b++ {
			bs = append(bs, b)
		}
	}
	var m [256]rune
	seen := map[int]bool{}
	for _, b := range bs {
		seen[b] = true
		m[b] = rune(b)
	}
	n := 0
	for b := range 256 {
		if !seen[b] {
			bs = append(bs, b)
			m[b] = rune(256 + n)
			n++
		}
	}
	alphabet := make([]rune, len(bs))
	for i, b := range bs {
		alphabet[i] = m[b]
	}
	return alphabet, m
}

// pieces pre-tokenizes text approximately as GPT-2's pattern does
// ('s|'t|'re|'ve|'m|'ll|'d| ?\pL+| ?\pN+| ?[^\s\pL\pN]+|\s+(?!\S)|\s+) and
// counts each piece as a byte-level string. Only the merge statistics
// depend on it; the tokenizer applies the exact pattern.
func pieces(text string, byteChar [256]rune) map[string]int {
	counts := map[string]int{}
	emit := func(p string) {
		var b strings.Builder
		for i := 0; i < len(p); i++ {
			b.WriteRune(byteChar[p[i]])
		}
		counts[b.String()]++
	}
	class := func(r rune) int {
		switch {
		case unicode.IsLetter(r):
			return 1
		case unicode.IsNumber(r):
			return 2
		case unicode.IsSpace(r):
			return 3
		}
		return 4
	}
	for i := 0; i < len(text); {
		if text[i] == '\'' {
			for _, c := range []string{"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"} {
				if strings.HasPrefix(text[i:], c) {
					emit(c)
					i += len(c)
					goto next
				}
			}
		}
		{
			j := i
			if text[j] == ' ' && j+1 < len(text) {
				if r, _ := utf8.DecodeRuneInString(text[j+1:]); class(r) != 3 {
					j++
				}
			}
			r, n := utf8.DecodeRuneInString(text[j:])
			k := class(r)
			end := j + n
			for end < len(text) {
				r2, n2 := utf8.DecodeRuneInString(text[end:])
				if class(r2) != k {
					break
				}
				end += n2
			}
			if k == 3 && end < len(text) && end-i > 1 {
				end-- // the last space goes with the next piece
			}
			emit(text[i:end])
			i = end
		}
	next:
	}
	return counts
}

// learn runs BPE training: repeatedly merge the most frequent adjacent
// pair of symbols (ties to the smallest pair, so the result is
// deterministic) in every piece.
func learn(counts map[string]int, merges int) [][2]string {
	type word struct {
		syms []string
		n    int
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	words := make([]word, len(keys))
	for i, k := range keys {
		for _, r := range k {
			words[i].syms = append(words[i].syms, string(r))
		}
		words[i].n = counts[k]
	}
	var out [][2]string
	for len(out) < merges {
		pairs := map[[2]string]int{}
		for _, w := range words {
			for j := 0; j+1 < len(w.syms); j++ {
				pairs[[2]string{w.syms[j], w.syms[j+1]}] += w.n
			}
		}
		var best [2]string
		bestN := 0
		for p, n := range pairs {
			if n > bestN || (n == bestN && (p[0] < best[0] || p[0] == best[0] && p[1] < best[1])) {
				best, bestN = p, n
			}
		}
		if bestN < 2 {
			break
		}
		out = append(out, best)
		for i := range words {
			s := words[i].syms
			k := 0
			for j := 0; j < len(s); j++ {
				if j+1 < len(s) && s[j] == best[0] && s[j+1] == best[1] {
					s[k] = best[0] + best[1]
					j++
				} else {
					s[k] = s[j]
				}
				k++
			}
			words[i].syms = s[:k]
		}
	}
	return out
}
