package request

import (
	"errors"
	"slices"
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
