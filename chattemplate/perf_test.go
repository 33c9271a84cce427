package chattemplate

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ardanlabs/jinja"
)

// agentic builds a conversation of about n bytes of text: a system prompt,
// tools, and turns of user text, assistant tool calls, tool results and
// answers (the shape of an agent's long context).
func agentic(n int) *Chat {
	c := &Chat{AddGenerationPrompt: true, Now: time.Date(2025, 7, 1, 0, 0, 0, 0, time.UTC)}
	c.Tools = json.RawMessage(`[{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]`)
	add := func(v any) {
		b, _ := json.Marshal(v)
		c.Messages = append(c.Messages, b)
	}
	add(map[string]any{"role": "system", "content": "You are a coding agent. Be precise."})
	size := 0
	para := "The function parses the request body, validates every field, and returns a typed error when a field is missing or malformed. "
	for i := 0; size < n; i++ {
		user := fmt.Sprintf("Step %d: look at file src/module_%d.go and explain it.", i, i)
		add(map[string]any{"role": "user", "content": user})
		add(map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{"id": fmt.Sprintf("call_%d", i), "type": "function",
			"function": map[string]any{"name": "read_file", "arguments": fmt.Sprintf(`{"path": "src/module_%d.go"}`, i)}}}})
		body := fmt.Sprintf("package module%d\n\nfunc F%d(x int) int {\n\treturn x * %d\n}\n", i, i, i) + strings.Repeat(para, 20)
		add(map[string]any{"role": "tool", "tool_call_id": fmt.Sprintf("call_%d", i), "content": body})
		answer := strings.Repeat(para, 8)
		add(map[string]any{"role": "assistant", "content": answer})
		size += len(user) + len(body) + len(answer)
	}
	return c
}

func BenchmarkRenderChat(b *testing.B) {
	for _, model := range []string{"llama3", "qwen3"} {
		b.Run(model, func(b *testing.B) {
			tmpl := load(b, model)
			c := agentic(400 << 10)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tmpl.RenderChat(c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRenderConverted: the render of a 400 KiB conversation whose
// messages are converted already, through the native renderer and through
// the Jinja interpreter.
func BenchmarkRenderConverted(b *testing.B) {
	for _, name := range []string{"llama3/native", "llama3/jinja", "qwen3/native", "qwen3/jinja"} {
		b.Run(name, func(b *testing.B) {
			model, engine, _ := strings.Cut(name, "/")
			tmpl := load(b, model)
			if engine == "jinja" {
				j := *tmpl
				j.forceJinja = true
				tmpl = &j
			}
			c := agentic(400 << 10)
			msgs := make([]jinja.Value, len(c.Messages))
			for i, m := range c.Messages {
				v, err := ConvertMessage(m, tmpl.ContentFormat())
				if err != nil {
					b.Fatal(err)
				}
				msgs[i] = v
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tmpl.RenderConverted(c, msgs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
