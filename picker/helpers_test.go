package picker_test

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/picker"
	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/picker/request"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

const (
	tenant = "team-a"
	model  = "m"
	scheme = "vllm"
	// blockSize is the service's fingerprint block size.
	blockSize = 16
)

// byteTokenizer is a deterministic stand-in for the chat-template
// tokenizer: one token per byte of each message as sent, so a later turn
// of a conversation extends an earlier turn's tokens exactly as a real
// template does. It counts its calls and can block (tokenizer-busy tests).
type byteTokenizer struct {
	block chan struct{} // when non-nil, RequestTokens waits on it
	// stubborn makes the wait ignore the context, as a tokenizer that
	// checks its deadline only between chunks of work overruns it.
	stubborn bool
	mu       sync.Mutex
	calls    int
}

func (b *byteTokenizer) RequestTokens(ctx context.Context, _ string, r *request.Request) ([]uint32, error) {
	b.mu.Lock()
	b.calls++
	b.mu.Unlock()
	if b.block != nil && b.stubborn {
		<-b.block
	} else if b.block != nil {
		select {
		case <-b.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return tokensOf(r), nil
}

func tokensOf(r *request.Request) []uint32 {
	var toks []uint32
	for _, m := range r.Messages {
		for _, c := range []byte(m.Raw) {
			toks = append(toks, uint32(c))
		}
	}
	for _, c := range []byte(r.Prompt) {
		toks = append(toks, uint32(c))
	}
	return toks
}

// feedback counts RequestStarted and RequestFinished per replica.
type feedback struct {
	mu       sync.Mutex
	started  map[string]int
	finished map[string]int
}

func newFeedback() *feedback {
	return &feedback{started: map[string]int{}, finished: map[string]int{}}
}

func (f *feedback) RequestStarted(_, _, replica string, _ int64) {
	f.mu.Lock()
	f.started[replica]++
	f.mu.Unlock()
}

func (f *feedback) RequestFinished(_, _, replica string, _ int64) {
	f.mu.Lock()
	f.finished[replica]++
	f.mu.Unlock()
}

func (f *feedback) balanced() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, v := range f.started {
		if f.finished[k] != v {
			return false
		}
	}
	for k, v := range f.finished {
		if f.started[k] != v {
			return false
		}
	}
	return true
}

// observer records what the picker reports.
type observer struct {
	mu        sync.Mutex
	picks     map[string]int // "outcome/reason"
	usage     map[string]int
	delivered []deliveredRec
	tokenized int
}

type deliveredRec struct {
	model                       string
	prompt, predicted, achieved int64
}

func newObserver() *observer { return &observer{picks: map[string]int{}, usage: map[string]int{}} }

func (o *observer) Picked(outcome, reason string, _ time.Duration) {
	o.mu.Lock()
	o.picks[outcome+"/"+reason]++
	o.mu.Unlock()
}
func (o *observer) Tokenized(time.Duration) { o.mu.Lock(); o.tokenized++; o.mu.Unlock() }
func (o *observer) Delivered(m string, p, pred, d int64) {
	o.mu.Lock()
	o.delivered = append(o.delivered, deliveredRec{m, p, pred, d})
	o.mu.Unlock()
}
func (o *observer) Usage(r string) { o.mu.Lock(); o.usage[r]++; o.mu.Unlock() }

func (o *observer) count(key string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.picks[key]
}

// env is a picker on a real gRPC server on 127.0.0.1 in front of a real
// index and lookup service (on a second gRPC server, which tests report
// cache state to).
type env struct {
	pk     *picker.Picker
	src    *endpoints.Fixed
	fb     *feedback
	obs    *observer
	tok    *byteTokenizer
	ep     extprocv3.ExternalProcessorClient
	cache  pb.InferenceCacheClient
	engine *engine.Engine
	store  *policy.Store
}

var testEndpoints = []endpoints.Endpoint{
	{ReplicaID: "pod-a", Address: "10.0.0.1:8000"},
	{ReplicaID: "pod-b", Address: "10.0.0.2:8000"},
	{ReplicaID: "pod-c", Address: "10.0.0.3:8000"},
}

func testPool(t testing.TB, eps ...endpoints.Endpoint) *endpoints.Pool {
	t.Helper()
	if eps == nil {
		eps = testEndpoints
	}
	p, err := endpoints.NewPool(tenant, scheme, nil, eps)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newEnv(t testing.TB, mutate func(*picker.Config)) *env {
	t.Helper()
	store := policy.NewStore()
	e := engine.New(engine.Config{Policies: store})
	svc, err := rpc.NewService(rpc.Config{Index: e, Policies: store, BlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	env := &env{src: endpoints.NewFixed(testPool(t)), fb: newFeedback(), obs: newObserver(), tok: &byteTokenizer{}, engine: e, store: store}
	cfg := picker.Config{Source: env.src, Lookup: svc, Tokenizer: env.tok, Feedback: env.fb, Observer: env.obs}
	if mutate != nil {
		mutate(&cfg)
	}
	env.pk, err = picker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cacheSrv := grpc.NewServer(rpc.ServerOptions()...)
	rpc.Register(cacheSrv, svc)
	pickSrv := grpc.NewServer()
	env.pk.Register(pickSrv)
	env.cache = pb.NewInferenceCacheClient(serve(t, cacheSrv))
	env.ep = extprocv3.NewExternalProcessorClient(serve(t, pickSrv))
	return env
}

// serve runs gs on 127.0.0.1 and returns a client connection to it.
func serve(t testing.TB, gs *grpc.Server) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// holds reports that replica holds the chain of toks.
func (env *env) holds(t testing.TB, replica string, toks []uint32) {
	t.Helper()
	sums := fingerprint.AppendChain(nil, toks, blockSize, 0, false)
	var hs [][]byte
	var cs []int32
	for _, h := range sums {
		hs = append(hs, fingerprint.AppendWire(nil, h))
		cs = append(cs, blockSize)
	}
	st, err := env.cache.ReportCacheState(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: replica,
		TimestampUs: time.Now().UnixMicro(), Stats: &pb.ReplicaStats{HitRate: 0.5},
		Prefixes: []*pb.PrefixEntry{{BlockHashes: hs, BlockTokenCounts: cs}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
}

// chatBody is an OpenAI chat request of the given turns (alternating
// user/assistant contents).
func chatBody(stream bool, turns ...string) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var msgs []msg
	for i, c := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, c})
	}
	b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "stream": stream,
		"stream_options": map[string]any{"include_usage": stream}})
	return b
}

// tokensOfBody is what byteTokenizer makes of a chat body.
func tokensOfBody(t testing.TB, body []byte) []uint32 {
	t.Helper()
	r, err := request.Parse(request.ChatPath, body)
	if err != nil {
		t.Fatal(err)
	}
	return tokensOf(r)
}

// client drives one ext_proc stream exactly as Envoy does.
type client struct {
	t  testing.TB
	st extprocv3.ExternalProcessor_ProcessClient
}

func (env *env) open(t testing.TB) *client {
	t.Helper()
	st, err := env.ep.Process(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return &client{t: t, st: st}
}

func (env *env) openCtx(t testing.TB, ctx context.Context) *client {
	t.Helper()
	st, err := env.ep.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &client{t: t, st: st}
}

func (c *client) send(m *extprocv3.ProcessingRequest) {
	c.t.Helper()
	if err := c.st.Send(m); err != nil {
		c.t.Fatal(err)
	}
}

func (c *client) recv() *extprocv3.ProcessingResponse {
	c.t.Helper()
	m, err := c.st.Recv()
	if err != nil {
		c.t.Fatalf("recv: %v", err)
	}
	return m
}

// protocolConfig is what Envoy puts on the first message.
func protocolConfig(req, resp filterv3.ProcessingMode_BodySendMode, early bool) *extprocv3.ProtocolConfiguration {
	return &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp, SendBodyWithoutWaitingForHeaderResponse: early}
}

// requestHeaders is Envoy's request_headers message: raw_value only, as
// current Envoy sends them.
func requestHeaders(eos bool, pc *extprocv3.ProtocolConfiguration, md *corev3.Metadata, extra ...string) *extprocv3.ProcessingRequest {
	hs := []*corev3.HeaderValue{
		{Key: ":authority", RawValue: []byte("gw.example")},
		{Key: ":path", RawValue: []byte(request.ChatPath)},
		{Key: ":method", RawValue: []byte("POST")},
		{Key: ":scheme", RawValue: []byte("http")},
		{Key: "content-type", RawValue: []byte("application/json")},
		{Key: "x-request-id", RawValue: []byte("3b2c0f1e")},
	}
	for i := 0; i+1 < len(extra); i += 2 {
		hs = append(hs, &corev3.HeaderValue{Key: extra[i], RawValue: []byte(extra[i+1])})
	}
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: hs}, EndOfStream: eos}},
		MetadataContext: md,
		ProtocolConfig:  pc,
	}
}

func requestBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// servedMD is the response-phase metadata_context naming the served
// endpoint (metadata_options.forwarding_namespaces.untyped: envoy.lb).
func servedMD(addr string) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		picker.MetadataNamespace: {Fields: map[string]*structpb.Value{picker.ServedKey: structpb.NewStringValue(addr)}},
	}}
}

func subsetMD(v *structpb.Value) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		picker.SubsetNamespace: {Fields: map[string]*structpb.Value{picker.SubsetKey: v}},
	}}
}

func responseHeaders(md *corev3.Metadata, eos bool, contentType string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":status", RawValue: []byte("200")},
				{Key: "content-type", RawValue: []byte(contentType)},
			}}, EndOfStream: eos}},
		MetadataContext: md,
	}
}

func responseBody(b []byte, eos bool, md *corev3.Metadata) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}},
		MetadataContext: md,
	}
}

// destination checks a request headers response the way Envoy applies
// it and returns the destination: the header (set with overwrite) and the
// envoy.lb metadata must agree, and the route cache is cleared.
func destination(t testing.TB, m *extprocv3.ProcessingResponse) string {
	t.Helper()
	hr := m.GetRequestHeaders()
	if hr == nil {
		t.Fatalf("want a request headers response, got %v", m)
	}
	cr := hr.GetResponse()
	if !cr.GetClearRouteCache() {
		t.Error("clear_route_cache is not set")
	}
	var header string
	n := 0
	for _, o := range cr.GetHeaderMutation().GetSetHeaders() {
		if strings.EqualFold(o.GetHeader().GetKey(), picker.DestinationHeader) {
			n++
			header = string(o.GetHeader().GetRawValue())
			if o.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
				t.Errorf("destination header append_action %v: a client's header would survive", o.GetAppendAction())
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d destination headers in %v", n, cr.GetHeaderMutation())
	}
	md := m.GetDynamicMetadata().GetFields()[picker.MetadataNamespace].GetStructValue().GetFields()[picker.DestinationHeader].GetStringValue()
	if md != header {
		t.Fatalf("header %q and envoy.lb metadata %q differ", header, md)
	}
	return header
}

// waitFor polls cond for at most 10 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
