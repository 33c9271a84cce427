// Package testbin builds the repository's commands for tests that run them
// as processes (chaos, the KV-event end-to-end suite, the operator's
// binary and flag checks, the server's memory test, loadgen's profile
// run).
//
// Every such build uses the flags of the shipped images (Flags, Env: static
// and path-free, as hack/images builds them), and `make test` compiles
// ./cmd/... with the same flags once before the tests start (its GOFLAGS,
// -pgo=off, reach these builds through the environment). The go
// command caches a compiled package per flag set, so one flag set means
// each dependency is compiled once for all of them and a test's build is
// little more than a link; before, plain, -pgo=off and image builds
// compiled the whole dependency tree three or four times over.
package testbin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Flags are the go build flags every test binary is built with (the
// images add only link flags, which do not change what is compiled).
var Flags = []string{"-trimpath"}

// Env is what a test build adds to the environment.
var Env = []string{"CGO_ENABLED=0"}

// GoCommand returns the go command: the one on PATH, else $GOROOT/bin/go.
func GoCommand() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("cannot find the go command on PATH or under $GOROOT")
}

// modulePath is the main module's path.
const modulePath = "github.com/inferencecache/inferencecache"

// RepoRoot is the repository's root directory: from this file's path, or,
// in a binary built with -trimpath (whose paths are import paths), the
// nearest directory above the working directory (a test's package
// directory) whose go.mod declares the main module.
func RepoRoot() string {
	if _, self, _, ok := runtime.Caller(0); ok && filepath.IsAbs(self) {
		return filepath.Join(filepath.Dir(self), "..", "..")
	}
	dir, err := os.Getwd()
	if err != nil {
		return "."
	}
	for {
		if declaresMainModule(filepath.Join(dir, "go.mod")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "."
		}
		dir = parent
	}
}

// declaresMainModule reports whether the go.mod at path is the main
// module's (a nested module's names a path below it).
func declaresMainModule(path string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`) == modulePath
		}
	}
	return false
}

// Build builds the main packages pkgs (import paths, or paths like
// ./cmd/server relative to the repository root) into dir, one binary
// each, named after the package's last element.
func Build(ctx context.Context, dir string, pkgs ...string) error {
	if len(pkgs) == 0 {
		return errors.New("testbin: no package to build")
	}
	goBin, err := GoCommand()
	if err != nil {
		return err
	}
	args := append([]string{"build"}, Flags...)
	args = append(args, "-o", dir+string(os.PathSeparator))
	args = append(args, pkgs...)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), Env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cannot build (go %s): %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
