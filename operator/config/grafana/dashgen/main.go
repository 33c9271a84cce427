// Command dashgen writes the Grafana dashboards of operator/config/grafana
// from the Go definitions in this module (grafana-foundation-sdk), one
// JSON file per dashboard, which the folder's kustomization wraps in
// ConfigMaps for the Grafana sidecar. `make dashboards` runs it; -check
// only compares and fails when a committed file differs.
//
// It is a module of its own so the SDK (and, in its tests, the Prometheus
// parser and the components whose metrics the dashboards read) stay out of
// the main module.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

// A dashboardFile is one dashboard and the file it is committed as.
type dashboardFile struct {
	Name  string
	Board board
}

// dashboardFiles lists every dashboard, in the order the kustomization
// lists them.
func dashboardFiles() []dashboardFile {
	return []dashboardFile{
		{"inferencecache-data-plane.json", dataPlane()},
		{"inferencecache-feed.json", feed()},
		{"inferencecache-controller.json", controllerBoard()},
	}
}

// ErrStale is returned by -check when a committed file differs from what
// the generator writes.
var ErrStale = errors.New("dashgen: committed dashboards differ from the generated ones; run `make dashboards`")

// generate renders every dashboard, keyed by file name.
func generate() (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, f := range dashboardFiles() {
		b, err := f.Board.render()
		if err != nil {
			return nil, err
		}
		out[f.Name] = b
	}
	return out, nil
}

// run writes (or, with check, compares) the dashboards under dir.
func run(dir string, check bool) error {
	files, err := generate()
	if err != nil {
		return err
	}
	var stale []string
	for _, f := range dashboardFiles() {
		path := filepath.Join(dir, f.Name)
		want := files[f.Name]
		if check {
			got, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(got, want) {
				stale = append(stale, path)
			}
			continue
		}
		if err := os.WriteFile(path, want, 0o644); err != nil {
			return fmt.Errorf("cannot write %s: %w", path, err)
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("%w: %v", ErrStale, stale)
	}
	return nil
}

func main() {
	dir := flag.String("out", "..", "folder the dashboard JSON files are written to (operator/config/grafana)")
	check := flag.Bool("check", false, "compare the files in -out with the generated ones instead of writing them; exit 1 if any differs")
	flag.Parse()
	if err := run(*dir, *check); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
