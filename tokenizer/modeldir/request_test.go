package modeldir

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/inferencecache/inferencecache/picker/request"
)

// requestTokenizer is the shape the endpoint picker calls.
type requestTokenizer interface {
	RequestTokens(ctx context.Context, modelID string, r *request.Request) ([]uint32, error)
}

var _ requestTokenizer = (*Dir)(nil)

var (
	sharedOnce sync.Once
	shared     *Dir
	sharedErr  error
)

// sharedDir is one Dir over the reference models for the tests that can
// share loaded models (a load takes seconds under the race detector).
func sharedDir(t testing.TB) *Dir {
	t.Helper()
	root := assetsDir(t)
	sharedOnce.Do(func() { shared, sharedErr = New(Config{Root: root, Logger: slog.New(slog.DiscardHandler)}) })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// convo builds chat request bodies turn by turn.
type convo struct {
	model string
	msgs  []any
	tools any
}

func (c *convo) add(m map[string]any) { c.msgs = append(c.msgs, m) }

func (c *convo) body(t testing.TB, extra map[string]any) []byte {
	t.Helper()
	b := map[string]any{"model": c.model, "messages": c.msgs}
	if c.tools != nil {
		b["tools"] = c.tools
	}
	for k, v := range extra {
		b[k] = v
	}
	data, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func parse(t testing.TB, body []byte) *request.Request {
	t.Helper()
	r, err := request.Parse(request.ChatPath, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var turnPieces = []string{"Hello", " world", "\n", "\n\n", "  ", "What is 2+2?", "<think>\nhmm\n</think>\n\n", "é", "🙂", "```go\nfunc f() {}\n```",
	"<|eot_id|>", "<|im_end|>", "<|im_start|>", "<tool_response>", "</tool_response>", " trailing ", "\t", "x", "1234567", "'s", "Ünïcödé"}

func randomTurn(r *rand.Rand) string {
	var b strings.Builder
	for range 1 + r.IntN(12) {
		b.WriteString(turnPieces[r.IntN(len(turnPieces))])
	}
	return b.String()
}

var weatherTool = []any{map[string]any{"type": "function", "function": map[string]any{"name": "get_weather", "description": "Weather of a city",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer", "minimum": 0.5}}}}}}

// randomConversation grows a conversation and checks, at every turn, that
// RequestTokens through the prefix cache equals a fresh Dir's full
// tokenization (ids identical), and that later turns hit the cache.
func checkConversation(t *testing.T, d *Dir, model string, r *rand.Rand, turns int) {
	c := &convo{model: model}
	if r.IntN(2) == 0 {
		c.add(map[string]any{"role": "system", "content": randomTurn(r)})
	}
	if r.IntN(2) == 0 {
		c.tools = weatherTool
	}
	ctx := context.Background()
	for turn := range turns {
		switch k := r.IntN(6); {
		case k == 0:
			c.add(map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": randomTurn(r)}, map[string]any{"type": "text", "text": randomTurn(r)}}})
		case k == 1 && turn > 0:
			id := fmt.Sprintf("call_%d", turn)
			c.add(map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": id, "type": "function",
				"function": map[string]any{"name": "get_weather", "arguments": `{"city": "Paris", "days": 2}`}}}})
			c.add(map[string]any{"role": "tool", "tool_call_id": id, "content": randomTurn(r)})
		default:
			c.add(map[string]any{"role": "user", "content": randomTurn(r)})
		}
		extra := map[string]any{}
		if r.IntN(4) == 0 {
			extra["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
		}
		req := parse(t, c.body(t, extra))
		got, err := d.RequestTokens(ctx, model, req)
		if err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
		m := d.models[model]
		text, err := m.tmpl.RenderChat(chatOf(req))
		if err != nil {
			t.Fatal(err)
		}
		want, err := m.tok.Encode(ctx, nil, text) // a full tokenization
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s turn %d: incremental ids differ from a full tokenization\n got %v\nwant %v", model, turn, got, want)
		}
		reply := randomTurn(r)
		if r.IntN(3) == 0 {
			c.add(map[string]any{"role": "assistant", "content": reply, "reasoning_content": randomTurn(r)})
		} else {
			c.add(map[string]any{"role": "assistant", "content": reply})
		}
	}
}

func TestRequestTokensIncrementalEqualsFull(t *testing.T) {
	d := sharedDir(t)
	models, convs, turns := []string{"llama3", "qwen3"}, 12, 12
	if raceEnabled {
		models, convs, turns = []string{"llama3"}, 3, 6
	}
	hits0 := map[string]int64{}
	for _, model := range models {
		if m := d.models[model]; m != nil {
			hits0[model] = m.prefix.hits.Load()
		}
		t.Run(model, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(len(model))))
			for range convs {
				checkConversation(t, d, model, r, turns)
			}
			entries, bytes := d.models[model].prefix.stats()
			hits := d.models[model].prefix.hits.Load() - hits0[model]
			t.Logf("%s: %d cache hits; cache %d entries, %d bytes", model, hits, entries, bytes)
			if hits < int64(convs*(turns-2)) {
				t.Errorf("%s: %d cache hits in %d conversations of %d turns", model, hits, convs, turns)
			}
		})
	}
}

func TestRequestTokensCompletion(t *testing.T) {
	d := sharedDir(t)
	ctx := context.Background()
	r, err := request.Parse(request.CompletionPath, []byte(`{"model": "llama2", "prompt": "hi there"}`))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := d.RequestTokens(ctx, "llama2", r)
	if err != nil {
		t.Fatal(err)
	}
	tok := d.models["llama2"].tok
	body, _ := tok.Encode(ctx, nil, "hi there")
	if want := append([]uint32{1}, body...); !slices.Equal(ids, want) {
		t.Errorf("llama2 completion: got %v, want <s> then the text: %v", ids, want)
	}
	r, _ = request.Parse(request.CompletionPath, []byte(`{"model": "llama2", "prompt": [1, 2, 3]}`))
	if ids, err := d.RequestTokens(ctx, "llama2", r); err != nil || !slices.Equal(ids, []uint32{1, 2, 3}) {
		t.Errorf("token prompt: %v %v", ids, err)
	}
}

func TestRequestTokensErrors(t *testing.T) {
	d := sharedDir(t)
	ctx := context.Background()
	f := func(model, body, reason string) {
		t.Helper()
		r, _ := request.Parse(request.ChatPath, []byte(body))
		_, err := d.RequestTokens(ctx, model, r)
		var e *Error
		if !errors.As(err, &e) || e.Reason != reason {
			t.Errorf("%s %s: got %v, want reason %s", model, body, err, reason)
		}
	}
	f("../x", `{"model": "m", "messages": [{"role": "user", "content": "hi"}]}`, ReasonInvalidModel)
	f("nope", `{"model": "m", "messages": [{"role": "user", "content": "hi"}]}`, ReasonNotFound)
	f("llama3", `{"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}`, ReasonRenderFailed)
	f("llama3", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "continue_final_message": true}`, ReasonRenderFailed)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	r, _ := request.Parse(request.ChatPath, []byte(`{"model": "m", "messages": [{"role": "user", "content": "hi"}]}`))
	if _, err := d.RequestTokens(canceled, "llama3", r); err == nil {
		t.Error("canceled context: no error")
	}
}

// TestRequestTokensConcurrent: many goroutines growing conversations of one
// model share its cache; every answer equals a full tokenization.
func TestRequestTokensConcurrent(t *testing.T) {
	d, err := New(Config{Root: assetsDir(t), Logger: slog.New(slog.DiscardHandler), PrefixCacheBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if raceEnabled {
		// Share the loaded model; the small cache is what is tested.
		sh := sharedDir(t)
		if _, err := sh.Encode(context.Background(), "llama3", "x"); err != nil {
			t.Fatal(err)
		}
		sh.mu.RLock()
		m := *sh.models["llama3"]
		sh.mu.RUnlock()
		m.prefix, m.msgs = newPrefixCache(256<<10), newMsgCache(256<<10)
		d.models["llama3"] = &m
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 9))
			c := &convo{model: "llama3"}
			for turn := range 8 {
				c.add(map[string]any{"role": "user", "content": randomTurn(r)})
				req := parse(t, c.body(t, nil))
				got, err := d.RequestTokens(ctx, "llama3", req)
				if err != nil {
					t.Error(err)
					return
				}
				m := d.models["llama3"]
				text, _ := m.tmpl.RenderChat(chatOf(req))
				want, _ := m.tok.Encode(ctx, nil, text)
				if !slices.Equal(got, want) {
					t.Errorf("goroutine %d turn %d: ids differ", g, turn)
					return
				}
				c.add(map[string]any{"role": "assistant", "content": randomTurn(r)})
			}
		})
	}
	wg.Wait()
	if _, bytes := d.models["llama3"].prefix.stats(); bytes > 256<<10 {
		t.Errorf("cache holds %d bytes, bound 256 KiB", bytes)
	}
}

type loadFailObserver struct {
	countObserver
	mu     sync.Mutex
	failed []string
}

func (o *loadFailObserver) TokenizerLoadFailed(model, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failed = append(o.failed, model+":"+reason)
}

// TestLoadFailurePerModel: a failed load reaches the observer with the
// model and the reason (the per-model metric), not only the log line.
func TestLoadFailurePerModel(t *testing.T) {
	root := t.TempDir()
	writeModel(t, root, "org/broken", "{", tinyConfig)
	obs := &loadFailObserver{}
	d, err := New(Config{Root: root, Observer: obs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, _ = d.Encode(ctx, "org/broken", "hi")
	_, _ = d.Encode(ctx, "org/missing", "hi")
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if want := []string{"org/broken:load_failed", "org/missing:not_found"}; !slices.Equal(obs.failed, want) {
		t.Errorf("load failures %v, want %v", obs.failed, want)
	}
}

// TestChatTemplateJinjaFile: a model's chat_template.jinja is its template
// (transformers prefers it to tokenizer_config.json's), and a config
// without chat_template still loads with it.
func TestChatTemplateJinjaFile(t *testing.T) {
	root := t.TempDir()
	writeModel(t, root, "org/jinja", string(tinyTokenizer()), `{"bos_token": "<s>"}`)
	if err := os.WriteFile(filepath.Join(root, "org", "jinja", "chat_template.jinja"), []byte(`{{ bos_token }}{% for m in messages %}U:{{ m.content }}{% endfor %}`), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Root: root, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	r := parse(t, []byte(`{"model": "org/jinja", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "a"}]}`))
	ids, err := d.RequestTokens(context.Background(), "org/jinja", r)
	if err != nil {
		t.Fatal(err)
	}
	tok := d.models["org/jinja"].tok
	want, _ := tok.Encode(context.Background(), nil, "<s>U:hiU:a")
	if !slices.Equal(ids, want) {
		t.Errorf("got %v, want %v", ids, want)
	}
}

func TestRequestTokensAddSpecialTokens(t *testing.T) {
	d := sharedDir(t)
	ctx := context.Background()
	// A completion that asks for no special tokens:
	r, err := request.Parse(request.CompletionPath, []byte(`{"model": "llama2", "prompt": "hi there", "add_special_tokens": false}`))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := d.RequestTokens(ctx, "llama2", r)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := d.models["llama2"].tok.Encode(ctx, nil, "hi there")
	if !slices.Equal(ids, want) {
		t.Errorf("completion without special tokens: %v, want %v", ids, want)
	}
	// A chat asking for them gets the post-processor's around the
	// rendering (DeepSeek V3: LlamaTokenizerFast, add_bos_token).
	r = parse(t, []byte(`{"model": "deepseek_v3", "messages": [{"role": "user", "content": "hi"}], "add_special_tokens": true}`))
	with, err := d.RequestTokens(ctx, "deepseek_v3", r)
	if err != nil {
		t.Fatal(err)
	}
	r = parse(t, []byte(`{"model": "deepseek_v3", "messages": [{"role": "user", "content": "hi"}]}`))
	without, err := d.RequestTokens(ctx, "deepseek_v3", r)
	if err != nil {
		t.Fatal(err)
	}
	bos, _ := d.models["deepseek_v3"].tok.Token("<｜begin▁of▁sentence｜>")
	if len(with) != len(without)+1 || with[0] != bos || !slices.Equal(with[1:], without) {
		t.Errorf("chat with add_special_tokens: %v, without: %v", with, without)
	}
}
