package picker

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferencecache/inferencecache/picker/endpoints"
)

// Phases of one stream (one HTTP request).
const (
	phaseHeaders  uint8 = iota // waiting for the request headers
	phaseBody                  // headers seen, buffering the body to its end
	phaseRouted                // the headers were answered; request body may still pass
	phaseResponse              // response headers seen
	phaseDone                  // the response ended
)

// maxRetainedBody bounds the body buffer a pooled stream keeps.
const maxRetainedBody = 1 << 20

// stream is the state of one ext_proc stream. Only the stream's own
// goroutine touches it; streams are pooled.
type stream struct {
	p   *Picker
	ctx context.Context
	srv extprocv3.ExternalProcessor_ProcessServer
	in  extprocv3.ProcessingRequest

	// Body modes, from the first message's protocol_config (or the
	// defaults of the configuration we ship: FULL_DUPLEX_STREAMED both
	// ways).
	reqMode, respMode filterv3.ProcessingMode_BodySendMode
	bodyEarly         bool // STREAMED with send_body_without_waiting_for_header_response
	first             bool // no message received yet

	phase     uint8
	path      string
	hasSubset bool
	subset    []string
	body      []byte
	chunks    int // request body messages received while buffering

	d *decision

	// routed is the endpoint the in-flight count and Feedback count the
	// request on; counted says they do.
	routed  endpoints.Endpoint
	counted bool
	served  string
	usage   usageScanner

	out *outMessages
}

// Process implements the ExternalProcessor service: one stream is one
// HTTP request (docs/gateway.md). It returns nil when the gateway ends the
// stream, or after an ImmediateResponse; a request's in-flight count is
// released however the stream ends.
func (p *Picker) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	p.streams.Add(1)
	defer p.streams.Add(-1)
	s := p.getStream(srv)
	defer p.putStream(s)
	defer s.release()
	return s.run()
}

var streamPool = sync.Pool{New: func() any { return &stream{d: new(decision), out: new(outMessages)} }}

func (p *Picker) getStream(srv extprocv3.ExternalProcessor_ProcessServer) *stream {
	s := streamPool.Get().(*stream)
	s.p, s.srv, s.ctx = p, srv, srv.Context()
	s.reqMode, s.respMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	s.first = true
	return s
}

func (p *Picker) putStream(s *stream) {
	body := s.body[:0]
	if cap(body) > maxRetainedBody {
		body = nil
	}
	d, out := s.d, s.out
	d.reset()
	s.usage.reset()
	s.in.Reset()
	s.p, s.ctx, s.srv = nil, nil, nil
	s.phase, s.path, s.hasSubset, s.subset, s.body, s.chunks = phaseHeaders, "", false, s.subset[:0], body, 0
	s.routed, s.counted, s.served = endpoints.Endpoint{}, false, ""
	s.d, s.out = d, out
	streamPool.Put(s)
}

// run is the stream's receive loop.
func (s *stream) run() error {
	for {
		if err := s.srv.RecvMsg(&s.in); err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || s.ctx.Err() != nil {
				return nil
			}
			return err
		}
		if s.first {
			s.first = false
			if pc := s.in.GetProtocolConfig(); pc != nil {
				s.reqMode, s.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
				s.bodyEarly = pc.GetSendBodyWithoutWaitingForHeaderResponse()
			}
		}
		if s.in.GetObservabilityMode() {
			// Observability mode ignores every answer; the picker cannot
			// route in it. Nothing to send.
			continue
		}
		var done bool
		var err error
		switch m := s.in.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			done, err = s.onRequestHeaders(m.RequestHeaders)
		case *extprocv3.ProcessingRequest_RequestBody:
			done, err = s.onRequestBody(m.RequestBody)
		case *extprocv3.ProcessingRequest_RequestTrailers:
			done, err = s.onRequestTrailers()
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			err = s.onResponseHeaders(m.ResponseHeaders)
		case *extprocv3.ProcessingRequest_ResponseBody:
			err = s.onResponseBody(m.ResponseBody)
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			err = s.onResponseTrailers()
		default:
			// A message carrying only flow-control fields: nothing to answer.
		}
		if err != nil || done {
			return err
		}
	}
}

func errUnexpected(what string) error {
	return status.Errorf(codes.FailedPrecondition, "picker: unexpected %s in this phase of the stream", what)
}

// canReadBody reports whether the gateway sends the body before the
// headers are answered, so the decision can wait for it.
func (s *stream) canReadBody() bool {
	return s.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED ||
		(s.reqMode == filterv3.ProcessingMode_STREAMED && s.bodyEarly)
}

func (s *stream) onRequestHeaders(h *extprocv3.HttpHeaders) (bool, error) {
	if s.phase != phaseHeaders {
		return false, errUnexpected("request headers")
	}
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == ":path" {
			s.path = headerValue(hv)
		}
		// A destination header the client sent is never read; the answer
		// overwrites it (OVERWRITE_IF_EXISTS_OR_ADD) on every path that
		// lets the request through.
	}
	s.readSubset()
	switch {
	case h.GetEndOfStream():
		return s.route(false, ReasonNoBody, true)
	case !s.canReadBody():
		s.p.rateLimitedWarn("the gateway sends the request body only after the headers are answered (body mode neither FULL_DUPLEX_STREAMED nor STREAMED with send_body_without_waiting_for_header_response): picking without the body",
			"request_body_mode", s.reqMode.String())
		return s.route(false, ReasonBodyUnavailable, true)
	}
	s.phase = phaseBody
	return false, nil
}

func (s *stream) onRequestBody(b *extprocv3.HttpBody) (bool, error) {
	switch s.phase {
	case phaseBody:
	case phaseRouted:
		// The headers were answered before the body (body_unavailable):
		// let it through unchanged.
		return false, s.passRequestBody(b.GetBody(), b.GetEndOfStream())
	default:
		return false, errUnexpected("request body")
	}
	if len(s.body)+len(b.GetBody()) > s.p.maxBody {
		s.p.obs.Picked(Outcome413, ReasonBodyTooLarge, 0)
		return true, s.sendImmediate(413, ReasonBodyTooLarge, "request body exceeds the endpoint picker's limit")
	}
	s.body = append(s.body, b.GetBody()...)
	s.chunks++
	if b.GetEndOfStream() {
		return s.route(true, "", true)
	}
	return false, nil
}

func (s *stream) onRequestTrailers() (bool, error) {
	switch s.phase {
	case phaseBody:
		// Trailers end the body (FULL_DUPLEX_STREAMED without
		// end_of_stream on the last chunk).
		if done, err := s.route(true, "", false); done || err != nil {
			return done, err
		}
	case phaseRouted:
	default:
		return false, errUnexpected("request trailers")
	}
	return false, s.send(s.out.trailers(true))
}

// route decides, then answers: an ImmediateResponse (done), or the
// deferred headers response followed by the buffered body. reason, when
// set, is why there is no body to read; eos says whether the body ended
// with end_of_stream (false: trailers follow).
func (s *stream) route(haveBody bool, reason string, eos bool) (bool, error) {
	var body []byte
	if haveBody {
		body = s.body
	}
	imm := s.p.decide(s, body, reason)
	if imm != nil {
		return true, s.sendImmediate(imm.code, imm.reason, imm.msg)
	}
	s.start()
	if err := s.send(s.out.headers(s.d.dest, s.d.pd, s.d.prefill)); err != nil {
		return true, err
	}
	s.phase = phaseRouted
	if !haveBody {
		return false, nil
	}
	if s.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return false, s.sendChunks(true, s.body, eos)
	}
	for range s.chunks {
		if err := s.send(s.out.bodyContinue(true)); err != nil {
			return true, err
		}
	}
	return false, nil
}

// passRequestBody answers a request body message after the headers.
func (s *stream) passRequestBody(b []byte, eos bool) error {
	if s.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return s.sendChunks(true, b, eos)
	}
	return s.send(s.out.bodyContinue(true))
}

// sendChunks re-emits b as streamed body responses of at most ChunkBytes,
// end_of_stream on the last when eos (an empty b is one empty chunk).
func (s *stream) sendChunks(request bool, b []byte, eos bool) error {
	for {
		n := min(len(b), ChunkBytes)
		last := n == len(b)
		if err := s.send(s.out.bodyStreamed(request, b[:n], last && eos)); err != nil {
			return err
		}
		if last {
			return nil
		}
		b = b[n:]
	}
}

func (s *stream) onResponseHeaders(h *extprocv3.HttpHeaders) error {
	if s.phase != phaseRouted {
		return errUnexpected("response headers")
	}
	s.phase = phaseResponse
	s.readServed()
	if err := s.send(s.out.responseHeaders()); err != nil {
		return err
	}
	if h.GetEndOfStream() {
		s.finishResponse()
	}
	return nil
}

func (s *stream) onResponseBody(b *extprocv3.HttpBody) error {
	if s.phase != phaseResponse && s.phase != phaseDone {
		return errUnexpected("response body")
	}
	s.readServed()
	s.usage.write(b.GetBody())
	var err error
	if s.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		err = s.sendChunks(false, b.GetBody(), b.GetEndOfStream())
	} else {
		err = s.send(s.out.bodyContinue(false))
	}
	if b.GetEndOfStream() {
		s.finishResponse()
	}
	return err
}

func (s *stream) onResponseTrailers() error {
	if s.phase != phaseResponse && s.phase != phaseDone {
		return errUnexpected("response trailers")
	}
	err := s.send(s.out.trailers(false))
	s.finishResponse()
	return err
}

// start counts the request on its primary endpoint.
func (s *stream) start() {
	if s.counted || s.d.n == 0 {
		return
	}
	s.routed = s.d.cands[0].ep
	s.counted = true
	s.p.inflight.counter(s.routed.Address).Add(1)
	s.p.feedback.RequestStarted(s.d.tenant, s.d.model, s.routed.ReplicaID, s.p.now().UnixMicro())
}

// release ends the count of the request, once (response end, stream end).
func (s *stream) release() {
	if !s.counted {
		return
	}
	s.counted = false
	s.p.inflight.counter(s.routed.Address).Add(-1)
	s.p.feedback.RequestFinished(s.d.tenant, s.d.model, s.routed.ReplicaID, s.p.now().UnixMicro())
}

// readServed reads the served endpoint from the metadata once, and moves
// the request's count there when the gateway retried on a fallback.
func (s *stream) readServed() {
	if s.served != "" {
		return
	}
	v := s.in.GetMetadataContext().GetFilterMetadata()[MetadataNamespace].GetFields()[ServedKey]
	served := v.GetStringValue()
	if served == "" {
		return
	}
	s.served = served
	if !s.counted || served == s.routed.Address {
		return
	}
	pool := s.p.src.Pool()
	if pool == nil {
		return
	}
	if ep, ok := pool.ByAddress(canonicalAddr(served)); ok {
		s.release()
		s.routed, s.counted = ep, true
		s.p.inflight.counter(ep.Address).Add(1)
		s.p.feedback.RequestStarted(s.d.tenant, s.d.model, ep.ReplicaID, s.p.now().UnixMicro())
	}
}

// finishResponse records the usage and ends the request's count.
func (s *stream) finishResponse() {
	if s.phase == phaseDone {
		return
	}
	s.phase = phaseDone
	res := s.usage.result()
	s.p.obs.Usage(res)
	if res == UsageRead && s.d.n > 0 {
		served := s.routed.Address
		if s.served != "" {
			served = canonicalAddr(s.served)
		}
		s.p.obs.Delivered(s.d.model, s.usage.prompt, int64(s.d.matchedAt(served)), s.usage.cached)
	}
	s.release()
}

// readSubset reads the subset hint of the request headers message.
func (s *stream) readSubset() {
	st, ok := s.in.GetMetadataContext().GetFilterMetadata()[SubsetNamespace]
	if !ok {
		return
	}
	v, ok := st.GetFields()[SubsetKey]
	if !ok {
		return
	}
	s.hasSubset = true
	add := func(list string) {
		for part := range strings.SplitSeq(list, ",") {
			if part = strings.TrimSpace(part); part != "" {
				s.subset = append(s.subset, canonicalAddr(part))
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		add(k.StringValue)
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			add(e.GetStringValue())
		}
	}
}

// headerValue reads a header: current Envoy sends raw_value, older
// versions value.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

func (s *stream) send(m *extprocv3.ProcessingResponse) error {
	if err := s.srv.Send(m); err != nil {
		return err
	}
	return nil
}

// sendImmediate answers the request itself with an OpenAI-style error.
func (s *stream) sendImmediate(code int, reason, msg string) error {
	s.phase = phaseDone
	return s.send(s.out.immediate(code, reason, msg))
}

// immediateResponse is a decision to answer the request itself.
type immediateResponse struct {
	code   int
	reason string
	msg    string
}

// outMessages are a stream's reusable response messages. gRPC marshals a
// message within Send, so each is rewritten only after the previous Send
// returned (no stats handler on the picker's server keeps them).
type outMessages struct {
	resp extprocv3.ProcessingResponse

	reqHeaders extprocv3.ProcessingResponse_RequestHeaders
	hdrs       extprocv3.HeadersResponse
	hdrsCommon extprocv3.CommonResponse
	mut        extprocv3.HeaderMutation
	destOpt    corev3.HeaderValueOption
	destHV     corev3.HeaderValue
	prefOpt    corev3.HeaderValueOption
	prefHV     corev3.HeaderValue
	setHeaders [2]*corev3.HeaderValueOption
	removeHdrs [1]string
	md, mdLB   structpb.Struct

	respHeaders extprocv3.ProcessingResponse_ResponseHeaders
	respHdrs    extprocv3.HeadersResponse
	respCommon  extprocv3.CommonResponse

	reqBody       extprocv3.ProcessingResponse_RequestBody
	respBodyOneof extprocv3.ProcessingResponse_ResponseBody
	bodyResp      extprocv3.BodyResponse
	bodyCommon    extprocv3.CommonResponse
	bodyMut       extprocv3.BodyMutation
	streamedMut   extprocv3.BodyMutation_StreamedResponse
	streamed      extprocv3.StreamedBodyResponse
}

// headers is the deferred request headers answer: the destination header
// (overwriting any the client sent) and the same value in envoy.lb
// metadata, with the route cache cleared so the new destination counts.
// In a P/D pool (pd) it also sets PrefillHeader to prefill, or removes it
// when prefill is empty.
func (o *outMessages) headers(dest string, pd bool, prefill string) *extprocv3.ProcessingResponse {
	o.destHV.Key, o.destHV.RawValue, o.destHV.Value = DestinationHeader, append(o.destHV.RawValue[:0], dest...), ""
	o.destOpt.Header = &o.destHV
	o.destOpt.AppendAction = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
	o.setHeaders[0] = &o.destOpt
	o.mut.SetHeaders = o.setHeaders[:1]
	o.mut.RemoveHeaders = nil
	switch {
	case pd && prefill != "":
		o.prefHV.Key, o.prefHV.RawValue, o.prefHV.Value = PrefillHeader, append(o.prefHV.RawValue[:0], prefill...), ""
		o.prefOpt.Header = &o.prefHV
		o.prefOpt.AppendAction = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		o.setHeaders[1] = &o.prefOpt
		o.mut.SetHeaders = o.setHeaders[:2]
	case pd:
		o.removeHdrs[0] = PrefillHeader
		o.mut.RemoveHeaders = o.removeHdrs[:]
	}
	o.hdrsCommon.HeaderMutation = &o.mut
	o.hdrsCommon.ClearRouteCache = true
	o.hdrs.Response = &o.hdrsCommon
	o.reqHeaders.RequestHeaders = &o.hdrs
	if o.mdLB.Fields == nil {
		o.mdLB.Fields = make(map[string]*structpb.Value, 1)
		o.md.Fields = make(map[string]*structpb.Value, 1)
	}
	o.mdLB.Fields[DestinationHeader] = structpb.NewStringValue(dest)
	o.md.Fields[MetadataNamespace] = structpb.NewStructValue(&o.mdLB)
	o.resp.Response, o.resp.DynamicMetadata = &o.reqHeaders, &o.md
	return &o.resp
}

func (o *outMessages) responseHeaders() *extprocv3.ProcessingResponse {
	o.respHdrs.Response = &o.respCommon
	o.respHeaders.ResponseHeaders = &o.respHdrs
	o.resp.Response, o.resp.DynamicMetadata = &o.respHeaders, nil
	return &o.resp
}

// bodyContinue answers one body chunk unchanged (STREAMED mode).
func (o *outMessages) bodyContinue(request bool) *extprocv3.ProcessingResponse {
	o.bodyCommon.BodyMutation = nil
	return o.body(request)
}

// bodyStreamed answers with one streamed chunk (FULL_DUPLEX_STREAMED).
func (o *outMessages) bodyStreamed(request bool, b []byte, eos bool) *extprocv3.ProcessingResponse {
	o.streamed.Body, o.streamed.EndOfStream = b, eos
	o.streamedMut.StreamedResponse = &o.streamed
	o.bodyMut.Mutation = &o.streamedMut
	o.bodyCommon.BodyMutation = &o.bodyMut
	return o.body(request)
}

func (o *outMessages) body(request bool) *extprocv3.ProcessingResponse {
	o.bodyResp.Response = &o.bodyCommon
	if request {
		o.reqBody.RequestBody = &o.bodyResp
		o.resp.Response = &o.reqBody
	} else {
		o.respBodyOneof.ResponseBody = &o.bodyResp
		o.resp.Response = &o.respBodyOneof
	}
	o.resp.DynamicMetadata = nil
	return &o.resp
}

func (o *outMessages) trailers(request bool) *extprocv3.ProcessingResponse {
	if request {
		o.resp.Response = &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}
	} else {
		o.resp.Response = &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}
	}
	o.resp.DynamicMetadata = nil
	return &o.resp
}

// immediate is an ImmediateResponse with an OpenAI-style JSON error body;
// details names the reason for the gateway's access log.
func (o *outMessages) immediate(code int, reason, msg string) *extprocv3.ProcessingResponse {
	body := `{"error":{"message":"` + msg + `","type":"` + reason + `","code":` + itoa(code) + `}}`
	o.resp.Response = &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode(code)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
			Header:       &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}}},
		Body:    []byte(body),
		Details: "inferencecache_picker_" + reason,
	}}
	o.resp.DynamicMetadata = nil
	return &o.resp
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}
