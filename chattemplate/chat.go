package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// Chat is one /v1/chat/completions request, as the engine's OpenAI server
// takes it: raw JSON, converted here the way vLLM converts it before it
// calls the template (vllm/entrypoints/chat_utils.py and the chat
// request's validators).
type Chat struct {
	// Messages are the "messages" objects as sent.
	Messages []json.RawMessage
	// Tools is the "tools" array as sent; nil when absent.
	Tools json.RawMessage
	// AddGenerationPrompt and ContinueFinalMessage are the request fields
	// (vLLM's defaults: true and false).
	AddGenerationPrompt, ContinueFinalMessage bool
	// Kwargs is "chat_template_kwargs" (an object); nil when absent.
	Kwargs json.RawMessage
	// Documents is "documents" (an array); nil when absent.
	Documents json.RawMessage
	// ReasoningEffort is "reasoning_effort"; "" when absent.
	ReasoningEffort string
	// Now is strftime_now's clock; zero means time.Now().
	Now time.Time
}

// Errors of RenderChat besides the template's own.
var (
	// ErrUnsupportedContent: a content part this package cannot render as
	// the engine would (images, audio, video and embeddings are expanded
	// by the engine's multimodal processor, not by the template).
	ErrUnsupportedContent = errors.New("chattemplate: unsupported content part")
	// ErrInvalidChat: the request is one the engine refuses (400).
	ErrInvalidChat = errors.New("chattemplate: invalid chat request")
)

// ContentFormat is how message content reaches the template (vLLM's
// --chat-template-content-format "auto" detection).
type ContentFormat uint8

const (
	// FormatString: content is one string, text parts joined with "\n".
	FormatString ContentFormat = iota
	// FormatOpenAI: content is a list of {"type": "text", "text": ...}
	// parts.
	FormatOpenAI
)

func (f ContentFormat) String() string {
	if f == FormatOpenAI {
		return "openai"
	}
	return "string"
}

// ContentFormat reports the detected content format of the template.
func (t *Template) ContentFormat() ContentFormat { return t.format }

// forStmt and setStmt read the statements detectContentFormat needs.
var (
	stmtRe  = regexp.MustCompile(`\{%-?\s*(for|set)\s+([\s\S]*?)-?%\}`)
	forRe   = regexp.MustCompile(`^([A-Za-z_]\w*)\s+in\s+([\s\S]+?)(?:\s+if\s[\s\S]*|\s+recursive)?\s*$`)
	setRe   = regexp.MustCompile(`^([A-Za-z_]\w*)\s*=\s*([\s\S]+?)\s*$`)
	sliceRe = regexp.MustCompile(`\[[^\[\]'"]*:[^\[\]'"]*\]\s*$`)
)

// detectContentFormat is vLLM's _detect_content_format on the template
// source: "openai" when some for loop iterates over the content of a
// message (for c in message['content'], message.content, or those
// filtered or sliced), where a message is the target of a loop over
// messages or a variable set from messages (filtered or sliced); "string"
// otherwise.
func detectContentFormat(src string) ContentFormat {
	type stmt struct{ kind, target, expr string }
	var stmts []stmt
	for _, m := range stmtRe.FindAllStringSubmatch(src, -1) {
		body := strings.TrimSpace(m[2])
		re := setRe
		if m[1] == "for" {
			re = forRe
		}
		if sm := re.FindStringSubmatch(body); sm != nil {
			stmts = append(stmts, stmt{m[1], sm[1], sm[2]})
		}
	}
	msgs := map[string]bool{"messages": true}
	for changed := true; changed; {
		changed = false
		for _, s := range stmts {
			if s.kind == "set" && !msgs[s.target] && elemsAccess(s.expr, msgs, "") {
				msgs[s.target], changed = true, true
			}
		}
	}
	items := map[string]bool{}
	for _, s := range stmts {
		if s.kind == "for" && elemsAccess(s.expr, msgs, "") {
			items[s.target] = true
		}
	}
	for _, s := range stmts {
		if s.kind == "for" && elemsAccess(s.expr, items, "content") {
			return FormatOpenAI
		}
	}
	return FormatString
}

// elemsAccess reports an expression that is one of vars (or its key
// attribute or item), possibly filtered, tested or sliced.
func elemsAccess(expr string, vars map[string]bool, key string) bool {
	e := strings.TrimSpace(expr)
	for strings.HasPrefix(e, "(") && strings.HasSuffix(e, ")") {
		e = strings.TrimSpace(e[1 : len(e)-1])
	}
	if i := topLevel(e, '|'); i >= 0 {
		e = strings.TrimSpace(e[:i])
	}
	if i := strings.Index(e, " is "); i >= 0 {
		e = strings.TrimSpace(e[:i])
	}
	for {
		loc := sliceRe.FindStringIndex(e)
		if loc == nil {
			break
		}
		e = strings.TrimSpace(e[:loc[0]])
	}
	if key != "" {
		switch {
		case strings.HasSuffix(e, "."+key):
			e = e[:len(e)-len(key)-1]
		case strings.HasSuffix(e, "['"+key+"']"), strings.HasSuffix(e, `["`+key+`"]`):
			e = e[:len(e)-len(key)-4]
		default:
			return false
		}
	}
	return vars[strings.TrimSpace(e)]
}

// topLevel is the index of c outside brackets and quotes, or -1.
func topLevel(s string, c byte) int {
	depth := 0
	var quote byte
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case quote != 0:
			if ch == '\\' {
				i++
			} else if ch == quote {
				quote = 0
			}
		case ch == '\'' || ch == '"':
			quote = ch
		case ch == '(' || ch == '[' || ch == '{':
			depth++
		case ch == ')' || ch == ']' || ch == '}':
			depth--
		case ch == c && depth == 0:
			return i
		}
	}
	return -1
}

// kwargNames are apply_chat_template's own parameters, which vLLM refuses
// (chat_template, tokenize) or which Python refuses as given twice
// (conversation, messages, tools) in chat_template_kwargs.
var refusedKwargs = map[string]bool{"chat_template": true, "tokenize": true, "conversation": true, "messages": true, "tools": true}

// RenderChat renders a whole conversation as the engine does for
// /v1/chat/completions: each message converted as vLLM converts it
// (content format, tool call arguments parsed, reasoning), the template
// called with the special tokens, chat_template_kwargs, tools and the
// generation prompt, and continue_final_message applied to the rendering
// as transformers does.
func (t *Template) RenderChat(c *Chat) (string, error) {
	if c.AddGenerationPrompt && c.ContinueFinalMessage {
		return "", fmt.Errorf("%w: add_generation_prompt and continue_final_message cannot both be true", ErrInvalidChat)
	}
	if len(c.Messages) == 0 {
		return "", fmt.Errorf("%w: no messages", ErrInvalidChat)
	}
	msgs := make([]jinja.Value, len(c.Messages))
	for i, raw := range c.Messages {
		v, err := ConvertMessage(raw, t.format)
		if err != nil {
			return "", fmt.Errorf("message %d: %w", i, err)
		}
		msgs[i] = v
	}
	return t.RenderConverted(c, msgs)
}

// RenderConverted is RenderChat with messages already converted by
// ConvertMessage for this template's format (a caller may keep converted
// messages of a conversation between its turns). The values are only read.
func (t *Template) RenderConverted(c *Chat, msgs []jinja.Value) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("cannot render chat_template: %v", r)
		}
	}()
	if c.AddGenerationPrompt && c.ContinueFinalMessage {
		return "", fmt.Errorf("%w: add_generation_prompt and continue_final_message cannot both be true", ErrInvalidChat)
	}
	data, err := t.chatData(c)
	if err != nil {
		return "", err
	}
	var native bool
	if out, native = t.renderNative(msgs, data); !native {
		data["messages"] = jinja.NewList(msgs)
		if out, err = t.tmpl.RenderValues(data); err != nil {
			return "", fmt.Errorf("cannot render chat_template: %w", err)
		}
	}
	if c.ContinueFinalMessage {
		return continueFinal(out, msgs[len(msgs)-1])
	}
	return out, nil
}

// chatData is what a chat render sees besides messages.
func (t *Template) chatData(c *Chat) (map[string]jinja.Value, error) {
	data := t.baseData(c.Now)
	if len(c.Kwargs) > 0 && string(c.Kwargs) != "null" {
		kw, err := decodeJSON(c.Kwargs)
		if err != nil || !kw.IsDict() {
			return nil, fmt.Errorf("%w: chat_template_kwargs is not a JSON object", ErrInvalidChat)
		}
		d := kw.AsDict()
		for _, k := range d.OrderedKeys() {
			if refusedKwargs[k] {
				return nil, fmt.Errorf("%w: chat_template_kwargs has %q", ErrInvalidChat, k)
			}
			data[k], _ = d.Get(k)
		}
	}
	// The request's own fields override chat_template_kwargs (vLLM merges
	// them over the user's kwargs, leaving out unset ones).
	data["add_generation_prompt"] = jinja.NewBool(c.AddGenerationPrompt)
	if c.ReasoningEffort != "" {
		data["reasoning_effort"] = jinja.NewString(c.ReasoningEffort)
		if _, set := data["enable_thinking"]; !set {
			data["enable_thinking"] = jinja.NewBool(c.ReasoningEffort != "none")
		}
	}
	data["tools"] = jinja.None()
	if len(c.Tools) > 0 && string(c.Tools) != "null" {
		tools, err := convertTools(c.Tools)
		if err != nil {
			return nil, err
		}
		data["tools"] = tools
	}
	data["documents"] = jinja.None()
	if len(c.Documents) > 0 && string(c.Documents) != "null" {
		docs, err := decodeJSON(c.Documents)
		if err != nil {
			return nil, fmt.Errorf("%w: documents: %v", ErrInvalidChat, err)
		}
		data["documents"] = docs
	}
	return data, nil
}

// baseData is what every render sees: the special tokens and our versions
// of the functions and filters that differ from the engine's.
func (t *Template) baseData(now time.Time) map[string]jinja.Value {
	data := make(map[string]jinja.Value, len(t.vars)+12)
	for k, v := range t.vars {
		data[k] = jinja.NewString(v)
	}
	if t.additional != nil {
		items := make([]jinja.Value, len(t.additional))
		for i, s := range t.additional {
			items[i] = jinja.NewString(s)
		}
		data["additional_special_tokens"] = jinja.NewList(items)
	}
	data[filterPrefix+"trim"] = jinja.NewCallable("trim", pyTrim)
	data[filterPrefix+"tojson"] = jinja.NewCallable("tojson", pyTojson)
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), fmt.Errorf("strftime_now: want one format string")
		}
		n := now
		if n.IsZero() {
			n = time.Now()
		}
		return jinja.NewString(strftime(n, args[0].AsString())), nil
	})
	return data
}

// continueFinal cuts the rendering after the final message's content, as
// transformers does for continue_final_message: at the last occurrence of
// the stripped content, keeping its leading part as rendered.
func continueFinal(out string, last jinja.Value) (string, error) {
	var final string
	content, _ := last.AsDict().Get("content")
	switch {
	case content.IsString():
		final = content.AsString()
	case content.IsList():
		found := false
		items := content.AsList().Items
		for i := len(items) - 1; i >= 0; i-- {
			if items[i].IsDict() {
				if txt, ok := items[i].AsDict().Get("text"); ok {
					final, found = pyStr(txt), true
					break
				}
			}
		}
		if !found {
			return "", fmt.Errorf("%w: continue_final_message is set but the final message has no text", ErrInvalidChat)
		}
	default:
		return "", fmt.Errorf("%w: continue_final_message is set but the final message has no content", ErrInvalidChat)
	}
	stripped := pyStrip(final)
	loc := strings.LastIndex(out, stripped)
	if loc < 0 {
		return "", fmt.Errorf("%w: continue_final_message is set but the final message does not appear in the rendering", ErrInvalidChat)
	}
	lead := strings.TrimLeftFunc(final, isPySpace)
	if strings.HasPrefix(out[loc:], lead) && len(out)-loc >= len(lead) && out[loc:loc+len(lead)] == lead {
		return out[:loc+len(lead)], nil
	}
	return out[:loc+len(stripped)], nil
}
