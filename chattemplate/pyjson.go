package chattemplate

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// pyTojson is transformers' tojson filter: json.dumps(x,
// ensure_ascii=False, indent=None, separators=None, sort_keys=False), with
// those four also accepted positionally. It writes floats as Python's repr
// does ("1.0", "1e-05", "1.5e+16"), keys in insertion order, and ", " /
// ": " separators (',' and ': ' when indented), as the engine's Python does.
func pyTojson(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), fmt.Errorf("tojson: no value")
	}
	opt := pyJSON{item: ", ", key: ": "}
	get := func(pos int, name string) (jinja.Value, bool) {
		if v, ok := kwargs[name]; ok {
			return v, true
		}
		if len(args) > pos {
			return args[pos], true
		}
		return jinja.Undefined(), false
	}
	if v, ok := get(1, "ensure_ascii"); ok {
		opt.ascii = v.IsTruthy()
	}
	if v, ok := get(2, "indent"); ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsInt():
			opt.indent = strings.Repeat(" ", max(0, int(v.AsInt())))
		case v.IsString():
			opt.indent = v.AsString()
		default:
			return jinja.Undefined(), fmt.Errorf("tojson: indent must be an int or a string")
		}
		opt.indented = true
		opt.item = ","
	}
	if v, ok := get(3, "separators"); ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Get(0).IsString() || !v.AsList().Get(1).IsString() {
			return jinja.Undefined(), fmt.Errorf("tojson: separators must be two strings")
		}
		opt.item, opt.key = v.AsList().Get(0).AsString(), v.AsList().Get(1).AsString()
	}
	if v, ok := get(4, "sort_keys"); ok {
		opt.sortKeys = v.IsTruthy()
	}
	var b strings.Builder
	if err := opt.encode(&b, args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(b.String()), nil
}

type pyJSON struct {
	item, key, indent string
	indented          bool
	ascii, sortKeys   bool
}

func (o *pyJSON) newline(b *strings.Builder, level int) {
	if !o.indented {
		return
	}
	b.WriteByte('\n')
	for range level {
		b.WriteString(o.indent)
	}
}

func (o *pyJSON) encode(b *strings.Builder, v jinja.Value, level int) error {
	if level > maxDepth {
		return fmt.Errorf("tojson: nested deeper than %d", maxDepth)
	}
	switch {
	case v.IsNone():
		b.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pyFloatJSON(v.AsFloat()))
	case v.IsString():
		writePyJSONString(b, v.AsString(), o.ascii)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(o.item)
			}
			o.newline(b, level+1)
			if err := o.encode(b, it, level+1); err != nil {
				return err
			}
		}
		o.newline(b, level)
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		keys := d.OrderedKeys()
		if len(keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		if o.sortKeys {
			keys = slices.Sorted(slices.Values(keys))
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(o.item)
			}
			o.newline(b, level+1)
			writePyJSONString(b, k, o.ascii)
			b.WriteString(o.key)
			val, _ := d.Get(k)
			if err := o.encode(b, val, level+1); err != nil {
				return err
			}
		}
		o.newline(b, level)
		b.WriteByte('}')
	default:
		// Python raises TypeError for Undefined and callables.
		return fmt.Errorf("tojson: %s is not JSON serializable", v.String())
	}
	return nil
}

// writePyJSONString writes s as json.dumps does: '"', '\\' and control
// characters escaped (\n, \r, \t, \b, \f short; others \u00XX), and with
// ensure_ascii every non-ASCII rune as \uXXXX (surrogate pairs above the
// BMP), lower-case hex.
func writePyJSONString(b *strings.Builder, s string, ascii bool) {
	const hex = "0123456789abcdef"
	u4 := func(r rune) {
		b.WriteString(`\u`)
		b.WriteByte(hex[r>>12&0xf])
		b.WriteByte(hex[r>>8&0xf])
		b.WriteByte(hex[r>>4&0xf])
		b.WriteByte(hex[r&0xf])
	}
	b.WriteByte('"')
	last := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && (c < utf8.RuneSelf || !ascii) {
			i++
			continue
		}
		b.WriteString(s[last:i])
		if c >= utf8.RuneSelf {
			r, n := utf8.DecodeRuneInString(s[i:])
			if r > 0xffff {
				r1, r2 := utf16.EncodeRune(r)
				u4(r1)
				u4(r2)
			} else {
				u4(r)
			}
			i += n
			last = i
			continue
		}
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			u4(rune(c))
		}
		i++
		last = i
	}
	b.WriteString(s[last:])
	b.WriteByte('"')
}

// pyFloatJSON is json.dumps of a float: repr, or Infinity/-Infinity/NaN.
func pyFloatJSON(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case math.IsNaN(f):
		return "NaN"
	}
	return pyFloatRepr(f)
}

// pyFloatRepr is Python's repr of a finite float: the shortest digits that
// round-trip, positional when the decimal exponent is in [-4, 16) (always
// with a fractional part: "1.0"), scientific otherwise ("1e-05", "1.5e+16").
func pyFloatRepr(f float64) string {
	e := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±XX
	neg := strings.HasPrefix(e, "-")
	e = strings.TrimPrefix(e, "-")
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	digits := strings.Replace(mant, ".", "", 1)
	var out string
	if exp >= -4 && exp < 16 {
		if exp >= 0 {
			if len(digits) <= exp+1 {
				out = digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
			} else {
				out = digits[:exp+1] + "." + digits[exp+1:]
			}
		} else {
			out = "0." + strings.Repeat("0", -exp-1) + digits
		}
	} else {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		out = fmt.Sprintf("%se%s%02d", m, sign, exp)
	}
	if neg {
		return "-" + out
	}
	return out
}
