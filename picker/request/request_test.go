package request

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParseChat(t *testing.T) {
	body := `{"model": "meta-llama/Llama-3.1-8B-Instruct", "stream": true, "stream_options": {"include_usage": true},
	  "messages": [{"role": "system", "content": "be brief"},
	               {"role": "user", "content": [{"type": "text", "text": "hi"}]},
	               {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
	               {"role": "tool", "tool_call_id": "c1", "content": "42"}],
	  "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
	  "chat_template_kwargs": {"enable_thinking": false}}`
	r, err := Parse("/v1/chat/completions", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != KindChat || r.Model != "meta-llama/Llama-3.1-8B-Instruct" || !r.Stream || !r.IncludeUsage || !r.AddGenerationPrompt {
		t.Fatalf("request %+v", r)
	}
	var roles []string
	for _, m := range r.Messages {
		roles = append(roles, m.Role)
	}
	if !slices.Equal(roles, []string{"system", "user", "assistant", "tool"}) {
		t.Fatalf("roles %v", roles)
	}
	if string(r.Messages[3].Raw) != `{"role": "tool", "tool_call_id": "c1", "content": "42"}` {
		t.Fatalf("raw message %s", r.Messages[3].Raw)
	}
	if r.Tools == nil || string(r.ChatTemplateKwargs) != `{"enable_thinking": false}` {
		t.Fatalf("tools %s kwargs %s", r.Tools, r.ChatTemplateKwargs)
	}
}

func TestParseCompletion(t *testing.T) {
	f := func(body string, text string, ids []uint32) {
		t.Helper()
		r, err := Parse("/v1/completions?x=1", []byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if r.Kind != KindCompletion || r.Prompt != text || r.HasPromptTokens != (ids != nil) || !slices.Equal(r.PromptTokens, ids) {
			t.Fatalf("%s: %+v", body, r)
		}
	}
	f(`{"model": "m", "prompt": "once upon"}`, "once upon", nil)
	f(`{"model": "m", "prompt": ["first", "second"]}`, "first", nil)
	f(`{"model": "m", "prompt": [1, 2, 4294967295]}`, "", []uint32{1, 2, 4294967295})
	f(`{"model": "m", "prompt": [[7, 8], [9]]}`, "", []uint32{7, 8})
}

func TestParseKindFromBody(t *testing.T) {
	r, err := Parse("/generate", []byte(`{"model": "m", "messages": [{"role": "user", "content": "x"}]}`))
	if err != nil || r.Kind != KindChat {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = Parse("/generate", []byte(`{"model": "m", "prompt": "x"}`))
	if err != nil || r.Kind != KindCompletion {
		t.Fatalf("%+v %v", r, err)
	}
}

func TestParseErrors(t *testing.T) {
	f := func(path, body string, want error) {
		t.Helper()
		_, err := Parse(path, []byte(body))
		if !errors.Is(err, want) {
			t.Errorf("%s %q: got %v, want %v", path, body, err, want)
		}
	}
	f(ChatPath, ``, ErrNotJSON)
	f(ChatPath, `not json`, ErrNotJSON)
	f(ChatPath, `[1, 2]`, ErrNotJSON)
	f(ChatPath, `{"model": "m", "messages": [`, ErrNotJSON)
	f(ChatPath, `{"messages": [{"role": "user", "content": "x"}]}`, ErrUnrecognized)
	f(ChatPath, `{"model": 3, "messages": [{"role": "user", "content": "x"}]}`, ErrUnrecognized)
	f(ChatPath, `{"model": "m", "messages": []}`, ErrUnrecognized)
	f(ChatPath, `{"model": "m", "messages": [{"content": "x"}]}`, ErrUnrecognized)
	f(ChatPath, `{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}`, ErrUnrecognized)
	f(ChatPath, `{"model": "m", "messages": [{"role": "user"}], "tools": {}}`, ErrUnrecognized)
	f(CompletionPath, `{"model": "m"}`, ErrUnrecognized)
	f(CompletionPath, `{"model": "m", "prompt": [-1]}`, ErrUnrecognized)
	f(CompletionPath, `{"model": "m", "prompt": [1.5]}`, ErrUnrecognized)
	f(CompletionPath, `{"model": "m", "prompt": 7}`, ErrUnrecognized)
	f("/other", `{"model": "m"}`, ErrUnrecognized)
}

func TestKindOfPath(t *testing.T) {
	for path, want := range map[string]Kind{
		"/v1/chat/completions":     KindChat,
		"/v1/chat/completions/":    KindChat,
		"/v1/chat/completions?a=b": KindChat,
		"/openai/v1/completions":   KindCompletion,
		"/v1/models":               KindUnknown,
		"":                         KindUnknown,
	} {
		if got := KindOfPath(path); got != want {
			t.Errorf("%q: %v, want %v", path, got, want)
		}
	}
}

// FuzzParse: any body parses without a panic; a request that parses has
// a kind and a model, and raw messages are objects.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model": "m", "messages": [{"role": "user", "content": "x"}]}`,
		`{"model": "m", "prompt": [[1, 2]], "stream": true, "stream_options": {"include_usage": true}}`,
		`{"model": "m", "prompt": ["a"]}`,
		`{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "tools": []}`,
		`{"model": "m", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low", "documents": [{"title": "t", "text": "d"}]}`,
		`{"model": "m", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": 1, "documents": {}}`,
		`{}`, `[]`, `null`, `{"prompt": [1e40]}`, `{"messages": [[]]}`, `{"prompt": [[]]}`, `{"prompt": [""]}`,
	} {
		f.Add("/v1/chat/completions", []byte(s))
		f.Add("/v1/completions", []byte(s))
	}
	f.Fuzz(func(t *testing.T, path string, b []byte) {
		r, err := Parse(path, b)
		if err != nil {
			return
		}
		if r.Kind == KindUnknown || r.Model == "" {
			t.Fatalf("parsed without kind or model: %+v", r)
		}
		for _, m := range r.Messages {
			if m.Role == "" || len(m.Raw) == 0 || m.Raw[0] != '{' {
				t.Fatalf("bad message %+v", m)
			}
		}
	})
}

func TestParseReasoningAndDocuments(t *testing.T) {
	r, err := Parse(ChatPath, []byte(`{"model": "m", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "high", "documents": [{"text": "d"}]}`))
	if err != nil || r.ReasoningEffort != "high" || string(r.Documents) != `[{"text": "d"}]` {
		t.Fatalf("%+v %v", r, err)
	}
	for _, bad := range []string{`"reasoning_effort": 1`, `"documents": {}`} {
		if _, err := Parse(ChatPath, []byte(`{"model": "m", "messages": [{"role": "user", "content": "x"}], `+bad+`}`)); !errors.Is(err, ErrUnrecognized) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// sameParse fails unless Parse and the encoding/json reference agree on
// b: the same error (text and sentinel) and the same Request, field by
// field (raw values byte for byte; nil and empty slices told apart).
func sameParse(t *testing.T, path string, b []byte) {
	t.Helper()
	got, gerr := Parse(path, b)
	want, werr := parseReference(path, b)
	if (gerr == nil) != (werr == nil) || (gerr != nil && (gerr.Error() != werr.Error() ||
		errors.Is(gerr, ErrNotJSON) != errors.Is(werr, ErrNotJSON))) {
		t.Fatalf("%q %q: error %v, reference %v", path, b, gerr, werr)
	}
	if (got == nil) != (want == nil) {
		t.Fatalf("%q %q: request %+v, reference %+v", path, b, got, want)
	}
	if got == nil {
		return
	}
	if !reflect.DeepEqual(normalized(got), normalized(want)) {
		t.Fatalf("%q %q:\n got %+v\nwant %+v", path, b, normalized(got), normalized(want))
	}
}

// normalized makes raw values comparable with DeepEqual (RawMessage nil
// vs empty is not a difference callers can see; text is).
func normalized(r *Request) Request {
	c := *r
	raw := func(m json.RawMessage) json.RawMessage {
		if m == nil {
			return nil
		}
		return append(json.RawMessage{}, m...)
	}
	c.Tools, c.ChatTemplateKwargs, c.Documents = raw(c.Tools), raw(c.ChatTemplateKwargs), raw(c.Documents)
	if c.Messages != nil {
		c.Messages = slices.Clone(c.Messages)
		for i := range c.Messages {
			c.Messages[i].Raw = raw(c.Messages[i].Raw)
		}
	}
	return c
}

// parseCorner are inputs where encoding/json's rules are easy to get
// wrong: case-folded and escaped names, duplicates (the last wins, but a
// null string field keeps the earlier value), nulls, Unicode whitespace
// around the body, invalid UTF-8, escapes, deep nesting, numbers.
var parseCorner = []string{
	`{"MODEL": "m", "Messages": [{"ROLE": "user", "content": "x"}]}`,
	`{"\u006dodel": "m", "messages": [{"r\u006fle": "user"}]}`,
	"{\"model\": \"m\", \"\u017ftream\": true, \"messages\": [{\"role\": \"user\"}]}",
	"{\"model\": \"m\", \"messages\": [{\"role\": \"user\"}], \"chat_template_\u212awargs\": {}}",
	`{"model": "a", "model": "b", "messages": [{"role": "user"}], "messages": [{"role": "tool"}, {"role": "user"}]}`,
	`{"model": "a", "model": null, "messages": [{"role": "user"}]}`,
	`{"model": "m", "messages": [{"role": "user", "role": null}]}`,
	`{"model": "m", "messages": [{"role": 5, "role": "user"}]}`,
	`{"model": "m", "messages": [{"role": "user"}, 7, {"role": ""}]}`,
	`{"model": "m", "messages": [{"role": "user"}], "messages": "x"}`,
	`{"model": "m", "messages": [{"role": "user"}], "messages": null}`,
	`{"model": "m", "messages": {}}`,
	`{"model": "m", "messages": [[], {"role": "user"}]}`,
	"\u00a0\u2028 {\"model\": \"m\", \"prompt\": \"x\"} \u0085",
	"{\"model\": \"m\xff\", \"prompt\": \"\xc3\"}",
	`{"model": "m\ud800", "prompt": "\ud83d\ude00\n\u0000"}`,
	`{"model": "m", "prompt": "x", "stream": tru}`,
	`{"model": "m", "prompt": "x"} x`,
	`{"model": "m", "prompt": "x",}`,
	`{"model": "m", "prompt": [01]}`,
	`{"model": "m", "prompt": [-0, 1.0, 2e0, 3E+0, 0.5]}`,
	`{"model": "m", "prompt": [1, null, 3]}`,
	`{"model": "m", "prompt": [null, 1]}`,
	`{"model": "m", "prompt": [1e400]}`,
	`{"model": "m", "prompt": [1e-400, 4294967295, 4294967296]}`,
	`{"model": "m", "prompt": [1, "2"]}`,
	`{"model": "m", "prompt": [1, -2, 3.5]}`,
	`{"model": "m", "prompt": [[1, 2], "x"]}`,
	`{"model": "m", "prompt": [[]]}`,
	`{"model": "m", "prompt": []}`,
	`{"model": "m", "prompt": [{}]}`,
	`{"model": "m", "prompt": ["a", 5]}`,
	`{"model": "m", "prompt": "x", "stream_options": {"INCLUDE_USAGE": true, "include_usage": null}}`,
	`{"model": "m", "prompt": "x", "stream_options": {"include_usage": 1}}`,
	`{"model": "m", "prompt": "x", "stream_options": []}`,
	`{"model": "m", "prompt": "x", "stream_options": null}`,
	`{"model": "m", "prompt": "x", "add_special_tokens": false, "stream": null}`,
	`{"model": "m", "messages": [{"role": "user"}], "tools": null, "documents": [], "reasoning_effort": null}`,
	`{"model":"m","messages":[{"role":"user","content":"a\"b\\c\/d\b\f\n\r\t\u00e9"}]}`,
	`{"model": "m", "messages": [{"role": "us\u0065r"}]}`,
	"{\"model\": \"m\", \"messages\": [{\"role\": \"u\tser\"}]}",
	`{"model": "m", "prompt": "x", "a": [[[[{"b": [{}]}]]]], "c": {"d": {"e": -1.5e-3}}}`,
	`{"model": "m", "prompt": "\u12"}`,
	`{"": 1, "m": 2, "model": "m", "prompt": "x"}`,
	`{}`, `{ }`, `{"a"}`, `{"a":}`, `{,}`, `{"model": "m", "prompt": "x"`,
}

func TestParseMatchesReference(t *testing.T) {
	for _, s := range parseCorner {
		for _, path := range []string{ChatPath, CompletionPath, "/x"} {
			sameParse(t, path, []byte(s))
		}
	}
	deep := func(n int, open, close string) string {
		return `{"model": "m", "prompt": "x", "d": ` + strings.Repeat(open, n) + strings.Repeat(close, n) + `}`
	}
	for _, n := range []int{9998, 9999, 10000} {
		sameParse(t, ChatPath, []byte(deep(n, "[", "]")))
		sameParse(t, ChatPath, []byte(deep(n, `{"a":`, "1}"[:1]+"}")))
	}
	// Every prefix of a realistic body: truncation anywhere is ErrNotJSON.
	body := `{"model": "m", "stream": true, "stream_options": {"include_usage": true}, "messages": [{"role": "system", "content": "be \"brief\""}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "tools": [{"type": "function"}], "prompt": [1, 2]}`
	for i := range len(body) + 1 {
		sameParse(t, ChatPath, []byte(body[:i]))
		sameParse(t, CompletionPath, []byte(body[:i]))
	}
}

// FuzzParseMatchesReference: Parse agrees with encoding/json on any input.
func FuzzParseMatchesReference(f *testing.F) {
	for _, s := range parseCorner {
		f.Add(ChatPath, []byte(s))
		f.Add(CompletionPath, []byte(s))
	}
	f.Fuzz(func(t *testing.T, path string, b []byte) {
		sameParse(t, path, b)
	})
}

// BenchmarkParse8k is Parse of an 8-turn chat body of about 8k tokens.
func BenchmarkParse8k(b *testing.B) {
	var msgs []map[string]string
	for i := range 8 {
		role := []string{"user", "assistant"}[i%2]
		msgs = append(msgs, map[string]string{"role": role, "content": strings.Repeat("the quick brown fox jumps over the lazy dog ", 90)})
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "stream": true})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(ChatPath, body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseReference8k is the encoding/json implementation on the
// same body, for the ratio.
func BenchmarkParseReference8k(b *testing.B) {
	var msgs []map[string]string
	for i := range 8 {
		role := []string{"user", "assistant"}[i%2]
		msgs = append(msgs, map[string]string{"role": role, "content": strings.Repeat("the quick brown fox jumps over the lazy dog ", 90)})
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "stream": true})
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseReference(ChatPath, body); err != nil {
			b.Fatal(err)
		}
	}
}
