package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferencecache/inferencecache/chattemplate"
	"github.com/inferencecache/inferencecache/kvevents"
	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	"github.com/inferencecache/inferencecache/tokenizer"
)

// Timing of the fake engines: a prefill costs prefillBase plus
// prefillPerToken for each prompt token it computes (cached blocks are
// free), then decodeTokens tokens stream at decodePerToken each. At most
// maxRunning requests run at once; the rest wait, as vLLM's scheduler
// queues them.
const (
	prefillBase     = 2 * time.Millisecond
	prefillPerToken = 40 * time.Microsecond
	decodeTokens    = 24
	decodePerToken  = time.Millisecond
	maxRunning      = 2
	engineBlock     = 16
)

// engineModel is what an engine loads for its model: the same files the
// picker's --tokenizer-dir holds, used the engine's way: the chat
// template over the whole conversation, then the tokenizer over the
// rendering (no prefix cache, no message cache: an independent check of
// the picker's incremental tokenization).
type engineModel struct {
	tok  *tokenizer.Tokenizer
	tmpl *chattemplate.Template
}

func loadEngineModel(tokenizerJSON, configJSON []byte) (*engineModel, error) {
	tok, err := tokenizer.Load(tokenizerJSON)
	if err != nil {
		return nil, fmt.Errorf("cannot load the engine's tokenizer: %w", err)
	}
	tmpl, err := chattemplate.ParseWithSource(configJSON, "")
	if err != nil {
		return nil, fmt.Errorf("cannot load the engine's chat template: %w", err)
	}
	return &engineModel{tok: tok, tmpl: tmpl}, nil
}

// promptTokens renders and tokenizes a chat request body as the engine
// does.
func (m *engineModel) promptTokens(ctx context.Context, body []byte) ([]uint32, string, error) {
	var req struct {
		Messages []json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, "", err
	}
	text, err := m.tmpl.RenderChat(&chattemplate.Chat{Messages: req.Messages, AddGenerationPrompt: true})
	if err != nil {
		return nil, "", err
	}
	ids, err := m.tok.Encode(ctx, nil, text)
	if err != nil {
		return nil, "", err
	}
	var last struct {
		Content string `json:"content"`
	}
	if n := len(req.Messages); n > 0 {
		_ = json.Unmarshal(req.Messages[n-1], &last)
	}
	return ids, last.Content, nil
}

// fakeEngine is one vLLM-like replica on 127.0.0.1: an OpenAI
// /v1/chat/completions endpoint that answers with SSE and usage
// (prompt_tokens_details.cached_tokens from its own prefix cache), a
// Prometheus /metrics with vLLM's request gauges and prefix-cache
// counters, and KV events (BlockStored with the token ids of each new
// block) on a ZMQ publisher that a real kvevents subscriber follows and
// forwards to the server.
type fakeEngine struct {
	replicaID string
	addr      string
	modelID   string
	model     *engineModel
	pub       *fakeengine.Publisher
	sub       *kvevents.Subscriber
	srv       *http.Server
	lis       net.Listener
	slots     chan struct{} // one token per running request
	// record, when set, receives each request's result by x-request-id
	// (set before the engine serves).
	record func(id string, res engineResult)

	running, waiting atomic.Int64
	// hits and queries are vLLM's prefix-cache counters, in tokens.
	hits, queries atomic.Int64

	// mu protects blocks (engine block hash -> held) and publishing in
	// chain order.
	mu     sync.Mutex
	blocks map[uint64]bool
}

func newFakeEngine(replicaID, modelID string, model *engineModel) (*fakeEngine, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	pub, err := fakeengine.NewPublisher(fakeengine.Config{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: kvevents.DefaultTopic,
	})
	if err != nil {
		_ = lis.Close()
		return nil, err
	}
	e := &fakeEngine{replicaID: replicaID, addr: lis.Addr().String(), modelID: modelID, model: model, pub: pub, lis: lis,
		slots: make(chan struct{}, maxRunning), blocks: map[uint64]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", e.chat)
	mux.HandleFunc("GET /metrics", e.metrics)
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = e.srv.Serve(lis) }()
	return e, nil
}

// subscribe starts the engine's kvevents subscriber (as its sidecar would
// run), forwarding to the server through sink, scraping /metrics every
// statsInterval.
func (e *fakeEngine) subscribe(ctx context.Context, sink kvevents.Sink, tenant, model string, statsInterval time.Duration, done *sync.WaitGroup) error {
	sub, err := kvevents.New(kvevents.Config{
		ReplicaID: e.replicaID, TenantID: tenant, ModelID: model, HashScheme: "vllm",
		Endpoint: e.pub.Endpoint(), ReplayEndpoint: e.pub.ReplayEndpoint(), Topic: kvevents.DefaultTopic,
		MetricsURL: "http://" + e.addr + "/metrics", StatsInterval: statsInterval,
		BlockSize: engineBlock, Window: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	}, sink)
	if err != nil {
		return err
	}
	e.sub = sub
	done.Go(func() { _ = sub.Run(ctx) })
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return e.pub.WaitSubscribed(wctx)
}

func (e *fakeEngine) close() {
	_ = e.srv.Close()
	_ = e.pub.Close()
}

// engineHash is the engine's own block hash (vLLM's is a SHA-256 of the
// parent's hash and the block's tokens; any chained hash does here: the
// subscriber maps it to the index's fingerprint).
func engineHash(parent uint64, toks []uint32) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for i := range 8 {
		b[i] = byte(parent >> (8 * i))
	}
	_, _ = h.Write(b[:])
	for _, t := range toks {
		_, _ = h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
	}
	return h.Sum64()
}

// prefill finds the cached prefix of toks (whole blocks the engine holds,
// never the last token: vLLM always computes at least one), stores the
// other full blocks and publishes them. It returns the cached tokens and
// the sequence number of the event batch (0 when nothing was new).
func (e *fakeEngine) prefill(toks []uint32) (cached int, seq uint64, err error) {
	nBlocks := len(toks) / engineBlock
	hashes := make([]uint64, nBlocks)
	var parent uint64
	for i := range nBlocks {
		parent = engineHash(parent, toks[i*engineBlock:(i+1)*engineBlock])
		hashes[i] = parent
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	held := 0
	for held < nBlocks && held < (len(toks)-1)/engineBlock && e.blocks[hashes[held]] {
		held++
	}
	first := held
	for first < nBlocks && e.blocks[hashes[first]] {
		first++
	}
	if first == nBlocks {
		return held * engineBlock, 0, nil
	}
	ev := fakeengine.Event{Kind: fakeengine.BlockStored, BlockHashes: hashes[first:], TokenIDs: toks[first*engineBlock : nBlocks*engineBlock], BlockSize: engineBlock}
	if first > 0 {
		p := hashes[first-1]
		ev.Parent = &p
	}
	for _, h := range hashes[first:] {
		e.blocks[h] = true
	}
	seq, err = e.pub.Publish(fakeengine.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: []fakeengine.Event{ev}})
	return held * engineBlock, seq, err
}

// indexed waits (bounded by ctx) until the subscriber has applied event
// batch seq and delivered it to the server.
func (e *fakeEngine) indexed(ctx context.Context, seq uint64) error {
	for e.sub.NextSeq() <= seq {
		select {
		case <-ctx.Done():
			return fmt.Errorf("engine %s: KV events not applied: %w", e.replicaID, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
	return e.sub.Forwarder().Flush(ctx)
}

// engineResult is what the demo's bookkeeping learns about one request
// an engine served, besides its response: the event batch its new blocks
// went out in.
type engineResult struct {
	engine *fakeEngine
	seq    uint64
}

// chat serves /v1/chat/completions: queue for a slot, render and
// tokenize, prefill (the cached prefix is free), publish the new blocks,
// stream the answer as SSE and end with the usage.
func (e *fakeEngine) chat(w http.ResponseWriter, r *http.Request) {
	body, err := readAll(r, 4<<20)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.waiting.Add(1)
	select {
	case e.slots <- struct{}{}:
	case <-r.Context().Done():
		e.waiting.Add(-1)
		return
	}
	e.waiting.Add(-1)
	e.running.Add(1)
	defer func() { e.running.Add(-1); <-e.slots }()

	toks, lastUser, err := e.model.promptTokens(r.Context(), body)
	if err != nil {
		http.Error(w, `{"error":{"message":"`+err.Error()+`"}}`, http.StatusBadRequest)
		return
	}
	cached, seq, err := e.prefill(toks)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	e.queries.Add(int64(len(toks)))
	e.hits.Add(int64(cached))
	if e.record != nil {
		e.record(r.Header.Get("x-request-id"), engineResult{engine: e, seq: seq})
	}
	time.Sleep(prefillBase + time.Duration(len(toks)-cached)*prefillPerToken)

	w.Header().Set("content-type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	answer := reply(lastUser)
	words := strings.SplitAfter(answer, " ")
	for i, part := range chunkWords(words, 4) {
		delta, _ := json.Marshal(map[string]any{"id": "chatcmpl-demo", "object": "chat.completion.chunk", "model": e.modelID,
			"choices": []any{map[string]any{"index": 0, "delta": map[string]string{"content": part}}}, "usage": nil})
		fmt.Fprintf(w, "data: %s\n\n", delta)
		if fl != nil {
			fl.Flush()
		}
		if i < 3 {
			time.Sleep(decodeTokens / 4 * decodePerToken)
		}
	}
	fmt.Fprintf(w, `data: {"id":"chatcmpl-demo","object":"chat.completion.chunk","model":%q,"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`+"\n\ndata: [DONE]\n\n",
		e.modelID, len(toks), decodeTokens, len(toks)+decodeTokens, cached)
}

// chunkWords splits words into n SSE deltas.
func chunkWords(words []string, n int) []string {
	out := make([]string, 0, n)
	per := (len(words) + n - 1) / n
	for i := 0; i < len(words); i += per {
		out = append(out, strings.Join(words[i:min(i+per, len(words))], ""))
	}
	return out
}

// metrics serves what the subscriber scrapes: vLLM's request gauges,
// prefix-cache counters (tokens) and cache usage.
func (e *fakeEngine) metrics(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	usage := float64(len(e.blocks)) / 4096
	e.mu.Unlock()
	w.Header().Set("content-type", "text/plain; version=0.0.4")
	fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=%q} %d\n", e.modelID, e.running.Load())
	fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=%q} %d\n", e.modelID, e.waiting.Load())
	fmt.Fprintf(w, "# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{model_name=%q} %d\n", e.modelID, e.queries.Load())
	fmt.Fprintf(w, "# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{model_name=%q} %d\n", e.modelID, e.hits.Load())
	fmt.Fprintf(w, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=%q} %g\n", e.modelID, min(usage, 1))
}

func readAll(r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = errors.New("request body too large")
	}
	return b, err
}
