package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/internal/testbin"
)

// buildServer builds ./cmd/server into dir.
func buildServer(t *testing.T, dir string) string {
	t.Helper()
	if _, err := testbin.GoCommand(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := testbin.Build(ctx, dir, "./cmd/server"); err != nil {
		t.Fatalf("cannot build the server: %v", err)
	}
	return filepath.Join(dir, "server")
}

func TestProfileAndAB(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the server binary")
	}
	dir := t.TempDir()
	bin := buildServer(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	out := filepath.Join(dir, "profiles")
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"profile", "-server", bin, "-out", out, "-rate", "300", "-warmup", "300ms", "-duration", "2s", "-quiet"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("profile: %v\n%s", err, stderr.String())
	}
	for _, name := range []string{"cpu", "heap", "allocs", "mutex", "block"} {
		b, err := os.ReadFile(filepath.Join(out, name+".pprof"))
		if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s.pprof is not a gzipped profile (%v, %d bytes)", name, err, len(b))
		}
	}
	for _, name := range []string{"loadgen.json", "loadgen.md"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Error(err)
		}
	}
	if !strings.Contains(stdout.String(), "µs of CPU per lookup") {
		t.Errorf("profile printed no server CPU figure:\n%s", stdout.String())
	}

	stdout.Reset()
	stderr.Reset()
	err = run(ctx, []string{"ab", "-a", bin, "-b", bin, "-rounds", "2", "-warmup", "200ms", "-duration", "1s", "-concurrency", "2",
		"-out", filepath.Join(dir, "ab"), "-quiet"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("ab: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"| throughput /s |", "| server CPU µs / lookup |", "round 2: A | B | B/A |"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("ab output lacks %q:\n%s", want, stdout.String())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ab", "b-2.json")); err != nil {
		t.Error(err)
	}

	// A binary that is not a server fails fast and says why.
	if err := run(ctx, []string{"profile", "-server", "/bin/false", "-out", out, "-duration", "2s", "-quiet"}, &stdout, &stderr); err == nil {
		t.Error("profiling /bin/false succeeded")
	}
	for _, args := range [][]string{{"profile"}, {"profile", "-server", bin, "-duration", "1s"}, {"ab", "-a", bin}, {"ab", "-a", bin, "-b", bin, "-rounds", "0"}} {
		if err := run(ctx, args, &stdout, &stderr); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
