package testbin

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A built binary runs, and it is static (no cgo): what the images ship.
func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a command")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	if err := Build(ctx, dir, "./cmd/kvevent-fake-engine"); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "kvevent-fake-engine")
	goBin, err := GoCommand()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, goBin, "version", "-m", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m: %v\n%s", err, out)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath=true"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("build settings lack %s:\n%s", want, out)
		}
	}
	if err := Build(ctx, dir); err == nil {
		t.Error("building nothing succeeded")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatal(err)
	}
}

// RepoRoot finds the root from a nested module's directory too, as a
// binary built with -trimpath (no absolute source paths) must.
func TestDeclaresMainModule(t *testing.T) {
	root := RepoRoot()
	if !declaresMainModule(filepath.Join(root, "go.mod")) {
		t.Errorf("%s/go.mod does not declare %s", root, modulePath)
	}
	if declaresMainModule(filepath.Join(root, "hack", "images", "go.mod")) {
		t.Error("a nested module's go.mod counts as the main module's")
	}
}
