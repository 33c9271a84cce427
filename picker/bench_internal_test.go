package picker

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/picker/request"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	"github.com/inferencecache/inferencecache/tokenizer/modeldir"
)

// fixedTokens returns the same ids for every request: the tokenizer's
// cost left out, so the benchmark measures the picker's own part.
type fixedTokens []uint32

func (f fixedTokens) RequestTokens(context.Context, string, *request.Request) ([]uint32, error) {
	return f, nil
}

// conversation is an 8-turn chat body of about words words.
func conversation(words int) []byte {
	var msgs []map[string]string
	per := words / 8
	for i := range 8 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": strings.Repeat("the quick brown fox jumps over the lazy dog ", per/9+1)})
	}
	b, _ := json.Marshal(map[string]any{"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": msgs, "stream": true})
	return b
}

// benchPicker is a picker over a real index and lookup service with 16
// endpoints; the first holds toks' chain.
func benchPicker(b *testing.B, tok Tokenizer, modelID string, toks []uint32) *Picker {
	store := policy.NewStore()
	e := engine.New(engine.Config{Policies: store})
	svc, err := rpc.NewService(rpc.Config{Index: e, Policies: store})
	if err != nil {
		b.Fatal(err)
	}
	var eps []endpoints.Endpoint
	for i := range 16 {
		eps = append(eps, endpoints.Endpoint{ReplicaID: "pod-" + itoa(i), Address: "10.0.0." + itoa(i+1) + ":8000"})
	}
	pool, err := endpoints.NewPool("team", "vllm", nil, eps)
	if err != nil {
		b.Fatal(err)
	}
	if len(toks) > 0 {
		sums := fingerprint.AppendChain(nil, toks, rpc.DefaultEngineBlockSize, 0, false)
		var pe engine.PrefixEntry
		for _, h := range sums {
			pe.BlockHashes = append(pe.BlockHashes, fingerprint.AppendWire(nil, h))
			pe.BlockTokenCounts = append(pe.BlockTokenCounts, int32(rpc.DefaultEngineBlockSize))
		}
		e.Ingest(&engine.Update{TenantID: "team", ModelID: modelID, HashScheme: "vllm", ReplicaID: "pod-3", Prefixes: []engine.PrefixEntry{pe}}, time.Now().UnixMicro())
	}
	p, err := New(Config{Source: endpoints.NewFixed(pool), Lookup: svc, Tokenizer: tok})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// runDecide times decide over the body and reports the p50 and p99.
func runDecide(b *testing.B, p *Picker, body []byte, want string) {
	s := &stream{p: p, ctx: context.Background(), d: new(decision), out: new(outMessages), path: request.ChatPath}
	if imm := p.decide(s, body, ""); imm != nil || s.d.outcome != want {
		b.Fatalf("decision %+v outcome %q reason %q, want %s", imm, s.d.outcome, s.d.reason, want)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for b.Loop() {
		t0 := time.Now()
		p.decide(s, body, "")
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	// On a shared machine wall-clock percentiles include waits for a
	// core; the CPU per decision does not.
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(len(lat)), "cpu-µs/op")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkDecide8k is the decision cost in process of an 8-turn chat
// request of 8k tokens: parse, tokens (fixed, 8,192 ids), the index
// lookup (fingerprint of 512 blocks, ranking), endpoint mapping and the
// destination list. Target p99 <= 1 ms with the real tokenizer
// (BenchmarkDecide8kLlama3).
func BenchmarkDecide8k(b *testing.B) {
	toks := make([]uint32, 8192)
	for i := range toks {
		toks[i] = uint32(i*7919) % 128000
	}
	p := benchPicker(b, fixedTokens(toks), "meta-llama/Llama-3.1-8B-Instruct", toks)
	runDecide(b, p, conversation(6000), OutcomePrefix)
}

// BenchmarkDecide8kLlama3 is the whole path with the real Llama 3
// tokenizer (TOKENIZER_ASSETS=$(bash hack/tokenizer-assets.sh)): the chat
// template over all 8 messages, tokenized, then as BenchmarkDecide8k. It
// skips until *modeldir.Dir has RequestTokens.
func BenchmarkDecide8kLlama3(b *testing.B) {
	assets := os.Getenv("TOKENIZER_ASSETS")
	if assets == "" {
		b.Skip("TOKENIZER_ASSETS not set (bash hack/tokenizer-assets.sh)")
	}
	dir, err := modeldir.New(modeldir.Config{Root: assets})
	if err != nil {
		b.Fatal(err)
	}
	tok, ok := any(dir).(Tokenizer)
	if !ok {
		b.Skip("*modeldir.Dir has no RequestTokens in this build")
	}
	body := conversation(6000)
	r, err := request.Parse(request.ChatPath, body)
	if err != nil {
		b.Fatal(err)
	}
	toks, err := tok.RequestTokens(context.Background(), "llama3", r)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d tokens", len(toks))
	p := benchPicker(b, tok, "llama3", toks)
	body = []byte(strings.Replace(string(body), "meta-llama/Llama-3.1-8B-Instruct", "llama3", 1))
	runDecide(b, p, body, OutcomePrefix)
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
