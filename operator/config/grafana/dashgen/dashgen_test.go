//lint:file-ignore SA1019 the dashboards are the classic model (panels.go says why)

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// dashDir is the folder the dashboards are committed in.
const dashDir = ".."

// lastAppliedLimit is the kube-apiserver's bound on an object's
// annotations (256 KiB). `kubectl apply` without --server-side copies the
// whole ConfigMap into kubectl.kubernetes.io/last-applied-configuration,
// so a dashboard ConfigMap must stay well below it.
const lastAppliedLimit = 256 << 10

// TestCommittedDashboardsAreGenerated: the committed JSON is byte for byte
// what the generator writes (run `make dashboards` after changing the Go
// definitions), and -check notices a file that differs.
func TestCommittedDashboardsAreGenerated(t *testing.T) {
	files, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range dashboardFiles() {
		got, err := os.ReadFile(filepath.Join(dashDir, f.Name))
		if err != nil {
			t.Fatalf("%v (run `make dashboards`)", err)
		}
		if !bytes.Equal(got, files[f.Name]) {
			t.Errorf("%s differs from the generated dashboard; run `make dashboards`", f.Name)
		}
	}
	if err := run(dashDir, true); err != nil {
		t.Errorf("-check: %v", err)
	}

	// -check on a copy with one byte changed, and on one missing a file.
	tmp := t.TempDir()
	if err := run(tmp, false); err != nil {
		t.Fatal(err)
	}
	if err := run(tmp, true); err != nil {
		t.Fatalf("-check right after writing: %v", err)
	}
	name := dashboardFiles()[1].Name
	path := filepath.Join(tmp, name)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(tmp, true); !errors.Is(err, ErrStale) || !strings.Contains(err.Error(), name) {
		t.Errorf("-check with %s changed: %v, want ErrStale naming it", name, err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := run(tmp, true); !errors.Is(err, ErrStale) {
		t.Errorf("-check with %s missing: %v, want ErrStale", name, err)
	}
}

// TestDashboardsDecodeIntoTheModel: each committed file decodes into the
// SDK's dashboard model (panels and queries through their plugins'
// decoders), validates, and encodes back to the same bytes: no field the
// model does not know, none it drops. (The SDK's UnmarshalJSONStrict loses
// every panel in v0.0.22, so the round trip stands in for it.)
func TestDashboardsDecodeIntoTheModel(t *testing.T) {
	plugins.RegisterDefaultPlugins()
	for _, f := range dashboardFiles() {
		raw, err := os.ReadFile(filepath.Join(dashDir, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard.Dashboard
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Errorf("%s: %v", f.Name, err)
			continue
		}
		if err := sdkErr(d.Validate()); err != nil {
			t.Errorf("%s: %v", f.Name, err)
		}
		again, err := json.MarshalIndent(d, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(append(again, '\n'), raw) {
			t.Errorf("%s does not survive a decode and encode unchanged", f.Name)
		}
	}
}

// sdkErr is err, or nil for an empty cog.BuildErrors, which the SDK
// returns as a non-nil error when nothing went wrong.
func sdkErr(err error) error {
	if errs, ok := err.(cog.BuildErrors); ok && len(errs) == 0 {
		return nil
	}
	return err
}

// gdash is the part of a committed dashboard JSON the tests read.
type gdash struct {
	file       string
	UID        string   `json:"uid"`
	Title      string   `json:"title"`
	Tags       []string `json:"tags"`
	Panels     []gpanel `json:"panels"`
	Templating struct {
		List []gvar `json:"list"`
	} `json:"templating"`
}

type gpanel struct {
	ID         int       `json:"id"`
	Type       string    `json:"type"`
	Title      string    `json:"title"`
	Desc       string    `json:"description"`
	Datasource *gds      `json:"datasource"`
	Targets    []gtarget `json:"targets"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Panels []gpanel `json:"panels"`
}

type gtarget struct {
	Datasource *gds   `json:"datasource"`
	Expr       string `json:"expr"`
	Legend     string `json:"legendFormat"`
	RefID      string `json:"refId"`
}

type gds struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type gvar struct {
	Type       string `json:"type"`
	Name       string `json:"name"`
	Query      any    `json:"query"`
	Datasource *gds   `json:"datasource"`
	AllValue   string `json:"allValue"`
	IncludeAll bool   `json:"includeAll"`
}

// loadDashboards reads every committed dashboard.
func loadDashboards(t *testing.T) []gdash {
	t.Helper()
	var out []gdash
	for _, f := range dashboardFiles() {
		raw, err := os.ReadFile(filepath.Join(dashDir, f.Name))
		if err != nil {
			t.Fatal(err)
		}
		var d gdash
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		d.file = f.Name
		out = append(out, d)
	}
	return out
}

// allPanels is every panel, those inside collapsed rows too.
func (d gdash) allPanels() []gpanel {
	var out []gpanel
	var walk func([]gpanel)
	walk = func(ps []gpanel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

func (d gdash) vars() map[string]gvar {
	out := map[string]gvar{}
	for _, v := range d.Templating.List {
		out[v.Name] = v
	}
	return out
}

// varRef is a dashboard variable reference: $name or ${name}.
var varRef = regexp.MustCompile(`\$(?:\{(\w+)\}|(\w+))`)

// builtinVars are Grafana's own variables the queries may use.
var builtinVars = []string{"__rate_interval", "__range", "__interval"}

// TestDashboardsShape: unique uids and titles; every panel reads the
// ${datasource} variable (a Prometheus data source variable), has a unit,
// a description and queries, fits the 24-column grid without overlapping
// another; every variable a query names is defined; every range is
// $__rate_interval (or $__range for a stat over the whole time range).
func TestDashboardsShape(t *testing.T) {
	uids := map[string]string{}
	for _, d := range loadDashboards(t) {
		if len(d.UID) > 40 || d.UID == "" {
			t.Errorf("%s: uid %q (Grafana allows 1 to 40 characters)", d.file, d.UID)
		}
		if other, ok := uids[d.UID]; ok {
			t.Errorf("%s and %s share uid %s", d.file, other, d.UID)
		}
		uids[d.UID] = d.file
		if !slices.Contains(d.Tags, "inferencecache") {
			t.Errorf("%s: no inferencecache tag (the dashboards link each other by it)", d.file)
		}
		vars := d.vars()
		if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || v.Query != "prometheus" {
			t.Errorf("%s: no Prometheus datasource variable: %+v", d.file, v)
		}
		for _, v := range d.Templating.List {
			if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
				t.Errorf("%s: variable %s does not query ${datasource}", d.file, v.Name)
			}
			if v.IncludeAll && v.AllValue != ".*" {
				t.Errorf("%s: variable %s: All is %q; .* also matches series without the label", d.file, v.Name, v.AllValue)
			}
		}

		titles, ids := map[string]bool{}, map[int]bool{}
		var grid [][24]bool
		nQueries := 0
		for _, p := range d.allPanels() {
			if ids[p.ID] || p.ID == 0 {
				t.Errorf("%s: panel %q has id %d, zero or not unique", d.file, p.Title, p.ID)
			}
			ids[p.ID] = true
			gp := p.GridPos
			if gp.X < 0 || gp.W <= 0 || gp.H <= 0 || gp.X+gp.W > 24 {
				t.Errorf("%s: panel %q at %+v is off the grid", d.file, p.Title, gp)
			}
			for y := gp.Y; y < gp.Y+gp.H; y++ {
				for len(grid) <= y {
					grid = append(grid, [24]bool{})
				}
				for x := gp.X; x < gp.X+gp.W && x < 24; x++ {
					if grid[y][x] {
						t.Errorf("%s: panel %q overlaps another at (%d, %d)", d.file, p.Title, x, y)
					}
					grid[y][x] = true
				}
			}
			if p.Type == "row" {
				continue
			}
			if titles[p.Title] {
				t.Errorf("%s: two panels titled %q", d.file, p.Title)
			}
			titles[p.Title] = true
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
				t.Errorf("%s: panel %q data source %+v, want the ${datasource} variable", d.file, p.Title, p.Datasource)
			}
			if p.FieldConfig.Defaults.Unit == "" {
				t.Errorf("%s: panel %q has no unit", d.file, p.Title)
			}
			if p.Desc == "" {
				t.Errorf("%s: panel %q has no description", d.file, p.Title)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", d.file, p.Title)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				nQueries++
				if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
					t.Errorf("%s: %q: a query without the ${datasource} variable", d.file, p.Title)
				}
				if refs[tg.RefID] || tg.RefID == "" {
					t.Errorf("%s: %q: refId %q empty or not unique", d.file, p.Title, tg.RefID)
				}
				refs[tg.RefID] = true
				checkVars(t, d.file+": "+p.Title, tg.Expr, vars)
				for _, r := range rangeRef.FindAllStringSubmatch(tg.Expr, -1) {
					if r[1] != "$__rate_interval" && !(r[1] == "$__range" && p.Type == "stat") {
						t.Errorf("%s: %q: range [%s]; rates use [$__rate_interval]", d.file, p.Title, r[1])
					}
				}
			}
		}
		if nQueries < 20 {
			t.Errorf("%s: only %d queries", d.file, nQueries)
		}
		for _, v := range d.Templating.List {
			if q, ok := v.Query.(string); ok && v.Type == "query" {
				checkVars(t, d.file+": variable "+v.Name, q, vars)
			}
		}
	}
}

// rangeRef is a range or subquery selector's brackets.
var rangeRef = regexp.MustCompile(`\[([^\]]*)\]`)

func checkVars(t *testing.T, where, expr string, vars map[string]gvar) {
	t.Helper()
	for _, m := range varRef.FindAllStringSubmatch(expr, -1) {
		name := m[1] + m[2]
		if _, ok := vars[name]; !ok && !slices.Contains(builtinVars, name) {
			t.Errorf("%s: $%s is not a variable of the dashboard", where, name)
		}
	}
}

// TestMonitoringBundleCarriesDashboards builds the monitoring bundle
// (operator/config/prometheus) and the dashboards alone (this folder) with
// the kustomize API, as `kubectl apply -k` does: one ConfigMap per
// dashboard, labelled for the Grafana sidecar, holding exactly the
// committed JSON under its file name, without a name hash (a new hash per
// change would leave the old ConfigMap behind as a duplicate dashboard),
// small enough for a client-side `kubectl apply`.
func TestMonitoringBundleCarriesDashboards(t *testing.T) {
	for _, dir := range []string{"../../prometheus", dashDir} {
		k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
		rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
		if err != nil {
			t.Fatalf("kustomize build %s: %v", dir, err)
		}
		found := map[string]bool{}
		for _, r := range rm.Resources() {
			if r.GetKind() != "ConfigMap" {
				continue
			}
			name := r.GetName()
			if r.GetNamespace() != "inferencecache-system" {
				t.Errorf("%s: ConfigMap %s in namespace %q", dir, name, r.GetNamespace())
			}
			if r.GetLabels()["grafana_dashboard"] != "1" {
				t.Errorf("%s: ConfigMap %s labels %v lack grafana_dashboard: \"1\"", dir, name, r.GetLabels())
			}
			data := r.GetDataMap()
			if len(data) != 1 {
				t.Errorf("%s: ConfigMap %s holds %d keys, want one dashboard", dir, name, len(data))
			}
			raw, err := r.AsYAML()
			if err != nil {
				t.Fatal(err)
			}
			if len(raw) > lastAppliedLimit*3/4 {
				t.Errorf("%s: ConfigMap %s is %d bytes; client-side apply stores it in an annotation capped at %d", dir, name, len(raw), lastAppliedLimit)
			}
			for key, v := range data {
				want, err := os.ReadFile(filepath.Join(dashDir, key))
				if err != nil {
					t.Errorf("%s: ConfigMap %s key %s is no committed dashboard: %v", dir, name, key, err)
					continue
				}
				if v != string(want) {
					t.Errorf("%s: ConfigMap %s key %s differs from the committed file", dir, name, key)
				}
				found[key] = true
				if want := "inferencecache-dashboard-" + strings.TrimSuffix(strings.TrimPrefix(key, "inferencecache-"), ".json"); name != want {
					t.Errorf("%s: ConfigMap %s holds %s; want it named %s", dir, name, key, want)
				}
			}
		}
		for _, f := range dashboardFiles() {
			if !found[f.Name] {
				t.Errorf("%s: no ConfigMap holds %s", dir, f.Name)
			}
		}
	}
}
