package chattemplate

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// ErrJSON marks request JSON this package cannot turn into template values.
var ErrJSON = errors.New("chattemplate: bad JSON")

// maxDepth bounds the nesting of decoded JSON (the stack of the decoder).
const maxDepth = 256

// decodeJSON parses one JSON value into template values the way Python's
// json.loads builds them for the engine: objects keep their keys in
// order (a repeated key keeps its first place and its last value, as a
// Python dict does), integers stay integers (int64; larger ones are an
// error rather than a silently different value), other numbers are floats.
// Invalid UTF-8 and lone surrogates become U+FFFD.
func decodeJSON(data []byte) (jinja.Value, error) {
	d := jsonDecoder{s: data}
	d.skipSpace()
	v, err := d.value(0)
	if err != nil {
		return jinja.Undefined(), err
	}
	d.skipSpace()
	if d.i != len(d.s) {
		return jinja.Undefined(), d.errorf("trailing data")
	}
	return v, nil
}

type jsonDecoder struct {
	s []byte
	i int
	// buf is scratch for unescaping strings.
	buf []byte
}

func (d *jsonDecoder) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at offset %d: %s", ErrJSON, d.i, fmt.Sprintf(format, args...))
}

func (d *jsonDecoder) skipSpace() {
	for d.i < len(d.s) {
		switch d.s[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *jsonDecoder) value(depth int) (jinja.Value, error) {
	if depth > maxDepth {
		return jinja.Undefined(), d.errorf("nested deeper than %d", maxDepth)
	}
	if d.i >= len(d.s) {
		return jinja.Undefined(), d.errorf("unexpected end")
	}
	switch c := d.s[d.i]; {
	case c == '{':
		return d.object(depth)
	case c == '[':
		return d.array(depth)
	case c == '"':
		s, err := d.str()
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewString(s), nil
	case c == 't':
		return d.literal("true", jinja.NewBool(true))
	case c == 'f':
		return d.literal("false", jinja.NewBool(false))
	case c == 'n':
		return d.literal("null", jinja.None())
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	}
	return jinja.Undefined(), d.errorf("unexpected %q", d.s[d.i])
}

func (d *jsonDecoder) literal(word string, v jinja.Value) (jinja.Value, error) {
	if len(d.s)-d.i < len(word) || string(d.s[d.i:d.i+len(word)]) != word {
		return jinja.Undefined(), d.errorf("bad literal")
	}
	d.i += len(word)
	return v, nil
}

func (d *jsonDecoder) object(depth int) (jinja.Value, error) {
	d.i++ // {
	obj := jinja.NewDict()
	dict := obj.AsDict()
	d.skipSpace()
	if d.i < len(d.s) && d.s[d.i] == '}' {
		d.i++
		return obj, nil
	}
	for {
		d.skipSpace()
		if d.i >= len(d.s) || d.s[d.i] != '"' {
			return jinja.Undefined(), d.errorf("want an object key")
		}
		k, err := d.str()
		if err != nil {
			return jinja.Undefined(), err
		}
		d.skipSpace()
		if d.i >= len(d.s) || d.s[d.i] != ':' {
			return jinja.Undefined(), d.errorf("want ':'")
		}
		d.i++
		d.skipSpace()
		v, err := d.value(depth + 1)
		if err != nil {
			return jinja.Undefined(), err
		}
		dict.Set(k, v)
		d.skipSpace()
		if d.i >= len(d.s) {
			return jinja.Undefined(), d.errorf("unexpected end in object")
		}
		switch d.s[d.i] {
		case ',':
			d.i++
		case '}':
			d.i++
			return obj, nil
		default:
			return jinja.Undefined(), d.errorf("want ',' or '}'")
		}
	}
}

func (d *jsonDecoder) array(depth int) (jinja.Value, error) {
	d.i++ // [
	var items []jinja.Value
	d.skipSpace()
	if d.i < len(d.s) && d.s[d.i] == ']' {
		d.i++
		return jinja.NewList([]jinja.Value{}), nil
	}
	for {
		d.skipSpace()
		v, err := d.value(depth + 1)
		if err != nil {
			return jinja.Undefined(), err
		}
		items = append(items, v)
		d.skipSpace()
		if d.i >= len(d.s) {
			return jinja.Undefined(), d.errorf("unexpected end in array")
		}
		switch d.s[d.i] {
		case ',':
			d.i++
		case ']':
			d.i++
			return jinja.NewList(slices.Clip(items)), nil
		default:
			return jinja.Undefined(), d.errorf("want ',' or ']'")
		}
	}
}

// str reads a string; the fast path (no escapes, valid UTF-8) copies once.
func (d *jsonDecoder) str() (string, error) {
	d.i++ // "
	start := d.i
	for d.i < len(d.s) {
		c := d.s[d.i]
		if c == '"' {
			raw := d.s[start:d.i]
			d.i++
			if utf8.Valid(raw) {
				return string(raw), nil
			}
			return strings.ToValidUTF8(string(raw), "\uFFFD"), nil
		}
		if c == '\\' || c < 0x20 {
			break
		}
		d.i++
	}
	// Escapes: the decoded string is at most as long as the raw one, so
	// one buffer of that size holds it; runs between escapes are copied
	// whole.
	end := d.i
	for end < len(d.s) && d.s[end] != '"' {
		if d.s[end] == '\\' {
			end++
		}
		end++
	}
	if n := end - start; cap(d.buf) < n {
		d.buf = make([]byte, 0, n)
	}
	d.buf = append(d.buf[:0], d.s[start:d.i]...)
	for d.i < len(d.s) {
		c := d.s[d.i]
		switch {
		case c == '"':
			d.i++
			return strings.ToValidUTF8(string(d.buf), "\uFFFD"), nil
		case c < 0x20:
			return "", d.errorf("control character in string")
		case c != '\\':
			run := d.i
			for d.i < len(d.s) && d.s[d.i] != '"' && d.s[d.i] != '\\' && d.s[d.i] >= 0x20 {
				d.i++
			}
			d.buf = append(d.buf, d.s[run:d.i]...)
			continue
		}
		d.i++
		if d.i >= len(d.s) {
			break
		}
		e := d.s[d.i]
		d.i++
		switch e {
		case '"', '\\', '/':
			d.buf = append(d.buf, e)
		case 'b':
			d.buf = append(d.buf, '\b')
		case 'f':
			d.buf = append(d.buf, '\f')
		case 'n':
			d.buf = append(d.buf, '\n')
		case 'r':
			d.buf = append(d.buf, '\r')
		case 't':
			d.buf = append(d.buf, '\t')
		case 'u':
			r, ok := d.hex4()
			if !ok {
				return "", d.errorf("bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				// A pair makes one rune; a lone half cannot be UTF-8.
				if r < 0xdc00 && d.i+1 < len(d.s) && d.s[d.i] == '\\' && d.s[d.i+1] == 'u' {
					save := d.i
					d.i += 2
					if r2, ok := d.hex4(); ok && r2 >= 0xdc00 && r2 <= 0xdfff {
						r = utf16.DecodeRune(r, r2)
					} else {
						d.i = save
						r = utf8.RuneError
					}
				} else {
					r = utf8.RuneError
				}
			}
			d.buf = utf8.AppendRune(d.buf, r)
		default:
			return "", d.errorf("bad escape")
		}
	}
	return "", d.errorf("unterminated string")
}

func (d *jsonDecoder) hex4() (rune, bool) {
	if len(d.s)-d.i < 4 {
		return 0, false
	}
	var r rune
	for _, c := range d.s[d.i : d.i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	d.i += 4
	return r, true
}

func (d *jsonDecoder) number() (jinja.Value, error) {
	start := d.i
	if d.s[d.i] == '-' {
		d.i++
	}
	digits := func() int {
		n := 0
		for d.i < len(d.s) && d.s[d.i] >= '0' && d.s[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	if d.i < len(d.s) && d.s[d.i] == '0' {
		d.i++
	} else if digits() == 0 {
		return jinja.Undefined(), d.errorf("bad number")
	}
	isFloat := false
	if d.i < len(d.s) && d.s[d.i] == '.' {
		d.i++
		isFloat = true
		if digits() == 0 {
			return jinja.Undefined(), d.errorf("bad number")
		}
	}
	if d.i < len(d.s) && (d.s[d.i] == 'e' || d.s[d.i] == 'E') {
		d.i++
		isFloat = true
		if d.i < len(d.s) && (d.s[d.i] == '+' || d.s[d.i] == '-') {
			d.i++
		}
		if digits() == 0 {
			return jinja.Undefined(), d.errorf("bad number")
		}
	}
	lit := string(d.s[start:d.i])
	if !isFloat {
		n, err := strconv.ParseInt(lit, 10, 64)
		if err != nil {
			return jinja.Undefined(), d.errorf("integer %s out of the int64 range", lit)
		}
		return jinja.NewInt(n), nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !math.IsInf(f, 0) {
		return jinja.Undefined(), d.errorf("bad number %s", lit)
	}
	return jinja.NewFloat(f), nil
}
