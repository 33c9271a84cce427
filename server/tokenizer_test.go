package server_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

// writeTinyModel lays out DIR/<id>/ with a char-level BPE tokenizer ("<s>"
// special, one merge "h i") and a template "<s>U:{content}\nA:".
func writeTinyModel(t *testing.T, root, id string) {
	t.Helper()
	vocab := map[string]int{"<unk>": 0, "<s>": 1}
	for i, r := range "abcdefghijklmnopqrstuvwxyzU:A \n" {
		vocab[string(r)] = 2 + i
	}
	vocab["hi"] = len(vocab)
	tok, err := json.Marshal(map[string]any{
		"added_tokens": []map[string]any{{"id": 1, "content": "<s>", "special": true}},
		"model":        map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{"h i"}, "unk_token": "<unk>"},
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, filepath.FromSlash(id))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := `{"bos_token": "<s>", "chat_template": "{{ bos_token }}U:{{ messages[0].content }}\nA:"}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestTokenizerDirMustExist(t *testing.T) {
	cfg := testConfig()
	cfg.TokenizerDir = filepath.Join(t.TempDir(), "missing")
	if _, err := server.New(cfg); !errors.Is(err, server.ErrInvalidConfig) {
		t.Fatalf("New: %v, want ErrInvalidConfig", err)
	}
}

// TestTokenizerDirServesPromptText: with --tokenizer-dir, prompt_text is
// rendered, tokenized and echoed; an unknown model fails open, counted by
// reason; the metrics exist.
func TestTokenizerDirServesPromptText(t *testing.T) {
	root := t.TempDir()
	writeTinyModel(t, root, "org/tiny")
	cfg := testConfig()
	cfg.TokenizerDir = root
	r := start(t, cfg)

	resp, err := r.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "t", ModelId: "org/tiny", HashScheme: "vllm", PromptText: "hi ab"})
	if err != nil {
		t.Fatal(err)
	}
	// <s> U : hi ' ' a b \n A :
	if want := []uint32{1, 28, 29, 33, 31, 2, 3, 32, 30, 29}; !slices.Equal(resp.TokenIds, want) {
		t.Fatalf("echoed %v, want %v", resp.TokenIds, want)
	}
	resp, err = r.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "t", ModelId: "org/none", HashScheme: "vllm", PromptText: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.ReasonCode != "NO_HINT" || len(resp.TokenIds) != 0 {
		t.Fatalf("unknown model: %s with %d tokens, want NO_HINT and none", resp.ReasonCode, len(resp.TokenIds))
	}

	fams := servertest.Scrape(t, r.Server)
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{"inferencecache_tokenizations_total", "", 1},
		{"inferencecache_tokenize_latency_seconds", "", 1},
		{"inferencecache_tokenize_failures_total", "reason=not_found", 1},
		{"inferencecache_tokenize_failures_total", "reason=invalid_model", 0},
		{"inferencecache_tokenizer_loads_total", "result=ok", 1},
		{"inferencecache_tokenizer_loads_total", "result=error", 1},
	} {
		if v, ok := servertest.Value(fams, c.name, c.labels); !ok || v != c.want {
			t.Errorf("%s{%s} = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
}
