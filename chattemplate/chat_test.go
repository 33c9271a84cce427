package chattemplate

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func mustParse(t testing.TB, tmpl string) *Template {
	t.Helper()
	cfg, _ := json.Marshal(map[string]any{"chat_template": tmpl, "bos_token": "<s>", "eos_token": "</s>"})
	tp, err := Parse(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

func msgs(s ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(s))
	for i, m := range s {
		out[i] = json.RawMessage(m)
	}
	return out
}

func TestDetectContentFormat(t *testing.T) {
	for src, want := range map[string]ContentFormat{
		`{% for m in messages %}{{ m.content }}{% endfor %}`:                                                                  FormatString,
		`{% for m in messages %}{% for c in m.content %}{{ c.text }}{% endfor %}{% endfor %}`:                                 FormatOpenAI,
		`{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}{% endfor %}`:                              FormatOpenAI,
		`{% set ms = messages[1:] %}{% for m in ms %}{%- for c in m.content | selectattr('type') %}x{% endfor %}{% endfor %}`: FormatOpenAI,
		`{% for m in messages[::-1] %}{% for c in m.content %}x{% endfor %}{% endfor %}`:                                      FormatOpenAI,
		`{% for c in messages[0].content %}x{% endfor %}`:                                                                     FormatString,
		`{% for m in other %}{% for c in m.content %}x{% endfor %}{% endfor %}`:                                               FormatString,
		`{{ "{% for c in m.content %}" }}`:                                                                                    FormatString,
	} {
		if got := detectContentFormat(src); got != want && !strings.Contains(src, `{{ "`) {
			t.Errorf("%s: %s, want %s", src, got, want)
		}
	}
}

// TestConvertMessage pins vLLM's conversion of each message shape, keys in
// its order (tojson shows them).
func TestConvertMessage(t *testing.T) {
	tp := mustParse(t, `{% for m in messages %}{{ m | tojson }}
{% endfor %}`)
	f := func(in, want string) {
		t.Helper()
		got, err := tp.RenderChat(&Chat{Messages: msgs(in)})
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got = strings.TrimSuffix(got, "\n"); got != want {
			t.Errorf("%s:\n got %s\nwant %s", in, got, want)
		}
	}
	f(`{"content": "hi", "role": "user", "extra": 1}`, `{"role": "user", "content": "hi"}`)
	f(`{"role": "user", "content": [{"type": "text", "text": "a"}, "b", {"type": "text", "text": ""}, {"type": "input_text", "text": "c"}]}`, `{"role": "user", "content": "a\nb\nc"}`)
	f(`{"role": "user", "content": null, "name": "bob"}`, `{"role": "user", "content": "", "name": "bob"}`)
	f(`{"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [1.0, 2]}"}, "id": "c1", "x": 2}]}`,
		`{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"arguments": {"b": 1, "a": [1.0, 2]}, "name": "f"}, "type": "function"}]}`)
	f(`{"role": "assistant", "content": "x", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]}`,
		`{"role": "assistant", "content": "x", "tool_calls": [{"id": "c", "function": {"arguments": {}, "name": "f"}, "type": "function"}]}`)
	f(`{"role": "assistant", "content": "x", "tool_calls": []}`, `{"role": "assistant", "content": "x"}`)
	f(`{"role": "assistant", "content": "x", "reasoning_content": "r"}`, `{"role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r"}`)
	f(`{"role": "assistant", "content": "x", "reasoning": "r2", "reasoning_content": "r"}`, `{"role": "assistant", "content": "x", "reasoning": "r2", "reasoning_content": "r2"}`)
	f(`{"role": "tool", "content": [{"type": "text", "text": "1"}, {"type": "text", "text": "2"}], "tool_call_id": "c1"}`, `{"role": "tool", "content": "1\n2", "tool_call_id": "c1"}`)
	f(`{"role": "developer", "content": "d"}`, `{"role": "developer", "content": "d", "tools": null}`)

	op := mustParse(t, `{% for m in messages %}{% for c in m.content %}{{ c | tojson }}{% endfor %}{% endfor %}`)
	got, err := op.RenderChat(&Chat{Messages: msgs(`{"role": "user", "content": [{"text": "a", "type": "text", "cache_control": {}}, "b"]}`)})
	if want := `{"type": "text", "text": "a"}{"type": "text", "text": "b"}`; err != nil || got != want {
		t.Errorf("openai format: %q %v, want %q", got, err, want)
	}
	for _, bad := range []string{`{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}`, `{"role": "user", "content": [{"image_url": "x"}]}`} {
		if _, err := tp.RenderChat(&Chat{Messages: msgs(bad)}); !errors.Is(err, ErrUnsupportedContent) {
			t.Errorf("%s: %v, want ErrUnsupportedContent", bad, err)
		}
	}
	for _, bad := range []string{`{"role": "user", "content": 5}`, `[1]`, `{"content": "x"}`, `{"role": "user", "content": [{"type": "nope"}]}`, `{"role": "user", "content": [{"type": "text", "text": 3}]}`} {
		if _, err := tp.RenderChat(&Chat{Messages: msgs(bad)}); !errors.Is(err, ErrInvalidChat) && !errors.Is(err, ErrJSON) {
			t.Errorf("%s: %v, want ErrInvalidChat", bad, err)
		}
	}
}

func TestRenderChatVariables(t *testing.T) {
	tp := mustParse(t, `{{ bos_token }}|{{ tools | tojson }}|{{ documents is none }}|{{ add_generation_prompt }}|{{ enable_thinking }}|{{ x | tojson }}|{{ strftime_now('%d %b %Y') }}|{{ w | trim }}|`)
	c := &Chat{Messages: msgs(`{"role": "user", "content": "hi"}`), AddGenerationPrompt: true, Kwargs: json.RawMessage(`{"x": 1.0, "w": " \u001c a \u3000", "add_generation_prompt": false, "bos_token": "<B>"}`),
		Tools: json.RawMessage(`[{"function": {"parameters": {"b": 1e-05, "a": 2.5}, "name": "f", "strict": true}, "type": "function"}]`), ReasoningEffort: "low",
		Now: time.Date(2025, 7, 4, 0, 0, 0, 0, time.UTC)}
	got, err := tp.RenderChat(c)
	if err != nil {
		t.Fatal(err)
	}
	want := `<B>|[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"b": 1e-05, "a": 2.5}, "strict": true}}]|True|True|True|1.0|04 Jul 2025|a|`
	if got != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
	c.Kwargs = json.RawMessage(`{"tokenize": true}`)
	if _, err := tp.RenderChat(c); !errors.Is(err, ErrInvalidChat) {
		t.Errorf("tokenize kwarg: %v", err)
	}
}

func TestContinueFinalMessage(t *testing.T) {
	tp := mustParse(t, `{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}`)
	c := &Chat{Messages: msgs(`{"role": "user", "content": "q"}`, `{"role": "assistant", "content": "The answer is  "}`), ContinueFinalMessage: true}
	got, err := tp.RenderChat(c)
	if want := "<user>q</user><assistant>The answer is"; err != nil || got != want {
		t.Errorf("got %q %v, want %q", got, err, want)
	}
	c.AddGenerationPrompt = true
	if _, err := tp.RenderChat(c); !errors.Is(err, ErrInvalidChat) {
		t.Errorf("both flags: %v", err)
	}
}

func TestPyTojson(t *testing.T) {
	tp := mustParse(t, `{{ v | tojson }}|{{ v | tojson(indent=2) }}|{{ v | tojson(ensure_ascii=true, sort_keys=true) }}|{{ v | tojson(separators=[',', ':']) }}`)
	c := &Chat{Messages: msgs(`{"role": "user", "content": "x"}`), Kwargs: json.RawMessage(`{"v": {"z": [1, 1.0, 1e16, 123456.789, -0.0001, true, null, "é\n\"<>&\u0001"], "a": {}, "m": []}}`)}
	got, err := tp.RenderChat(c)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"z": [1, 1.0, 1e+16, 123456.789, -0.0001, true, null, "é\n\"<>&\u0001"], "a": {}, "m": []}|{
  "z": [
    1,
    1.0,
    1e+16,
    123456.789,
    -0.0001,
    true,
    null,
    "é\n\"<>&\u0001"
  ],
  "a": {},
  "m": []
}|{"a": {}, "m": [], "z": [1, 1.0, 1e+16, 123456.789, -0.0001, true, null, "\u00e9\n\"<>&\u0001"]}|{"z":[1,1.0,1e+16,123456.789,-0.0001,true,null,"é\n\"<>&\u0001"],"a":{},"m":[]}`
	if got != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
}

// TestTrimPythonWhitespace: the trim filter strips what Python's
// str.strip() strips. Fails before (the library's trim is Go's
// strings.TrimSpace, which keeps U+001C..U+001F).
func TestTrimPythonWhitespace(t *testing.T) {
	tp := mustParse(t, `[{{ messages[0].content | trim }}]`)
	for in, want := range map[string]string{
		"\x1c\x1d a \x1e\x1f":         "[a]",
		"\u00a0\u2003 b \u3000\u0085": "[b]",
		"\ufeff c \ufeff":             "[\ufeff c \ufeff]", // not whitespace in Python
		"\u200b d":                    "[\u200b d]",
	} {
		b, _ := json.Marshal(map[string]string{"role": "user", "content": in})
		got, err := tp.RenderChat(&Chat{Messages: msgs(string(b))})
		if err != nil || got != want {
			t.Errorf("%q: got %q %v, want %q", in, got, err, want)
		}
	}
}

func TestPyFloatRepr(t *testing.T) {
	for f, want := range map[float64]string{1: "1.0", 0.1: "0.1", 1e16: "1e+16", 1e15: "1000000000000000.0", 1e-4: "0.0001", 1e-5: "1e-05",
		1234567: "1234567.0", -2.5: "-2.5", 1.5e300: "1.5e+300", 0: "0.0", 123456789012345678: "1.2345678901234568e+17"} {
		if got := pyFloatRepr(f); got != want {
			t.Errorf("%v: %s, want %s", f, got, want)
		}
	}
}

func TestRewriteFilters(t *testing.T) {
	in := `{{ x | trim }}{{ "| trim" }}{% set y = z|tojson %}{# | trim #}{{x|trimmed}}`
	want := `{{ x | __ic_trim }}{{ "| trim" }}{% set y = z|__ic_tojson %}{# | trim #}{{x|trimmed}}`
	if got := rewriteFilters(in); got != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
}

// FuzzConvertMessage: any bytes either convert or fail with an error, never
// a panic; a converted message always has a role and content.
func FuzzConvertMessage(f *testing.F) {
	f.Add([]byte(`{"role": "user", "content": "hi"}`), false)
	f.Add([]byte(`{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}`), false)
	f.Add([]byte(`{"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "1"}]}`), true)
	f.Add([]byte(`{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}`), true)
	f.Add([]byte(`{"role": "user", "content": "\ud800\udc00 \ud800 \u00e9", "n": -1.5e-300}`), false)
	f.Fuzz(func(t *testing.T, data []byte, openai bool) {
		format := FormatString
		if openai {
			format = FormatOpenAI
		}
		v, err := ConvertMessage(data, format)
		if err != nil {
			return
		}
		d := v.AsDict()
		if !d.Has("role") || !d.Has("content") {
			t.Fatalf("converted %s without role or content", data)
		}
		var b strings.Builder
		o := pyJSON{item: ", ", key: ": "}
		if err := o.encode(&b, v, 0); err != nil {
			t.Fatalf("cannot encode a converted message: %v", err)
		}
	})
}

// FuzzDecodeJSON: the decoder agrees with encoding/json on validity and,
// for valid input, on the value (compared through Python-style encoding of
// both sides where they are representable).
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, `{"a": [1, 2.5, "x", null, true]}`, `"\u00e9\n"`, `1e400`, `{"a": 1, "a": 2}`, `[`, `{"a" 1}`, `99999999999999999999`, `-0`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := decodeJSON(data)
		valid := json.Valid(data)
		if err == nil && !valid {
			t.Fatalf("decoded invalid JSON %q", data)
		}
		if err != nil && valid && !strings.Contains(err.Error(), "int64") && !strings.Contains(err.Error(), "nested") {
			t.Fatalf("refused valid JSON %q: %v", data, err)
		}
	})
}

// TestTemplateNewlines: the template source is read as Jinja2 reads it
// with keep_trailing_newline off: its lines split as Python's
// str.splitlines splits them and joined with "\n", so one trailing newline
// goes and "\r\n" (and the other line boundaries) become "\n". Fails
// before: the library kept "a\n" as "a\n" (chat_template.jinja files end
// with a newline).
func TestTemplateNewlines(t *testing.T) {
	for src, want := range map[string]string{
		"a\n":                         "a",
		"a\n\n":                       "a\n",
		"{{ 'q' }}\n":                 "q",
		"a\r\nb\rc\u2028d\n":          "a\nb\nc\nd",
		"{{ 'x\r\ny' }}":              "x\ny",
		"{% if true %}x{% endif %}\n": "x",
	} {
		got, err := mustParse(t, src).RenderChat(&Chat{Messages: msgs(`{"role": "user", "content": "hi"}`)})
		if err != nil || got != want {
			t.Errorf("%q: got %q %v, want %q", src, got, err, want)
		}
	}
}

// TestStringLiteralEscapes: string literals in the template mean what
// Python's unicode-escape makes of them. Fails before: the library kept
// \x, \u and \r escapes as written.
func TestStringLiteralEscapes(t *testing.T) {
	for src, want := range map[string]string{
		`{{ 'a\x41\u00e9\U0001F642' }}`: "aAé🙂",
		`{{ "r\r|b\b|0\101|q\x27" }}`:   "r\r|b\b|0A|q'",
		`{{ 'n\n t\t s\\ q\' z\q' }}`:   "n\n t\t s\\ q' z\\q",
		`{{ "\x22" }}`:                  `"`,
		`x\u00e9{{ 'y' }}`:              `x\u00e9y`, // outside tags: text
	} {
		got, err := mustParse(t, src).RenderChat(&Chat{Messages: msgs(`{"role": "user", "content": "hi"}`)})
		if err != nil || got != want {
			t.Errorf("%s: got %q %v, want %q", src, got, err, want)
		}
	}
}
