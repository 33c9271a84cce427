package request

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"unicode/utf8"
)

// scanner validates JSON exactly as encoding/json does (RFC 8259 with its
// leniency: invalid UTF-8 inside strings passes; nesting deeper than
// maxDepth fails) in one pass over the bytes, and hands the values a
// request needs to its callers as spans of the input. It allocates
// nothing; on any syntax error it stops (ok false).
type scanner struct {
	b []byte
	i int
	// depth is the containers open; stack holds one bit per level (1:
	// object) for the generic skipper.
	depth int
	stack [maxDepth/64 + 1]uint64
}

// maxDepth is encoding/json's nesting limit: a document nesting more
// arrays and objects than this is a syntax error.
const maxDepth = 10000

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (s *scanner) ws() {
	for s.i < len(s.b) && isSpace(s.b[s.i]) {
		s.i++
	}
}

// push opens a container; false past maxDepth.
func (s *scanner) push(object bool) bool {
	if s.depth >= maxDepth {
		return false
	}
	w, bit := s.depth/64, uint64(1)<<(s.depth%64)
	if object {
		s.stack[w] |= bit
	} else {
		s.stack[w] &^= bit
	}
	s.depth++
	return true
}

// inObject reports whether the innermost open container is an object.
func (s *scanner) inObject() bool {
	d := s.depth - 1
	return s.stack[d/64]&(1<<(d%64)) != 0
}

// str scans the string starting at s.i (a '"'), leaving s.i after its
// closing quote. plain says it holds no escape and only valid UTF-8, so
// its bytes between the quotes are its value.
func (s *scanner) str() (plain, ok bool) {
	b := s.b
	start := s.i + 1
	i := start
	esc, high := false, false
	var acc uint64
	for {
		// Eight bytes at a time up to one that needs a look: '"', '\\' or
		// a control character (SWAR: a byte's high bit is set in t for
		// each, exactly when there is one).
		for i+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[i:])
			q, bs := x^(lsb*'"'), x^(lsb*'\\')
			t := ((q - lsb) &^ q) | ((bs - lsb) &^ bs) | ((x - lsb*0x20) &^ x)
			if t&msb != 0 {
				break
			}
			acc |= x
			i += 8
		}
		if i >= len(b) {
			return false, false
		}
		c := b[i]
		switch {
		case c == '"':
			s.i = i + 1
			if esc || (high || acc&msb != 0) && !utf8.Valid(b[start:i]) {
				return false, true
			}
			return true, true
		case c == '\\':
			esc = true
			i++
			if i >= len(b) {
				return false, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if i+5 > len(b) {
					return false, false
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						return false, false
					}
				}
				i += 5
			default:
				return false, false
			}
		case c < 0x20:
			return false, false
		default:
			if c >= utf8.RuneSelf {
				high = true
			}
			i++
		}
	}
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// number scans -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? at s.i.
func (s *scanner) number() bool {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return false
	case b[i] == '0':
		i++
	case '1' <= b[i] && b[i] <= '9':
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return false
		}
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return false
		}
		for i++; i < len(b) && isDigit(b[i]); i++ {
		}
	}
	s.i = i
	return true
}

func (s *scanner) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

// scalar scans a string, number or literal at s.i.
func (s *scanner) scalar() bool {
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '"':
		_, ok := s.str()
		return ok
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	default:
		return s.number()
	}
}

// key scans `"name"` and the colon after it (whitespace allowed around),
// returning the name's span.
func (s *scanner) key() (start, end int, plain, ok bool) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return 0, 0, false, false
	}
	start = s.i
	if plain, ok = s.str(); !ok {
		return 0, 0, false, false
	}
	end = s.i
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != ':' {
		return 0, 0, false, false
	}
	s.i++
	s.ws()
	return start, end, plain, true
}

// skip scans one value at s.i (whitespace before it skipped), however
// deeply nested, without recursion.
func (s *scanner) skip() bool {
	base := s.depth
	for {
		// A value.
		s.ws()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case '{', '[':
			object := s.b[s.i] == '{'
			s.i++
			if !s.push(object) {
				return false
			}
			s.ws()
			if s.i < len(s.b) && s.b[s.i] == "]}"[b2i(object)] {
				s.i++
				s.depth--
				break
			}
			if object {
				if _, _, _, ok := s.key(); !ok {
					return false
				}
			}
			continue
		default:
			if !s.scalar() {
				return false
			}
		}
		// After a value: close containers, or a comma and the next one.
		for {
			if s.depth == base {
				return true
			}
			s.ws()
			if s.i >= len(s.b) {
				return false
			}
			object := s.inObject()
			c := s.b[s.i]
			s.i++
			if c == ',' {
				if object {
					if _, _, _, ok := s.key(); !ok {
						return false
					}
				}
				break
			}
			if c != "]}"[b2i(object)] {
				return false
			}
			s.depth--
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// object scans the object at s.i (a '{'), calling field with each member's
// key span, whether the key is plain, and the scanner positioned at the
// value, which field must scan (s.skip() when it has no interest).
func (s *scanner) object(field func(keyStart, keyEnd int, plain bool) bool) bool {
	s.i++
	if !s.push(true) {
		return false
	}
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		s.depth--
		return true
	}
	for {
		ks, ke, plain, ok := s.key()
		if !ok || !field(ks, ke, plain) {
			return false
		}
		s.ws()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case '}':
			s.i++
			s.depth--
			return true
		default:
			return false
		}
	}
}

// array scans the array at s.i (a '['), calling elem with the scanner
// positioned at each element, which elem must scan.
func (s *scanner) array(elem func(i int) bool) bool {
	s.i++
	if !s.push(false) {
		return false
	}
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		s.depth--
		return true
	}
	for n := 0; ; n++ {
		s.ws()
		if !elem(n) {
			return false
		}
		s.ws()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
		case ']':
			s.i++
			s.depth--
			return true
		default:
			return false
		}
	}
}

// keyIs reports whether the key at b[start:end] (quotes included) names
// name as encoding/json matches struct fields: exactly or under Unicode
// case folding, after unescaping.
func keyIs(b []byte, start, end int, plain bool, name string) bool {
	k := b[start+1 : end-1]
	if plain {
		return bytes.EqualFold(k, []byte(name))
	}
	var u string
	if json.Unmarshal(b[start:end], &u) != nil {
		return false
	}
	return bytes.EqualFold([]byte(u), []byte(name))
}

// stringValue is the value of the valid JSON string raw (quotes
// included), decoded as encoding/json decodes it.
func stringValue(raw []byte, plain bool) string {
	if plain {
		return string(raw[1 : len(raw)-1])
	}
	var s string
	_ = json.Unmarshal(raw, &s) // raw is a valid string: cannot fail
	return s
}
