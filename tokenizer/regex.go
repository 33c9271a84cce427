package tokenizer

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A small backtracking regex engine for the pre-tokenizer patterns of
// tokenizer.json (Split with {"Regex": ...}). Go's regexp has no lookahead,
// and the GPT-4-style patterns of Llama 3, Qwen 2/3 and DeepSeek V3 need
// `\s+(?!\S)`. Semantics follow Oniguruma (what Hugging Face tokenizers
// uses): leftmost-first alternation, greedy quantifiers that backtrack,
// \s is the Unicode White_Space property.
//
// Supported: literals and escapes (\r \n \t \f \v \\ and escaped
// punctuation), ., classes [...] with ranges, negation, \p{..}/\P{..},
// \s \S \d \D \w \W; groups (...), (?:...), (?i:...), (?=...), (?!...);
// quantifiers ? * + {n} {n,} {n,m} and their lazy forms; alternation; ^ and
// $ (at text start and end). Anything else is a compile error, so a
// tokenizer.json with an unsupported pattern fails to load instead of
// tokenizing wrongly.

// class is a set of runes.
type class struct {
	ascii  [2]uint64 // bitmap of the ASCII members (after negation)
	ranges []runeRange
	tables []*unicode.RangeTable
	union  []*class // members of these are members (\s or \p{L} inside [...])
	negate bool
}

type runeRange struct{ lo, hi rune }

// slowContains reports whether r is a member, without the ASCII bitmap.
func (c *class) slowContains(r rune) bool {
	in := false
	for _, rr := range c.ranges {
		if r >= rr.lo && r <= rr.hi {
			in = true
			break
		}
	}
	if !in {
		for _, t := range c.tables {
			if unicode.Is(t, r) {
				in = true
				break
			}
		}
	}
	if !in {
		for _, u := range c.union {
			if u.slowContains(r) {
				in = true
				break
			}
		}
	}
	return in != c.negate
}

// seal fills the ASCII bitmap; call it once the class is complete.
func (c *class) seal() {
	for r := rune(0); r < 128; r++ {
		if c.slowContains(r) {
			c.ascii[r>>6] |= 1 << (uint(r) & 63)
		}
	}
}

type opcode uint8

const (
	opClass opcode = iota // consume one rune in classes[arg]
	opSplit               // try x, then y
	opJmp                 // goto x
	opLook                // zero-width: sub-program looks[arg] must (not) match
	opBegin               // zero-width: at text start
	opEnd                 // zero-width: at text end
	opMatch
)

type inst struct {
	op   opcode
	arg  int // class or look index
	x, y int
}

type look struct {
	prog   *prog
	negate bool
}

type prog struct {
	insts   []inst
	classes []*class
	looks   []look
}

// Regex is a compiled pattern. It is immutable and safe for concurrent use;
// matching takes a caller-owned backtrack stack.
type Regex struct {
	src  string
	prog *prog
}

// String returns the source pattern.
func (re *Regex) String() string { return re.src }

// node is the parsed syntax tree.
type node struct {
	kind     nodeKind
	cls      *class
	subs     []*node
	min, max int // repeat; max -1 = unbounded
	lazy     bool
	negate   bool // lookahead
}

type nodeKind uint8

const (
	nClass nodeKind = iota
	nConcat
	nAlt
	nRepeat
	nLook
	nBegin
	nEnd
	nEmpty
)

// CompileRegex parses pattern.
func CompileRegex(pattern string) (*Regex, error) {
	p := &parser{src: pattern}
	n, err := p.parseAlt(false)
	if err != nil {
		return nil, fmt.Errorf("cannot compile regex %q: %w", pattern, err)
	}
	if p.pos != len(p.src) {
		return nil, fmt.Errorf("cannot compile regex %q: unexpected ) at %d", pattern, p.pos)
	}
	pr := &prog{}
	c := compiler{prog: pr}
	c.emit(n)
	if c.size > maxProgSize {
		return nil, fmt.Errorf("cannot compile regex %q: program over %d instructions", pattern, maxProgSize)
	}
	pr.insts = append(pr.insts, inst{op: opMatch})
	return &Regex{src: pattern, prog: pr}, nil
}

type parser struct {
	src   string
	pos   int
	fold  bool // inside (?i:...)
	depth int
}

func (p *parser) more() bool { return p.pos < len(p.src) }

func (p *parser) peek() rune {
	r, _ := utf8.DecodeRuneInString(p.src[p.pos:])
	return r
}

func (p *parser) next() rune {
	r, n := utf8.DecodeRuneInString(p.src[p.pos:])
	p.pos += n
	return r
}

func (p *parser) parseAlt(inGroup bool) (*node, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > 100 {
		return nil, fmt.Errorf("nesting too deep")
	}
	var alts []*node
	for {
		seq, err := p.parseConcat()
		if err != nil {
			return nil, err
		}
		alts = append(alts, seq)
		if !p.more() || p.peek() != '|' {
			break
		}
		p.next()
	}
	if p.more() && p.peek() == ')' && !inGroup {
		return nil, fmt.Errorf("unbalanced ) at %d", p.pos)
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return &node{kind: nAlt, subs: alts}, nil
}

func (p *parser) parseConcat() (*node, error) {
	var items []*node
	for p.more() {
		r := p.peek()
		if r == '|' || r == ')' {
			break
		}
		atom, err := p.parseAtom()
		if err != nil {
			return nil, err
		}
		atom, err = p.parseQuant(atom)
		if err != nil {
			return nil, err
		}
		items = append(items, atom)
	}
	switch len(items) {
	case 0:
		return &node{kind: nEmpty}, nil
	case 1:
		return items[0], nil
	}
	return &node{kind: nConcat, subs: items}, nil
}

func (p *parser) parseQuant(atom *node) (*node, error) {
	for p.more() {
		min, max := -1, -1
		switch p.peek() {
		case '?':
			p.next()
			min, max = 0, 1
		case '*':
			p.next()
			min, max = 0, -1
		case '+':
			p.next()
			min, max = 1, -1
		case '{':
			end := strings.IndexByte(p.src[p.pos:], '}')
			if end < 0 {
				return nil, fmt.Errorf("unterminated {")
			}
			body := p.src[p.pos+1 : p.pos+end]
			lo, hi, ok := strings.Cut(body, ",")
			a, err := strconv.Atoi(lo)
			if err != nil || a < 0 || a > 1000 {
				return nil, fmt.Errorf("bad repeat {%s}", body)
			}
			b := a
			if ok {
				if hi == "" {
					b = -1
				} else if b, err = strconv.Atoi(hi); err != nil || b < a || b > 1000 {
					return nil, fmt.Errorf("bad repeat {%s}", body)
				}
			}
			p.pos += end + 1
			min, max = a, b
		default:
			return atom, nil
		}
		if atom.kind == nLook || atom.kind == nBegin || atom.kind == nEnd {
			return nil, fmt.Errorf("quantifier on a zero-width assertion")
		}
		if atom.kind == nRepeat {
			return nil, fmt.Errorf("nested quantifier at %d", p.pos)
		}
		lazy := false
		if p.more() && p.peek() == '?' {
			p.next()
			lazy = true
		} else if p.more() && p.peek() == '+' {
			return nil, fmt.Errorf("possessive quantifiers are not supported")
		}
		atom = &node{kind: nRepeat, subs: []*node{atom}, min: min, max: max, lazy: lazy}
	}
	return atom, nil
}

func (p *parser) parseAtom() (*node, error) {
	r := p.next()
	switch r {
	case '(':
		kind := nodeKind(255)
		negate := false
		fold := p.fold
		if strings.HasPrefix(p.src[p.pos:], "?:") {
			p.pos += 2
		} else if strings.HasPrefix(p.src[p.pos:], "?i:") {
			p.pos += 3
			p.fold = true
		} else if strings.HasPrefix(p.src[p.pos:], "?=") {
			p.pos += 2
			kind = nLook
		} else if strings.HasPrefix(p.src[p.pos:], "?!") {
			p.pos += 2
			kind, negate = nLook, true
		} else if strings.HasPrefix(p.src[p.pos:], "?") {
			return nil, fmt.Errorf("unsupported group at %d", p.pos)
		}
		sub, err := p.parseAlt(true)
		p.fold = fold
		if err != nil {
			return nil, err
		}
		if !p.more() || p.next() != ')' {
			return nil, fmt.Errorf("missing )")
		}
		if kind == nLook {
			return &node{kind: nLook, subs: []*node{sub}, negate: negate}, nil
		}
		return sub, nil
	case '[':
		c, err := p.parseClass()
		if err != nil {
			return nil, err
		}
		return &node{kind: nClass, cls: c}, nil
	case '.':
		c := &class{ranges: []runeRange{{'\n', '\n'}}, negate: true}
		c.seal()
		return &node{kind: nClass, cls: c}, nil
	case '^':
		return &node{kind: nBegin}, nil
	case '$':
		return &node{kind: nEnd}, nil
	case '\\':
		c, lit, err := p.parseEscape()
		if err != nil {
			return nil, err
		}
		if c == nil {
			c = p.literal(lit)
		}
		return &node{kind: nClass, cls: c}, nil
	case '*', '+', '?', '{':
		return nil, fmt.Errorf("nothing to repeat at %d", p.pos-1)
	}
	return &node{kind: nClass, cls: p.literal(r)}, nil
}

// literal is a one-rune class, case-folded inside (?i:...).
func (p *parser) literal(r rune) *class {
	c := &class{ranges: []runeRange{{r, r}}}
	if p.fold {
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			c.ranges = append(c.ranges, runeRange{f, f})
		}
	}
	c.seal()
	return c
}

var (
	spaceClass = func() *class { c := &class{tables: []*unicode.RangeTable{unicode.White_Space}}; c.seal(); return c }()
	digitClass = func() *class { c := &class{tables: []*unicode.RangeTable{unicode.Nd}}; c.seal(); return c }()
	wordClass  = func() *class {
		c := &class{tables: []*unicode.RangeTable{unicode.L, unicode.M, unicode.Nd, unicode.Pc}}
		c.seal()
		return c
	}()
)

// parseEscape reads after a backslash: a class (\s, \p{L} ...) or a
// literal rune.
func (p *parser) parseEscape() (*class, rune, error) {
	if !p.more() {
		return nil, 0, fmt.Errorf("trailing backslash")
	}
	r := p.next()
	switch r {
	case 's':
		return spaceClass, 0, nil
	case 'S':
		return negated(spaceClass), 0, nil
	case 'd':
		return digitClass, 0, nil
	case 'D':
		return negated(digitClass), 0, nil
	case 'w':
		return wordClass, 0, nil
	case 'W':
		return negated(wordClass), 0, nil
	case 'p', 'P':
		var name string
		if p.more() && p.peek() == '{' {
			end := strings.IndexByte(p.src[p.pos:], '}')
			if end < 0 {
				return nil, 0, fmt.Errorf("unterminated \\p{")
			}
			name = p.src[p.pos+1 : p.pos+end]
			p.pos += end + 1
		} else if p.more() {
			name = string(p.next())
		}
		t := unicodeTable(name)
		if t == nil {
			return nil, 0, fmt.Errorf("unknown Unicode class %q", name)
		}
		c := &class{tables: []*unicode.RangeTable{t}}
		c.seal()
		if r == 'P' {
			return negated(c), 0, nil
		}
		return c, 0, nil
	case 'r':
		return nil, '\r', nil
	case 'n':
		return nil, '\n', nil
	case 't':
		return nil, '\t', nil
	case 'f':
		return nil, '\f', nil
	case 'v':
		return nil, '\v', nil
	case 'x':
		if p.pos+2 > len(p.src) {
			return nil, 0, fmt.Errorf("bad \\x escape")
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+2], 16, 8)
		if err != nil {
			return nil, 0, fmt.Errorf("bad \\x escape")
		}
		p.pos += 2
		return nil, rune(v), nil
	}
	if r < 128 && !isASCIIAlnum(r) {
		return nil, r, nil
	}
	return nil, 0, fmt.Errorf("unsupported escape \\%c", r)
}

func isASCIIAlnum(r rune) bool {
	return r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
}

func negated(c *class) *class {
	n := &class{union: []*class{c}, negate: true}
	n.seal()
	return n
}

func unicodeTable(name string) *unicode.RangeTable {
	if t, ok := unicode.Categories[name]; ok {
		return t
	}
	if t, ok := unicode.Scripts[name]; ok {
		return t
	}
	return nil
}

func (p *parser) parseClass() (*class, error) {
	c := &class{}
	if p.more() && p.peek() == '^' {
		p.next()
		c.negate = true
	}
	first := true
	for {
		if !p.more() {
			return nil, fmt.Errorf("unterminated [")
		}
		r := p.next()
		if r == ']' && !first {
			break
		}
		first = false
		var lo rune
		switch r {
		case '\\':
			sub, lit, err := p.parseEscape()
			if err != nil {
				return nil, err
			}
			if sub != nil {
				c.union = append(c.union, sub)
				continue
			}
			lo = lit
		case '[':
			return nil, fmt.Errorf("nested classes are not supported")
		default:
			lo = r
		}
		hi := lo
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.next()
			h := p.next()
			if h == '\\' {
				sub, lit, err := p.parseEscape()
				if err != nil || sub != nil {
					return nil, fmt.Errorf("bad class range")
				}
				h = lit
			}
			if h < lo {
				return nil, fmt.Errorf("bad class range %c-%c", lo, h)
			}
			hi = h
		}
		c.ranges = append(c.ranges, runeRange{lo, hi})
		if p.fold {
			for x := lo; x <= hi && x-lo < 512; x++ {
				for f := unicode.SimpleFold(x); f != x; f = unicode.SimpleFold(f) {
					c.ranges = append(c.ranges, runeRange{f, f})
				}
			}
		}
	}
	c.seal()
	return c, nil
}

// maxProgSize bounds a compiled pattern (counted repeats are expanded).
const maxProgSize = 1 << 16

type compiler struct {
	prog *prog
	// size counts instructions across the program and its lookaheads;
	// emitting stops growing once it passes maxProgSize.
	size int
}

func (c *compiler) pc() int { return len(c.prog.insts) }

func (c *compiler) add(i inst) int {
	c.size++
	c.prog.insts = append(c.prog.insts, i)
	return len(c.prog.insts) - 1
}

func (c *compiler) emit(n *node) {
	if c.size > maxProgSize {
		return
	}
	switch n.kind {
	case nEmpty:
	case nClass:
		c.prog.classes = append(c.prog.classes, n.cls)
		c.add(inst{op: opClass, arg: len(c.prog.classes) - 1})
	case nBegin:
		c.add(inst{op: opBegin})
	case nEnd:
		c.add(inst{op: opEnd})
	case nConcat:
		for _, s := range n.subs {
			c.emit(s)
		}
	case nAlt:
		var jumps []int
		for i, s := range n.subs {
			if i == len(n.subs)-1 {
				c.emit(s)
				break
			}
			split := c.add(inst{op: opSplit})
			c.prog.insts[split].x = c.pc()
			c.emit(s)
			jumps = append(jumps, c.add(inst{op: opJmp}))
			c.prog.insts[split].y = c.pc()
		}
		for _, j := range jumps {
			c.prog.insts[j].x = c.pc()
		}
	case nLook:
		sub := &prog{}
		sc := compiler{prog: sub, size: c.size}
		sc.emit(n.subs[0])
		c.size = sc.size
		sub.insts = append(sub.insts, inst{op: opMatch})
		c.prog.looks = append(c.prog.looks, look{prog: sub, negate: n.negate})
		c.add(inst{op: opLook, arg: len(c.prog.looks) - 1})
	case nRepeat:
		body := n.subs[0]
		for i := 0; i < n.min; i++ {
			c.emit(body)
		}
		if n.max == -1 {
			// L: split body, out; body; jmp L
			split := c.add(inst{op: opSplit})
			c.emit(body)
			c.add(inst{op: opJmp, x: split})
			c.setSplit(split, split+1, c.pc(), n.lazy)
			return
		}
		var splits []int
		for i := n.min; i < n.max; i++ {
			s := c.add(inst{op: opSplit})
			splits = append(splits, s)
			c.emit(body)
			c.prog.insts[s].x = s + 1
		}
		for _, s := range splits {
			c.setSplit(s, s+1, c.pc(), n.lazy)
		}
	}
}

func (c *compiler) setSplit(at, body, out int, lazy bool) {
	if lazy {
		body, out = out, body
	}
	c.prog.insts[at].x, c.prog.insts[at].y = body, out
}

type thread struct{ pc, pos int }

// matcher holds the reusable backtrack stack.
type matcher struct {
	stack []thread
}

// matchAt reports the end of the leftmost-first match of re starting
// exactly at pos, or -1.
func (m *matcher) matchAt(re *Regex, s string, pos int) int {
	return m.run(re.prog, s, pos)
}

// maxSteps bounds the work of one match attempt; patterns of real
// tokenizers backtrack a few steps per rune, so only a pathological pattern
// reaches it (and then fails to match there, the same in every call).
const maxStepsPerByte = 256

func (m *matcher) run(pr *prog, s string, start int) int {
	base := len(m.stack)
	m.stack = append(m.stack, thread{0, start})
	budget := maxStepsPerByte*(len(s)-start+1) + 1024
	for len(m.stack) > base {
		t := m.stack[len(m.stack)-1]
		m.stack = m.stack[:len(m.stack)-1]
		pc, pos := t.pc, t.pos
	thread:
		for {
			budget--
			if budget < 0 {
				m.stack = m.stack[:base]
				return -1
			}
			in := &pr.insts[pc]
			switch in.op {
			case opMatch:
				m.stack = m.stack[:base]
				return pos
			case opClass:
				if pos >= len(s) {
					break thread
				}
				c := s[pos]
				if c < utf8.RuneSelf {
					cls := pr.classes[in.arg]
					if cls.ascii[c>>6]&(1<<(c&63)) == 0 {
						break thread
					}
					pos++
				} else {
					r, n := utf8.DecodeRuneInString(s[pos:])
					if !pr.classes[in.arg].slowContains(r) {
						break thread
					}
					pos += n
				}
				pc++
			case opSplit:
				m.stack = append(m.stack, thread{in.y, pos})
				pc = in.x
			case opJmp:
				pc = in.x
			case opBegin:
				if pos != 0 {
					break thread
				}
				pc++
			case opEnd:
				if pos != len(s) {
					break thread
				}
				pc++
			case opLook:
				l := pr.looks[in.arg]
				ok := m.run(l.prog, s, pos) >= 0
				if ok == l.negate {
					break thread
				}
				pc++
			}
		}
	}
	return -1
}

// findAll calls fn for each non-overlapping leftmost-first match [start,end)
// of re in s, in order. Empty matches are skipped (the scan moves on one
// rune).
func (m *matcher) findAll(re *Regex, s string, fn func(start, end int)) {
	for pos := 0; pos < len(s); {
		end := m.run(re.prog, s, pos)
		if end > pos {
			fn(pos, end)
			pos = end
			continue
		}
		if s[pos] < utf8.RuneSelf {
			pos++
		} else {
			_, n := utf8.DecodeRuneInString(s[pos:])
			pos += n
		}
	}
}
