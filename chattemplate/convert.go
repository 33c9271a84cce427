package chattemplate

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// textPartTypes are the content part types vLLM turns into text, with the
// field holding the text.
var textPartTypes = map[string]string{
	"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking",
}

// mediaPartTypes are the part types the engine's multimodal processor
// expands (not representable as template text here).
var mediaPartTypes = map[string]bool{
	"image_url": true, "input_image": true, "image_embeds": true, "audio_embeds": true, "prompt_embeds": true,
	"image_pil": true, "audio_url": true, "input_audio": true, "video_url": true,
}

// ConvertMessage turns one request message (a JSON object) into the
// template value vLLM builds for it (_parse_chat_message_content and
// _postprocess_messages), for the given content format:
//
//   - content null, a string, or a list of parts; text parts ("text",
//     "input_text", "output_text", "refusal", "thinking", and plain
//     strings) become one string joined with "\n" (empty ones dropped) in
//     the string format, or fresh {"type": "text", "text": ...} parts in the
//     openai format; "tool_reference" parts become their name (string) or
//     {"type": "tool_reference", "name": ...};
//   - assistant: tool_calls (when not null) with each function's arguments
//     string parsed as JSON ({} when it is not JSON; an empty list is
//     dropped); "reasoning" (or the deprecated "reasoning_content") as both
//     reasoning and reasoning_content;
//   - tool: tool_call_id, and a content list of text parts only joined into
//     one string;
//   - name and task when strings; developer: tools.
//
// Keys come in vLLM's order (role, content, then the others). Media parts
// are ErrUnsupportedContent; shapes the engine refuses are ErrInvalidChat.
func ConvertMessage(raw json.RawMessage, format ContentFormat) (jinja.Value, error) {
	if format == FormatString {
		if v, ok := convertSimple(raw); ok {
			return v, nil
		}
	}
	return convertGeneral(raw, format)
}

// convertGeneral is ConvertMessage for every message.
func convertGeneral(raw json.RawMessage, format ContentFormat) (jinja.Value, error) {
	v, err := decodeJSON(raw)
	if err != nil {
		return jinja.Undefined(), err
	}
	if !v.IsDict() {
		return jinja.Undefined(), fmt.Errorf("%w: a message is not an object", ErrInvalidChat)
	}
	in := v.AsDict()
	role, ok := in.Get("role")
	if !ok || !role.IsString() {
		return jinja.Undefined(), fmt.Errorf("%w: a message has no string role", ErrInvalidChat)
	}
	r := role.AsString()
	out := jinja.NewDict()
	o := out.AsDict()
	o.Set("role", role)
	content, err := convertContent(in, format)
	if err != nil {
		return jinja.Undefined(), err
	}
	o.Set("content", content)
	switch r {
	case "assistant":
		if tc, ok := in.Get("tool_calls"); ok && !tc.IsNone() {
			calls, err := convertToolCalls(tc)
			if err != nil {
				return jinja.Undefined(), err
			}
			if calls.AsList().Len() > 0 {
				o.Set("tool_calls", calls)
			}
		}
		reasoning, ok := in.Get("reasoning")
		if !ok || reasoning.IsNone() {
			// The request validator renames the deprecated field.
			reasoning, ok = in.Get("reasoning_content")
		}
		if ok && !reasoning.IsNone() {
			o.Set("reasoning", reasoning)
			o.Set("reasoning_content", reasoning)
		}
	case "tool":
		if id, ok := in.Get("tool_call_id"); ok {
			o.Set("tool_call_id", id)
		}
		if content.IsList() {
			allText := true
			var texts []string
			for _, p := range content.AsList().Items {
				typ, _ := p.AsDict().Get("type")
				if !typ.IsString() || typ.AsString() != "text" {
					allText = false
					break
				}
				txt, _ := p.AsDict().Get("text")
				texts = append(texts, pyStr(txt))
			}
			if allText {
				o.Set("content", jinja.NewString(strings.Join(texts, "\n")))
			}
		}
	}
	if name, ok := in.Get("name"); ok && name.IsString() {
		o.Set("name", name)
	}
	if task, ok := in.Get("task"); ok && task.IsString() {
		o.Set("task", task)
	}
	if r == "developer" {
		tools, ok := in.Get("tools")
		if !ok {
			tools = jinja.None()
		}
		o.Set("tools", tools)
	}
	return out, nil
}

func convertContent(in *jinja.Dict, format ContentFormat) (jinja.Value, error) {
	content, ok := in.Get("content")
	var parts []jinja.Value
	switch {
	case !ok || content.IsNone():
	case content.IsString():
		parts = []jinja.Value{content}
	case content.IsList():
		parts = content.AsList().Items
	default:
		return jinja.Undefined(), fmt.Errorf("%w: content is neither a string, a list of parts nor null", ErrInvalidChat)
	}
	var texts []string
	var out []jinja.Value
	for _, p := range parts {
		if p.IsString() {
			texts = append(texts, p.AsString())
			out = append(out, textPart(p))
			continue
		}
		if !p.IsDict() {
			return jinja.Undefined(), fmt.Errorf("%w: a content part is not an object", ErrInvalidChat)
		}
		d := p.AsDict()
		typ, _ := d.Get("type")
		uuid, hasUUID := d.Get("uuid")
		hasUUID = hasUUID && !uuid.IsNone()
		if typ.IsUndefined() || typ.IsNone() || hasUUID {
			for k := range mediaPartTypes {
				if d.Has(k) {
					return jinja.Undefined(), fmt.Errorf("%w: %q", ErrUnsupportedContent, k)
				}
			}
			if d.Has("tool_reference") && !hasUUID {
				return jinja.Undefined(), fmt.Errorf("%w: a tool_reference part without type", ErrUnsupportedContent)
			}
			if !hasUUID {
				return jinja.Undefined(), fmt.Errorf("%w: a content part without type", ErrInvalidChat)
			}
		}
		if !typ.IsString() {
			return jinja.Undefined(), fmt.Errorf("%w: a content part type is not a string", ErrInvalidChat)
		}
		t := typ.AsString()
		if field, ok := textPartTypes[t]; ok {
			txt, ok := d.Get(field)
			if !ok || txt.IsNone() {
				continue // vLLM skips a text part without text
			}
			if !txt.IsString() {
				return jinja.Undefined(), fmt.Errorf("%w: a %s part's %s is not a string", ErrInvalidChat, t, field)
			}
			texts = append(texts, txt.AsString())
			out = append(out, textPart(txt))
			continue
		}
		if t == "tool_reference" {
			name, _ := d.Get("name")
			if name.IsString() {
				texts = append(texts, name.AsString())
			}
			ref := jinja.NewDict()
			ref.AsDict().Set("type", jinja.NewString("tool_reference"))
			ref.AsDict().Set("name", name)
			out = append(out, ref)
			continue
		}
		if mediaPartTypes[t] {
			return jinja.Undefined(), fmt.Errorf("%w: %q", ErrUnsupportedContent, t)
		}
		return jinja.Undefined(), fmt.Errorf("%w: content part type %q", ErrInvalidChat, t)
	}
	if format == FormatOpenAI {
		if out == nil {
			out = []jinja.Value{}
		}
		return jinja.NewList(out), nil
	}
	// Python joins the truthy parts: empty strings are dropped.
	kept := texts[:0]
	for _, s := range texts {
		if s != "" {
			kept = append(kept, s)
		}
	}
	return jinja.NewString(strings.Join(kept, "\n")), nil
}

func textPart(text jinja.Value) jinja.Value {
	p := jinja.NewDict()
	p.AsDict().Set("type", jinja.NewString("text"))
	p.AsDict().Set("text", text)
	return p
}

// convertToolCalls rebuilds each tool call as the request's validation
// leaves it ({"id", "function": {"arguments", "name"}, "type"}, the field
// order of the OpenAI types, other keys dropped) with arguments parsed.
func convertToolCalls(tc jinja.Value) (jinja.Value, error) {
	if !tc.IsList() {
		return jinja.Undefined(), fmt.Errorf("%w: tool_calls is not a list", ErrInvalidChat)
	}
	calls := make([]jinja.Value, 0, tc.AsList().Len())
	for _, c := range tc.AsList().Items {
		if !c.IsDict() {
			return jinja.Undefined(), fmt.Errorf("%w: a tool call is not an object", ErrInvalidChat)
		}
		cd := c.AsDict()
		fn, ok := cd.Get("function")
		if !ok || !fn.IsDict() {
			return jinja.Undefined(), fmt.Errorf("%w: a tool call has no function", ErrInvalidChat)
		}
		name, _ := fn.AsDict().Get("name")
		args, _ := fn.AsDict().Get("arguments")
		if !name.IsString() || !args.IsString() {
			return jinja.Undefined(), fmt.Errorf("%w: a tool call's function needs string name and arguments", ErrInvalidChat)
		}
		parsed, err := decodeJSON([]byte(args.AsString()))
		if err != nil {
			parsed = jinja.NewDict() // Python's json.loads failed: {}
		}
		f := jinja.NewDict()
		f.AsDict().Set("arguments", parsed)
		f.AsDict().Set("name", name)
		call := jinja.NewDict()
		for _, k := range []string{"id", "function", "type"} {
			switch k {
			case "function":
				call.AsDict().Set("function", f)
			default:
				if v, ok := cd.Get(k); ok {
					call.AsDict().Set(k, v)
				}
			}
		}
		calls = append(calls, call)
	}
	return jinja.NewList(calls), nil
}

// convertTools is vLLM's [tool.model_dump() for tool in request.tools]:
// {"type", "function": {"name", "description", "parameters", extra
// function keys}, extra tool keys}, with description and parameters null
// when absent.
func convertTools(raw json.RawMessage) (jinja.Value, error) {
	v, err := decodeJSON(raw)
	if err != nil {
		return jinja.Undefined(), fmt.Errorf("%w: tools: %v", ErrInvalidChat, err)
	}
	if !v.IsList() {
		return jinja.Undefined(), fmt.Errorf("%w: tools is not a list", ErrInvalidChat)
	}
	out := make([]jinja.Value, 0, v.AsList().Len())
	for _, t := range v.AsList().Items {
		if !t.IsDict() {
			return jinja.Undefined(), fmt.Errorf("%w: a tool is not an object", ErrInvalidChat)
		}
		td := t.AsDict()
		typ, ok := td.Get("type")
		if !ok {
			typ = jinja.NewString("function")
		}
		if !typ.IsString() || typ.AsString() != "function" {
			return jinja.Undefined(), fmt.Errorf("%w: a tool's type is not \"function\"", ErrInvalidChat)
		}
		fn, ok := td.Get("function")
		if !ok || !fn.IsDict() {
			return jinja.Undefined(), fmt.Errorf("%w: a tool has no function object", ErrInvalidChat)
		}
		fd := fn.AsDict()
		name, _ := fd.Get("name")
		if !name.IsString() {
			return jinja.Undefined(), fmt.Errorf("%w: a tool function has no string name", ErrInvalidChat)
		}
		f := jinja.NewDict()
		f.AsDict().Set("name", name)
		for _, k := range []string{"description", "parameters"} {
			val, ok := fd.Get(k)
			if !ok {
				val = jinja.None()
			}
			f.AsDict().Set(k, val)
		}
		for _, k := range fd.OrderedKeys() {
			if k != "name" && k != "description" && k != "parameters" {
				val, _ := fd.Get(k)
				f.AsDict().Set(k, val)
			}
		}
		tool := jinja.NewDict()
		tool.AsDict().Set("type", typ)
		tool.AsDict().Set("function", f)
		for _, k := range td.OrderedKeys() {
			if k != "type" && k != "function" {
				val, _ := td.Get(k)
				tool.AsDict().Set(k, val)
			}
		}
		out = append(out, tool)
	}
	return jinja.NewList(out), nil
}
