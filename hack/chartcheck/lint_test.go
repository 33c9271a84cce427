package chartcheck

import (
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/cli/values"
	"helm.sh/helm/v4/pkg/getter"
)

// TestChartLint runs Helm's linter (`helm lint --strict`) over the chart
// with the defaults and with every example: no error and no warning.
func TestChartLint(t *testing.T) {
	kv, err := common.ParseKubeVersion(minKubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			var files []string
			for _, e := range sc.examples {
				files = append(files, exampleValues(e))
			}
			opts := values.Options{ValueFiles: files}
			vals, err := opts.MergeValues(getter.Providers{})
			if err != nil {
				t.Fatal(err)
			}
			l := action.NewLint()
			l.Strict = true
			l.Namespace = releaseNamespace
			l.KubeVersion = kv
			res := l.Run([]string{chartDir}, vals)
			for _, m := range res.Messages {
				t.Log(m)
			}
			for _, e := range res.Errors {
				t.Errorf("helm lint: %v", e)
			}
			if action.HasWarningsOrErrors(res) {
				t.Errorf("helm lint --strict reports warnings")
			}
		})
	}
}
