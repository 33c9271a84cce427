package prompttemplate

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/inferencecache/inferencecache/policy"
)

func stable(name string) policy.TemplateSlot {
	return policy.TemplateSlot{Name: name, Type: policy.SlotStable, Required: true}
}
func mutable(name string) policy.TemplateSlot {
	return policy.TemplateSlot{Name: name, Type: policy.SlotMutable}
}

func mustCompile(t *testing.T, body string, slots ...policy.TemplateSlot) *Template {
	t.Helper()
	c, err := Compile(&policy.Template{PromptTemplate: &policy.PromptTemplate{Namespace: "ns", Name: "t", Body: body, Slots: slots}, Revision: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNames(t *testing.T) {
	f := func(body string, want ...string) {
		t.Helper()
		got, err := Names(body)
		if err != nil {
			t.Fatalf("Names(%q): %v", body, err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("Names(%q) = %v, want %v", body, got, want)
		}
	}
	f("plain text")
	f("{{ a }} and {{ b|upper }} {{ c.attr }} {{ d['k'] }}", "a", "b", "c", "d")
	f("{{ x | default('none') | truncate(10, killwords=true) }}", "x")
	f("{% if a is defined and b is not none %}{{ a }}{% endif %}", "a", "b")
	f("{% for doc in docs if doc != skip %}{{ loop.index }}: {{ doc }}{% endfor %}", "docs", "skip")
	f("{% for k, v in pairs.items() %}{{ k }}={{ v }}{% endfor %}", "pairs")
	f("{% set greeting = 'Hi ' ~ name %}{{ greeting }}", "name")
	f("{% set ns = namespace(n=0) %}{% for i in range(count) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", "count")
	f("{% macro card(title, body='x') %}<{{ title }}|{{ body }}|{{ footer }}>{% endmacro %}{{ card(heading) }}", "footer", "heading")
	f("{# {{ hidden }} #}{% raw %}{{ literal }}{% endraw %}{{ shown }}", "shown")
	f("{{ 'a}}b' ~ tail }}", "tail")
	f(`{{ "quoted {{ x }}" }}{{ y }}`, "y")
	f("{%- if flag -%}\n{{- value -}}\n{%- endif -%}", "flag", "value")
	f("{% filter upper %}{{ shout }}{% endfilter %}", "shout")
	f("{{ raise_exception('no') if not q else q }}", "q")
	f("{{ [a, b][0] }}{{ {'k': c} }}", "a", "b", "c")
	f("{{ n > 3 and n <= 10 }}{{ 2 ** e }}", "e", "n")
}

func TestValidate(t *testing.T) {
	ok := []policy.TemplateSlot{stable("system"), mutable("question")}
	if err := Validate("{{ system }}\n\nUser: {{ question }}", ok); err != nil {
		t.Fatalf("a valid template: %v", err)
	}
	for name, c := range map[string]struct {
		body  string
		slots []policy.TemplateSlot
		want  []string
	}{
		"undeclared": {"{{ system }} {{ extra }}", []policy.TemplateSlot{stable("system")},
			[]string{`the body uses "extra", which is not a declared slot`}},
		"unused": {"{{ system }}", ok, []string{`slot "question" is declared but the body never uses it`}},
		"both":   {"{{ other }}", ok, []string{`uses "other"`, `"question" is declared but`, `"system" is declared but`}},
		"syntax": {"{{ system ", ok, []string{"cannot compile"}},
		"bad slot type": {"{{ s }}", []policy.TemplateSlot{{Name: "s", Type: "stable"}},
			[]string{`slot "s" has type "stable"`}},
		"duplicate slot": {"{{ s }}", []policy.TemplateSlot{stable("s"), mutable("s")}, []string{`slot "s" is declared twice`}},
		"empty name":     {"{{ s }}", []policy.TemplateSlot{stable("s"), {Type: "Stable"}}, []string{"empty name"}},
		"empty body":     {"", nil, []string{"empty body"}},
		// A loop variable or a set target is not a slot.
		"bound names are fine": {"{% for d in docs %}{{ d }}{% endfor %}{% set x = 1 %}{{ x }}", []policy.TemplateSlot{stable("docs")}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			err := Validate(c.body, c.slots)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidTemplate) {
				t.Fatalf("err = %v, want ErrInvalidTemplate", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestRender(t *testing.T) {
	tm := mustCompile(t, "System: {{ system }}\nContext: {{ ctx }}\nUser: {{ question }}{% if note %} ({{ note }}){% endif %}",
		stable("system"), policy.TemplateSlot{Name: "ctx", Type: policy.SlotStable}, mutable("question"), mutable("note"))
	r, err := tm.Render(map[string]string{"system": "You help.", "ctx": "docs", "question": "Why?"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "System: You help.\nContext: docs\nUser: Why?"; r.Text != want {
		t.Fatalf("rendered %q, want %q", r.Text, want)
	}
	if got, want := r.Text[:r.StableLen], "System: You help.\nContext: docs\nUser: "; got != want {
		t.Errorf("stable prefix %q, want %q", got, want)
	}
	// Another question, same stable values: same stable prefix.
	r2, _ := tm.Render(map[string]string{"system": "You help.", "ctx": "docs", "question": "User: again", "note": "n"})
	if r2.Text[:r2.StableLen] != r.Text[:r.StableLen] {
		t.Errorf("stable prefix moved with a mutable value: %q", r2.Text[:r2.StableLen])
	}
	// Another stable value: another stable prefix.
	r3, _ := tm.Render(map[string]string{"system": "You refuse.", "question": "Why?"})
	if got, want := r3.Text[:r3.StableLen], "System: You refuse.\nContext: \nUser: "; got != want {
		t.Errorf("stable prefix %q, want %q", got, want)
	}

	for name, c := range map[string]struct {
		vars map[string]string
		want string
	}{
		"missing required": {map[string]string{"question": "q"}, `required slot "system" is missing`},
		"unknown variable": {map[string]string{"system": "s", "sytem": "typo"}, `"sytem" is not a slot`},
		"not text":         {map[string]string{"system": "\xff"}, "not UTF-8 text"},
		"too long":         {map[string]string{"system": strings.Repeat("x", MaxValueBytes+1)}, "over"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := tm.Render(c.vars)
			if !errors.Is(err, ErrRender) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want ErrRender saying %q", err, c.want)
			}
		})
	}
}

func TestRenderErrorsAndStability(t *testing.T) {
	t.Run("the template raises", func(t *testing.T) {
		tm := mustCompile(t, "{% if n|int == 0 %}{{ raise_exception('n must be a positive number') }}{% endif %}{{ n }}", stable("n"))
		if _, err := tm.Render(map[string]string{"n": "abc"}); !errors.Is(err, ErrRender) || !strings.Contains(err.Error(), "positive number") {
			t.Errorf("err = %v", err)
		}
		if r, err := tm.Render(map[string]string{"n": "3"}); err != nil || r.Text != "3" || r.StableLen != 1 {
			t.Errorf("got %+v, %v", r, err)
		}
	})
	t.Run("a rendering over the cap", func(t *testing.T) {
		tm := mustCompile(t, "{% for i in range(n|int) %}{{ s }}{% endfor %}", stable("n"), stable("s"))
		if _, err := tm.Render(map[string]string{"n": "5000", "s": strings.Repeat("y", 1000)}); !errors.Is(err, ErrRender) || !strings.Contains(err.Error(), "over") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("control flow on a mutable slot ends the stable prefix there", func(t *testing.T) {
		tm := mustCompile(t, "A{{ s }}B{% if m == '' %}EMPTY{% endif %}C{{ m }}", stable("s"), mutable("m"))
		r, _ := tm.Render(map[string]string{"s": "x", "m": ""})
		if r.Text != "AxBEMPTYC" || r.Text[:r.StableLen] != "AxB" {
			t.Errorf("got %q stable %q, want stable AxB", r.Text, r.Text[:r.StableLen])
		}
		r, _ = tm.Render(map[string]string{"s": "x", "m": "v"})
		if r.Text[:r.StableLen] != "AxBC" {
			t.Errorf("got %q stable %q, want AxBC", r.Text, r.Text[:r.StableLen])
		}
	})
	t.Run("a probe that raises claims nothing", func(t *testing.T) {
		tm := mustCompile(t, "Head {% if m not in ['a', 'b'] %}{{ raise_exception('bad') }}{% endif %}{{ m }}", mutable("m"))
		r, err := tm.Render(map[string]string{"m": "a"})
		if err != nil || r.Text != "Head a" || r.StableLen != 0 {
			t.Errorf("got %+v, %v; want stable length 0", r, err)
		}
	})
	t.Run("no mutable slot: all of it is stable", func(t *testing.T) {
		tm := mustCompile(t, "{{ s }}!", stable("s"))
		if r, _ := tm.Render(map[string]string{"s": "é"}); r.StableLen != len(r.Text) {
			t.Errorf("stable %d of %d", r.StableLen, len(r.Text))
		}
	})
	t.Run("the prefix ends on a UTF-8 boundary", func(t *testing.T) {
		// Both probes start with U+E00x (EE 80 8x): without the cut the
		// common prefix would end inside the character.
		tm := mustCompile(t, "é{{ m }}", mutable("m"))
		r, _ := tm.Render(map[string]string{"m": "\uE005"})
		if r.StableLen != len("é") {
			t.Errorf("stable length %d, want %d", r.StableLen, len("é"))
		}
	})
	t.Run("the cache keeps stable values apart and stays bounded", func(t *testing.T) {
		tm := mustCompile(t, "{{ s }}|{{ m }}", stable("s"), mutable("m"))
		for i := range 3 * stableCacheEntries {
			v := strings.Repeat("a", i%7) + string(rune('a'+i%26))
			r, err := tm.Render(map[string]string{"s": v, "m": "q"})
			if err != nil || r.Text[:r.StableLen] != v+"|" {
				t.Fatalf("i=%d: stable %q of %q, %v", i, r.Text[:r.StableLen], r.Text, err)
			}
		}
		tm.mu.Lock()
		n := len(tm.stable) + len(tm.old)
		tm.mu.Unlock()
		if n > 2*stableCacheEntries {
			t.Errorf("cache holds %d entries", n)
		}
	})
}

func TestCompileErrors(t *testing.T) {
	_, err := Compile(&policy.Template{PromptTemplate: &policy.PromptTemplate{Namespace: "ns", Name: "t", Body: "{% for x in %}"}})
	if !errors.Is(err, ErrInvalidTemplate) || !strings.Contains(err.Error(), "ns/t") {
		t.Errorf("err = %v", err)
	}
}

// FuzzNames: the analysis never panics on a body the engine compiles, and
// every name it reports is an identifier that occurs in the body.
func FuzzNames(f *testing.F) {
	for _, s := range []string{
		"{{ a }}", "{% for x in y %}{{ x }}{% endfor %}", "{% set a.b = c %}", "{{ 'a' ~ b }}",
		"{% macro m(p, q=r) %}{{ p }}{% endmacro %}", "{# c #}{% raw %}{{ z }}{% endraw %}",
		"{{ f(a=1, b=c) }}", "{% call(x) m(y) %}{{ x }}{% endcall %}", "{{ x is not defined }}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		if _, err := compile(body); err != nil {
			return
		}
		names, err := Names(body)
		if err != nil {
			return
		}
		for _, n := range names {
			if n == "" || !strings.Contains(body, n) || keywords[n] || builtins[n] {
				t.Fatalf("Names(%q) reported %q", body, n)
			}
		}
		_ = Validate(body, nil)
	})
}
