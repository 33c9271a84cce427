package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the README's run command, shortened, and checks the
// picker section: every request was picked and served, later turns hit
// their prefix, and the cached tokens the index predicted are the ones
// the engines delivered, within a few blocks (an engine never reports its
// last token cached; an event can reach the index after the lookup).
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	svgPath := filepath.Join(t.TempDir(), "demo.svg")
	if err := run(ctx, []string{"-rate", "300", "-warmup", "300ms", "-duration", "1s", "-svg", svgPath}, &stdout, &stderr); err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"inferencecache demo: server in process", "| LookupRoute latency |", "| PREFIX_MATCH |",
		"It matches the load generator's count of responses.",
		"## Through the endpoint picker", "48 chat requests", "| prefix | none |", "later turns", "the demo tokenizer",
		"| engine-a |", "| engine-b |", "| engine-c |", "support-4", "own-4"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasSuffix(out, svgPath+"\n") {
		t.Errorf("the demo does not end with the SVG's path %s:\n%s", svgPath, out)
	}
	if svg, err := os.ReadFile(svgPath); err != nil || !bytes.Contains(svg, []byte("Modeled block hit ratio per slice")) {
		t.Errorf("demo SVG: %v\n%.200s", err, svg)
	}
	m := regexp.MustCompile(`later turns (\d+) %`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no later-turn hit ratio:\n%s", out)
	}
	if hit, _ := strconv.Atoi(m[1]); hit < 40 {
		t.Errorf("later turns found %d %% of their prompt cached: the picker did not follow the conversations", hit)
	}
	m = regexp.MustCompile(`: (\d+) predicted, (\d+) delivered`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no predicted/delivered figures:\n%s", out)
	}
	pred, _ := strconv.Atoi(m[1])
	deliv, _ := strconv.Atoi(m[2])
	if deliv == 0 || pred < deliv*8/10 || pred > deliv*12/10 {
		t.Errorf("predicted %d cached tokens, the engines delivered %d", pred, deliv)
	}
	if err := run(ctx, []string{"stray"}, &stdout, &stderr); err == nil {
		t.Error("a stray argument was accepted")
	}
}
