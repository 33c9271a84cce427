package request

// The encoding/json implementation Parse replaced, kept verbatim (renamed)
// as the reference its one-pass reader must agree with on every input
// (TestParseMatchesReference, FuzzParseMatchesReference).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// body is the part of both APIs' bodies Parse reads.
type refBody struct {
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

// parseReference is Parse as it was with encoding/json: the behaviour Parse keeps.
//
// Old doc: Parse reads a request body sent to path. The kind comes from the path,
// or, on another path, from the body ("messages" is chat, "prompt" is
// completion). A body that is not a JSON object is ErrNotJSON; a JSON
// object without a usable model and messages or prompt is ErrUnrecognized
// (wrapped with the reason), and the Request then holds what could be read.
func parseReference(path string, b []byte) (*Request, error) {
	var in refBody
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
		case refPresent(in.Messages):
			r.Kind = KindChat
		case refPresent(in.Prompt):
			r.Kind = KindCompletion
		}
	}
	var errs []string
	if !refStringField(in.Model, &r.Model) || r.Model == "" {
		errs = append(errs, `"model" is not a non-empty string`)
	}
	if !refBoolField(in.Stream, &r.Stream) {
		errs = append(errs, `"stream" is not a boolean`)
	}
	if refPresent(in.StreamOptions) {
		var so struct {
			IncludeUsage json.RawMessage `json:"include_usage"`
		}
		if json.Unmarshal(in.StreamOptions, &so) != nil || !refBoolField(so.IncludeUsage, &r.IncludeUsage) {
			errs = append(errs, `"stream_options" is not an object with a boolean include_usage`)
		}
	}
	r.AddSpecialTokens = r.Kind == KindCompletion
	if !refBoolField(in.AddSpecialTokens, &r.AddSpecialTokens) {
		errs = append(errs, `"add_special_tokens" is not a boolean`)
	}
	switch r.Kind {
	case KindChat:
		if err := r.refParseChat(&in); err != nil {
			errs = append(errs, err.Error())
		}
	case KindCompletion:
		if err := r.refParsePrompt(in.Prompt); err != nil {
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

func (r *Request) refParseChat(in *refBody) error {
	var raw []json.RawMessage
	if !refPresent(in.Messages) || json.Unmarshal(in.Messages, &raw) != nil || len(raw) == 0 {
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
	if refPresent(in.Tools) {
		if in.Tools[0] != '[' {
			return errors.New(`"tools" is not an array`)
		}
		r.Tools = in.Tools
	}
	if !refBoolField(in.AddGenerationPrompt, &r.AddGenerationPrompt) {
		return errors.New(`"add_generation_prompt" is not a boolean`)
	}
	if !refBoolField(in.ContinueFinalMessage, &r.ContinueFinalMessage) {
		return errors.New(`"continue_final_message" is not a boolean`)
	}
	if refPresent(in.ChatTemplateKwargs) {
		if in.ChatTemplateKwargs[0] != '{' {
			return errors.New(`"chat_template_kwargs" is not an object`)
		}
		r.ChatTemplateKwargs = in.ChatTemplateKwargs
	}
	if refPresent(in.Documents) {
		if in.Documents[0] != '[' {
			return errors.New(`"documents" is not an array`)
		}
		r.Documents = in.Documents
	}
	if !refStringField(in.ReasoningEffort, &r.ReasoningEffort) {
		return errors.New(`"reasoning_effort" is not a string`)
	}
	return nil
}

// parsePrompt reads a completion prompt: a string, a list of strings, a
// list of token ids, or a list of token-id lists (the first of a batch).
func (r *Request) refParsePrompt(raw json.RawMessage) error {
	const bad = `"prompt" is not a string, a token-id array, or an array of those`
	if !refPresent(raw) {
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
		return r.refTokens(items[0])
	default:
		return r.refTokens(raw)
	}
}

func (r *Request) refTokens(raw json.RawMessage) error {
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
func refPresent(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// stringField sets *dst from a string field; absent or null leaves it.
func refStringField(raw json.RawMessage, dst *string) bool {
	if !refPresent(raw) {
		return true
	}
	return raw[0] == '"' && json.Unmarshal(raw, dst) == nil
}

// boolField sets *dst from a boolean field; absent or null leaves it.
func refBoolField(raw json.RawMessage, dst *bool) bool {
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
