package chattemplate

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

var nativePieces = []string{"Hello", " ", "\n", "\n\n", "<think>", "</think>", "<think>\nhm\n</think>\n\n", "<tool_response>", "</tool_response>",
	"<|im_end|>", "<|eot_id|>", "é", "🙂", "\t", " \x1c ", "\u3000", "x", "{\"a\": 1}", "'", "\"", "\\", "%}", "{{"}

func nativeText(r *rand.Rand) string {
	var b strings.Builder
	for range r.IntN(8) {
		b.WriteString(nativePieces[r.IntN(len(nativePieces))])
	}
	return b.String()
}

// randomChat is a conversation with every shape the two templates branch
// on: system first or later, developer messages, user turns that look like
// tool responses, assistant turns with and without reasoning, with think
// blocks in the content, tool calls with string, object or broken
// arguments, runs of tool results; tools or none; enable_thinking.
func randomChat(r *rand.Rand) *Chat {
	c := &Chat{AddGenerationPrompt: r.IntN(4) != 0}
	add := func(v map[string]any) {
		b, _ := json.Marshal(v)
		c.Messages = append(c.Messages, b)
	}
	if r.IntN(2) == 0 {
		add(map[string]any{"role": "system", "content": nativeText(r)})
	}
	for range 1 + r.IntN(8) {
		switch r.IntN(9) {
		case 0:
			add(map[string]any{"role": "user", "content": "<tool_response>" + nativeText(r) + "</tool_response>"})
		case 1:
			add(map[string]any{"role": "assistant", "content": nativeText(r), "reasoning_content": nativeText(r)})
		case 2:
			args := []string{`{"city": "Paris"}`, `not json`, `[1, 2.5]`, `""`}[r.IntN(4)]
			var content any = nativeText(r)
			if r.IntN(2) == 0 {
				content = nil
			}
			add(map[string]any{"role": "assistant", "content": content, "tool_calls": []any{
				map[string]any{"id": "a", "type": "function", "function": map[string]any{"name": "f", "arguments": args}},
				map[string]any{"id": "b", "type": "function", "function": map[string]any{"name": "g", "arguments": `{"k": [true, null]}`}}}[:1+r.IntN(2)]})
		case 3:
			add(map[string]any{"role": "tool", "tool_call_id": "a", "content": nativeText(r)})
			if r.IntN(2) == 0 {
				add(map[string]any{"role": "tool", "tool_call_id": "b", "content": nativeText(r)})
			}
		case 4:
			add(map[string]any{"role": []string{"system", "developer"}[r.IntN(2)], "content": nativeText(r)})
		case 5:
			add(map[string]any{"role": "assistant", "content": nativeText(r) + "</think>" + nativeText(r)})
		default:
			add(map[string]any{"role": []string{"user", "assistant"}[r.IntN(2)], "content": nativeText(r)})
		}
	}
	if r.IntN(2) == 0 {
		c.Tools = json.RawMessage(`[{"type": "function", "function": {"name": "f", "description": "é \"q\"", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}, {"function": {"name": "g"}}]`)
	}
	switch r.IntN(4) {
	case 0:
		c.Kwargs = json.RawMessage(`{"enable_thinking": false}`)
	case 1:
		c.Kwargs = json.RawMessage(`{"enable_thinking": true}`)
	case 2:
		c.Kwargs = json.RawMessage(`{"unknown_kwarg": 1}`)
	}
	return c
}

// TestNativeMatchesJinja: the native renderers give what the interpreted
// template gives, byte for byte, on random and adversarial conversations,
// and are used whenever the kwargs allow.
func TestNativeMatchesJinja(t *testing.T) {
	n := 3000
	if raceEnabled {
		n = 300
	}
	for _, model := range []string{"llama3", "qwen3"} {
		t.Run(model, func(t *testing.T) {
			tmpl := load(t, model)
			if tmpl.native == nil {
				t.Fatalf("%s: no native renderer for the reference template", model)
			}
			jinjaOnly := *tmpl
			jinjaOnly.forceJinja = true
			r := rand.New(rand.NewPCG(3, uint64(len(model))))
			used := 0
			for i := range n {
				c := randomChat(r)
				msgs := make([]json.RawMessage, len(c.Messages))
				copy(msgs, c.Messages)
				want, wantErr := jinjaOnly.RenderChat(c)
				got, gotErr := tmpl.RenderChat(c)
				if (wantErr == nil) != (gotErr == nil) || got != want {
					t.Fatalf("case %d %s:\nnative %q (%v)\n jinja %q (%v)", i, c.Messages, got, gotErr, want, wantErr)
				}
				conv := make([]jinja.Value, len(msgs))
				convOK := true
				for j, m := range msgs {
					var err error
					if conv[j], err = ConvertMessage(m, tmpl.format); err != nil {
						convOK = false
					}
				}
				if data, err := tmpl.chatData(c); convOK && err == nil {
					if _, ok := tmpl.renderNative(conv, data); ok {
						used++
					}
				}
			}
			t.Logf("%s: %d conversations, native renderer used for %d", model, n, used)
			if used < n/2 {
				t.Errorf("native renderer used for %d of %d", used, n)
			}
		})
	}
}

// FuzzNativeMatchesJinja: for any conversation the native renderers and
// the interpreter agree (the seeds are conversations from randomChat).
func FuzzNativeMatchesJinja(f *testing.F) {
	r := rand.New(rand.NewPCG(5, 5))
	for range 8 {
		c := randomChat(r)
		b, _ := json.Marshal(map[string]any{"messages": c.Messages, "tools": c.Tools, "kwargs": c.Kwargs, "agp": c.AddGenerationPrompt})
		f.Add(b)
	}
	tmpls := map[string]*Template{}
	for _, model := range []string{"llama3", "qwen3"} {
		tmpls[model] = load(f, model)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var in struct {
			Messages []json.RawMessage `json:"messages"`
			Tools    json.RawMessage   `json:"tools"`
			Kwargs   json.RawMessage   `json:"kwargs"`
			AGP      bool              `json:"agp"`
		}
		if json.Unmarshal(data, &in) != nil {
			return
		}
		c := &Chat{Messages: in.Messages, Tools: in.Tools, Kwargs: in.Kwargs, AddGenerationPrompt: in.AGP}
		for model, tmpl := range tmpls {
			jinjaOnly := *tmpl
			jinjaOnly.forceJinja = true
			want, wantErr := jinjaOnly.RenderChat(c)
			got, gotErr := tmpl.RenderChat(c)
			if (wantErr == nil) != (gotErr == nil) || got != want {
				t.Fatalf("%s: native %q (%v), jinja %q (%v)", model, got, gotErr, want, wantErr)
			}
		}
	})
}
