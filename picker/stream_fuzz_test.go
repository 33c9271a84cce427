package picker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/picker/request"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
)

// fuzzServerStream is the ext_proc stream a fuzz input describes: the
// messages a gateway sends, in order, then the end of the stream. What
// the picker sends is marshaled (it must be a valid message) and counted.
type fuzzServerStream struct {
	grpc.ServerStream // unused methods: nil
	ctx               context.Context
	msgs              []*extprocv3.ProcessingRequest
	next              int
	sent              int
}

func (f *fuzzServerStream) Context() context.Context { return f.ctx }

func (f *fuzzServerStream) RecvMsg(m any) error {
	if f.next >= len(f.msgs) {
		return io.EOF
	}
	dst := m.(*extprocv3.ProcessingRequest)
	proto.Reset(dst)
	proto.Merge(dst, f.msgs[f.next])
	f.next++
	return nil
}

func (f *fuzzServerStream) Recv() (*extprocv3.ProcessingRequest, error) {
	m := new(extprocv3.ProcessingRequest)
	return m, f.RecvMsg(m)
}

func (f *fuzzServerStream) Send(m *extprocv3.ProcessingResponse) error {
	if _, err := proto.Marshal(m); err != nil {
		return err
	}
	f.sent++
	return nil
}

// countingFeedback counts starts and ends (all replicas).
type countingFeedback struct{ started, finished atomic.Int64 }

func (c *countingFeedback) RequestStarted(string, string, string, int64)  { c.started.Add(1) }
func (c *countingFeedback) RequestFinished(string, string, string, int64) { c.finished.Add(1) }

// byteTokens is one token per byte of each message (a stand-in: the fuzz
// target is the stream, not the tokenizer).
type byteTokens struct{}

func (byteTokens) RequestTokens(_ context.Context, _ string, r *request.Request) ([]uint32, error) {
	var toks []uint32
	for _, m := range r.Messages {
		for _, c := range m.Raw {
			toks = append(toks, uint32(c))
		}
	}
	for _, c := range []byte(r.Prompt) {
		toks = append(toks, uint32(c))
	}
	return toks, nil
}

var (
	fuzzOnce   sync.Once
	fuzzPicker *Picker
	fuzzFB     *countingFeedback
)

// fuzzEndpoints are the fuzz picker's pool; inputs name them by index.
var fuzzEndpoints = []string{"10.0.0.1:8000", "10.0.0.2:8000", "[fd00::3]:8000"}

func fuzzSetup(t testing.TB) *Picker {
	fuzzOnce.Do(func() {
		store := policy.NewStore()
		e := engine.New(engine.Config{Policies: store})
		svc, err := rpc.NewService(rpc.Config{Index: e, Policies: store})
		if err != nil {
			panic(err)
		}
		var eps []endpoints.Endpoint
		for i, a := range fuzzEndpoints {
			eps = append(eps, endpoints.Endpoint{ReplicaID: "pod-" + itoa(i), Address: a})
		}
		pool, err := endpoints.NewPool("team", "vllm", nil, eps)
		if err != nil {
			panic(err)
		}
		// One pod holds a chain, so some picks are prefix picks.
		holdChain(e, "m", "pod-1", byteChain(`{"role":"user","content":"hello there, how are you today?"}`))
		fuzzFB = &countingFeedback{}
		fuzzPicker, err = New(Config{Source: endpoints.NewFixed(pool), Lookup: svc, Tokenizer: byteTokens{}, Feedback: fuzzFB,
			MaxBodyBytes: 4096, Logger: discardLogger()})
		if err != nil {
			panic(err)
		}
	})
	return fuzzPicker
}

func byteChain(raw string) []uint32 {
	toks := make([]uint32, len(raw))
	for i := range raw {
		toks[i] = uint32(raw[i])
	}
	return toks
}

// fuzzMessages turns fuzz bytes into a gateway's messages: each op byte
// (kind and flags) is followed by a length byte and that many bytes of
// payload (a body chunk, a path, a served endpoint, a subset hint).
func fuzzMessages(data []byte) []*extprocv3.ProcessingRequest {
	var out []*extprocv3.ProcessingRequest
	modes := []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_STREAMED,
		filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_NONE}
	for len(data) >= 2 && len(out) < 64 {
		op, n := data[0], int(data[1])
		data = data[2:]
		n = min(n, len(data))
		payload := data[:n]
		data = data[n:]
		eos := op&0x10 != 0
		m := &extprocv3.ProcessingRequest{}
		if op&0x20 != 0 {
			m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: modes[op>>6], ResponseBodyMode: modes[(op>>6+1)%4],
				SendBodyWithoutWaitingForHeaderResponse: op&0x40 != 0}
		}
		served := func() *corev3.Metadata {
			addr := string(payload)
			if len(payload) == 1 {
				addr = fuzzEndpoints[int(payload[0])%len(fuzzEndpoints)]
			}
			return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataNamespace: {
				Fields: map[string]*structpb.Value{ServedKey: structpb.NewStringValue(strings.ToValidUTF8(addr, ""))}}}}
		}
		switch op & 0x0f {
		case 0, 1:
			path := request.ChatPath
			if op&1 == 1 {
				path = strings.ToValidUTF8(string(payload), "")
			}
			m.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: eos,
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte(path)}, {Key: DestinationHeader, Value: "1.2.3.4:5"}}}}}
		case 2:
			m.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: eos}}
			hint := strings.ToValidUTF8(string(payload), "")
			var v *structpb.Value
			if op&0x40 != 0 {
				var list []any
				for _, p := range strings.Split(hint, ",") {
					list = append(list, p)
				}
				lv, _ := structpb.NewList(list)
				v = structpb.NewListValue(lv)
			} else {
				v = structpb.NewStringValue(hint)
			}
			m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: v}}}}
		case 3, 4, 5:
			m.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: payload, EndOfStream: eos}}
		case 6:
			m.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}
		case 7:
			m.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{EndOfStream: eos}}
			m.MetadataContext = served()
		case 8, 9, 10:
			m.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: payload, EndOfStream: eos}}
			if op&0x40 != 0 {
				m.MetadataContext = served()
			}
		case 11:
			m.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}
		case 12:
			m.ObservabilityMode = true
			m.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: payload}}
		default:
			// A message with no request (flow control only).
		}
		out = append(out, m)
	}
	return out
}

// fuzzInput builds an input: (op, payload) pairs.
func fuzzInput(parts ...any) []byte {
	var b []byte
	for i := 0; i+1 < len(parts); i += 2 {
		p := []byte(parts[i+1].(string))
		b = append(b, parts[i].(byte), byte(len(p)))
		b = append(b, p...)
	}
	return b
}

// FuzzStream: any sequence of gateway messages, cut anywhere, makes the
// picker answer with valid messages or end the stream with a gRPC status
// (never a panic), and leaves nothing counted in flight: every
// RequestStarted has its RequestFinished.
func FuzzStream(f *testing.F) {
	chat := `{"model":"m","messages":[{"role":"user","content":"hello there, how are you today?"}]}`
	usage := `{"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}}`
	f.Add(fuzzInput(byte(0x20), "", byte(0x13), chat, byte(0x57), "\x01", byte(0x18), usage))
	f.Add(fuzzInput(byte(0x20), "", byte(0x03), chat[:20], byte(0x13), chat[20:], byte(0x07), "", byte(0x08), "data: "+usage+"\n\n", byte(0x0b), ""))
	f.Add(fuzzInput(byte(0x20), "", byte(0x03), chat, byte(0x06), "", byte(0x07), "", byte(0x18), usage))
	f.Add(fuzzInput(byte(0x60), "", byte(0x13), chat, byte(0x47), "10.0.0.9:8000", byte(0x18), ""))
	f.Add(fuzzInput(byte(0x12), "", byte(0x37), "", byte(0x18), usage))
	f.Add(fuzzInput(byte(0x02), "10.0.0.1:8000,[fd00:0::3]:8000", byte(0x13), chat, byte(0x17), "\x02"))
	f.Add(fuzzInput(byte(0x42), "nope", byte(0x13), chat))
	f.Add(fuzzInput(byte(0x20), "", byte(0x13), "not json", byte(0x0c), "x"))
	f.Add(fuzzInput(byte(0x21), "/v1/completions", byte(0x13), `{"model":"m","prompt":[1,2,3]}`, byte(0x17), ""))
	f.Add(fuzzInput(byte(0x08), "early response body", byte(0x13), chat))
	p := fuzzSetup(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st := &fuzzServerStream{ctx: ctx, msgs: fuzzMessages(data)}
		err := p.Process(st)
		if err != nil {
			if s, ok := status.FromError(err); !ok || s.Code() != codes.FailedPrecondition {
				t.Fatalf("Process: %v (want nil or FailedPrecondition)", err)
			}
		}
		if n := p.InflightTotal(); n != 0 {
			t.Fatalf("%d requests left in flight", n)
		}
		if s, fin := fuzzFB.started.Load(), fuzzFB.finished.Load(); s != fin {
			t.Fatalf("%d starts, %d ends", s, fin)
		}
	})
}

// TestFuzzStreamSeedsRoute: the seeds reach the decision (so the fuzz
// target explores past the headers).
func TestFuzzStreamSeedsRoute(t *testing.T) {
	p := fuzzSetup(t)
	chat := `{"model":"m","messages":[{"role":"user","content":"hello there, how are you today?"}]}`
	st := &fuzzServerStream{ctx: context.Background(), msgs: fuzzMessages(fuzzInput(byte(0x20), "", byte(0x13), chat, byte(0x57), "\x01", byte(0x18), ""))}
	if err := p.Process(st); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	// Headers answer, body chunk, response headers, response body.
	if st.sent != 4 {
		t.Fatalf("the picker sent %d messages, want 4", st.sent)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
