package rpc_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// genDir is where hack/proto.sh writes the Go code, relative to its output root.
const genDir = "rpc/gen/inferencecache/v1alpha1"

// protocVersionLine matches the header line naming the protoc version in both
// protoc-gen-go ("// \tprotoc        v3.21.12") and protoc-gen-go-grpc
// ("// - protoc             v3.21.12") output. It is the only line that
// depends on which Debian release supplied protoc, so the staleness check
// ignores it (and reports it).
var protocVersionLine = regexp.MustCompile(`(?m)^// (?:\t|- )protoc +(v\S+)$`)

// TestGeneratedCodeIsFresh regenerates the contract's Go code into a temp
// dir with hack/proto.sh and fails when the committed rpc/gen differs.
func TestGeneratedCodeIsFresh(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("cannot find the module root above rpc/: %v", err)
	}
	ci := os.Getenv("CI") == "true"
	for _, bin := range []string{"bash", "protoc"} {
		if _, err := exec.LookPath(bin); err != nil {
			if !ci {
				t.Skipf("%s not found (%v); install protobuf-compiler to run this test (it is mandatory when CI=true)", bin, err)
			}
			if bin == "bash" {
				t.Fatalf("CI=true but bash is missing: %v", err)
			}
			// In CI hack/proto.sh installs protoc itself when it runs as
			// root with apt-get; if it cannot, it fails and so do we.
			t.Logf("CI=true and protoc is missing; hack/proto.sh will try to install it")
		}
	}

	// Bound the run: building the two plugins on a busy machine can be slow,
	// but never let it outlive the test binary's own deadline.
	budget := 8 * time.Minute
	if dl, ok := t.Deadline(); ok {
		budget = min(budget, time.Until(dl)-15*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()

	out := t.TempDir()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack", "proto.sh"), out)
	cmd.Dir = root
	cmd.WaitDelay = 5 * time.Second
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			t.Fatalf("hack/proto.sh did not finish within %v:\n%s", budget, log.String())
		}
		if !ci && strings.Contains(log.String(), "protoc not found") {
			t.Skipf("protoc unavailable:\n%s", log.String())
		}
		t.Fatalf("hack/proto.sh failed: %v\n%s", err, log.String())
	}

	committed := filepath.Join(root, genDir)
	fresh := filepath.Join(out, genDir)
	want := pbFiles(t, fresh)
	have := pbFiles(t, committed)
	if !slices.Equal(want, have) {
		t.Fatalf("generated code is stale: hack/proto.sh produces %v but %s holds %v.\n"+
			"Run hack/proto.sh and commit %s.", want, genDir, have, genDir)
	}
	for _, name := range want {
		got := readFile(t, filepath.Join(committed, name))
		exp := readFile(t, filepath.Join(fresh, name))
		if v1, v2 := protocVersion(got), protocVersion(exp); v1 != v2 {
			t.Logf("%s: committed code names protoc %s, this machine has %s; that header line is ignored", name, v1, v2)
		}
		got = protocVersionLine.ReplaceAll(got, []byte("// protoc <version>"))
		exp = protocVersionLine.ReplaceAll(exp, []byte("// protoc <version>"))
		if !bytes.Equal(got, exp) {
			t.Errorf("generated code is stale: %s/%s differs from what hack/proto.sh produces from the .proto.\n%s\n"+
				"Run hack/proto.sh and commit %s.", genDir, name, firstDiff(got, exp), genDir)
		}
	}
}

func pbFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range names {
		names[i] = filepath.Base(n)
	}
	slices.Sort(names)
	return names
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("cannot read generated file: %v", err)
	}
	return b
}

func protocVersion(src []byte) string {
	if m := protocVersionLine.FindSubmatch(src); m != nil {
		return string(m[1])
	}
	return "(none)"
}

// firstDiff describes the first line where committed and regenerated differ.
func firstDiff(committed, regenerated []byte) string {
	a := strings.Split(string(committed), "\n")
	b := strings.Split(string(regenerated), "\n")
	for i := 0; i < max(len(a), len(b)); i++ {
		var la, lb string
		if i < len(a) {
			la = a[i]
		}
		if i < len(b) {
			lb = b[i]
		}
		if la != lb || i >= len(a) || i >= len(b) {
			return fmt.Sprintf("first difference at line %d:\n  committed:   %q\n  regenerated: %q", i+1, la, lb)
		}
	}
	return "files differ"
}
