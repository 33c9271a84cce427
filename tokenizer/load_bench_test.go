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
