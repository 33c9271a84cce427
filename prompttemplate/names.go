package prompttemplate

import (
	"fmt"
	"slices"
	"strings"
)

// Free names of a Jinja template body: the variables it reads that nothing
// in the template binds. The engine (github.com/ardanlabs/jinja) exposes no
// syntax tree, so this is a scanner of its own over the tags, which the
// engine has already parsed (Names runs only on bodies that compile):
//
//   - {{ … }} and {% … %} tags are lexed into names, strings, numbers and
//     punctuation; {# … #} comments and {% raw %} blocks are skipped.
//   - A name is a reference unless it follows "." (an attribute), "|" (a
//     filter), "is" or "is not" (a test), is a keyword or a builtin
//     (range, namespace, loop, raise_exception, …), is a keyword argument
//     inside a call's parentheses (name=…), or opens a statement
//     (for, set, macro, …).
//   - Names bound anywhere in the template (for targets, set targets,
//     macro names and parameters, call parameters) are not free. Binding
//     is not scoped: a slot shadowed by a loop variable of the same name
//     elsewhere is not seen. A template doing that is confusing anyway.

// keywords are never references.
var keywords = map[string]bool{
	"and": true, "or": true, "not": true, "in": true, "is": true, "if": true, "else": true, "elif": true,
	"true": true, "false": true, "none": true, "True": true, "False": true, "None": true,
	"recursive": true,
}

// statements open a {% … %} tag.
var statements = map[string]bool{
	"if": true, "elif": true, "else": true, "endif": true, "for": true, "endfor": true,
	"set": true, "endset": true, "macro": true, "endmacro": true, "call": true, "endcall": true,
	"filter": true, "endfilter": true, "raw": true, "endraw": true, "break": true, "continue": true,
	"generation": true, "endgeneration": true,
}

// builtins are the engine's globals and the names it defines in scopes.
var builtins = map[string]bool{
	"range": true, "namespace": true, "dict": true, "joiner": true, "cycler": true,
	"raise_exception": true, "strftime_now": true, "loop": true, "caller": true, "varargs": true, "kwargs": true,
}

type tokKind uint8

const (
	tokName tokKind = iota
	tokString
	tokNumber
	tokPunct
)

type token struct {
	kind tokKind
	text string
}

// lexTag splits a tag's content into tokens.
func lexTag(s string) ([]token, error) {
	var out []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i + 1
			for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9') {
				j++
			}
			out = append(out, token{tokName, s[i:j]})
			i = j
		case c >= '0' && c <= '9':
			j := i + 1
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.' || s[j] == '_' || s[j] == 'e' || s[j] == 'E') {
				j++
			}
			out = append(out, token{tokNumber, s[i:j]})
			i = j
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated string in %q", clip(s))
			}
			out = append(out, token{tokString, s[i+1 : j]})
			i = j + 1
		default:
			// Two-character operators first, so "==" is not "=".
			if i+1 < len(s) {
				switch s[i : i+2] {
				case "==", "!=", "<=", ">=", "**", "//":
					out = append(out, token{tokPunct, s[i : i+2]})
					i += 2
					continue
				}
			}
			out = append(out, token{tokPunct, s[i : i+1]})
			i++
		}
	}
	return out, nil
}

// tag is one {{ … }} or {% … %} tag's content.
type tag struct {
	stmt bool
	text string
}

// tags returns the body's expression and statement tags, in order,
// without comments and raw blocks.
func tags(body string) ([]tag, error) {
	var out []tag
	inRaw := false
	for i := 0; i < len(body); {
		j := strings.IndexByte(body[i:], '{')
		if j < 0 || i+j+1 >= len(body) {
			break
		}
		i += j
		var closer string
		switch body[i+1] {
		case '{':
			closer = "}}"
		case '%':
			closer = "%}"
		case '#':
			closer = "#}"
		default:
			i++
			continue
		}
		start := i + 2
		end := -1
		// The closer, outside quotes (as the engine scans; not in comments).
		for k := start; k+1 < len(body); k++ {
			c := body[k]
			if closer != "#}" && (c == '\'' || c == '"') {
				k++
				for k < len(body) && body[k] != c {
					if body[k] == '\\' {
						k++
					}
					k++
				}
				continue
			}
			if body[k:k+2] == closer {
				end = k
				break
			}
		}
		if end < 0 {
			return nil, fmt.Errorf("unclosed tag at byte %d", i)
		}
		text := strings.TrimSpace(strings.Trim(body[start:end], "-+"))
		i = end + 2
		if closer == "#}" {
			continue
		}
		stmt := closer == "%}"
		kw := firstWord(text)
		if inRaw {
			if stmt && kw == "endraw" {
				inRaw = false
			}
			continue
		}
		if stmt && kw == "raw" {
			inRaw = true
			continue
		}
		out = append(out, tag{stmt, text})
	}
	return out, nil
}

func firstWord(s string) string {
	end := 0
	for end < len(s) && (s[end] == '_' || s[end] >= 'a' && s[end] <= 'z' || s[end] >= 'A' && s[end] <= 'Z' || s[end] >= '0' && s[end] <= '9') {
		end++
	}
	return s[:end]
}

// Names returns the free names of body (see above), sorted. body must be a
// template the engine compiles (Compile checks that first).
func Names(body string) ([]string, error) {
	ts, err := tags(body)
	if err != nil {
		return nil, err
	}
	refs := map[string]bool{}
	bound := map[string]bool{}
	for _, tg := range ts {
		toks, err := lexTag(tg.text)
		if err != nil {
			return nil, err
		}
		if len(toks) == 0 {
			continue
		}
		from := 0
		if tg.stmt && toks[0].kind == tokName && statements[toks[0].text] {
			from = 1
			switch toks[0].text {
			case "for":
				// Targets up to "in".
				for from < len(toks) && !(toks[from].kind == tokName && toks[from].text == "in") {
					if toks[from].kind == tokName {
						bound[toks[from].text] = true
					}
					from++
				}
			case "set":
				// "set x = …", "set x, y = …", "set x" (block) and
				// "set ns.attr = …", where ns is read.
				k := from
				for k < len(toks) && !(toks[k].kind == tokPunct && toks[k].text == "=") {
					k++
				}
				for m := from; m < k; m++ {
					t := toks[m]
					if t.kind != tokName {
						continue
					}
					if m > from && toks[m-1].kind == tokPunct && toks[m-1].text == "." {
						continue // an attribute of a namespace
					}
					if m+1 < k && toks[m+1].kind == tokPunct && toks[m+1].text == "." {
						refs[t.text] = true // the namespace is read
						continue
					}
					bound[t.text] = true
				}
				from = k
			case "macro":
				// Its name, then its parameters (defaults are expressions).
				if from < len(toks) && toks[from].kind == tokName {
					bound[toks[from].text] = true
					from++
				}
				bindParams(toks[from:], bound)
			case "call":
				// "call(params) macro(args)": the parameters are bound.
				if from < len(toks) && toks[from].text == "(" {
					end := closeParen(toks, from)
					bindParams(toks[from:end+1], bound)
					from = end + 1
				}
			case "filter":
				// The filter name (and any further ones after "|").
				if from < len(toks) && toks[from].kind == tokName {
					from++
				}
			}
		}
		collectRefs(toks[from:], refs, bound)
	}
	var out []string
	for n := range refs {
		if !bound[n] && !builtins[n] {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// closeParen returns the index of the ")" closing toks[open], or the last
// index when it is unbalanced.
func closeParen(toks []token, open int) int {
	depth := 0
	for i := open; i < len(toks); i++ {
		switch toks[i].text {
		case "(":
			depth++
		case ")":
			if depth--; depth == 0 {
				return i
			}
		}
	}
	return len(toks) - 1
}

// bindParams binds the parameter names of "(a, b=expr, …)": names at
// depth 1 right after "(" or ",".
func bindParams(toks []token, bound map[string]bool) {
	depth := 0
	for i, t := range toks {
		switch {
		case t.kind == tokPunct && (t.text == "(" || t.text == "[" || t.text == "{"):
			depth++
		case t.kind == tokPunct && (t.text == ")" || t.text == "]" || t.text == "}"):
			depth--
		case t.kind == tokName && depth == 1 && i > 0 && (toks[i-1].text == "(" || toks[i-1].text == ","):
			bound[t.text] = true
		}
	}
}

// collectRefs adds the names toks reads to refs.
func collectRefs(toks []token, refs, bound map[string]bool) {
	depth := 0 // inside parentheses
	for i, t := range toks {
		switch t.kind {
		case tokPunct:
			switch t.text {
			case "(":
				depth++
			case ")":
				depth--
			}
			continue
		case tokName:
		default:
			continue
		}
		if keywords[t.text] {
			continue
		}
		if i > 0 {
			p := toks[i-1]
			if p.kind == tokPunct && (p.text == "." || p.text == "|") {
				continue
			}
			if p.kind == tokName && (p.text == "is" || (p.text == "not" && i > 1 && toks[i-2].text == "is")) {
				continue
			}
		}
		if depth > 0 && i+1 < len(toks) && toks[i+1].kind == tokPunct && toks[i+1].text == "=" {
			continue // a keyword argument
		}
		refs[t.text] = true
	}
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
