package chartcheck

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/cli/values"
	"helm.sh/helm/v4/pkg/getter"
	release "helm.sh/helm/v4/pkg/release/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// rewrite regenerates what this package keeps in sync by copying or
// generating: the chart's files/ copies of generated manifests and the
// values table of the chart's README.
var rewrite = flag.Bool("rewrite", false, "rewrite the chart's copies of operator/config files and its README values table")

const (
	repoRoot  = "../.."
	chartDir  = repoRoot + "/charts/inferencecache"
	configDir = repoRoot + "/operator/config"
	// releaseNamespace is the namespace operator/config/default installs
	// into; the chart is rendered there for the comparisons.
	releaseNamespace = "inferencecache-system"
	// minKubeVersion is the oldest Kubernetes Chart.yaml's kubeVersion
	// admits; the chart is rendered and linted for it.
	minKubeVersion = "v1.29.0"
)

// object is one manifest, decoded through JSON as the apiserver would
// read it, so both renderers' objects compare with the same Go types
// (numbers are float64, no YAML-only types).
type object = map[string]any

// renderChart renders the chart with the Helm SDK as `helm template
// --namespace ns -f valuesFiles...` does (client-only dry run of an
// install, values checked against values.schema.json), and decodes its
// manifests.
func renderChart(t *testing.T, ns string, valuesFiles []string, set map[string]any) []object {
	t.Helper()
	objs, err := tryRenderChart(ns, valuesFiles, set)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	return objs
}

func tryRenderChart(ns string, valuesFiles []string, set map[string]any) ([]object, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	opts := values.Options{ValueFiles: valuesFiles}
	vals, err := opts.MergeValues(getter.Providers{})
	if err != nil {
		return nil, err
	}
	vals = mergeMaps(vals, set)
	inst := action.NewInstall(action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler)))
	inst.DryRunStrategy = action.DryRunClient
	inst.ReleaseName = "inferencecache"
	inst.Namespace = ns
	inst.Replace = true
	inst.DisableHooks = true
	// The oldest Kubernetes the chart supports (Chart.yaml kubeVersion):
	// the SDK's own default is older than it.
	kv, err := common.ParseKubeVersion(minKubeVersion)
	if err != nil {
		return nil, err
	}
	inst.KubeVersion = kv
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := inst.RunWithContext(ctx, ch, vals)
	if err != nil {
		return nil, err
	}
	rel, ok := r.(*release.Release)
	if !ok {
		return nil, errors.New("helm returned no v1 release")
	}
	if len(rel.Hooks) > 0 {
		return nil, errors.New("the chart has hooks; the comparison does not cover them")
	}
	return decodeManifests([]byte(rel.Manifest))
}

// mergeMaps merges src into dst recursively (src wins), as --set does.
func mergeMaps(dst, src map[string]any) map[string]any {
	if dst == nil {
		dst = map[string]any{}
	}
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				dst[k] = mergeMaps(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
	return dst
}

// renderKustomize builds a kustomization directory with the kustomize
// library, as `kubectl apply -k` does.
func renderKustomize(t *testing.T, dir string) []object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	raw, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests(raw)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return objs
}

// decodeManifests splits a multi-document YAML stream into objects,
// dropping empty documents.
func decodeManifests(raw []byte) ([]object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var out []object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var o object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return nil, err
		}
		if len(o) > 0 {
			out = append(out, o)
		}
	}
}

// exampleValues are the chart's example values files, by overlay name.
func exampleValues(name string) string {
	return filepath.Join(chartDir, "examples", name+".yaml")
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func str(o object, path ...string) string {
	v, _ := dig(o, path...).(string)
	return v
}

func dig(o any, path ...string) any {
	for _, p := range path {
		m, ok := o.(map[string]any)
		if !ok {
			return nil
		}
		o = m[p]
	}
	return o
}

// id names an object the way kubectl does: kind, namespace and name.
func id(o object) string {
	group := str(o, "apiVersion")
	if i := strings.LastIndex(group, "/"); i >= 0 {
		group = group[:i]
	} else {
		group = ""
	}
	return strings.Join([]string{str(o, "kind") + "." + group, str(o, "metadata", "namespace"), str(o, "metadata", "name")}, "/")
}
