package modeldir

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/picker/request"
)

// agenticRequest is a chat request of about tokens Llama 3 tokens: a system
// prompt, a tool, and turns of a user asking, the assistant calling the
// tool, the tool's result (code and prose) and the assistant's answer.
func agenticRequest(b testing.TB, d *Dir, model string, tokens, maxTurns int) (*request.Request, int) {
	b.Helper()
	msgs := []any{map[string]any{"role": "system", "content": "You are a coding agent. Read files before you answer, and be precise."}}
	para := "The handler parses the request body, validates every field, and returns a typed error when a field is missing or malformed; "
	var req *request.Request
	for i := 0; i < maxTurns; i++ {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("Step %d: read src/module_%d.go and explain what changed.", i, i)})
		id := fmt.Sprintf("call_%d", i)
		msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": id, "type": "function",
			"function": map[string]any{"name": "read_file", "arguments": fmt.Sprintf(`{"path": "src/module_%d.go"}`, i)}}}})
		body := fmt.Sprintf("package module%d\n\nimport \"fmt\"\n\nfunc Handle%d(x int) (int, error) {\n\tif x < 0 {\n\t\treturn 0, fmt.Errorf(\"negative %%d\", x)\n\t}\n\treturn x * %d, nil\n}\n", i, i, i+7) +
			strings.Repeat(para, 14)
		msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": id, "content": body})
		msgs = append(msgs, map[string]any{"role": "assistant", "content": fmt.Sprintf("Module %d multiplies by %d. ", i, i+7) + strings.Repeat(para, 6)})
		data, _ := json.Marshal(map[string]any{"model": model, "messages": append(msgs, map[string]any{"role": "user", "content": "Go on."}),
			"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "read_file", "description": "Read a file",
				"parameters": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}, "required": []string{"path"}}}}}})
		var err error
		if req, err = request.Parse(request.ChatPath, data); err != nil {
			b.Fatal(err)
		}
		if i%16 != 7 && i != maxTurns-1 {
			continue
		}
		ids, err := d.RequestTokens(context.Background(), model, req)
		if err != nil {
			b.Fatal(err)
		}
		if len(ids) >= tokens {
			return req, len(ids)
		}
	}
	ids, _ := d.RequestTokens(context.Background(), model, req)
	return req, len(ids)
}

func benchDir(b *testing.B, cacheBytes int64) *Dir {
	d, err := New(Config{Root: assetsDir(b), Logger: slog.New(slog.DiscardHandler), PrefixCacheBytes: cacheBytes})
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkRequestTokensFull: render and tokenize a whole conversation with
// no cached prefix (the cache holds nothing): an 8k-token 8-turn chat, and
// a 100k-token agentic conversation (target <= 15 ms).
//
//	TOKENIZER_ASSETS=$(bash hack/tokenizer-assets.sh) go test ./tokenizer/modeldir -run '^$' -bench RequestTokens -benchtime 20x
func BenchmarkRequestTokensFull(b *testing.B) {
	for _, c := range []struct {
		name          string
		tokens, turns int
	}{{"8k-8turns", 8000, 8}, {"100k-agentic", 100000, 1000}} {
		if c.turns == 8 {
			// 8 turns of about 1k tokens each.
			c.turns = 8
		}
		for _, model := range []string{"llama3", "qwen3"} {
			b.Run(c.name+"/"+model, func(b *testing.B) {
				d := benchDir(b, 1) // nothing fits: every request is a full tokenization
				req, n := agenticRequest(b, d, model, c.tokens, c.turns)
				ctx := context.Background()
				b.ReportAllocs()
				lat := make([]time.Duration, 0, 1024)
				cpu0 := processCPU()
				for b.Loop() {
					start := time.Now()
					if _, err := d.RequestTokens(ctx, model, req); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(start))
				}
				b.ReportMetric(float64(n), "tokens")
				reportLatency(b, lat)
				reportCPU(b, cpu0, len(lat))
			})
		}
	}
}

// BenchmarkRequestTokensNextTurn: the next turn of a 100k-token
// conversation whose previous turn is cached (target <= 2 ms): each
// iteration appends the assistant's reply and a new user message.
func BenchmarkRequestTokensNextTurn(b *testing.B) {
	for _, model := range []string{"llama3", "qwen3"} {
		b.Run("100k/"+model, func(b *testing.B) {
			d := benchDir(b, 0)
			base, n := agenticRequest(b, d, model, 100000, 1000)
			ctx := context.Background()
			if _, err := d.RequestTokens(ctx, model, base); err != nil {
				b.Fatal(err)
			}
			reply := json.RawMessage(`{"role": "assistant", "content": "Done: the module now validates its input first."}`)
			hits := d.models[model].prefix.hits.Load()
			b.ReportAllocs()
			i := 0
			lat := make([]time.Duration, 0, 1024)
			cpu0 := processCPU()
			for b.Loop() {
				i++
				start := time.Now()
				req := *base
				user := json.RawMessage(fmt.Sprintf(`{"role": "user", "content": "Next, turn %d: what does module %d return for -1?"}`, i, i))
				req.Messages = append(base.Messages[:len(base.Messages):len(base.Messages)],
					request.Message{Role: "assistant", Raw: reply}, request.Message{Role: "user", Raw: user})
				if _, err := d.RequestTokens(ctx, model, &req); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			b.ReportMetric(float64(n), "tokens")
			reportLatency(b, lat)
			reportCPU(b, cpu0, i)
			if got := d.models[model].prefix.hits.Load() - hits; got < int64(i) {
				b.Fatalf("%d cache hits in %d turns", got, i)
			}
		})
	}
}

// BenchmarkRenderNextTurn is the rendering part of
// BenchmarkRequestTokensNextTurn alone (cached message conversion, then
// the Jinja render of the whole conversation): the rest of that
// benchmark's time is the incremental tokenization.
func BenchmarkRenderNextTurn(b *testing.B) {
	for _, model := range []string{"llama3", "qwen3"} {
		b.Run("100k/"+model, func(b *testing.B) {
			d := benchDir(b, 0)
			base, n := agenticRequest(b, d, model, 100000, 1000)
			m := d.models[model]
			reply := json.RawMessage(`{"role": "assistant", "content": "Done: the module now validates its input first."}`)
			b.ReportAllocs()
			i := 0
			lat := make([]time.Duration, 0, 1024)
			for b.Loop() {
				i++
				start := time.Now()
				req := *base
				user := json.RawMessage(fmt.Sprintf(`{"role": "user", "content": "Next, turn %d: what does module %d return for -1?"}`, i, i))
				req.Messages = append(base.Messages[:len(base.Messages):len(base.Messages)],
					request.Message{Role: "assistant", Raw: reply}, request.Message{Role: "user", Raw: user})
				chat := chatOf(&req)
				msgs, err := m.msgs.convert(chat.Messages, m.tmpl.ContentFormat())
				if err != nil {
					b.Fatal(err)
				}
				if _, err := m.tmpl.RenderConverted(chat, msgs); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.ReportMetric(float64(n), "tokens")
			reportLatency(b, lat)
		})
	}
}

// reportLatency adds the median and the fastest iteration: on a shared
// machine the fastest is the closest to the uncontended cost.
func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[0].Microseconds()), "min-µs")
}

// reportCPU adds the process CPU time (user and system, GC included) per
// iteration since cpu0: what the work costs whatever the machine's load.
func reportCPU(b *testing.B, cpu0 time.Duration, n int) {
	if n > 0 && cpu0 > 0 {
		b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(n), "cpu-µs/op")
	}
}
