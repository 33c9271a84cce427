package testbin

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNestedModulesShareVersions checks that every module a nested module
// and the main module both build from is at the same version in both. The
// go command caches a compiled package by its sources and its
// dependencies', so one differing version (golang.org/x/net, say) makes
// every package above it compile again for the nested module: before this
// check, rulestest and dashgen recompiled the whole Kubernetes and gRPC
// tree under -race, 3.6 of the 32 minutes of a cold `make test`. The fix
// for a failure is to raise the lower side (`go get mod@version` in the
// main module or the nested one, then `go mod tidy`).
func TestNestedModulesShareVersions(t *testing.T) {
	if testing.Short() {
		t.Skip("lists every package's module")
	}
	root := RepoRoot()
	goCmd, err := GoCommand()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	// The modules `make test` tests after the main one: the Makefile's list.
	var nested []string
	for line := range strings.Lines(string(mk)) {
		if rest, ok := strings.CutPrefix(line, "NESTED_MODULES :="); ok {
			nested = strings.Fields(rest)
		}
	}
	if len(nested) == 0 {
		t.Fatal("the Makefile lists no NESTED_MODULES")
	}
	main := builtModules(ctx, t, goCmd, root)
	for _, m := range nested {
		t.Run(m, func(t *testing.T) {
			dir := filepath.Join(root, m)
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
				t.Fatalf("%s, listed in the Makefile's NESTED_MODULES: %v", m, err)
			}
			var differ []string
			for path, v := range builtModules(ctx, t, goCmd, dir) {
				if mv, ok := main[path]; ok && mv != v && path != mainModule {
					differ = append(differ, path+" "+mv+" (main) vs "+v)
				}
			}
			slices.Sort(differ)
			if len(differ) > 0 {
				t.Errorf("%s builds %d modules at other versions than the main module, so their packages compile twice:\n\t%s",
					m, len(differ), strings.Join(differ, "\n\t"))
			}
		})
	}
}

const mainModule = "github.com/inferencecache/inferencecache"

// builtModules maps each module that provides a package the module in dir
// builds (its packages, their tests and dependencies) to its version.
func builtModules(ctx context.Context, t *testing.T, goCmd, dir string) map[string]string {
	t.Helper()
	cmd := exec.CommandContext(ctx, goCmd, "list", "-mod=readonly", "-deps", "-test",
		"-f", "{{with .Module}}{{.Path}} {{.Version}}{{end}}", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v (a missing go.sum entry: run go mod tidy there)\n%s", dir, err, stderr.Bytes())
	}
	mods := map[string]string{}
	for line := range strings.Lines(string(out)) {
		if path, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			mods[path] = v
		} else if path != "" {
			mods[path] = ""
		}
	}
	return mods
}
