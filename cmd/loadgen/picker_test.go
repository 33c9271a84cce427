package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPickerCommand runs `loadgen picker` against a server it starts in
// process (the demo tokenizer as its --tokenizer-dir), and writes the
// Markdown and JSON reports.
func TestPickerCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"picker", "-tokenizer-dir", "../demo/tokenizer", "-model", "demo-model", "-endpoints", "4",
		"-conversations", "4", "-turns", "3", "-prompt-tokens", "300", "-concurrency", "2", "-warmup", "200ms", "-duration", "1s",
		"-json", filepath.Join(dir, "r.json"), "-quiet"}
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"Endpoint picker 127.0.0.1:", "(TLS)", "| picks/s |", "| decision (last body chunk to the headers answer) |", "engine feedback", "| outcome | reason | picks |"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "r.json")); err != nil || !bytes.Contains(b, []byte(`"picks_per_s"`)) {
		t.Errorf("JSON report: %v %s", err, b)
	}
	for _, bad := range [][]string{{"picker", "-cache-addr", "127.0.0.1:1", "-addr", "127.0.0.1:2"}, {"picker", "stray"}} {
		if err := run(ctx, bad, &stdout, &stderr); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}
