// Package request reads what an OpenAI-compatible inference request asks
// for, from its HTTP path and JSON body: the model, the chat messages (or
// the completion prompt) and the streaming options. It does no I/O; the
// endpoint picker renders and tokenizes what it returns.
package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Kind is the API a request calls.
type Kind uint8

// Kinds.
const (
	// KindUnknown: neither API (the path and the body say neither).
	KindUnknown Kind = iota
	// KindChat is POST /v1/chat/completions.
	KindChat
	// KindCompletion is POST /v1/completions.
	KindCompletion
)

func (k Kind) String() string {
	switch k {
	case KindChat:
		return "chat"
	case KindCompletion:
		return "completion"
	}
	return "unknown"
}

// Request is what one inference request asks. Raw JSON fields alias the
// body passed to Parse; keep the body alive and unmodified while they are
// used.
type Request struct {
	Kind  Kind
	Model string
	// Stream is "stream": true; IncludeUsage is
	// "stream_options": {"include_usage": true}, which makes the engine
	// send usage in the last SSE chunk.
	Stream, IncludeUsage bool

	// Chat.
	Messages []Message
	// Tools is the "tools" array as sent, nil when absent or null.
	Tools json.RawMessage
	// AddGenerationPrompt is vLLM's "add_generation_prompt" (default
	// true); ContinueFinalMessage its "continue_final_message".
	AddGenerationPrompt, ContinueFinalMessage bool
	// ChatTemplateKwargs is vLLM's "chat_template_kwargs" object (for
	// example {"enable_thinking": false}), nil when absent.
	ChatTemplateKwargs json.RawMessage
	// Documents is vLLM's "documents" array (passed to the template), nil
	// when absent.
	Documents json.RawMessage
	// ReasoningEffort is "reasoning_effort" ("" when absent); vLLM passes
	// it to the template and turns enable_thinking on unless it is "none".
	ReasoningEffort string

	// AddSpecialTokens is vLLM's "add_special_tokens": whether the
	// tokenizer's post-processor adds its special tokens (a BOS) to the
	// prompt. vLLM's defaults: false for chat (the template writes them),
	// true for completion.
	AddSpecialTokens bool

	// Completion. A prompt is text (Prompt) or token ids (PromptTokens,
	// HasPromptTokens). A batch of prompts is routed by its first.
	Prompt          string
	PromptTokens    []uint32
	HasPromptTokens bool
}

// Message is one chat message.
type Message struct {
	// Role is "system", "user", "assistant", "tool", ...
	Role string
	// Raw is the message object as sent (content as a string or as
	// content parts, tool_calls, tool_call_id, name, ...).
	Raw json.RawMessage
}

// Errors of Parse. ErrNotJSON is the client's error (answer 400); a
// request that is JSON but ErrUnrecognized can still be sent somewhere.
var (
	ErrNotJSON      = errors.New("request: body is not a JSON object")
	ErrUnrecognized = errors.New("request: not an OpenAI chat or completion request")
)

// Paths of the two APIs.
const (
	ChatPath       = "/v1/chat/completions"
	CompletionPath = "/v1/completions"
)

// KindOfPath returns the API a path (with or without a query) names.
func KindOfPath(path string) Kind {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return KindChat
	case strings.HasSuffix(path, "/completions"):
		return KindCompletion
	}
	return KindUnknown
}

// body is the part of both APIs' bodies Parse reads. Each field is the
// raw value of the body's last member of that name, matched as
// encoding/json matches struct fields (exactly or under Unicode case
// folding), nil when absent.
type body struct {
	Model                json.RawMessage
	Messages             json.RawMessage
	Prompt               json.RawMessage
	Tools                json.RawMessage
	Stream               json.RawMessage
	StreamOptions        json.RawMessage
	AddGenerationPrompt  json.RawMessage
	ContinueFinalMessage json.RawMessage
	ChatTemplateKwargs   json.RawMessage
	Documents            json.RawMessage
	ReasoningEffort      json.RawMessage
	AddSpecialTokens     json.RawMessage

	// msgs are the elements of Messages when it is an array, read in the
	// same pass; badMsg is the first that is not an object with a
	// non-empty string role, -1 when none.
	msgs   []Message
	badMsg int
}

// field returns the member of in that key names, nil for none.
func (in *body) field(b []byte, ks, ke int, plain bool) *json.RawMessage {
	// Dispatch on the first letter, folded: at most three names share one.
	if ke-ks < 3 {
		return nil
	}
	if b[ks+1] == '\\' {
		// An escaped first letter: try every name.
		for _, f := range in.fields() {
			if keyIs(b, ks, ke, plain, f.name) {
				return f.dst
			}
		}
		return nil
	}
	c := b[ks+1] | 0x20 // ASCII letters folded; other bytes try every name
	for _, f := range in.fields() {
		if (f.name[0] == c || c >= utf8.RuneSelf) && keyIs(b, ks, ke, plain, f.name) {
			return f.dst
		}
	}
	return nil
}

type namedField struct {
	name string
	dst  *json.RawMessage
}

func (in *body) fields() [12]namedField {
	return [12]namedField{
		{"model", &in.Model}, {"messages", &in.Messages}, {"prompt", &in.Prompt}, {"tools", &in.Tools},
		{"stream", &in.Stream}, {"stream_options", &in.StreamOptions}, {"add_generation_prompt", &in.AddGenerationPrompt},
		{"continue_final_message", &in.ContinueFinalMessage}, {"chat_template_kwargs", &in.ChatTemplateKwargs},
		{"documents", &in.Documents}, {"reasoning_effort", &in.ReasoningEffort}, {"add_special_tokens", &in.AddSpecialTokens},
	}
}

// scanBody validates the whole body as encoding/json does and reads its
// members into in, in one pass (the messages' roles included). false: not
// valid JSON.
func scanBody(b []byte, in *body) bool {
	s := &scanner{b: b}
	in.badMsg = -1
	ok := s.object(func(ks, ke int, plain bool) bool {
		dst := in.field(b, ks, ke, plain)
		start := s.i
		if dst == &in.Messages {
			in.msgs, in.badMsg = in.msgs[:0], -1
			if s.i < len(b) && b[s.i] == '[' {
				if !s.messages(in) {
					return false
				}
			} else if !s.skip() {
				return false
			}
		} else if !s.skip() {
			return false
		}
		if dst != nil {
			*dst = b[start:s.i]
		}
		return true
	})
	if !ok {
		return false
	}
	s.ws()
	return s.i == len(b)
}

// messages scans the messages array at s.i into in.msgs.
func (s *scanner) messages(in *body) bool {
	return s.array(func(n int) bool {
		start := s.i
		role, good := "", false
		if s.i < len(s.b) && s.b[s.i] == '{' {
			good = true
			ok := s.object(func(ks, ke int, plain bool) bool {
				if !keyIs(s.b, ks, ke, plain, "role") {
					return s.skip()
				}
				switch {
				case s.i < len(s.b) && s.b[s.i] == '"':
					vs := s.i
					plain, ok := s.str()
					if !ok {
						return false
					}
					role = roleString(s.b[vs:s.i], plain)
				case s.literal("null"):
					// encoding/json leaves a string field as it was on null.
				default:
					good = false
					return s.skip()
				}
				return true
			})
			if !ok {
				return false
			}
		} else if !s.skip() {
			return false
		}
		if (!good || role == "") && in.badMsg < 0 {
			in.badMsg = n
		}
		in.msgs = append(in.msgs, Message{Role: role, Raw: s.b[start:s.i]})
		return true
	})
}

// roleString decodes a role, without allocating for the usual ones.
func roleString(raw []byte, plain bool) string {
	if plain {
		switch string(raw[1 : len(raw)-1]) {
		case "system":
			return "system"
		case "user":
			return "user"
		case "assistant":
			return "assistant"
		case "tool":
			return "tool"
		case "developer":
			return "developer"
		}
	}
	return stringValue(raw, plain)
}

// Parse reads a request body sent to path. The kind comes from the path,
// or, on another path, from the body ("messages" is chat, "prompt" is
// completion). A body that is not a JSON object is ErrNotJSON; a JSON
// object without a usable model and messages or prompt is ErrUnrecognized
// (wrapped with the reason), and the Request then holds what could be read.
//
// It reads the body in one pass, validating it as encoding/json does and
// reading the values as encoding/json would decode them into the
// documented fields (member names matched exactly or under case folding,
// the last of a name winning).
func Parse(path string, b []byte) (*Request, error) {
	var in body
	trimmed := bytes.TrimSpace(b)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, ErrNotJSON
	}
	if !scanBody(trimmed, &in) {
		return nil, ErrNotJSON
	}
	r := &Request{Kind: KindOfPath(path), AddGenerationPrompt: true}
	if r.Kind == KindUnknown {
		switch {
		case present(in.Messages):
			r.Kind = KindChat
		case present(in.Prompt):
			r.Kind = KindCompletion
		}
	}
	var errs []string
	if !stringField(in.Model, &r.Model) || r.Model == "" {
		errs = append(errs, `"model" is not a non-empty string`)
	}
	if !boolField(in.Stream, &r.Stream) {
		errs = append(errs, `"stream" is not a boolean`)
	}
	if present(in.StreamOptions) {
		iu, ok := member(in.StreamOptions, "include_usage")
		if !ok || !boolField(iu, &r.IncludeUsage) {
			errs = append(errs, `"stream_options" is not an object with a boolean include_usage`)
		}
	}
	r.AddSpecialTokens = r.Kind == KindCompletion
	if !boolField(in.AddSpecialTokens, &r.AddSpecialTokens) {
		errs = append(errs, `"add_special_tokens" is not a boolean`)
	}
	switch r.Kind {
	case KindChat:
		if err := r.parseChat(&in); err != nil {
			errs = append(errs, err.Error())
		}
	case KindCompletion:
		if err := r.parsePrompt(in.Prompt); err != nil {
			errs = append(errs, err.Error())
		}
	default:
		errs = append(errs, "neither a chat nor a completion path, and no messages or prompt")
	}
	if len(errs) > 0 {
		return r, fmt.Errorf("%w: %s", ErrUnrecognized, strings.Join(errs, "; "))
	}
	return r, nil
}

// member returns the value of the last member of the valid JSON value raw
// that name names; ok is false when raw is not an object (what decoding
// it into a struct refuses).
func member(raw []byte, name string) (v json.RawMessage, ok bool) {
	if raw[0] != '{' {
		return nil, false
	}
	s := &scanner{b: raw}
	s.object(func(ks, ke int, plain bool) bool {
		start := s.i
		if !s.skip() {
			return false
		}
		if keyIs(raw, ks, ke, plain, name) {
			v = raw[start:s.i]
		}
		return true
	})
	return v, true
}

func (r *Request) parseChat(in *body) error {
	if !present(in.Messages) || in.Messages[0] != '[' || len(in.msgs) == 0 {
		return errors.New(`"messages" is not a non-empty array`)
	}
	r.Messages = in.msgs
	if i := in.badMsg; i >= 0 {
		clear(r.Messages[i:])
		return fmt.Errorf("message %d is not an object with a string role", i)
	}
	if present(in.Tools) {
		if in.Tools[0] != '[' {
			return errors.New(`"tools" is not an array`)
		}
		r.Tools = in.Tools
	}
	if !boolField(in.AddGenerationPrompt, &r.AddGenerationPrompt) {
		return errors.New(`"add_generation_prompt" is not a boolean`)
	}
	if !boolField(in.ContinueFinalMessage, &r.ContinueFinalMessage) {
		return errors.New(`"continue_final_message" is not a boolean`)
	}
	if present(in.ChatTemplateKwargs) {
		if in.ChatTemplateKwargs[0] != '{' {
			return errors.New(`"chat_template_kwargs" is not an object`)
		}
		r.ChatTemplateKwargs = in.ChatTemplateKwargs
	}
	if present(in.Documents) {
		if in.Documents[0] != '[' {
			return errors.New(`"documents" is not an array`)
		}
		r.Documents = in.Documents
	}
	if !stringField(in.ReasoningEffort, &r.ReasoningEffort) {
		return errors.New(`"reasoning_effort" is not a string`)
	}
	return nil
}

// parsePrompt reads a completion prompt: a string, a list of strings, a
// list of token ids, or a list of token-id lists (the first of a batch).
func (r *Request) parsePrompt(raw json.RawMessage) error {
	const bad = `"prompt" is not a string, a token-id array, or an array of those`
	if !present(raw) {
		return errors.New(`"prompt" is missing`)
	}
	switch raw[0] {
	case '"':
		r.Prompt = unquote(raw)
		return nil
	case '[':
	default:
		return errors.New(bad)
	}
	s := &scanner{b: raw, i: 1}
	s.ws()
	if raw[s.i] == ']' {
		return errors.New(bad)
	}
	start := s.i
	s.skip()
	first := raw[start:s.i]
	switch first[0] {
	case '"':
		r.Prompt = unquote(first)
		return nil
	case '[':
		return r.tokens(first)
	default:
		return r.tokens(raw)
	}
}

// tokens reads the token-id array raw as encoding/json decodes it into
// []float64 (a null element is 0; any other non-number fails the whole
// array), then checks each id is a uint32.
func (r *Request) tokens(raw json.RawMessage) error {
	ids := make([]uint32, 0, len(raw)/4+1)
	typeErr, badAt := false, -1
	var badID float64
	s := &scanner{b: raw}
	s.array(func(int) bool {
		start := s.i
		var f float64
		switch c := raw[s.i]; {
		case c == '-' || isDigit(c):
			s.number()
			var ok bool
			if f, ok = parseNumber(raw[start:s.i]); !ok {
				typeErr = true
			}
		case s.literal("null"):
		default:
			typeErr = true
			s.skip()
		}
		if badAt < 0 && (f < 0 || f > math.MaxUint32 || f != math.Trunc(f)) {
			badAt, badID = len(ids), f
		}
		ids = append(ids, uint32(f))
		return true
	})
	if typeErr {
		return errors.New(`"prompt" token ids are not numbers`)
	}
	r.PromptTokens = ids
	if badAt >= 0 {
		clear(ids[badAt:])
		return fmt.Errorf(`"prompt" token id %v is not a uint32`, badID)
	}
	r.HasPromptTokens = true
	return nil
}

// parseNumber is a valid JSON number's float64 value, as encoding/json
// reads it (false: out of range).
func parseNumber(lit []byte) (float64, bool) {
	if len(lit) <= 10 {
		var u uint64
		digits := true
		for _, c := range lit {
			if !isDigit(c) {
				digits = false
				break
			}
			u = u*10 + uint64(c-'0')
		}
		if digits {
			return float64(u), true
		}
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	return f, err == nil
}

// unquote decodes the valid JSON string raw (quotes included).
func unquote(raw []byte) string {
	inner := raw[1 : len(raw)-1]
	return stringValue(raw, bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner))
}

// present reports a field that is there and not null.
func present(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// stringField sets *dst from a string field; absent or null leaves it.
func stringField(raw json.RawMessage, dst *string) bool {
	if !present(raw) {
		return true
	}
	if raw[0] != '"' {
		return false
	}
	*dst = unquote(raw)
	return true
}

// boolField sets *dst from a boolean field; absent or null leaves it.
func boolField(raw json.RawMessage, dst *bool) bool {
	switch string(raw) {
	case "", "null":
		return true
	case "true":
		*dst = true
		return true
	case "false":
		*dst = false
		return true
	}
	return false
}
