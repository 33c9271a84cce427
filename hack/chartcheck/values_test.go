package chartcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// TestChartVersionFollowsImageTag: Chart.yaml's appVersion is the image tag
// operator/config/default pins (the one place it is set, which `make
// images` tags the tarballs with), its version the same without the v, and
// the chart's default registry the one those images name.
func TestChartVersionFollowsImageTag(t *testing.T) {
	var k struct {
		Images []struct {
			Name    string `json:"name"`
			NewName string `json:"newName"`
			NewTag  string `json:"newTag"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal(readFile(t, filepath.Join(configDir, "default", "kustomization.yaml")), &k); err != nil {
		t.Fatal(err)
	}
	if len(k.Images) == 0 {
		t.Fatal("operator/config/default/kustomization.yaml pins no images")
	}
	var vals struct {
		Image struct {
			Registry string `json:"registry"`
			Tag      string `json:"tag"`
		} `json:"image"`
	}
	if err := yaml.Unmarshal(readFile(t, filepath.Join(chartDir, "values.yaml")), &vals); err != nil {
		t.Fatal(err)
	}
	m := loadChartMeta(t)
	for _, img := range k.Images {
		if img.NewTag != m.AppVersion {
			t.Errorf("image %s is pinned to %q, Chart.yaml appVersion is %q", img.Name, img.NewTag, m.AppVersion)
		}
		if want := strings.TrimPrefix(img.NewTag, "v"); m.Version != want {
			t.Errorf("Chart.yaml version %q, want %q (the pinned tag %q without the v)", m.Version, want, img.NewTag)
		}
		if dir := path.Dir(img.NewName); dir != vals.Image.Registry {
			t.Errorf("image %s is %s, values.yaml image.registry is %q", img.Name, img.NewName, vals.Image.Registry)
		}
	}
	if vals.Image.Tag != "" {
		t.Errorf("values.yaml image.tag is %q; leave it empty so the tag is the chart's appVersion", vals.Image.Tag)
	}
}

// valueDoc is one documented key of values.yaml.
type valueDoc struct {
	key, def, desc string
}

// documentedValues walks values.yaml: a key whose comment starts with
// "# --" is one documented value (its children, if any, belong to it);
// other mappings are sections and are walked into. A value that is
// neither documented nor inside a documented key is an error.
func documentedValues(t *testing.T) []valueDoc {
	t.Helper()
	var root yamlv3.Node
	if err := yamlv3.Unmarshal(readFile(t, filepath.Join(chartDir, "values.yaml")), &root); err != nil {
		t.Fatal(err)
	}
	var out []valueDoc
	var walk func(prefix string, n *yamlv3.Node)
	walk = func(prefix string, n *yamlv3.Node) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := prefix + k.Value
			if desc, ok := docComment(k.HeadComment); ok {
				var val any
				if err := v.Decode(&val); err != nil {
					t.Fatalf("values.yaml %s: %v", key, err)
				}
				def, err := json.Marshal(val)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, valueDoc{key: key, def: string(def), desc: desc})
				continue
			}
			if v.Kind != yamlv3.MappingNode || len(v.Content) == 0 {
				t.Errorf("values.yaml: %s has no `# --` description", key)
				continue
			}
			walk(key+".", v)
		}
	}
	if len(root.Content) != 1 || root.Content[0].Kind != yamlv3.MappingNode {
		t.Fatal("values.yaml is not a mapping")
	}
	walk("", root.Content[0])
	return out
}

// docComment returns the text of a "# -- ..." comment block (the "-- "
// line and the comment lines after it).
func docComment(c string) (string, bool) {
	var parts []string
	found := false
	for line := range strings.SplitSeq(c, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if rest, ok := strings.CutPrefix(line, "-- "); ok {
			found, parts = true, []string{rest}
			continue
		}
		if found && line != "" {
			parts = append(parts, line)
		}
	}
	return strings.Join(parts, " "), found
}

const (
	tableBegin = "<!-- values:begin (generated from values.yaml by hack/chartcheck; make chart-sync) -->"
	tableEnd   = "<!-- values:end -->"
)

func valuesTable(docs []valueDoc) string {
	var b strings.Builder
	b.WriteString("| Key | Default | Description |\n|---|---|---|\n")
	for _, d := range docs {
		def := "`" + d.def + "`"
		if len(d.def) > 60 {
			def = "see values.yaml"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", d.key, def, strings.ReplaceAll(d.desc, "|", `\|`))
	}
	return b.String()
}

// TestValuesTable: the values table in the chart's README is the one
// values.yaml's comments generate, so every value is documented there and
// no row names a value that is gone.
func TestValuesTable(t *testing.T) {
	docs := documentedValues(t)
	if len(docs) < 30 {
		t.Fatalf("only %d documented values", len(docs))
	}
	readme := filepath.Join(chartDir, "README.md")
	raw := readFile(t, readme)
	before, rest, ok := bytes.Cut(raw, []byte(tableBegin))
	_, after, ok2 := bytes.Cut(rest, []byte(tableEnd))
	if !ok || !ok2 {
		t.Fatalf("%s has no %q ... %q section", readme, tableBegin, tableEnd)
	}
	want := tableBegin + "\n" + valuesTable(docs) + tableEnd
	got := tableBegin + string(rest[:len(rest)-len(after)])
	if got == want {
		return
	}
	if *rewrite {
		out := slices.Concat(before, []byte(want), after)
		if err := os.WriteFile(readme, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("the values table of charts/inferencecache/README.md is not the one values.yaml generates; run `make chart-sync`")
}

// TestSchemaCoversValues: values.schema.json describes exactly the keys of
// values.yaml: every section closes its properties
// (additionalProperties: false, so a misspelt key fails the install), and
// the schema names no key values.yaml does not have. Values whose schema
// has no properties (resources, affinity, a volume source) are free-form.
func TestSchemaCoversValues(t *testing.T) {
	var schema map[string]any
	if err := json.Unmarshal(readFile(t, filepath.Join(chartDir, "values.schema.json")), &schema); err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(readFile(t, filepath.Join(chartDir, "values.yaml")), &vals); err != nil {
		t.Fatal(err)
	}
	var walk func(key string, v any, s map[string]any)
	walk = func(key string, v any, s map[string]any) {
		props, ok := s["properties"].(map[string]any)
		if !ok {
			return
		}
		if s["additionalProperties"] != false {
			t.Errorf("values.schema.json %s: properties without additionalProperties: false", key)
		}
		m, ok := v.(map[string]any)
		if !ok {
			t.Errorf("values.schema.json %s: has properties, values.yaml's is %T", key, v)
			return
		}
		for k, sub := range props {
			if _, ok := m[k]; !ok {
				t.Errorf("values.schema.json names %s%s, values.yaml does not have it", key, k)
				continue
			}
			walk(key+k+".", m[k], sub.(map[string]any))
		}
		for k := range m {
			if _, ok := props[k]; !ok {
				t.Errorf("values.yaml %s%s is not in values.schema.json", key, k)
			}
		}
	}
	walk("", vals, schema)
}

// TestSchemaRejects: values that the schema must refuse, through Helm's
// own validation at install.
func TestSchemaRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]any
	}{
		{"misspelt key", map[string]any{"server": map[string]any{"replica": 3}}},
		{"unknown section", map[string]any{"picker": map[string]any{"enabled": true}}},
		{"replicas as a string", map[string]any{"server": map[string]any{"replicas": "3"}}},
		{"zero controller replicas", map[string]any{"controller": map[string]any{"replicas": 0}}},
		{"bad failureMode", map[string]any{"server": map[string]any{"picker": map[string]any{"inferencePool": map[string]any{"failureMode": "Open"}}}}},
		{"bad pull policy", map[string]any{"image": map[string]any{"pullPolicy": "Sometimes"}}},
		{"allow-list as a string", map[string]any{"controller": map[string]any{"allowedBackendImages": "ghcr.io/"}}},
		{"bad duration", map[string]any{"controller": map[string]any{"pushInterval": "30 seconds"}}},
		{"bad port", map[string]any{"server": map[string]any{"picker": map[string]any{"port": 70000}}}},
		{"prometheus service account without namespace", map[string]any{"monitoring": map[string]any{"serviceMonitors": map[string]any{"prometheusServiceAccount": map[string]any{"name": "prom", "namespace": ""}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tryRenderChart(releaseNamespace, nil, tc.set)
			if err == nil || !strings.Contains(err.Error(), "schema") {
				t.Errorf("install with %v: err %v, want a values schema error", tc.set, err)
			}
		})
	}
}
