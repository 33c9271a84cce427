// Package prompttemplate renders PromptTemplates (spec.body, a Jinja
// template, with spec.slots) for RenderTemplate, finds the part of a
// rendering that its Stable slots alone decide, and checks a template's
// slots against its body for the admission webhook (Validate).
//
// Rendering uses github.com/ardanlabs/jinja, the engine the chat templates
// use (chattemplate). Slot values are text (the RPC's variables are a
// map<string, string>); each declared slot is a template variable, and an
// optional slot the caller leaves out is undefined (renders empty).
//
// The stable prefix. A rendering's stable prefix is its longest leading
// part that depends on the Stable slots only: Render renders the template
// again with every Mutable slot (given or not) set to one marker value, and
// again with another, and takes the longest common prefix of the three
// renderings, cut back to a UTF-8 boundary. Output that a Mutable slot
// decides differs between the renderings from its first byte on; output
// before it cannot depend on one. If a probe rendering fails (a template
// that raises on an unexpected value), the stable prefix is empty: nothing
// is claimed that was not observed. The probes' results are cached per
// (template, Stable values), so a stream of requests that share their
// Stable values pays one rendering each.
//
// Package policy holds the wire form; this package imports nothing else of
// ours, so the operator's webhook can use Validate.
package prompttemplate

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"

	"github.com/inferencecache/inferencecache/policy"
)

// Errors. Render's wrap ErrRender; Validate's wrap ErrInvalidTemplate.
var (
	ErrRender          = errors.New("prompttemplate: cannot render")
	ErrInvalidTemplate = errors.New("prompttemplate: invalid template")
)

// Limits of Render's input.
const (
	// MaxValueBytes caps one slot value.
	MaxValueBytes = 1 << 20
	// MaxRenderBytes caps a rendering (a template that loops may grow it
	// far beyond its input).
	MaxRenderBytes = 4 << 20
	// stableCacheEntries bounds each template's cache of stable prefixes.
	stableCacheEntries = 1024
)

// The marker values the stable-prefix probes give every Mutable slot: two
// different strings of private-use characters, which prompts do not
// contain, of different lengths.
const (
	probeA = "\uE000\uE001"
	probeB = "\uE002\uE003\uE004"
)

// Template is a compiled PromptTemplate. It is safe for concurrent use.
type Template struct {
	ref      string
	revision string
	tmpl     *jinja.Template
	slots    []policy.TemplateSlot
	bySlot   map[string]int
	required []string
	mutable  []string

	// mu guards stable, the cache of the probes' common prefix keyed by
	// the Stable slots' values (stableKey), and old, the previous
	// generation (a cache that fills up becomes old and a new one starts).
	mu          sync.Mutex
	stable, old map[string]string
}

// Compile compiles t. The error wraps ErrInvalidTemplate.
func Compile(t *policy.Template) (*Template, error) {
	tm, err := compile(t.Body)
	if err != nil {
		return nil, fmt.Errorf("%w: %s/%s: %w", ErrInvalidTemplate, t.Namespace, t.Name, err)
	}
	c := &Template{ref: policy.Ref(t.Namespace, t.Name), revision: t.Revision, tmpl: tm,
		slots: t.Slots, bySlot: make(map[string]int, len(t.Slots)), stable: map[string]string{}}
	for i, s := range t.Slots {
		c.bySlot[s.Name] = i
		if s.Required {
			c.required = append(c.required, s.Name)
		}
		if s.Type == policy.SlotMutable {
			c.mutable = append(c.mutable, s.Name)
		}
	}
	return c, nil
}

// compile wraps jinja.Compile: a body the engine cannot parse is an
// error, even if the engine panics on it.
func compile(body string) (tm *jinja.Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot compile: %v", r)
		}
	}()
	tm, err = jinja.Compile(body)
	if err != nil {
		return nil, fmt.Errorf("cannot compile: %w", err)
	}
	return tm, nil
}

// Revision is the template's revision (status.templateRevision).
func (t *Template) Revision() string { return t.revision }

// Rendering is one rendered template.
type Rendering struct {
	// Text is the rendered prompt.
	Text string
	// StableLen is the length in bytes of Text's stable prefix (see the
	// package comment): Text[:StableLen] depends on Stable slots only.
	StableLen int
}

// Render renders t with vars. It fails (ErrRender) when a required slot is
// missing, a variable names no declared slot, a value is not UTF-8 text or
// exceeds MaxValueBytes, the template raises an error while rendering
// (raise_exception, or an operation the engine refuses), or the rendering
// exceeds MaxRenderBytes.
func (t *Template) Render(vars map[string]string) (Rendering, error) {
	for _, name := range t.required {
		if _, ok := vars[name]; !ok {
			return Rendering{}, fmt.Errorf("%w %s: required slot %q is missing", ErrRender, t.ref, name)
		}
	}
	for name, v := range vars {
		if _, ok := t.bySlot[name]; !ok {
			return Rendering{}, fmt.Errorf("%w %s: %q is not a slot of the template (declared: %s)", ErrRender, t.ref, clip(name), t.slotNames())
		}
		switch {
		case len(v) > MaxValueBytes:
			return Rendering{}, fmt.Errorf("%w %s: slot %q is %d bytes, over %d", ErrRender, t.ref, name, len(v), MaxValueBytes)
		case !utf8.ValidString(v):
			return Rendering{}, fmt.Errorf("%w %s: slot %q is not UTF-8 text (slots are text)", ErrRender, t.ref, name)
		}
	}
	text, err := t.render(vars, "")
	if err != nil {
		return Rendering{}, err
	}
	return Rendering{Text: text, StableLen: t.stableLen(vars, text)}, nil
}

func (t *Template) slotNames() string {
	names := make([]string, len(t.slots))
	for i, s := range t.slots {
		names[i] = s.Name
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// render renders with vars; a non-empty probe replaces every Mutable slot.
func (t *Template) render(vars map[string]string, probe string) (out string, err error) {
	data := make(map[string]any, len(t.slots))
	for name, v := range vars {
		data[name] = v
	}
	if probe != "" {
		for _, name := range t.mutable {
			data[name] = probe
		}
	}
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("%w %s: the template engine failed: %v", ErrRender, t.ref, r)
		}
	}()
	out, err = t.tmpl.Render(data)
	if err != nil {
		return "", fmt.Errorf("%w %s: %w", ErrRender, t.ref, err)
	}
	if len(out) > MaxRenderBytes {
		return "", fmt.Errorf("%w %s: the rendering is %d bytes, over %d", ErrRender, t.ref, len(out), MaxRenderBytes)
	}
	return out, nil
}

// stableLen is the stable prefix length of text, the rendering of vars:
// the common prefix of text and the probes' common prefix, which depends
// on the Stable values only and is cached by them.
func (t *Template) stableLen(vars map[string]string, text string) int {
	if len(t.mutable) == 0 {
		return len(text)
	}
	key := t.stableKey(vars)
	t.mu.Lock()
	p, ok := t.stable[key]
	if !ok {
		p, ok = t.old[key]
	}
	t.mu.Unlock()
	if !ok {
		p = t.probe(vars)
		t.mu.Lock()
		if len(t.stable) >= stableCacheEntries {
			t.old, t.stable = t.stable, make(map[string]string, stableCacheEntries)
		}
		t.stable[key] = p
		t.mu.Unlock()
	}
	return commonPrefix(text, p)
}

// probe renders with both marker values and returns their common prefix
// ("" when either fails).
func (t *Template) probe(vars map[string]string) string {
	a, err := t.render(vars, probeA)
	if err != nil {
		return ""
	}
	b, err := t.render(vars, probeB)
	if err != nil {
		return ""
	}
	return a[:commonPrefix(a, b)]
}

// stableKey identifies the Stable slots' values (length-prefixed, in slot
// order, with presence).
func (t *Template) stableKey(vars map[string]string) string {
	var b strings.Builder
	for _, s := range t.slots {
		if s.Type != policy.SlotStable {
			continue
		}
		v, ok := vars[s.Name]
		if !ok {
			b.WriteString("-;")
			continue
		}
		fmt.Fprintf(&b, "%d:", len(v))
		b.WriteString(v)
	}
	return b.String()
}

// commonPrefix returns the length of the longest common prefix of a and b,
// cut back to the start of a UTF-8 sequence.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i < len(a) {
		for i > 0 && !utf8.RuneStart(a[i]) {
			i--
		}
	}
	return i
}

// Problem is one thing wrong with a PromptTemplate spec. Slot is the index
// of the slot it is about (-1: the body); Attr the slot's attribute ("name",
// "type"); Value the offending value, so that a caller keying problems by
// (place, value) can tell a new problem from one the spec already had.
type Problem struct {
	Slot   int
	Attr   string
	Value  string
	Detail string
}

// Check lists what is wrong with a PromptTemplate spec, the rules the
// admission webhook enforces: the body is non-empty and compiles, every name
// it reads is a declared slot, every declared slot is read, and slot
// declarations are well formed (non-empty unique names, type Stable or
// Mutable). Problems come in a stable order.
func Check(body string, slots []policy.TemplateSlot) []Problem {
	var out []Problem
	bodyProblem := func(value, detail string) {
		out = append(out, Problem{Slot: -1, Value: value, Detail: detail})
	}
	if body == "" {
		bodyProblem("", "empty body")
	}
	declared := map[string]int{} // slot name → index of its first declaration
	for i, s := range slots {
		switch _, dup := declared[s.Name]; {
		case s.Name == "":
			out = append(out, Problem{Slot: i, Attr: "name", Detail: "a slot has an empty name"})
		case dup:
			out = append(out, Problem{Slot: i, Attr: "name", Value: s.Name, Detail: fmt.Sprintf("slot %q is declared twice", s.Name)})
		default:
			declared[s.Name] = i
		}
		if s.Type != policy.SlotStable && s.Type != policy.SlotMutable {
			out = append(out, Problem{Slot: i, Attr: "type", Value: s.Type,
				Detail: fmt.Sprintf("slot %q has type %q, want Stable or Mutable", s.Name, s.Type)})
		}
	}
	if body == "" {
		return out
	}
	if _, err := compile(body); err != nil {
		bodyProblem(err.Error(), "the body "+err.Error())
		return out
	}
	names, err := Names(body)
	if err != nil {
		bodyProblem(err.Error(), "the body cannot be analyzed: "+err.Error())
		return out
	}
	used := map[string]bool{}
	for _, n := range names {
		used[n] = true
		if _, ok := declared[n]; !ok {
			bodyProblem(n, fmt.Sprintf("the body uses %q, which is not a declared slot", n))
		}
	}
	var unused []string
	for n := range declared {
		if n != "" && !used[n] {
			unused = append(unused, n)
		}
	}
	slices.Sort(unused)
	for _, n := range unused {
		out = append(out, Problem{Slot: declared[n], Attr: "name", Value: n,
			Detail: fmt.Sprintf("slot %q is declared but the body never uses it", n)})
	}
	return out
}

// Validate is Check as one error wrapping ErrInvalidTemplate that names
// every problem found (nil when there is none).
func Validate(body string, slots []policy.TemplateSlot) error {
	problems := Check(body, slots)
	if len(problems) == 0 {
		return nil
	}
	details := make([]string, len(problems))
	for i, p := range problems {
		details[i] = p.Detail
	}
	return fmt.Errorf("%w: %s", ErrInvalidTemplate, strings.Join(details, "; "))
}
