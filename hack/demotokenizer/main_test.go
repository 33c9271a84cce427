package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/inferencecache/inferencecache/chattemplate"
	"github.com/inferencecache/inferencecache/tokenizer"
)

const checkedIn = "../../cmd/demo/tokenizer/demo-model"

// TestCheckedInIsGenerated: the demo's tokenizer files are what this
// command makes from corpus.txt (regenerate with the command in the
// package doc after changing either).
func TestCheckedInIsGenerated(t *testing.T) {
	corpus, err := os.ReadFile("corpus.txt")
	if err != nil {
		t.Fatal(err)
	}
	tok, cfg, err := Build(string(corpus), DefaultMerges)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]byte{"tokenizer.json": tok, "tokenizer_config.json": cfg} {
		got, err := os.ReadFile(filepath.Join(checkedIn, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the generator's output: go run ./hack/demotokenizer -out cmd/demo/tokenizer/demo-model", name)
		}
	}
	again, _, _ := Build(string(corpus), DefaultMerges)
	if !bytes.Equal(tok, again) {
		t.Error("two runs differ: the training is not deterministic")
	}
}

// TestLoadsAndFramesChatML: the tokenizer loads, compresses its domain's
// text (more than 3 bytes a token), and a ChatML rendering tokenizes with
// the frame markers as single special ids.
func TestLoadsAndFramesChatML(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(checkedIn, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(data)
	if err != nil {
		t.Fatal(err)
	}
	cfgData, err := os.ReadFile(filepath.Join(checkedIn, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chattemplate.ParseWithSource(cfgData, "")
	if err != nil {
		t.Fatal(err)
	}
	corpus, _ := os.ReadFile("corpus.txt")
	ids, err := tok.Encode(context.Background(), nil, string(corpus))
	if err != nil {
		t.Fatal(err)
	}
	if r := float64(len(corpus)) / float64(len(ids)); r < 3 {
		t.Errorf("%.2f bytes a token on the training text", r)
	}
	text, err := tmpl.RenderChat(&chattemplate.Chat{AddGenerationPrompt: true, Messages: []json.RawMessage{
		json.RawMessage(`{"role": "system", "content": "You are a helpful assistant."}`),
		json.RawMessage(`{"role": "user", "content": "Where is my order?"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhere is my order?<|im_end|>\n<|im_start|>assistant\n"
	if text != want {
		t.Fatalf("rendering %q, want %q", text, want)
	}
	ids, err = tok.Encode(context.Background(), nil, text)
	if err != nil {
		t.Fatal(err)
	}
	start, _ := tok.Token("<|im_start|>")
	end, _ := tok.Token("<|im_end|>")
	if ids[0] != start || slices.Index(ids, end) < 0 || countOf(ids, start) != 3 || countOf(ids, end) != 2 {
		t.Fatalf("ids %v: want 3 <|im_start|> (%d) and 2 <|im_end|> (%d)", ids, start, end)
	}
}

func countOf(ids []uint32, id uint32) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}
