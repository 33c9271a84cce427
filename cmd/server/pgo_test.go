package main

import (
	"bufio"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/internal/testbin"
)

const module = "github.com/inferencecache/inferencecache/"

// TestDefaultProfile checks default.pgo, which `make test` builds without
// (GOFLAGS=-pgo=off there, see the Makefile): the compiler's own reader
// must accept it, as `go build` does before it compiles anything, and the
// functions of ours it names must still exist, or the profile guides
// inlining of code that is gone and needs a refresh (profiles/README.md).
func TestDefaultProfile(t *testing.T) {
	goBin, err := testbin.GoCommand()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := filepath.Join(t.TempDir(), "profile.txt")
	if b, err := exec.CommandContext(ctx, goBin, "tool", "preprofile", "-i", "default.pgo", "-o", out).CombinedOutput(); err != nil {
		t.Fatalf("go tool preprofile rejects default.pgo: %v\n%s", err, b)
	}
	named := profiledFunctions(t, out)
	if len(named) < 20 {
		t.Fatalf("default.pgo names %d functions of ours, want a profile of the server's hot paths", len(named))
	}
	defined := definedFunctions(t, testbin.RepoRoot())
	var gone []string
	for fn := range named {
		if !defined[fn] {
			gone = append(gone, fn)
		}
	}
	t.Logf("%d functions of ours in default.pgo, %d gone: %v", len(named), len(gone), gone)
	// A few renames are harmless (the compiler ignores what it cannot
	// match); a quarter gone means the hot paths were rewritten since.
	if 4*len(gone) > len(named) {
		t.Errorf("%d of the %d functions of ours in default.pgo no longer exist (%v): refresh it (profiles/README.md)", len(gone), len(named), gone)
	}
}

// closure matches the suffixes the compiler gives closures and their
// inlined copies (F.func1, F.func1.2, F.gowrap3).
var closure = regexp.MustCompile(`\.(func|gowrap)\d+(\.\d+)*$|\.\d+$`)

// profiledFunctions returns the functions of this module that the
// preprocessed profile names, as "pkg/path.Func", "pkg/path.(*T).M" or
// "pkg/path.T.M", closures folded into the function that holds them.
func profiledFunctions(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fns := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, module) {
			continue
		}
		name := line
		for {
			trimmed := closure.ReplaceAllString(name, "")
			if trimmed == name {
				break
			}
			name = trimmed
		}
		if i := strings.Index(name, "["); i >= 0 { // generic instantiation
			name = name[:i] + name[strings.LastIndex(name, "]")+1:]
		}
		fns[name] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return fns
}

// definedFunctions returns every function and method declared in the
// module's non-test Go files, named as profiledFunctions names them.
func definedFunctions(t *testing.T, root string) map[string]bool {
	t.Helper()
	defs := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // a nested module
				}
				if n := d.Name(); strings.HasPrefix(n, ".") || n == "testdata" || n == "bin" {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := module + filepath.ToSlash(rel)
		if file.Name.Name == "main" {
			pkg = "main"
		}
		for _, decl := range file.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if fd.Recv == nil || len(fd.Recv.List) == 0 {
				defs[pkg+"."+fd.Name.Name] = true
				continue
			}
			recv := fd.Recv.List[0].Type
			ptr := false
			if s, ok := recv.(*ast.StarExpr); ok {
				ptr, recv = true, s.X
			}
			switch r := recv.(type) { // drop type parameters
			case *ast.IndexExpr:
				recv = r.X
			case *ast.IndexListExpr:
				recv = r.X
			}
			id, ok := recv.(*ast.Ident)
			if !ok {
				continue
			}
			if ptr {
				defs[pkg+".(*"+id.Name+")."+fd.Name.Name] = true
			} else {
				defs[pkg+"."+id.Name+"."+fd.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return defs
}
