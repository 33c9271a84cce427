package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferencecache/inferencecache/picker"
	"github.com/inferencecache/inferencecache/picker/request"
)

// gateway plays Envoy with the ext_proc filter we ship
// (operator/config/gateway/envoy-static.yaml): FULL_DUPLEX_STREAMED both
// ways, the request to the picker first, then upstream to the endpoint
// the picker chose (the destination header), the engine's response
// streamed through the picker with the served endpoint in the envoy.lb
// metadata, and what the picker passes on is what the client receives.
type gateway struct {
	ext  extprocv3.ExternalProcessorClient
	http *http.Client
	ids  atomic.Int64
}

// exchange is one HTTP request as the client and the gateway saw it.
type exchange struct {
	id     string
	dest   string // the primary endpoint
	answer string
	// usage the client read from the last SSE event.
	prompt, cached int
}

// bodyChunk is the size of the request body chunks the gateway sends
// (Envoy streams a body in buffer-sized pieces).
const bodyChunk = 16 << 10

func (g *gateway) do(ctx context.Context, body []byte) (*exchange, error) {
	st, err := g.ext.Process(ctx)
	if err != nil {
		return nil, err
	}
	x := &exchange{id: "demo-" + strconv.FormatInt(g.ids.Add(1), 10)}
	if err := st.Send(&extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(request.ChatPath)},
			{Key: ":authority", RawValue: []byte("gateway.demo")}, {Key: "content-type", RawValue: []byte("application/json")},
			{Key: "x-request-id", RawValue: []byte(x.id)},
		}}}},
	}); err != nil {
		return nil, err
	}
	for off := 0; off < len(body); off += bodyChunk {
		end := min(off+bodyChunk, len(body))
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}}); err != nil {
			return nil, err
		}
	}
	// The deferred headers answer: where to send the request.
	m, err := st.Recv()
	if err != nil {
		return nil, err
	}
	if ir := m.GetImmediateResponse(); ir != nil {
		return nil, fmt.Errorf("the picker answered %d: %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	var header string
	for _, o := range m.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if o.GetHeader().GetKey() == picker.DestinationHeader {
			header = string(o.GetHeader().GetRawValue())
		}
	}
	md := m.GetDynamicMetadata().GetFields()[picker.MetadataNamespace].GetStructValue().GetFields()[picker.DestinationHeader].GetStringValue()
	if header == "" || header != md {
		return nil, fmt.Errorf("destination header %q and envoy.lb metadata %q", header, md)
	}
	x.dest, _, _ = strings.Cut(header, ",")
	// The body as the picker passes it on: what goes upstream.
	var upstream []byte
	for {
		m, err := st.Recv()
		if err != nil {
			return nil, err
		}
		sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		upstream = append(upstream, sr.GetBody()...)
		if sr.GetEndOfStream() {
			break
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+x.dest+request.ChatPath, bytes.NewReader(upstream))
	if err != nil {
		return nil, err
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-request-id", x.id)
	resp, err := g.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", x.dest, err)
	}
	defer resp.Body.Close()
	served := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{picker.MetadataNamespace: {
		Fields: map[string]*structpb.Value{picker.ServedKey: structpb.NewStringValue(x.dest)}}}}
	if err := st.Send(&extprocv3.ProcessingRequest{MetadataContext: served, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte(strconv.Itoa(resp.StatusCode))}, {Key: "content-type", RawValue: []byte(resp.Header.Get("content-type"))},
		}}}}}); err != nil {
		return nil, err
	}
	if _, err := st.Recv(); err != nil {
		return nil, err
	}
	// The response body, streamed through the picker chunk by chunk as it
	// arrives; the client reads what the picker passes on.
	var client bytes.Buffer
	buf := make([]byte, 4096)
	for done := false; !done; {
		n, rerr := resp.Body.Read(buf)
		done = rerr != nil
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return nil, fmt.Errorf("upstream %s: %w", x.dest, rerr)
		}
		if n == 0 && !done {
			continue
		}
		if err := st.Send(&extprocv3.ProcessingRequest{MetadataContext: served, Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: append([]byte(nil), buf[:n]...), EndOfStream: done}}}); err != nil {
			return nil, err
		}
		m, err := st.Recv()
		if err != nil {
			return nil, err
		}
		client.Write(m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
	}
	if err := st.CloseSend(); err != nil {
		return nil, err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("the ext_proc stream did not end cleanly: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("upstream %s answered %d: %s", x.dest, resp.StatusCode, client.Bytes())
	}
	return x, x.readSSE(client.Bytes())
}

// readSSE reads the answer and the usage from a chat completion stream.
func (x *exchange) readSSE(b []byte) error {
	var answer strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(b))
	usage := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return fmt.Errorf("cannot read the response stream: %w", err)
		}
		for _, c := range ev.Choices {
			answer.WriteString(c.Delta.Content)
		}
		if ev.Usage != nil {
			usage = true
			x.prompt, x.cached = ev.Usage.PromptTokens, ev.Usage.PromptTokensDetails.CachedTokens
		}
	}
	if !usage {
		return errors.New("the response stream has no usage")
	}
	x.answer = answer.String()
	return nil
}
