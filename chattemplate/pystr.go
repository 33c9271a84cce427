package chattemplate

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// isPySpace is Python's str.isspace for one rune, which str.strip() strips:
// Unicode White_Space plus the ASCII separators U+001C..U+001F (Go's
// unicode.IsSpace leaves those out).
func isPySpace(r rune) bool {
	switch {
	case r == ' ' || r >= '\t' && r <= '\r' || r >= 0x1c && r <= 0x1f:
		return true
	case r < 0x85:
		return false
	}
	switch r {
	case 0x85, 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

// pyStrip is Python's str.strip() without arguments.
func pyStrip(s string) string { return strings.TrimFunc(s, isPySpace) }

// pyTrim is Jinja's trim filter: str.strip(chars).
func pyTrim(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	s := pyStr(args[0])
	chars, ok := kwargs["chars"]
	if !ok && len(args) > 1 {
		chars, ok = args[1], true
	}
	if ok && !chars.IsNone() && !chars.IsUndefined() {
		return jinja.NewString(strings.Trim(s, pyStr(chars))), nil
	}
	return jinja.NewString(pyStrip(s)), nil
}

// pyStr is str() of a value as far as chat templates need it.
func pyStr(v jinja.Value) string {
	switch {
	case v.IsString():
		return v.AsString()
	case v.IsNone():
		return "None"
	case v.IsFloat():
		return pyFloatRepr(v.AsFloat())
	}
	return v.String()
}

// strftime formats t with the strftime directives chat templates use (%d
// %b %Y and friends), as Python's time.strftime does in the C locale.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			fmt.Fprintf(&b, "%04d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			fmt.Fprintf(&b, "%02d", (t.Hour()+11)%12+1)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'B':
			b.WriteString(t.Month().String())
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'w':
			fmt.Fprintf(&b, "%d", int(t.Weekday()))
		case 'Z':
			name, _ := t.Zone()
			b.WriteString(name)
		case 'z':
			b.WriteString(t.Format("-0700"))
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}

// rewriteFilters renames, inside the template's tags, the filters whose
// library version differs from the engine's (trim: Python whitespace;
// tojson: Python's json.dumps) to names the library does not define, so
// the render finds ours in its variables. String literals are left alone.
func rewriteFilters(src string) string {
	var b strings.Builder
	b.Grow(len(src) + 64)
	for i := 0; i < len(src); {
		open := strings.Index(src[i:], "{")
		if open < 0 || i+open+1 >= len(src) {
			b.WriteString(src[i:])
			break
		}
		open += i
		kind := src[open+1]
		if kind != '{' && kind != '%' && kind != '#' {
			b.WriteString(src[i : open+1])
			i = open + 1
			continue
		}
		b.WriteString(src[i : open+2])
		closer := "}}"
		switch kind {
		case '%':
			closer = "%}"
		case '#':
			end := strings.Index(src[open+2:], "#}")
			if end < 0 {
				b.WriteString(src[open+2:])
				return b.String()
			}
			b.WriteString(src[open+2 : open+2+end+2])
			i = open + 2 + end + 2
			continue
		}
		j := open + 2
		for j < len(src) {
			c := src[j]
			if c == '\'' || c == '"' {
				k := j + 1
				for k < len(src) && src[k] != c {
					if src[k] == '\\' {
						k++
					}
					k++
				}
				k = min(k+1, len(src))
				b.WriteString(pyLiteral(src[j:k]))
				j = k
				continue
			}
			if strings.HasPrefix(src[j:], closer) {
				break
			}
			if c == '|' {
				k := j + 1
				for k < len(src) && (src[k] == ' ' || src[k] == '\t' || src[k] == '\n' || src[k] == '\r') {
					k++
				}
				name := k
				for k < len(src) && (src[k] == '_' || src[k] >= 'a' && src[k] <= 'z' || src[k] >= 'A' && src[k] <= 'Z' || src[k] >= '0' && src[k] <= '9') {
					k++
				}
				if w := src[name:k]; w == "trim" || w == "tojson" {
					b.WriteString(src[j:name])
					b.WriteString(filterPrefix + w)
					j = k
					continue
				}
			}
			b.WriteByte(c)
			j++
		}
		i = j
	}
	return b.String()
}

// filterPrefix names our versions of library filters.
const filterPrefix = "__ic_"

// jinjaSource is the template source as Jinja2's lexer sees it with
// keep_trailing_newline off (transformers' environment):
// "\n".join(source.splitlines()), Python's line boundaries (\n, \r, \r\n,
// \v, \f, U+001C..U+001E, U+0085, U+2028, U+2029) all becoming "\n" and a
// final one dropped.
func jinjaSource(src string) string {
	var b strings.Builder
	b.Grow(len(src))
	for i := 0; i < len(src); {
		r, n := rune(src[i]), 1
		if r >= 0x80 {
			r, n = utf8.DecodeRuneInString(src[i:])
		}
		switch r {
		case '\r':
			if i+1 < len(src) && src[i+1] == '\n' {
				n = 2
			}
			fallthrough
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			if i+n < len(src) {
				b.WriteByte('\n')
			}
		default:
			b.WriteString(src[i : i+n])
		}
		i += n
	}
	return b.String()
}

// pyLiteral rewrites a quoted Jinja string literal so that the library
// reads it as Jinja2 does (Python's unicode-escape): the escapes the
// library lacks (\r, \b, \f, \v, \a, \xHH, \uHHHH, \UHHHHHHHH, octal) are
// written out as the characters they stand for; \n, \t, \\, \' and \" and
// unknown escapes are left to the library, which reads them alike.
func pyLiteral(lit string) string {
	if !strings.Contains(lit, `\`) || len(lit) < 2 {
		return lit
	}
	quote := lit[0]
	var b strings.Builder
	b.Grow(len(lit))
	for i := 0; i < len(lit); i++ {
		c := lit[i]
		if c != '\\' || i+1 >= len(lit)-1 {
			b.WriteByte(c)
			continue
		}
		e := lit[i+1]
		emit := func(r rune, n int) {
			switch {
			case r == rune(quote) || r == '\\':
				b.WriteByte('\\')
				b.WriteRune(r)
			case r == '\n':
				b.WriteString(`\n`)
			case r == '\t':
				b.WriteString(`\t`)
			default:
				b.WriteRune(r)
			}
			i += n
		}
		hex := func(n int) (rune, bool) {
			if i+2+n > len(lit)-1 {
				return 0, false
			}
			v, err := strconv.ParseUint(lit[i+2:i+2+n], 16, 32)
			if err != nil || v > utf8.MaxRune {
				return 0, false
			}
			return rune(v), true
		}
		switch e {
		case 'r':
			emit('\r', 1)
		case 'b':
			emit('\b', 1)
		case 'f':
			emit('\f', 1)
		case 'v':
			emit('\v', 1)
		case 'a':
			emit('\a', 1)
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if r, ok := hex(n); ok {
				emit(r, 1+n)
			} else {
				b.WriteByte(c)
			}
		case '0', '1', '2', '3', '4', '5', '6', '7':
			j := i + 1
			for j < len(lit)-1 && j < i+4 && lit[j] >= '0' && lit[j] <= '7' {
				j++
			}
			v, _ := strconv.ParseUint(lit[i+1:j], 8, 32)
			emit(rune(v), j-i-1)
		default:
			// \n \t \\ \' \" and unknown escapes: the library's
			// reading is Python's.
			b.WriteByte(c)
			b.WriteByte(e)
			i++
		}
	}
	return b.String()
}
