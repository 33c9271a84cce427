package chattemplate

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/ardanlabs/jinja"
)

// A native renderer is a Go transcription of one published chat template,
// used in place of the Jinja interpreter when a config's chat_template is
// byte-for-byte that template: an interpreted render of a 100k-token
// conversation costs milliseconds, the transcription about one copy of the
// text. It answers ok=false for any input it was not written for (a
// variable the template reads that has an unexpected type, an unknown
// chat_template_kwargs key), and the Jinja render runs instead. Each is
// pinned to the interpreter by TestNativeMatchesJinja (random and
// adversarial conversations) and FuzzNativeMatchesJinja, and through it to
// the reference renderings of the golden conversations.
type nativeRenderer struct {
	name string
	// reads are the variables the template reads besides messages; a
	// render whose data has another non-standard variable falls back.
	reads  map[string]bool
	render func(b *strings.Builder, msgs []jinja.Value, data map[string]jinja.Value) bool
}

// nativeBySHA maps the sha256 of a template source to its renderer.
var nativeBySHA = map[string]*nativeRenderer{
	// Meta-Llama-3-8B-Instruct and -70B-Instruct (Llama 3.0).
	"b48c47f6443892716176eb200bf4ef108f64e06ca26ed0fa8ebc0a4b3992fcb2": {name: "llama3", reads: map[string]bool{"bos_token": true}, render: renderLlama3},
	// Qwen3 (0.6B to 235B-A22B share it).
	"87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5": {name: "qwen3",
		reads: map[string]bool{"tools": true, "add_generation_prompt": true, "enable_thinking": true}, render: renderQwen3},
}

// standardVars are the variables every render gets; a native renderer
// ignores those it does not read.
var standardVars = map[string]bool{
	"bos_token": true, "eos_token": true, "unk_token": true, "pad_token": true, "sep_token": true, "cls_token": true, "mask_token": true,
	"additional_special_tokens": true, "add_generation_prompt": true, "tools": true, "documents": true, "messages": true,
	"reasoning_effort": true, "strftime_now": true, filterPrefix + "trim": true, filterPrefix + "tojson": true,
}

func nativeFor(src string) *nativeRenderer {
	sum := sha256.Sum256([]byte(src))
	return nativeBySHA[hex.EncodeToString(sum[:])]
}

// renderNative runs the template's native renderer, or reports false.
func (t *Template) renderNative(msgs []jinja.Value, data map[string]jinja.Value) (string, bool) {
	n := t.native
	if n == nil || t.forceJinja {
		return "", false
	}
	for k := range data {
		// A variable the template does not mention cannot change its
		// output; one it mentions but the transcription does not read
		// (a kwarg shadowing a global, say) sends the render to Jinja.
		if !standardVars[k] && !n.reads[k] && t.idents[k] {
			return "", false
		}
	}
	size := 256
	for _, m := range msgs {
		if m.IsDict() {
			if c, ok := m.AsDict().Get("content"); ok && c.IsString() {
				size += len(c.AsString()) + 64
			}
		}
	}
	var b strings.Builder
	b.Grow(size)
	if !n.render(&b, msgs, data) {
		return "", false
	}
	return b.String(), true
}

// msgStr reads a string field of a message dict.
func msgStr(m jinja.Value, key string) (string, bool) {
	if !m.IsDict() {
		return "", false
	}
	v, ok := m.AsDict().Get(key)
	if !ok || !v.IsString() {
		return "", false
	}
	return v.AsString(), true
}

// renderLlama3 is Meta Llama 3.0's template: every message as
// <|start_header_id|>role<|end_header_id|>\n\n + trimmed content +
// <|eot_id|>, bos_token before the first, and the assistant header always
// (the template ignores add_generation_prompt).
func renderLlama3(b *strings.Builder, msgs []jinja.Value, data map[string]jinja.Value) bool {
	bos, ok := data["bos_token"]
	if !ok || !bos.IsString() {
		return false
	}
	for i, m := range msgs {
		role, ok1 := msgStr(m, "role")
		content, ok2 := msgStr(m, "content")
		if !ok1 || !ok2 {
			return false
		}
		if i == 0 {
			b.WriteString(bos.AsString())
		}
		b.WriteString("<|start_header_id|>")
		b.WriteString(role)
		b.WriteString("<|end_header_id|>\n\n")
		b.WriteString(pyStrip(content))
		b.WriteString("<|eot_id|>")
	}
	b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	return true
}

// renderQwen3 is Qwen 3's template: the system turn with the tools block,
// ChatML turns, assistant turns after the last real user query with their
// reasoning in <think>, tool calls in <tool_call>, consecutive tool
// results in one user turn, and the generation prompt (with an empty
// think block when enable_thinking is false).
func renderQwen3(b *strings.Builder, msgs []jinja.Value, data map[string]jinja.Value) bool {
	if len(msgs) == 0 {
		return false // messages[0] raises in the template
	}
	type msg struct {
		role, content string
		m             *jinja.Dict
	}
	ms := make([]msg, len(msgs))
	for i, m := range msgs {
		role, ok1 := msgStr(m, "role")
		content, ok2 := msgStr(m, "content")
		if !ok1 || !ok2 {
			return false
		}
		ms[i] = msg{role, content, m.AsDict()}
	}
	tools := data["tools"]
	if !tools.IsNone() && !tools.IsList() {
		return false
	}
	if tools.IsList() && tools.AsList().Len() > 0 {
		b.WriteString("<|im_start|>system\n")
		if ms[0].role == "system" {
			b.WriteString(ms[0].content)
			b.WriteString("\n\n")
		}
		b.WriteString("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>")
		o := pyJSON{item: ", ", key: ": "}
		for _, tool := range tools.AsList().Items {
			b.WriteString("\n")
			if o.encode(b, tool, 0) != nil {
				return false
			}
		}
		b.WriteString("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")
	} else if ms[0].role == "system" {
		b.WriteString("<|im_start|>system\n")
		b.WriteString(ms[0].content)
		b.WriteString("<|im_end|>\n")
	}
	lastQuery := len(ms) - 1
	for i := len(ms) - 1; i >= 0; i-- {
		if m := ms[i]; m.role == "user" && !(strings.HasPrefix(m.content, "<tool_response>") && strings.HasSuffix(m.content, "</tool_response>")) {
			lastQuery = i
			break
		}
	}
	for i, m := range ms {
		last := i == len(ms)-1
		switch {
		case m.role == "user" || m.role == "system" && i > 0:
			b.WriteString("<|im_start|>")
			b.WriteString(m.role)
			b.WriteString("\n")
			b.WriteString(m.content)
			b.WriteString("<|im_end|>\n")
		case m.role == "assistant":
			content, reasoning := m.content, ""
			if rc, ok := m.m.Get("reasoning_content"); ok && !rc.IsNone() {
				if !rc.IsString() {
					return false
				}
				reasoning = rc.AsString()
			} else if strings.Contains(content, "</think>") {
				parts := strings.Split(content, "</think>")
				content = strings.TrimLeft(parts[len(parts)-1], "\n")
				think := strings.Split(strings.TrimRight(parts[0], "\n"), "<think>")
				reasoning = strings.TrimLeft(think[len(think)-1], "\n")
			}
			b.WriteString("<|im_start|>assistant\n")
			if i > lastQuery && (last || reasoning != "") {
				b.WriteString("<think>\n")
				b.WriteString(strings.Trim(reasoning, "\n"))
				b.WriteString("\n</think>\n\n")
				b.WriteString(strings.TrimLeft(content, "\n"))
			} else {
				b.WriteString(content)
			}
			if tc, ok := m.m.Get("tool_calls"); ok && tc.IsTruthy() {
				if !tc.IsList() {
					return false
				}
				for j, call := range tc.AsList().Items {
					if j > 0 || content != "" {
						b.WriteString("\n")
					}
					if !call.IsDict() {
						return false
					}
					if fn, ok := call.AsDict().Get("function"); ok && fn.IsTruthy() {
						call = fn
						if !call.IsDict() {
							return false
						}
					}
					name, ok := call.AsDict().Get("name")
					if !ok || !name.IsString() {
						return false
					}
					args, ok := call.AsDict().Get("arguments")
					if !ok {
						return false
					}
					b.WriteString("<tool_call>\n{\"name\": \"")
					b.WriteString(name.AsString())
					b.WriteString("\", \"arguments\": ")
					if args.IsString() {
						b.WriteString(args.AsString())
					} else {
						o := pyJSON{item: ", ", key: ": "}
						if o.encode(b, args, 0) != nil {
							return false
						}
					}
					b.WriteString("}\n</tool_call>")
				}
			}
			b.WriteString("<|im_end|>\n")
		case m.role == "tool":
			if i == 0 || ms[i-1].role != "tool" {
				b.WriteString("<|im_start|>user")
			}
			b.WriteString("\n<tool_response>\n")
			b.WriteString(m.content)
			b.WriteString("\n</tool_response>")
			if last || ms[i+1].role != "tool" {
				b.WriteString("<|im_end|>\n")
			}
		}
	}
	agp := data["add_generation_prompt"]
	if !agp.IsBool() {
		return false
	}
	if agp.AsBool() {
		b.WriteString("<|im_start|>assistant\n")
		if et, ok := data["enable_thinking"]; ok && et.IsBool() && !et.AsBool() {
			b.WriteString("<think>\n\n</think>\n\n")
		}
	}
	return true
}
