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
	"strings"
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

// body is the part of both APIs' bodies Parse reads.
type body struct {
	Model                json.RawMessage `json:"model"`
	Messages             json.RawMessage `json:"messages"`
	Prompt               json.RawMessage `json:"prompt"`
	Tools                json.RawMessage `json:"tools"`
	Stream               json.RawMessage `json:"stream"`
	StreamOptions        json.RawMessage `json:"stream_options"`
	AddGenerationPrompt  json.RawMessage `json:"add_generation_prompt"`
	ContinueFinalMessage json.RawMessage `json:"continue_final_message"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	Documents            json.RawMessage `json:"documents"`
	ReasoningEffort      json.RawMessage `json:"reasoning_effort"`
	AddSpecialTokens     json.RawMessage `json:"add_special_tokens"`
}

// Parse reads a request body sent to path. The kind comes from the path,
// or, on another path, from the body ("messages" is chat, "prompt" is
// completion). A body that is not a JSON object is ErrNotJSON; a JSON
// object without a usable model and messages or prompt is ErrUnrecognized
// (wrapped with the reason), and the Request then holds what could be read.
func Parse(path string, b []byte) (*Request, error) {
	var in body
	trimmed := bytes.TrimSpace(b)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, ErrNotJSON
	}
	if err := json.Unmarshal(trimmed, &in); err != nil {
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) {
			return nil, ErrNotJSON
		}
		// Cannot happen with RawMessage fields; kept for safety.
		return nil, fmt.Errorf("%w: %v", ErrUnrecognized, err)
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
		var so struct {
			IncludeUsage json.RawMessage `json:"include_usage"`
		}
		if json.Unmarshal(in.StreamOptions, &so) != nil || !boolField(so.IncludeUsage, &r.IncludeUsage) {
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

func (r *Request) parseChat(in *body) error {
	var raw []json.RawMessage
	if !present(in.Messages) || json.Unmarshal(in.Messages, &raw) != nil || len(raw) == 0 {
		return errors.New(`"messages" is not a non-empty array`)
	}
	r.Messages = make([]Message, len(raw))
	for i, m := range raw {
		var head struct {
			Role string `json:"role"`
		}
		if len(m) == 0 || m[0] != '{' || json.Unmarshal(m, &head) != nil || head.Role == "" {
			return fmt.Errorf("message %d is not an object with a string role", i)
		}
		r.Messages[i] = Message{Role: head.Role, Raw: m}
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
		if json.Unmarshal(raw, &r.Prompt) != nil {
			return errors.New(bad)
		}
		return nil
	case '[':
	default:
		return errors.New(bad)
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || len(items) == 0 {
		return errors.New(bad)
	}
	switch items[0][0] {
	case '"':
		if json.Unmarshal(items[0], &r.Prompt) != nil {
			return errors.New(bad)
		}
		return nil
	case '[':
		return r.tokens(items[0])
	default:
		return r.tokens(raw)
	}
}

func (r *Request) tokens(raw json.RawMessage) error {
	var ids []float64
	if json.Unmarshal(raw, &ids) != nil {
		return errors.New(`"prompt" token ids are not numbers`)
	}
	r.PromptTokens = make([]uint32, len(ids))
	for i, f := range ids {
		if f < 0 || f > math.MaxUint32 || f != math.Trunc(f) {
			return fmt.Errorf(`"prompt" token id %v is not a uint32`, f)
		}
		r.PromptTokens[i] = uint32(f)
	}
	r.HasPromptTokens = true
	return nil
}

// present reports a field that is there and not null.
func present(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// stringField sets *dst from a string field; absent or null leaves it.
func stringField(raw json.RawMessage, dst *string) bool {
	if !present(raw) {
		return true
	}
	return raw[0] == '"' && json.Unmarshal(raw, dst) == nil
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
