package chartcheck

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// A scenario renders the chart with the defaults plus some examples/
// values files, and kustomize with the overlays they stand for; the two
// must produce the same objects.
type scenario struct {
	name     string
	examples []string // charts/inferencecache/examples/NAME.yaml
	overlays []string // operator/config/NAME, their union
}

var scenarios = []scenario{
	{name: "default", overlays: []string{"default"}},
	{name: "scaleout", examples: []string{"scaleout"}, overlays: []string{"scaleout"}},
	{name: "gateway", examples: []string{"gateway"}, overlays: []string{"gateway"}},
	{name: "monitoring", examples: []string{"monitoring"}, overlays: []string{"default", "prometheus"}},
}

// chartMeta is what the comparison needs of Chart.yaml.
type chartMeta struct {
	Name       string `json:"name"`
	Version    string `json:"version"`
	AppVersion string `json:"appVersion"`
}

func loadChartMeta(t *testing.T) chartMeta {
	t.Helper()
	var m chartMeta
	if err := yaml.Unmarshal(readFile(t, filepath.Join(chartDir, "Chart.yaml")), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// helmLabels are the labels the chart puts on every object's metadata for
// Helm's bookkeeping (release, chart version). operator/config has none of
// them; they are the one addition the comparison removes, after checking
// each is there with its value.
func helmLabels(m chartMeta) map[string]string {
	return map[string]string{
		"helm.sh/chart":                m.Name + "-" + m.Version,
		"app.kubernetes.io/managed-by": "Helm",
		"app.kubernetes.io/instance":   "inferencecache",
		"app.kubernetes.io/version":    m.AppVersion,
	}
}

// stripHelmAdditions removes, after checking them, what the chart adds on
// purpose to an object operator/config also has: Helm's labels, and the
// keep policy of the CRDs (crds.keep).
func stripHelmAdditions(t *testing.T, o object, want map[string]string) {
	t.Helper()
	meta := o["metadata"].(map[string]any)
	labels, _ := meta["labels"].(map[string]any)
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("%s: label %s=%v, want %q", id(o), k, labels[k], v)
		}
		delete(labels, k)
	}
	if len(labels) == 0 {
		delete(meta, "labels")
	}
	if str(o, "kind") == "CustomResourceDefinition" {
		ann, _ := meta["annotations"].(map[string]any)
		if ann["helm.sh/resource-policy"] != "keep" {
			t.Errorf("%s: no helm.sh/resource-policy: keep (crds.keep defaults to true)", id(o))
		}
		delete(ann, "helm.sh/resource-policy")
		if len(ann) == 0 {
			delete(meta, "annotations")
		}
	}
}

// TestChartMatchesKustomize is the one-source-of-truth check: for each
// scenario, every object kustomize builds from operator/config is rendered
// by the chart, field for field (kinds, names, namespaces, images, args,
// env, ports, probes, resources, RBAC rules, webhook configurations,
// NetworkPolicy rules, PDBs, CRD schemas, alert rules, dashboards), and
// the chart renders nothing more. The differences on purpose, each
// checked rather than ignored:
//   - the Namespace object: a chart installs into its release namespace
//     (`helm install -n inferencecache-system --create-namespace`), so it
//     does not render one;
//   - Helm's four bookkeeping labels on every object's metadata (not on
//     pod templates or selectors);
//   - `helm.sh/resource-policy: keep` on the CRDs.
func TestChartMatchesKustomize(t *testing.T) {
	meta := loadChartMeta(t)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			var files []string
			for _, e := range sc.examples {
				files = append(files, exampleValues(e))
			}
			chart := map[string]object{}
			for _, o := range renderChart(t, releaseNamespace, files, nil) {
				if _, dup := chart[id(o)]; dup {
					t.Errorf("chart renders %s twice", id(o))
				}
				stripHelmAdditions(t, o, helmLabels(meta))
				chart[id(o)] = o
			}
			kust := map[string]object{}
			for _, dir := range sc.overlays {
				for _, o := range renderKustomize(t, filepath.Join(configDir, dir)) {
					kust[id(o)] = o
				}
			}
			const ns = "Namespace.//" + releaseNamespace
			if _, ok := kust[ns]; !ok {
				t.Errorf("kustomize renders no %s; the chart relies on the release namespace being it", ns)
			}
			delete(kust, ns)

			var ids []string
			for k := range kust {
				ids = append(ids, k)
			}
			for k := range chart {
				if _, ok := kust[k]; !ok {
					ids = append(ids, k)
				}
			}
			sort.Strings(ids)
			for _, k := range ids {
				c, inChart := chart[k]
				u, inKust := kust[k]
				switch {
				case !inChart:
					t.Errorf("%s: operator/config renders it, the chart does not", k)
				case !inKust:
					t.Errorf("%s: the chart renders it, operator/config does not", k)
				default:
					if d := cmp.Diff(u, c); d != "" {
						t.Errorf("%s differs (-operator/config +chart):\n%s", k, d)
					}
				}
			}
			if len(chart) < 10 {
				t.Errorf("the chart rendered only %d objects", len(chart))
			}
		})
	}
}

// TestExamplesAreCompared: every examples/ values file stands for an
// overlay and is compared against it above, so none can go stale.
func TestExamplesAreCompared(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join(chartDir, "examples"))
	if err != nil {
		t.Fatal(err)
	}
	var used []string
	for _, sc := range scenarios {
		used = append(used, sc.examples...)
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".yaml")
		if !ok || !slices.Contains(used, name) {
			t.Errorf("examples/%s is compared against no operator/config overlay", e.Name())
		}
	}
}
