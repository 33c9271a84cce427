package v1alpha1_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// TestGeneratedFilesUpToDate regenerates the deep-copy code, CRDs, RBAC role
// and webhook configuration into a temporary directory with
// hack/manifests.sh and fails when a committed file differs: run
// `bash hack/manifests.sh` and commit the result.
func TestGeneratedFilesUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs controller-gen; skipped with -short")
	}
	_, self, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(self), "..", "..", "..")
	out := t.TempDir()
	cmd := exec.Command("bash", filepath.Join(root, "hack", "manifests.sh"), out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/manifests.sh: %v\n%s", err, b)
	}
	pairs := map[string]string{
		filepath.Join(out, "zz_generated.deepcopy.go"):  filepath.Join(root, "operator", "api", "v1alpha1", "zz_generated.deepcopy.go"),
		filepath.Join(out, "rbac", "role.yaml"):         filepath.Join(root, "operator", "config", "rbac", "role.yaml"),
		filepath.Join(out, "webhook", "manifests.yaml"): filepath.Join(root, "operator", "config", "webhook", "manifests.yaml"),
	}
	crds, err := filepath.Glob(filepath.Join(out, "crd", "bases", "*.yaml"))
	if err != nil || len(crds) != 6 {
		t.Fatalf("generated %d CRDs (%v), want 6", len(crds), err)
	}
	for _, f := range crds {
		pairs[f] = filepath.Join(root, "operator", "config", "crd", "bases", filepath.Base(f))
	}
	committed, _ := filepath.Glob(filepath.Join(root, "operator", "config", "crd", "bases", "*.yaml"))
	if len(committed) != len(crds) {
		t.Errorf("operator/config/crd/bases has %d files, the generator makes %d", len(committed), len(crds))
	}
	for gen, want := range pairs {
		g, err := os.ReadFile(gen)
		if err != nil {
			t.Fatal(err)
		}
		w, err := os.ReadFile(want)
		if err != nil {
			t.Errorf("%v (run bash hack/manifests.sh)", err)
			continue
		}
		if !bytes.Equal(g, w) {
			t.Errorf("%s is stale: run bash hack/manifests.sh and commit the result", want)
		}
	}
}
