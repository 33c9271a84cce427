package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the README's run command, shortened.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, []string{"-rate", "300", "-warmup", "300ms", "-duration", "1s"}, &stdout, &stderr); err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"inferencecache demo: server in process", "| LookupRoute latency |", "| PREFIX_MATCH |",
		"It matches the load generator's count of responses.",
		"## Through the endpoint picker", "| prefix | none |", "later turns"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if err := run(ctx, []string{"stray"}, &stdout, &stderr); err == nil {
		t.Error("a stray argument was accepted")
	}
}
