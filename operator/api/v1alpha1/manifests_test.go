package v1alpha1_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/inferencecache/inferencecache/internal/testbin"
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
	// controller-gen is built, and loads the packages, with the binaries'
	// flags: the Kubernetes packages it shares with ./cmd/... are then
	// compiled once, by the build `make test` starts with.
	cmd.Env = append(os.Environ(), testbin.Env...)
	cmd.Env = append(cmd.Env, "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" "+strings.Join(testbin.Flags, " ")))
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

// TestDurationPatternMatchesParseDuration: the schema pattern on the
// metav1.Duration fields admits exactly the strings time.ParseDuration
// parses (short of overflow), so a stored object always decodes and a
// typed list never fails on one bad field.
func TestDurationPatternMatchesParseDuration(t *testing.T) {
	_, self, _, _ := runtime.Caller(0)
	crds := filepath.Join(filepath.Dir(self), "..", "..", "config", "crd", "bases")
	pattern := func(file string, path ...string) *regexp.Regexp {
		t.Helper()
		raw, err := os.ReadFile(filepath.Join(crds, file))
		if err != nil {
			t.Fatal(err)
		}
		var crd map[string]any
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			t.Fatal(err)
		}
		node := crd["spec"].(map[string]any)["versions"].([]any)[0].(map[string]any)["schema"].(map[string]any)["openAPIV3Schema"]
		for _, p := range path {
			node = node.(map[string]any)["properties"].(map[string]any)[p]
		}
		s, _ := node.(map[string]any)["pattern"].(string)
		if s == "" {
			t.Fatalf("%s %v has no pattern", file, path)
		}
		return regexp.MustCompile(s)
	}
	res := []*regexp.Regexp{
		pattern("inferencecache.io_cachepolicies.yaml", "spec", "evictionTTL"),
		pattern("inferencecache.io_cachebackends.yaml", "spec", "integration", "firstEventTimeout"),
	}
	for _, s := range []string{
		"15m", "1h30m", "1.5h", ".5s", "1.s", "0", "-0", "+0", "0s", "-1m0s", "500ms", "1µs", "1μs", "2us", "3ns", "1h2m3s4ms5us6ns",
		"", "15", "m", "1d", "1w", "15 m", " 15m", "15m ", "1h-30m", "--1s", "1e3s", ".s", "1..5s", "abc", "1S", "1H",
	} {
		_, err := time.ParseDuration(s)
		for _, re := range res {
			if got := re.MatchString(s); got != (err == nil) {
				t.Errorf("%q: pattern %v, time.ParseDuration error %v", s, got, err)
			}
		}
	}
}
