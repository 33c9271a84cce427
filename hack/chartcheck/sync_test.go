package chartcheck

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A copy is a folder (or one file) of operator/config the chart carries
// verbatim under files/, because a chart cannot read outside its own
// directory: generated manifests (CRDs, the controller's role, the webhook
// configurations) and the alert rules and dashboards. The templates read
// them with .Files; TestChartMatchesKustomize checks what they render.
type copySpec struct {
	src, dst string // relative to operator/config and to the chart
	glob     string // for folders: the files copied; "" for one file
	optional bool   // the source folder may not exist (then dst must be empty)
}

var copies = []copySpec{
	{src: "crd/bases", dst: "files/crds", glob: "*.yaml"},
	{src: "rbac/role.yaml", dst: "files/rbac-role.yaml"},
	{src: "webhook/manifests.yaml", dst: "files/webhook-manifests.yaml"},
	{src: "prometheus/prometheusrule.yaml", dst: "files/prometheusrule.yaml"},
	{src: "grafana", dst: "files/dashboards", glob: "*.json", optional: true},
}

// filesOf lists the base names of dir's files matching glob; a missing
// dir has none.
func filesOf(t *testing.T, dir, glob string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, glob))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range matches {
		names = append(names, filepath.Base(m))
	}
	slices.Sort(names)
	return names
}

// TestChartCopiesInSync: each copy under charts/inferencecache/files is
// byte for byte its source in operator/config, with no file more or less.
// `make chart-sync` (this test with -rewrite) brings them back in line.
func TestChartCopiesInSync(t *testing.T) {
	for _, c := range copies {
		src, dst := filepath.Join(configDir, c.src), filepath.Join(chartDir, c.dst)
		if c.glob == "" {
			checkCopy(t, src, dst)
			continue
		}
		if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) && c.optional {
			// The source folder is not there (yet): the chart carries none.
		} else if err != nil {
			t.Fatal(err)
		}
		want, have := filesOf(t, src, c.glob), filesOf(t, dst, c.glob)
		for _, name := range have {
			if !slices.Contains(want, name) {
				if *rewrite {
					if err := os.Remove(filepath.Join(dst, name)); err != nil {
						t.Fatal(err)
					}
					continue
				}
				t.Errorf("%s/%s has no source in operator/config/%s; run `make chart-sync`", c.dst, name, c.src)
			}
		}
		for _, name := range want {
			checkCopy(t, filepath.Join(src, name), filepath.Join(dst, name))
		}
	}
}

func checkCopy(t *testing.T, src, dst string) {
	t.Helper()
	want := readFile(t, src)
	have, err := os.ReadFile(dst)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	if bytes.Equal(want, have) {
		return
	}
	if *rewrite {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s is not a copy of %s; run `make chart-sync`", rel(dst), rel(src))
}

func rel(p string) string {
	r, err := filepath.Rel(repoRoot, p)
	if err != nil {
		return p
	}
	return r
}
