package testbin

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRaceSkippedRunsInFull checks the Makefile's promise that what the
// -race run shrinks or skips runs in full without it: every test whose
// body consults raceEnabled (the build-tagged constant a package's tests
// define) must match RACE_SKIPPED_RUN and sit in a package of
// RACE_SKIPPED_PACKAGES. Otherwise its full size, or the whole check (an
// allocation count, a memory bound), never runs in CI.
func TestRaceSkippedRunsInFull(t *testing.T) {
	root := RepoRoot()
	run, err := regexp.Compile(strings.ReplaceAll(makefileVar(t, root, "RACE_SKIPPED_RUN"), "$$", "$"))
	if err != nil {
		t.Fatalf("RACE_SKIPPED_RUN: %v", err)
	}
	pkgs := strings.Fields(makefileVar(t, root, "RACE_SKIPPED_PACKAGES"))
	covered := func(dir string) bool {
		rel, _ := filepath.Rel(root, dir)
		rel = "./" + filepath.ToSlash(rel)
		for _, p := range pkgs {
			if tree, ok := strings.CutSuffix(p, "/..."); ok {
				if rel == tree || strings.HasPrefix(rel, tree+"/") {
					return true
				}
			} else if strings.TrimSuffix(p, "/") == rel {
				return true
			}
		}
		return false
	}
	fset := token.NewFileSet()
	found := 0
	// Nested modules are tested without -race.
	for _, path := range goFiles(t, root, false, "_test.go") {
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || fd.Body == nil || !strings.HasPrefix(fd.Name.Name, "Test") || !mentions(fd.Body, "raceEnabled") {
				continue
			}
			found++
			rel, _ := filepath.Rel(root, path)
			if !run.MatchString(fd.Name.Name) {
				t.Errorf("%s: %s consults raceEnabled but does not match the Makefile's RACE_SKIPPED_RUN, so it never runs in full", rel, fd.Name.Name)
			}
			if !covered(filepath.Dir(path)) {
				t.Errorf("%s: %s consults raceEnabled but its package is not in the Makefile's RACE_SKIPPED_PACKAGES", rel, fd.Name.Name)
			}
		}
	}
	if found == 0 {
		t.Fatal("no test consults raceEnabled: the walk is looking in the wrong place")
	}
}

// mentions reports whether the identifier name occurs in n.
func mentions(n ast.Node, name string) bool {
	seen := false
	ast.Inspect(n, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == name {
			seen = true
		}
		return !seen
	})
	return seen
}

// makefileVar returns the value of a `NAME := value` line of the Makefile.
func makefileVar(t *testing.T, root, name string) string {
	t.Helper()
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(mk)) {
		if rest, ok := strings.CutPrefix(line, name+" :="); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("the Makefile defines no %s", name)
	return ""
}

// TestNoNATSServerLinkedIntoTests keeps the NATS server out of the test
// binaries: a test starts it with bus/bustest, as a process built once
// without -race. Imported by a test, nats-server/v2/server is compiled
// again with the race detector and linked into that test binary, minutes
// of the cold budget for code the race detector need not watch.
func TestNoNATSServerLinkedIntoTests(t *testing.T) {
	const banned = "github.com/nats-io/nats-server/v2/"
	root := RepoRoot()
	fset := token.NewFileSet()
	files := goFiles(t, root, true, ".go")
	if len(files) == 0 {
		t.Fatal("no Go file found: the walk is looking in the wrong place")
	}
	for _, path := range files {
		file, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			if p := strings.Trim(imp.Path.Value, `"`); strings.HasPrefix(p, banned) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s imports %s: start NATS with bus/bustest instead", rel, p)
			}
		}
	}
}

// goFiles lists the files under root whose names end in suffix, skipping
// hidden directories and testdata, and nested modules unless withNested.
func goFiles(t *testing.T, root string, withNested bool, suffix string) []string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			if strings.HasSuffix(path, suffix) {
				paths = append(paths, path)
			}
			return nil
		}
		if path == root {
			return nil
		}
		if n := d.Name(); strings.HasPrefix(n, ".") || n == "testdata" {
			return filepath.SkipDir
		}
		if !withNested {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}
