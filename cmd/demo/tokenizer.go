package main

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// demoTokenizerFS holds the demo model's tokenizer: a byte-level BPE with
// merges learned from hack/demotokenizer/corpus.txt and a ChatML chat
// template (regenerate: go run ./hack/demotokenizer). Real tokenizer.json
// files are 2-35 MB; this one is 24 KB and loads through the same code.
//
//go:embed tokenizer
var demoTokenizerFS embed.FS

// writeDemoTokenizer lays the embedded files out as a --tokenizer-dir in a
// new temporary folder and returns it; the caller removes it.
func writeDemoTokenizer() (string, error) {
	dir, err := os.MkdirTemp("", "inferencecache-demo-tokenizers-")
	if err != nil {
		return "", fmt.Errorf("cannot write the demo tokenizer: %w", err)
	}
	err = fs.WalkDir(demoTokenizerFS, "tokenizer", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("tokenizer", filepath.FromSlash(path))
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		data, err := demoTokenizerFS.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), data, 0o644)
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("cannot write the demo tokenizer: %w", err)
	}
	return dir, nil
}

// readModelFiles reads model's tokenizer.json and tokenizer_config.json
// from a --tokenizer-dir, for the fake engines.
func readModelFiles(dir, model string) (tok, cfg []byte, err error) {
	base := filepath.Join(dir, filepath.FromSlash(model))
	if tok, err = os.ReadFile(filepath.Join(base, "tokenizer.json")); err != nil {
		return nil, nil, fmt.Errorf("cannot read the model's tokenizer: %w", err)
	}
	if cfg, err = os.ReadFile(filepath.Join(base, "tokenizer_config.json")); err != nil {
		return nil, nil, fmt.Errorf("cannot read the model's tokenizer config: %w", err)
	}
	return tok, cfg, nil
}
