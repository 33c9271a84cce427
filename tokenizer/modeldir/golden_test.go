package modeldir

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func assetsDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("TOKENIZER_ASSETS")
	if dir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("TOKENIZER_ASSETS is not set: run the tests through make test (hack/tokenizer-assets.sh)")
		}
		t.Skip("TOKENIZER_ASSETS is not set (bash hack/tokenizer-assets.sh prints it)")
	}
	return dir
}

type goldenChat struct {
	Chat []struct {
		Text string   `json:"text"`
		IDs  []uint32 `json:"ids"`
	} `json:"chat"`
}

func readGolden(t testing.TB, model string) goldenChat {
	t.Helper()
	var g goldenChat
	readGz(t, model, &g)
	return g
}

// readGz decodes tokenizer/testdata/golden/<name>.json.gz.
func readGz(t testing.TB, name string, v any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "golden", name+".json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewDecoder(zr).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// TestGoldenPrompts: Encode (render, then tokenize) gives what the
// reference implementation gives for one user message with the generation
// prompt: the ids an engine computes for the same request.
func TestGoldenPrompts(t *testing.T) {
	d := sharedDir(t)
	models, every := []string{"llama3", "qwen3", "deepseek_v3"}, 1
	if raceEnabled {
		// A model load takes seconds under the race detector; the full
		// check runs without it (make test runs both).
		models, every = []string{"llama3"}, 4
	}
	for _, model := range models {
		g := readGolden(t, model)
		if len(g.Chat) < 100 {
			t.Fatalf("%s: %d golden prompts", model, len(g.Chat))
		}
		match, total := 0, 0
		for i, c := range g.Chat {
			if i%every != 0 {
				continue
			}
			total++
			got, err := d.Encode(context.Background(), model, c.Text)
			if err != nil {
				t.Fatalf("%s: %v", model, err)
			}
			if !equal(got, c.IDs) {
				t.Errorf("%s %q:\n got %v\nwant %v", model, c.Text, got, c.IDs)
				continue
			}
			match++
		}
		t.Logf("%s: %d/%d prompts match", model, match, total)
	}
}
