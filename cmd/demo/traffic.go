package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
)

// The picker's traffic: users of two applications whose conversations
// share the application's system prompt (a support desk, a coding
// assistant), and users whose conversation has a system prompt of its
// own. Each conversation is a few turns; every turn sends the whole
// conversation so far, as chat clients do.

const supportPrompt = "You are the support assistant of an online shop. Answer briefly and precisely. " +
	"If you do not know the answer, say so. Do not make up order numbers, prices or dates. " +
	"Use the tools you are given to look up an order, an invoice or an account before you answer a question about it. " +
	"Keep the customer's personal data private. Refunds are returned to the original payment method and usually appear " +
	"within three to seven days, depending on the bank. A damaged package is replaced or refunded within five working days " +
	"once the customer sends a photo. Invoices are in the account under billing, as a PDF. To reset a password, the customer " +
	"opens the sign in page and follows the link that says they forgot their password; the email is valid for one hour. " +
	"For security reasons the email address of an account cannot be changed over chat. Thank the customer, and ask for the " +
	"order number and the email address they used when you need them."

const codingPrompt = "You are a coding assistant. Read the files before you change them. Explain what a change does and why, " +
	"in a few sentences, then show the code. Prefer small functions with clear names, tests for every behaviour, and errors " +
	"that say what went wrong. Follow the style of the code around you. Pass the context down to every call that can block, " +
	"return the error from close, and reuse buffers in loops instead of allocating a new slice for every item. When a change " +
	"adds a cache, say what protects it, how entries expire, and show the benchmark before and after. When you are not sure " +
	"what the user wants, ask."

var supportQuestions = []string{
	"Where is my order 48213? It was supposed to arrive on Monday.",
	"The package arrived damaged. What do I do now?",
	"How do I download the invoice for my last order?",
	"My payment failed, but the money left my account. Can you check?",
	"I forgot my password and the reset email does not arrive.",
	"Can I change the delivery address of an order that has shipped?",
	"When will I get my refund for the returned shoes?",
	"Can you change the email address on my account?",
}

var codingQuestions = []string{
	"Write a function that returns the longest common prefix of two strings, with a table test.",
	"Review this handler: it parses the body, calls the service and writes JSON. What would you change?",
	"This loop allocates a new slice for every item. How do I reuse the buffer?",
	"Add a cache in front of the database keyed by user id, with a time to live of five minutes.",
	"The error from close is ignored here. How should I return it?",
	"Make the function work on a list of strings and show the benchmark.",
	"The context is not passed to the call below. Why does that matter?",
	"Explain the time complexity, and what changes for byte slices.",
}

var ownTopics = []struct{ who, topic string }{
	{"Ada", "the routing of requests to replicas that hold their prompt's prefix"},
	{"Lin", "planning a three day trip to the mountains by train"},
	{"Sam", "the accounts of a small bakery and its invoices"},
	{"Noor", "a reading list about language models and their caches"},
	{"Kai", "the training plan for a half marathon in the spring"},
	{"Eve", "the garden: what to plant in which month, on a balcony"},
}

var ownQuestions = []string{
	"Where should I start?",
	"Give me the three most important points.",
	"What did we decide so far? Summarize it in two sentences.",
	"What is the next step, and how long will it take?",
	"What could go wrong, and what would I do then?",
	"Write it down as a short checklist.",
}

var replies = []string{
	"Thank you for the details. I checked the status, and the next step is on our side: you will get an email with the tracking link today.",
	"Here is what I would do, in order: first read the relevant file, then write a test that shows the problem, then make the smallest change that fixes it.",
	"In short: the earlier turns of this conversation are already computed on one engine, so sending this turn there saves their prefill.",
	"Two things matter most here. The first is to keep the common part at the start, the second is to measure before and after.",
	"I would keep it simple: one function, a clear name, a table test with the edge cases, and an error that says what went wrong.",
	"That is a good question. The answer depends on the load: when the engine that holds the prefix is busy, another one may be faster.",
}

// conversation is one user's chat.
type conversation struct {
	name   string
	kind   string // "support", "coding", "own"
	system string
	qs     []string
	offset int
	// msgs is the history: system, then (user, assistant) per turn done.
	msgs []map[string]string
}

// conversations builds n conversations: a third of each kind, in an
// interleaved order so that the kinds start at different times.
func conversations(n int) []*conversation {
	out := make([]*conversation, 0, n)
	counts := map[string]int{}
	for i := range n {
		c := &conversation{offset: i}
		switch i % 3 {
		case 0:
			c.kind, c.system, c.qs = "support", supportPrompt, supportQuestions
		case 1:
			c.kind, c.system, c.qs = "coding", codingPrompt, codingQuestions
		default:
			t := ownTopics[(i/3)%len(ownTopics)]
			c.kind, c.qs = "own", ownQuestions
			c.system = fmt.Sprintf("You are the personal assistant of %s (user %d), who is working on %s. Keep answers short, "+
				"use plain words, and ask before you assume anything about %s's plans.", t.who, i, t.topic, t.who)
		}
		counts[c.kind]++
		c.name = fmt.Sprintf("%s-%d", c.kind, counts[c.kind])
		c.msgs = []map[string]string{{"role": "system", "content": c.system}}
		out = append(out, c)
	}
	return out
}

// body is the chat request of the conversation's next turn: the history
// and the turn's question.
func (c *conversation) body(model string, turn int) []byte {
	msgs := append(c.msgs[:len(c.msgs):len(c.msgs)], map[string]string{"role": "user", "content": c.question(turn)})
	b, _ := json.Marshal(map[string]any{"model": model, "messages": msgs, "stream": true,
		"stream_options": map[string]bool{"include_usage": true}})
	return b
}

func (c *conversation) question(turn int) string { return c.qs[(c.offset+turn)%len(c.qs)] }

// answered appends the turn's question and the engine's answer to the
// history.
func (c *conversation) answered(turn int, answer string) {
	c.msgs = append(c.msgs, map[string]string{"role": "user", "content": c.question(turn)},
		map[string]string{"role": "assistant", "content": answer})
}

// reply is the fake engine's answer to a user message: one of the canned
// replies, the same for the same message.
func reply(user string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(user))
	return replies[h.Sum32()%uint32(len(replies))]
}
