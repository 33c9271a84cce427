package picker

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// Synthetic but varied text for the decision benchmarks: sentences drawn
// from a few hundred words, identifiers, numbers and Go-like code, so the
// tokenizer does real work (a repeated phrase would be one cached word
// after another) and every conversation differs from every other.

var benchWords = strings.Fields(`the a an of to in and or for with on at by from as is are was be been being it this that these those
there here which who what when where why how not no all any each every some many much more most few less other another same such
request response engine replica cache prefix block token tokens model gateway picker endpoint route router index lookup score load
queue latency throughput memory budget eviction policy tenant adapter stream message body header status error retry timeout deadline
user assistant system tool function call result value field name type string number list object array map key set get put
read write open close parse render encode decode hash chain match rank pick send receive start finish count measure report
file line code test benchmark profile build run deploy config flag option default limit bound size length offset version
order invoice account payment refund delivery package address email password shipment tracking support customer price date
fast slow small large long short new old first last next previous early late high low full empty warm cold busy idle
because however although therefore instead meanwhile finally first then also only still already again often always never
server client service handler worker thread goroutine channel mutex atomic pointer slice buffer allocation garbage collector
compute prefill decode attention layer weight vocabulary merge byte character word sentence paragraph document conversation
turn history context window question answer explanation summary detail example case edge path branch loop condition return
keeps holds takes gives makes finds shows says means needs wants uses adds drops moves changes checks fails passes works helps
quickly slowly exactly roughly carefully simply clearly mostly nearly rarely usually sometimes`)

var benchIdents = strings.Fields(`handler config reader writer cache index router picker stream buffer parser encoder request response
session tenant replica endpoint metrics registry limiter scheduler worker pool queue batch chunk token block chain`)

type benchText struct{ r *rand.Rand }

func newBenchText(seed uint64) *benchText { return &benchText{rand.New(rand.NewPCG(seed, 0x5eed))} }

func (t *benchText) word() string { return benchWords[t.r.IntN(len(benchWords))] }

// sentence is 6 to 18 words, capitalized, with the odd comma, number or
// identifier.
func (t *benchText) sentence(sb *strings.Builder) {
	n := 6 + t.r.IntN(13)
	for i := range n {
		w := t.word()
		switch {
		case i == 0:
			w = strings.ToUpper(w[:1]) + w[1:]
		case t.r.IntN(17) == 0:
			w = fmt.Sprint(t.r.IntN(100000))
		case t.r.IntN(23) == 0:
			w = benchIdents[t.r.IntN(len(benchIdents))] + "_" + fmt.Sprint(t.r.IntN(100)) + "()"
		}
		if i > 0 {
			sb.WriteByte(' ')
		}
		sb.WriteString(w)
		if i < n-1 && t.r.IntN(9) == 0 {
			sb.WriteByte(',')
		}
	}
	sb.WriteString(". ")
}

// prose is about words words.
func (t *benchText) prose(words int) string {
	var sb strings.Builder
	for sb.Len() < words*6 {
		t.sentence(&sb)
		if t.r.IntN(6) == 0 {
			sb.WriteString("\n\n")
		}
	}
	return strings.TrimSpace(sb.String())
}

// code is a Go-like function of about lines lines.
func (t *benchText) code(lines int) string {
	var sb strings.Builder
	id := func() string { return benchIdents[t.r.IntN(len(benchIdents))] }
	fmt.Fprintf(&sb, "package %s\n\nimport (\n\t\"context\"\n\t\"fmt\"\n)\n\n", id())
	fmt.Fprintf(&sb, "// %s%d %s.\nfunc (s *%s) %s%d(ctx context.Context, n int) (int, error) {\n", strings.ToUpper(id()[:1]), t.r.IntN(100), t.prose(8), id(), strings.ToUpper(id()[:1])+id()[1:], t.r.IntN(1000))
	for i := range lines {
		switch i % 4 {
		case 0:
			fmt.Fprintf(&sb, "\tif n > %d {\n\t\treturn 0, fmt.Errorf(\"cannot %s %s: %%w\", err)\n\t}\n", t.r.IntN(4096), t.word(), id())
		case 1:
			fmt.Fprintf(&sb, "\t%s := s.%s[n%%%d]\n", id(), id(), 1+t.r.IntN(64))
		case 2:
			fmt.Fprintf(&sb, "\tfor i := 0; i < %d; i++ {\n\t\tn += s.%s(ctx, i)\n\t}\n", t.r.IntN(256), id())
		default:
			fmt.Fprintf(&sb, "\t// %s\n", t.prose(10))
		}
	}
	sb.WriteString("\treturn n, nil\n}\n")
	return sb.String()
}

// benchMessage is one chat message as a client sends it.
type benchMessage = map[string]any

// chatConversation is a conversation of n messages (user and assistant in
// turn) of about words words each, its own from the first message on.
func chatConversation(seed uint64, n, words int) []benchMessage {
	t := newBenchText(seed)
	msgs := make([]benchMessage, 0, n)
	for i := range n {
		role := []string{"user", "assistant"}[i%2]
		msgs = append(msgs, benchMessage{"role": role, "content": fmt.Sprintf("[conversation %d, message %d] ", seed, i) + t.prose(words)})
	}
	return msgs
}

// agenticConversation is a coding agent's conversation: a system prompt
// (its session named first), then steps of a user asking, an assistant
// tool call, the tool's result (code and prose) and the assistant's
// summary, ending with the user's next ask.
func agenticConversation(seed uint64, steps int) []benchMessage {
	t := newBenchText(seed)
	msgs := []benchMessage{{"role": "system", "content": fmt.Sprintf("Session %d. You are a coding agent. ", seed) + t.prose(200)}}
	for i := range steps {
		path := fmt.Sprintf("src/%s/%s_%d.go", benchIdents[t.r.IntN(len(benchIdents))], benchIdents[t.r.IntN(len(benchIdents))], i)
		id := fmt.Sprintf("call_%d_%d", seed, i)
		msgs = append(msgs,
			benchMessage{"role": "user", "content": fmt.Sprintf("Step %d: read %s. ", i, path) + t.prose(20)},
			benchMessage{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": id, "type": "function",
				"function": map[string]any{"name": "read_file", "arguments": fmt.Sprintf(`{"path": %q}`, path)}}}},
			benchMessage{"role": "tool", "tool_call_id": id, "content": t.code(12) + "\n" + t.prose(60)},
			benchMessage{"role": "assistant", "content": t.prose(40)})
	}
	return append(msgs, benchMessage{"role": "user", "content": "Go on with the next file."})
}

// nextTurn is conv with the assistant's reply and the user's next
// question.
func nextTurn(conv []benchMessage, i int) []benchMessage {
	t := newBenchText(uint64(i) + 1<<40)
	return append(conv[:len(conv):len(conv)], benchMessage{"role": "assistant", "content": t.prose(60)},
		benchMessage{"role": "user", "content": fmt.Sprintf("Next, question %d: ", i) + t.prose(20)})
}

// benchTools is the agent's tool list.
var benchTools = []any{map[string]any{"type": "function", "function": map[string]any{"name": "read_file", "description": "Read a file of the repository.",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}, "required": []string{"path"}}}}}

// chatBody is the request body of a conversation (with the agent's tools
// when it calls any).
func chatBody(msgs []benchMessage) []byte {
	body := map[string]any{"model": "llama3", "messages": msgs, "stream": true, "stream_options": map[string]bool{"include_usage": true}}
	for _, m := range msgs {
		if _, ok := m["tool_calls"]; ok {
			body["tools"] = benchTools
			break
		}
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return b
}
