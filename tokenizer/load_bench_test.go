package tokenizer

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkLoad: parsing a real tokenizer.json (a model's first request
// waits for it).
func BenchmarkLoad(b *testing.B) {
	for _, model := range []string{"llama3", "qwen3"} {
		b.Run(model, func(b *testing.B) {
			data, err := os.ReadFile(filepath.Join(assetsDir(b), model, "tokenizer.json"))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Load(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEncode8k: about 8.7k Llama 3 tokens of the golden corpus, with
// the per-word cache warm (a server's steady state) and cold (emptied
// before every encode: every word merged).
func BenchmarkEncode8k(b *testing.B) {
	var corpus []string
	readGz(b, "testdata/golden/corpus.json.gz", &corpus)
	tk := loadModel(b, "llama3")
	var sb []byte
	for i := 0; len(sb) < 22000; i++ {
		sb = append(append(sb, corpus[i%len(corpus)]...), '\n')
	}
	text := string(sb)
	for _, cold := range []bool{false, true} {
		name := "warm"
		if cold {
			name = "cold"
		}
		b.Run(name, func(b *testing.B) {
			ids, _ := tk.Encode(b.Context(), nil, text)
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if cold {
					tk.model.cache.init()
				}
				ids, _ = tk.Encode(b.Context(), ids[:0], text)
			}
			b.ReportMetric(float64(len(ids)), "tokens")
		})
	}
}
