package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/picker"
	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/picker/request"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/tokenizer/modeldir"
)

// The picker part of the demo: three fake engines behind the endpoint
// picker, multi-turn chats sent through it as Envoy sends them (ext_proc
// over a real gRPC connection on 127.0.0.1), each engine keeping the KV
// blocks of what it served and reporting them to the index, so later
// turns of a conversation find their prefix.
const (
	demoTenant = "demo"
	demoModel  = "demo-model"
	demoBlock  = 16
)

// demoEngines are the pool's endpoints; nothing listens there: the demo
// plays the gateway and hands each request to the engine object whose
// address the picker chose.
var demoEngines = []endpoints.Endpoint{
	{ReplicaID: "engine-a", Address: "127.0.0.1:18001"},
	{ReplicaID: "engine-b", Address: "127.0.0.1:18002"},
	{ReplicaID: "engine-c", Address: "127.0.0.1:18003"},
}

// stand-in tokenization when this build has no whole-conversation
// tokenizer: one token per byte of each message as sent, used by the
// picker and the fake engines alike (said so in the report).
type byteTokenizer struct{}

func (byteTokenizer) RequestTokens(_ context.Context, _ string, r *request.Request) ([]uint32, error) {
	var toks []uint32
	for _, m := range r.Messages {
		for _, c := range []byte(m.Raw) {
			toks = append(toks, uint32(c))
		}
	}
	return toks, nil
}

// demoTokenizer returns the model directory's whole-conversation
// tokenizer when dir has one, else the stand-in, and a line saying which.
func demoTokenizer(dir string) (picker.Tokenizer, string, error) {
	if dir != "" {
		d, err := modeldir.New(modeldir.Config{Root: dir})
		if err != nil {
			return nil, "", err
		}
		if t, ok := any(d).(picker.Tokenizer); ok {
			return t, "the model's chat template and tokenizer from " + dir, nil
		}
	}
	return byteTokenizer{}, "a stand-in tokenization (one token per byte of each message), shared by the picker and the fake engines: this build has no whole-conversation tokenizer", nil
}

// fakeEngine keeps the block chain hashes it computed, as vLLM's prefix
// cache does, and reports new ones to the index.
type fakeEngine struct {
	ep     endpoints.Endpoint
	blocks map[uint64]bool
}

// serve computes the prompt's cached prefix on this engine (leading
// blocks it holds), stores the rest, and returns (prompt, cached) tokens
// and the new chain to report.
func (e *fakeEngine) serve(toks []uint32) (int, int, *pb.CacheStateUpdate) {
	sums := fingerprint.AppendChain(nil, toks, demoBlock, 0, false)
	cached := 0
	for _, h := range sums {
		if !e.blocks[h] {
			break
		}
		cached += demoBlock
	}
	u := &pb.CacheStateUpdate{TenantId: demoTenant, ModelId: demoModel, HashScheme: "vllm", ReplicaId: e.ep.ReplicaID, TimestampUs: time.Now().UnixMicro()}
	pe := &pb.PrefixEntry{}
	for _, h := range sums {
		e.blocks[h] = true
		pe.BlockHashes = append(pe.BlockHashes, fingerprint.AppendWire(nil, h))
		pe.BlockTokenCounts = append(pe.BlockTokenCounts, demoBlock)
	}
	u.Prefixes = []*pb.PrefixEntry{pe}
	return len(toks), cached, u
}

// pickerResult is what the chat run saw.
type pickerResult struct {
	requests          int
	outcomes          map[string]int // "outcome/reason" from the server's metrics
	perEngine         map[string]int
	firstPrompt       int
	firstCached       int
	laterPrompt       int
	laterCached       int
	laterRequests     int
	laterSameEngine   int
	tokenizerNote     string
	predicted, served float64
}

// runPickerChats sends conversations x turns chat requests through the
// picker and reports where they went.
func runPickerChats(ctx context.Context, srv *server.Server, tok picker.Tokenizer, conversations, turns int) (*pickerResult, error) {
	creds := insecure.NewCredentials()
	if srv.PickerTLS() {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // gateways do not verify an endpoint picker
	}
	pconn, err := grpc.NewClient(srv.PickerAddr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer pconn.Close()
	cconn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer cconn.Close()
	ext, cache := extprocv3.NewExternalProcessorClient(pconn), pb.NewInferenceCacheClient(cconn)
	engines := map[string]*fakeEngine{}
	for _, ep := range demoEngines {
		engines[ep.Address] = &fakeEngine{ep: ep, blocks: map[uint64]bool{}}
	}
	// Each engine introduces itself (stats, no blocks yet), as a
	// subscriber does at start, so the index knows all three.
	for _, ep := range demoEngines {
		if err := report(ctx, cache, &pb.CacheStateUpdate{TenantId: demoTenant, ModelId: demoModel, HashScheme: "vllm", ReplicaId: ep.ReplicaID,
			TimestampUs: time.Now().UnixMicro(), Stats: &pb.ReplicaStats{HitRate: 0}}); err != nil {
			return nil, err
		}
	}
	res := &pickerResult{outcomes: map[string]int{}, perEngine: map[string]int{}}
	last := map[int]string{}
	for turn := range turns {
		for c := range conversations {
			body := conversation(c, turn)
			r, err := request.Parse(request.ChatPath, body)
			if err != nil {
				return nil, err
			}
			toks, err := tok.RequestTokens(ctx, demoModel, r)
			if err != nil {
				return nil, fmt.Errorf("cannot tokenize the demo conversation: %w", err)
			}
			dest, err := gatewayRequest(ctx, ext, body, func(addr string) (string, error) {
				e := engines[addr]
				if e == nil {
					return "", fmt.Errorf("the picker chose %q, not a pool endpoint", addr)
				}
				prompt, cached, u := e.serve(toks)
				if err := report(ctx, cache, u); err != nil {
					return "", err
				}
				if turn == 0 {
					res.firstPrompt += prompt
					res.firstCached += cached
				} else {
					res.laterPrompt += prompt
					res.laterCached += cached
					res.laterRequests++
				}
				return fmt.Sprintf(`{"id":"demo","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":%d}}}`, prompt, cached), nil
			})
			if err != nil {
				return nil, err
			}
			res.requests++
			res.perEngine[engines[dest].ep.ReplicaID]++
			if turn > 0 && last[c] == dest {
				res.laterSameEngine++
			}
			last[c] = dest
		}
	}
	return res, nil
}

// conversation is conversation c's chat body at turn t: a shared system
// prompt per conversation, then t earlier exchanges and a new question.
func conversation(c, t int) []byte {
	msgs := []map[string]string{{"role": "system", "content": fmt.Sprintf("You are assistant %d of the inferencecache demo. ", c) + strings.Repeat("Answer briefly and cite the manual. ", 6)}}
	for i := 0; i <= t; i++ {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("Conversation %d, question %d: how does the KV cache help here?", c, i)})
		if i < t {
			msgs = append(msgs, map[string]string{"role": "assistant", "content": fmt.Sprintf("Answer %d: the prefix of this conversation is already computed on one engine.", i)})
		}
	}
	b, _ := json.Marshal(map[string]any{"model": demoModel, "messages": msgs, "stream": true, "stream_options": map[string]bool{"include_usage": true}})
	return b
}

// gatewayRequest plays Envoy for one HTTP request: one ext_proc stream in
// FULL_DUPLEX_STREAMED mode, the request to the picker, the response
// (SSE, usage in the last event) from serve, with the served endpoint in
// the metadata. It returns the endpoint that served.
func gatewayRequest(ctx context.Context, ext extprocv3.ExternalProcessorClient, body []byte, serve func(addr string) (string, error)) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := ext.Process(ctx)
	if err != nil {
		return "", err
	}
	send := st.Send
	if err := send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(request.ChatPath)},
			{Key: "content-type", RawValue: []byte("application/json")},
		}}}},
	}); err != nil {
		return "", err
	}
	if err := send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		return "", err
	}
	m, err := st.Recv()
	if err != nil {
		return "", err
	}
	if ir := m.GetImmediateResponse(); ir != nil {
		return "", fmt.Errorf("the picker answered %d: %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	dest := m.GetDynamicMetadata().GetFields()[picker.MetadataNamespace].GetStructValue().GetFields()[picker.DestinationHeader].GetStringValue()
	primary, _, _ := strings.Cut(dest, ",")
	for got := 0; got < len(body); {
		m, err := st.Recv()
		if err != nil {
			return "", err
		}
		sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		got += len(sr.GetBody())
		if sr.GetEndOfStream() {
			break
		}
	}
	last, err := serve(primary)
	if err != nil {
		return "", err
	}
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{picker.MetadataNamespace: {Fields: map[string]*structpb.Value{picker.ServedKey: structpb.NewStringValue(primary)}}}}
	if err := send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte("text/event-stream")},
	}}}}}); err != nil {
		return "", err
	}
	if _, err := st.Recv(); err != nil {
		return "", err
	}
	events := []string{`data: {"id":"demo","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"The prefix is cached."}}],"usage":null}` + "\n\n", "data: " + last + "\n\ndata: [DONE]\n\n"}
	for i, ev := range events {
		if err := send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(ev), EndOfStream: i == len(events)-1}}}); err != nil {
			return "", err
		}
		if _, err := st.Recv(); err != nil {
			return "", err
		}
	}
	if err := st.CloseSend(); err != nil {
		return "", err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("the ext_proc stream did not end cleanly: %v", err)
	}
	return primary, nil
}

func report(ctx context.Context, cache pb.InferenceCacheClient, u *pb.CacheStateUpdate) error {
	st, err := cache.ReportCacheState(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(u); err != nil {
		return err
	}
	_, err = st.CloseAndRecv()
	return err
}

// writePickerReport prints where the chats went and why.
func writePickerReport(w io.Writer, r *pickerResult) {
	fmt.Fprintf(w, "\n## Through the endpoint picker (ext_proc, as Envoy sends it)\n\n")
	fmt.Fprintf(w, "%d chat requests (multi-turn conversations) to 3 fake engines; tokens from %s.\n\n", r.requests, r.tokenizerNote)
	fmt.Fprintln(w, "| outcome | reason | requests |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, k := range slices.Sorted(maps.Keys(r.outcomes)) {
		if r.outcomes[k] == 0 {
			continue
		}
		o, reason, _ := strings.Cut(k, "/")
		fmt.Fprintf(w, "| %s | %s | %d |\n", o, reason, r.outcomes[k])
	}
	fmt.Fprintln(w, "\n| engine | requests |")
	fmt.Fprintln(w, "|---|---|")
	for _, k := range slices.Sorted(maps.Keys(r.perEngine)) {
		fmt.Fprintf(w, "| %s | %d |\n", k, r.perEngine[k])
	}
	pct := func(a, b int) float64 {
		if b == 0 {
			return 0
		}
		return 100 * float64(a) / float64(b)
	}
	fmt.Fprintf(w, "\nPrefix-cache hits the engines reported: first turns %.0f %% of prompt tokens, later turns %.0f %% "+
		"(%d of %d later turns went to the engine of the conversation's previous turn).\n",
		pct(r.firstCached, r.firstPrompt), pct(r.laterCached, r.laterPrompt), r.laterSameEngine, r.laterRequests)
	fmt.Fprintf(w, "Server /metrics: predicted cached tokens %.0f, delivered %.0f.\n", r.predicted, r.served)
}
