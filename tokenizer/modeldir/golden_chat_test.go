package modeldir

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/inferencecache/inferencecache/picker/request"
)

type goldenConversations struct {
	Conversations []struct {
		Request  json.RawMessage `json:"request"`
		Rendered string          `json:"rendered"`
		IDs      []uint32        `json:"ids"`
	} `json:"conversations"`
	Completion []struct {
		Text string   `json:"text"`
		IDs  []uint32 `json:"ids"`
	} `json:"completion"`
}

// TestGoldenConversations: whole multi-turn conversations (system prompts,
// user turns as strings and content parts, assistant replies with
// reasoning, tools, tool calls and tool results, enable_thinking) render
// and tokenize to what the reference gives: @lenml/tokenizers' own
// rendering of the vLLM-converted messages for Llama 3; for Qwen 3, whose
// template its Jinja cannot parse, the template's documented ChatML form
// (hack/tokenizer-golden.js), tokenized by @lenml/tokenizers. Completion
// prompts get the post-processor's special tokens as the reference adds
// them with add_special_tokens.
func TestGoldenConversations(t *testing.T) {
	d := sharedDir(t)
	models, every := []string{"llama3", "qwen3", "llama2"}, 1
	if raceEnabled {
		models, every = []string{"llama3"}, 8
	}
	ctx := context.Background()
	for _, model := range models {
		t.Run(model, func(t *testing.T) {
			var g goldenConversations
			readGz(t, "chat_"+model, &g)
			if model != "llama2" && len(g.Conversations) < 40 {
				t.Fatalf("%d golden conversations", len(g.Conversations))
			}
			match := 0
			for i, c := range g.Conversations {
				if i%every != 0 {
					continue
				}
				// The body as sent, keys in their order (the tools'
				// JSON schema is rendered in it).
				body := append([]byte(`{"model": "`+model+`", `), c.Request[1:]...)
				req, err := request.Parse(request.ChatPath, body)
				if err != nil {
					t.Fatal(err)
				}
				ids, err := d.RequestTokens(ctx, model, req)
				if err != nil {
					t.Errorf("conversation %d: %v", i, err)
					continue
				}
				m := d.models[model]
				if text, _ := m.tmpl.RenderChat(chatOf(req)); text != c.Rendered {
					t.Errorf("conversation %d rendering:\n got %q\nwant %q", i, text, c.Rendered)
					continue
				}
				if !equal(ids, c.IDs) {
					t.Errorf("conversation %d ids:\n got %v\nwant %v", i, ids, c.IDs)
					continue
				}
				match++
			}
			for i, c := range g.Completion {
				if i%every != 0 {
					continue
				}
				body, _ := json.Marshal(map[string]any{"model": model, "prompt": c.Text})
				req, err := request.Parse(request.CompletionPath, body)
				if err != nil {
					t.Fatal(err)
				}
				ids, err := d.RequestTokens(ctx, model, req)
				if err != nil || !equal(ids, c.IDs) {
					t.Errorf("completion %q: got %v %v, want %v", c.Text, ids, err, c.IDs)
				}
			}
			t.Logf("%s: %d conversations match, %d completions checked", model, match, len(g.Completion)/every)
		})
	}
}
