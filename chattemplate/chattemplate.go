// Package chattemplate renders the chat template of a Hugging Face
// tokenizer_config.json (a Jinja template) for one user message with the
// generation prompt appended: what an engine's chat endpoint renders before
// it tokenizes a single-turn prompt. Rendering uses
// github.com/ardanlabs/jinja, a pure-Go Jinja engine built for chat
// templates (namespace, raise_exception, strftime_now, tojson, loop
// variables, string methods).
//
// The template sees messages (one {"role": "user", "content": text}),
// add_generation_prompt=true and the special tokens of the config
// (bos_token, eos_token, unk_token, pad_token) as strings; tools, documents
// and the like are undefined. A template that needs more fails to render
// with an error; callers fail open.
package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/ardanlabs/jinja"
)

// ErrNoTemplate means tokenizer_config.json has no chat_template.
var ErrNoTemplate = errors.New("chattemplate: tokenizer_config.json has no chat_template")

// Template is a compiled chat template; safe for concurrent use.
type Template struct {
	tmpl *jinja.Template
	// vars are the config's special tokens, passed to every render.
	vars map[string]string
	// additional is additional_special_tokens, nil when absent.
	additional []string
	// format is the content format vLLM detects for the template.
	format ContentFormat
	// mutates: the template calls a method that modifies a list or dict.
	mutates bool
	// native is the Go transcription of the template, nil for most.
	native *nativeRenderer
	// forceJinja makes every render interpreted (tests).
	forceJinja bool
	// idents are the identifiers in the template's tags.
	idents map[string]bool
}

var identRe = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)

// tagIdents collects the identifiers inside the template's tags (a
// superset of the variables it reads: string literals are included).
func tagIdents(src string) map[string]bool {
	ids := map[string]bool{}
	for _, tag := range stmtOrExprRe.FindAllString(src, -1) {
		for _, id := range identRe.FindAllString(tag, -1) {
			ids[id] = true
		}
	}
	return ids
}

var stmtOrExprRe = regexp.MustCompile(`\{\{[\s\S]*?\}\}|\{%[\s\S]*?%\}`)

// mutatingCall finds calls of the list and dict methods that modify their
// receiver (the engine's immutable sandbox refuses them; this Jinja
// library runs them).
var mutatingCall = regexp.MustCompile(`\.(append|pop|insert|update|extend|remove|clear|setdefault|sort|reverse|popitem)\s*\(`)

// MayModifyValues reports a template that could modify the values it is
// given (RenderConverted callers then must not share them between
// renders).
func (t *Template) MayModifyValues() bool { return t.mutates }

type configJSON struct {
	ChatTemplate json.RawMessage   `json:"chat_template"`
	BOS          json.RawMessage   `json:"bos_token"`
	EOS          json.RawMessage   `json:"eos_token"`
	UNK          json.RawMessage   `json:"unk_token"`
	PAD          json.RawMessage   `json:"pad_token"`
	SEP          json.RawMessage   `json:"sep_token"`
	CLS          json.RawMessage   `json:"cls_token"`
	MASK         json.RawMessage   `json:"mask_token"`
	Additional   []json.RawMessage `json:"additional_special_tokens"`
}

// Parse reads a tokenizer_config.json and compiles its chat_template (a
// string, or a list of named templates of which "default" is used).
func Parse(config []byte) (*Template, error) {
	return ParseWithSource(config, "")
}

// ParseWithSource is Parse with the template given apart from the config
// (a model's chat_template.jinja file, which transformers prefers to the
// config's chat_template); "" means the config's.
func ParseWithSource(config []byte, source string) (*Template, error) {
	var c configJSON
	if err := json.Unmarshal(config, &c); err != nil {
		return nil, fmt.Errorf("cannot parse tokenizer_config.json: %w", err)
	}
	src := source
	if src == "" {
		var err error
		if src, err = templateSource(c.ChatTemplate); err != nil {
			return nil, err
		}
	}
	// Compiled, scanned and matched to a native renderer as Jinja2 reads
	// it (a chat_template.jinja's final newline does not count).
	src = jinjaSource(src)
	native := nativeFor(src)
	var err error
	t := &Template{vars: map[string]string{}}
	for name, raw := range map[string]json.RawMessage{"bos_token": c.BOS, "eos_token": c.EOS, "unk_token": c.UNK, "pad_token": c.PAD,
		"sep_token": c.SEP, "cls_token": c.CLS, "mask_token": c.MASK} {
		if s, ok := tokenString(raw); ok {
			t.vars[name] = s
		}
	}
	for _, raw := range c.Additional {
		if s, ok := tokenString(raw); ok {
			t.additional = append(t.additional, s)
		}
	}
	if c.Additional != nil && t.additional == nil {
		t.additional = []string{}
	}
	t.format = detectContentFormat(src)
	t.mutates = mutatingCall.MatchString(src)
	t.native = native
	t.idents = tagIdents(src)
	if t.tmpl, err = compile(rewriteFilters(src)); err != nil {
		return nil, err
	}
	return t, nil
}

// compile wraps jinja.Compile: a template the engine cannot parse is an
// error, even if the engine panics on it.
func compile(src string) (tmpl *jinja.Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot compile chat_template: %v", r)
		}
	}()
	tmpl, err = jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("cannot compile chat_template: %w", err)
	}
	return tmpl, nil
}

func templateSource(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", ErrNoTemplate
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if s == "" {
			return "", ErrNoTemplate
		}
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("cannot parse chat_template: want a string or a list of {name, template}")
	}
	for _, n := range named {
		if n.Name == "default" && n.Template != "" {
			return n.Template, nil
		}
	}
	return "", ErrNoTemplate
}

// tokenString reads a special token given as a string or as an AddedToken
// object ({"content": ...}).
func tokenString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}

// RenderUser renders text as the one user message of a conversation, with
// the generation prompt.
func (t *Template) RenderUser(text string) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("cannot render chat_template: %v", r)
		}
	}()
	data := t.baseData(time.Time{})
	// An ordered dict, role first: tojson writes keys in insertion order,
	// as Python does for the engine's {"role": ..., "content": ...}.
	msg := jinja.NewDict()
	msg.AsDict().Set("role", jinja.NewString("user"))
	if t.format == FormatOpenAI {
		msg.AsDict().Set("content", jinja.NewList([]jinja.Value{textPart(jinja.NewString(text))}))
	} else {
		msg.AsDict().Set("content", jinja.NewString(text))
	}
	data["messages"] = jinja.NewList([]jinja.Value{msg})
	data["add_generation_prompt"] = jinja.NewBool(true)
	data["tools"] = jinja.None()
	data["documents"] = jinja.None()
	out, err = t.tmpl.RenderValues(data)
	if err != nil {
		return "", fmt.Errorf("cannot render chat_template: %w", err)
	}
	return out, nil
}
