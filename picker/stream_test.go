package picker_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferencecache/inferencecache/picker"
	"github.com/inferencecache/inferencecache/picker/endpoints"
)

var fullDuplex = protocolConfig(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false)

// sendRequest drives the request phase in FULL_DUPLEX_STREAMED mode: the
// headers (with extra headers), the body in chunks of chunk bytes (the
// last with end_of_stream), then reads the deferred headers answer and
// the re-emitted body. It returns the destination and the body as
// re-emitted.
func (c *client) sendRequest(body []byte, chunk int, extra ...string) (string, []byte) {
	c.t.Helper()
	c.send(requestHeaders(false, fullDuplex, nil, extra...))
	for off := 0; off < len(body); off += chunk {
		end := min(off+chunk, len(body))
		c.send(requestBody(body[off:end], end == len(body)))
	}
	dest := destination(c.t, c.recv())
	var got []byte
	for {
		m := c.recv()
		sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			c.t.Fatalf("want a streamed request body chunk, got %v", m)
		}
		if len(sr.GetBody()) > picker.ChunkBytes {
			c.t.Fatalf("chunk of %d bytes, over %d", len(sr.GetBody()), picker.ChunkBytes)
		}
		got = append(got, sr.GetBody()...)
		if sr.GetEndOfStream() {
			return dest, got
		}
		if len(got) > len(body) {
			c.t.Fatalf("re-emitted %d bytes of a %d-byte body without end_of_stream", len(got), len(body))
		}
	}
}

// finishSSE drives the response phase: headers naming the served
// endpoint, then the SSE events one chunk each, checking each chunk is
// passed through unchanged.
func (c *client) finishSSE(served string, events ...string) {
	c.t.Helper()
	c.send(responseHeaders(servedMD(served), false, "text/event-stream"))
	if m := c.recv(); m.GetResponseHeaders() == nil || m.GetResponseHeaders().GetResponse().GetHeaderMutation() != nil {
		c.t.Fatalf("want an unchanged response headers answer, got %v", m)
	}
	for i, ev := range events {
		last := i == len(events)-1
		c.send(responseBody([]byte(ev), last, servedMD(served)))
		m := c.recv()
		sr := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil || string(sr.GetBody()) != ev || sr.GetEndOfStream() != last {
			c.t.Fatalf("response chunk %d not passed through: %v", i, m)
		}
	}
}

func sseEvents(prompt, cached int) []string {
	return []string{
		`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}],"usage":null}` + "\n\n",
		`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"lo \"usage\": {"}}],"usage":null}` + "\n\n",
		`data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":` + fmt.Sprint(prompt) +
			`,"total_tokens":300,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":` + fmt.Sprint(cached) + `}}}` + "\n\ndata: [DONE]\n\n",
	}
}

// A chat request whose prefix one replica holds goes there (header and
// metadata agree, a spoofed destination header is overwritten), the body
// comes back byte for byte, the SSE response passes through unchanged,
// its usage is read from the last event and compared with the prediction,
// and the in-flight count returns to 0.
func TestFullDuplexPrefixPick(t *testing.T) {
	env := newEnv(t, nil)
	body := chatBody(true, strings.Repeat("You are a helpful assistant. ", 20), "Hi", "Hello! How can I help?", "Tell me more")
	toks := tokensOfBody(t, body)
	env.holds(t, "pod-b", toks)

	c := env.open(t)
	dest, got := c.sendRequest(body, 100, "x-gateway-destination-endpoint", "6.6.6.6:1")
	primary, _, _ := strings.Cut(dest, ",")
	if primary != "10.0.0.2:8000" {
		t.Fatalf("destination %q, want pod-b's 10.0.0.2:8000 first", dest)
	}
	if strings.Contains(dest, "6.6.6.6") {
		t.Fatalf("the client's destination header leaked into %q", dest)
	}
	if n := strings.Count(dest, ",") + 1; n != 3 {
		t.Fatalf("destination %q: want the primary and 2 fallbacks (3 endpoints)", dest)
	}
	if !bytes.Equal(got, body) {
		t.Fatal("the body was not re-emitted byte for byte")
	}
	if env.obs.count("prefix/none") != 1 {
		t.Fatalf("picks %v", env.obs.picks)
	}
	if got := env.pk.InflightTotal(); got != 1 {
		t.Fatalf("in flight %d during the response, want 1", got)
	}
	matched := len(toks) / blockSize * blockSize
	c.finishSSE("10.0.0.2:8000", sseEvents(len(toks), matched-16)...)
	waitFor(t, "the request to end", func() bool { return env.pk.InflightTotal() == 0 })
	if err := c.st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	env.obs.mu.Lock()
	defer env.obs.mu.Unlock()
	if env.obs.usage[picker.UsageRead] != 1 || len(env.obs.delivered) != 1 {
		t.Fatalf("usage %v delivered %v", env.obs.usage, env.obs.delivered)
	}
	if d := env.obs.delivered[0]; d.model != model || d.prompt != int64(len(toks)) || d.predicted != int64(matched) || d.achieved != int64(matched-16) {
		t.Fatalf("delivered %+v, want prompt %d predicted %d achieved %d", d, len(toks), matched, matched-16)
	}
	if !env.fb.balanced() || env.fb.started["pod-b"] != 1 {
		t.Fatalf("feedback started %v finished %v", env.fb.started, env.fb.finished)
	}
}

// STREAMED mode with send_body_without_waiting_for_header_response: the
// headers answer waits for the body, then one CONTINUE per chunk.
func TestStreamedMode(t *testing.T) {
	env := newEnv(t, nil)
	body := chatBody(false, "hello there")
	c := env.open(t)
	c.send(requestHeaders(false, protocolConfig(filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_STREAMED, true), nil))
	c.send(requestBody(body[:10], false))
	c.send(requestBody(body[10:20], false))
	c.send(requestBody(body[20:], true))
	if dest := destination(t, c.recv()); dest == "" {
		t.Fatal("no destination")
	}
	for i := range 3 {
		m := c.recv()
		if m.GetRequestBody() == nil || m.GetRequestBody().GetResponse().GetBodyMutation() != nil {
			t.Fatalf("body answer %d: want CONTINUE, got %v", i, m)
		}
	}
	c.send(responseHeaders(nil, false, "application/json"))
	c.recv()
	c.send(responseBody([]byte(`{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":0}}}`), true, nil))
	if m := c.recv(); m.GetResponseBody() == nil || m.GetResponseBody().GetResponse().GetBodyMutation() != nil {
		t.Fatalf("want CONTINUE for the response body, got %v", m)
	}
	waitFor(t, "the request to end", func() bool { return env.pk.InflightTotal() == 0 })
	env.obs.mu.Lock()
	defer env.obs.mu.Unlock()
	if env.obs.usage[picker.UsageRead] != 1 {
		t.Fatalf("usage of the JSON body not read: %v", env.obs.usage)
	}
}

// STREAMED without sending the body early: the picker must answer the
// headers before it sees the body, so it picks without it (counted).
func TestStreamedWithoutEarlyBody(t *testing.T) {
	env := newEnv(t, nil)
	c := env.open(t)
	c.send(requestHeaders(false, protocolConfig(filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_NONE, false), nil))
	destination(t, c.recv())
	c.send(requestBody([]byte(`{"model":"m"}`), true))
	if m := c.recv(); m.GetRequestBody() == nil {
		t.Fatalf("want a body CONTINUE, got %v", m)
	}
	if env.obs.count("fallback/body_unavailable") != 1 {
		t.Fatalf("picks %v", env.obs.picks)
	}
}

// A request without a body is picked at once, from the headers.
func TestHeadersOnly(t *testing.T) {
	env := newEnv(t, nil)
	c := env.open(t)
	c.send(requestHeaders(true, fullDuplex, nil))
	if dest := destination(t, c.recv()); strings.Count(dest, ",") != 2 {
		t.Fatalf("destination %q", dest)
	}
	if env.obs.count("fallback/no_body") != 1 {
		t.Fatalf("picks %v", env.obs.picks)
	}
	// The response ends with its headers.
	c.send(responseHeaders(nil, true, "application/json"))
	c.recv()
	waitFor(t, "the request to end", func() bool { return env.pk.InflightTotal() == 0 })
}

// The subset hint restricts the candidates, as a list or a comma string;
// one that names no pool endpoint is a 503, and so is an empty one.
func TestSubsetHint(t *testing.T) {
	env := newEnv(t, nil)
	body := chatBody(false, "hello")
	env.holds(t, "pod-a", tokensOfBody(t, body)) // the prefix is on pod-a, outside the subset
	for _, tc := range []struct {
		name string
		v    *structpb.Value
		want string // "" = 503
	}{
		{"list", structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("10.0.0.3:8000"), structpb.NewStringValue("10.0.0.2:8000")}}), "10.0.0.2:8000,10.0.0.3:8000"},
		{"string", structpb.NewStringValue("10.0.0.3:8000, 9.9.9.9:1"), "10.0.0.3:8000"},
		{"none eligible", structpb.NewStringValue("9.9.9.9:1"), ""},
		{"empty", structpb.NewListValue(&structpb.ListValue{}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := env.open(t)
			c.send(requestHeaders(false, fullDuplex, subsetMD(tc.v)))
			c.send(requestBody(body, true))
			m := c.recv()
			if tc.want == "" {
				if m.GetImmediateResponse().GetStatus().GetCode() != 503 {
					t.Fatalf("want 503, got %v", m)
				}
				return
			}
			dest := destination(t, m)
			for _, a := range strings.Split(dest, ",") {
				if !strings.Contains(tc.want, a) {
					t.Fatalf("destination %q has %q outside the subset %q", dest, a, tc.want)
				}
			}
			if strings.Count(dest, ",") != strings.Count(tc.want, ",") {
				t.Fatalf("destination %q, want the endpoints %q", dest, tc.want)
			}
		})
	}
	if env.obs.count("503/empty_subset") != 2 {
		t.Fatalf("picks %v", env.obs.picks)
	}
}

// A 300 KB body comes back in chunks of at most 62,000 bytes, identical,
// end_of_stream on the last.
func TestLargeBodyRechunked(t *testing.T) {
	env := newEnv(t, nil)
	body := chatBody(false, strings.Repeat("x", 300_000))
	c := env.open(t)
	_, got := c.sendRequest(body, 16_384)
	if !bytes.Equal(got, body) {
		t.Fatalf("re-emitted %d bytes, want the %d sent", len(got), len(body))
	}
}

// Past the limit: 413 as an ImmediateResponse.
func TestBodyTooLarge(t *testing.T) {
	env := newEnv(t, func(c *picker.Config) { c.MaxBodyBytes = 1000 })
	c := env.open(t)
	c.send(requestHeaders(false, fullDuplex, nil))
	c.send(requestBody(bytes.Repeat([]byte("a"), 600), false))
	c.send(requestBody(bytes.Repeat([]byte("a"), 600), true))
	m := c.recv()
	if m.GetImmediateResponse().GetStatus().GetCode() != 413 {
		t.Fatalf("want 413, got %v", m)
	}
	if env.obs.count("413/body_too_large") != 1 || env.pk.InflightTotal() != 0 {
		t.Fatalf("picks %v in flight %d", env.obs.picks, env.pk.InflightTotal())
	}
}

// A body that is not JSON: 400, with an OpenAI-style error.
func TestNotJSON(t *testing.T) {
	env := newEnv(t, nil)
	c := env.open(t)
	c.send(requestHeaders(false, fullDuplex, nil))
	c.send(requestBody([]byte("model=m&prompt=hi"), true))
	m := c.recv()
	ir := m.GetImmediateResponse()
	if ir.GetStatus().GetCode() != 400 || !strings.Contains(string(ir.GetBody()), `"error"`) {
		t.Fatalf("want 400 with an error body, got %v", m)
	}
}

// No endpoints known: 503.
func TestNoEndpoints(t *testing.T) {
	env := newEnv(t, nil)
	env.src.Set(nil)
	c := env.open(t)
	c.send(requestHeaders(true, fullDuplex, nil))
	if m := c.recv(); m.GetImmediateResponse().GetStatus().GetCode() != 503 {
		t.Fatalf("want 503, got %v", m)
	}
}

// Trailers end the body in FULL_DUPLEX_STREAMED: the last re-emitted
// chunk has no end_of_stream and a trailers answer follows.
func TestRequestTrailers(t *testing.T) {
	env := newEnv(t, nil)
	body := chatBody(false, "hi")
	c := env.open(t)
	c.send(requestHeaders(false, fullDuplex, nil))
	c.send(requestBody(body, false))
	c.send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
	destination(t, c.recv())
	m := c.recv()
	if sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr == nil || sr.GetEndOfStream() || !bytes.Equal(sr.GetBody(), body) {
		t.Fatalf("want the body without end_of_stream, got %v", m)
	}
	if m := c.recv(); m.GetRequestTrailers() == nil {
		t.Fatalf("want a trailers answer, got %v", m)
	}
}

// Without a tokenizer the pick is the least-loaded endpoint: requests in
// flight push the next one elsewhere; the same conversation goes to the
// same endpoint while loads tie.
func TestLeastLoadedFallback(t *testing.T) {
	env := newEnv(t, func(c *picker.Config) { c.Tokenizer = nil })
	body := chatBody(false, "first message of a conversation")
	seen := map[string]bool{}
	var open []*client
	for i := range 3 {
		c := env.open(t)
		dest, _ := c.sendRequest(body, 1<<20)
		primary, _, _ := strings.Cut(dest, ",")
		if seen[primary] {
			t.Fatalf("request %d went to %s, which already has one in flight (picks %v)", i, primary, seen)
		}
		seen[primary] = true
		open = append(open, c)
	}
	if env.obs.count("fallback/no_tokenizer") != 3 {
		t.Fatalf("picks %v", env.obs.picks)
	}
	for _, c := range open {
		if err := c.st.CloseSend(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the streams to end", func() bool { return env.pk.InflightTotal() == 0 })
	// Idle again: the same conversation, the same endpoint, every time.
	var first string
	for i := range 3 {
		c := env.open(t)
		dest, _ := c.sendRequest(chatBody(false, "first message of a conversation", "reply", fmt.Sprint("turn ", i)), 1<<20)
		_ = c.st.CloseSend()
		waitFor(t, "the stream to end", func() bool { return env.pk.InflightTotal() == 0 })
		if i == 0 {
			first = dest
		} else if dest != first {
			t.Fatalf("turn %d went to %q, turn 0 to %q", i, dest, first)
		}
	}
}

// A request that finds every tokenizer slot taken waits for one: a burst
// queues instead of being misrouted.
func TestTokenizerBurstWaits(t *testing.T) {
	block := make(chan struct{})
	env := newEnv(t, func(c *picker.Config) { c.MaxConcurrentTokenize = 1; c.TokenizeTimeout = time.Minute })
	env.tok.block = block
	c1 := env.open(t)
	c1.send(requestHeaders(false, fullDuplex, nil))
	c1.send(requestBody(chatBody(false, "one"), true))
	waitFor(t, "the first tokenization to start", func() bool { env.tok.mu.Lock(); defer env.tok.mu.Unlock(); return env.tok.calls == 1 })
	c2 := env.open(t)
	c2.send(requestHeaders(false, fullDuplex, nil))
	c2.send(requestBody(chatBody(false, "two"), true))
	time.Sleep(20 * time.Millisecond) // c2 is queued behind c1's slot
	env.tok.mu.Lock()
	calls := env.tok.calls
	env.tok.mu.Unlock()
	if calls != 1 {
		t.Fatalf("%d tokenizations started with one slot", calls)
	}
	close(block)
	destination(t, c1.recv())
	destination(t, c2.recv())
	if n := env.obs.count("fallback/tokenizer_busy"); n != 0 {
		t.Fatalf("%d busy fallbacks, picks %v", n, env.obs.picks)
	}
}

// A tokenizer that stays saturated for the whole timeout sheds to the
// fallback (counted).
func TestTokenizerBusy(t *testing.T) {
	block := make(chan struct{})
	env := newEnv(t, func(c *picker.Config) { c.MaxConcurrentTokenize = 1; c.TokenizeTimeout = 50 * time.Millisecond })
	env.tok.block, env.tok.stubborn = block, true
	c1 := env.open(t)
	c1.send(requestHeaders(false, fullDuplex, nil))
	c1.send(requestBody(chatBody(false, "one"), true))
	waitFor(t, "the first tokenization to start", func() bool { env.tok.mu.Lock(); defer env.tok.mu.Unlock(); return env.tok.calls == 1 })
	c2 := env.open(t)
	c2.sendRequest(chatBody(false, "two"), 1<<20)
	if env.obs.count("fallback/tokenizer_busy") != 1 {
		t.Fatalf("picks %v", env.obs.picks)
	}
	close(block)
	destination(t, c1.recv())
}

// The gateway retried on a fallback: the served endpoint takes over the
// in-flight count and the prediction compared is the served one's.
func TestServedFallback(t *testing.T) {
	env := newEnv(t, nil)
	body := chatBody(true, strings.Repeat("system prompt ", 10), "q")
	env.holds(t, "pod-a", tokensOfBody(t, body))
	c := env.open(t)
	dest, _ := c.sendRequest(body, 1<<20)
	parts := strings.Split(dest, ",")
	if parts[0] != "10.0.0.1:8000" {
		t.Fatalf("destination %q", dest)
	}
	c.send(responseHeaders(servedMD(parts[1]), false, "text/event-stream"))
	c.recv()
	if got := env.pk.InflightTotal(); got != 1 {
		t.Fatalf("in flight %d", got)
	}
	var onServed int64
	env.pk.Inflight(func(ep endpoints.Endpoint, n int64) {
		if ep.Address == parts[1] {
			onServed = n
		}
	})
	if onServed != 1 {
		t.Fatalf("the count did not move to the served endpoint %s", parts[1])
	}
	c.send(responseBody([]byte(sseEvents(100, 0)[2]), true, nil))
	c.recv()
	waitFor(t, "the request to end", func() bool { return env.pk.InflightTotal() == 0 })
	env.obs.mu.Lock()
	defer env.obs.mu.Unlock()
	if len(env.obs.delivered) != 1 || env.obs.delivered[0].predicted != 0 {
		t.Fatalf("delivered %v: the served fallback had no predicted prefix", env.obs.delivered)
	}
	if !env.fb.balanced() || env.fb.started["pod-a"] != 1 || env.fb.finished["pod-a"] != 1 {
		t.Fatalf("feedback started %v finished %v", env.fb.started, env.fb.finished)
	}
}

// A stream that breaks mid-response (the client went away) still ends
// the request's count: nothing leaks, whichever phase it broke in.
func TestBrokenStreamReleases(t *testing.T) {
	env := newEnv(t, nil)
	for _, phase := range []string{"after-pick", "mid-response"} {
		ctx, cancel := context.WithCancel(tctx(t))
		c := env.openCtx(t, ctx)
		c.sendRequest(chatBody(true, "hello "+phase), 1<<20)
		if phase == "mid-response" {
			c.send(responseHeaders(nil, false, "text/event-stream"))
			c.recv()
			c.send(responseBody([]byte(sseEvents(1, 0)[0]), false, nil))
			c.recv()
		}
		if env.pk.InflightTotal() != 1 {
			t.Fatalf("%s: in flight %d", phase, env.pk.InflightTotal())
		}
		cancel()
		waitFor(t, phase+": the count to return to 0", func() bool { return env.pk.InflightTotal() == 0 && env.pk.StreamsOpen() == 0 })
	}
	if !env.fb.balanced() {
		t.Fatalf("feedback started %v finished %v", env.fb.started, env.fb.finished)
	}
}

// Older Envoy sends header values in value, not raw_value.
func TestHeaderValueField(t *testing.T) {
	env := newEnv(t, nil)
	c := env.open(t)
	m := requestHeaders(false, fullDuplex, nil)
	for _, h := range m.GetRequestHeaders().GetHeaders().GetHeaders() {
		h.Value, h.RawValue = string(h.RawValue), nil
	}
	c.send(m)
	c.send(requestBody([]byte(`{"model":"m","prompt":"once upon a time"}`), true))
	destination(t, c.recv())
	c.recv()
	// A prompt body sent to the chat path is unrecognized; with the path
	// unread it would have been taken for a completion.
	if env.obs.count("fallback/unrecognized") != 1 {
		t.Fatalf("picks %v: the path was not read from value", env.obs.picks)
	}
}
