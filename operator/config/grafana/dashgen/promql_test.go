package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// A pquery is one PromQL expression of a dashboard, with where it is.
type pquery struct {
	Where  string
	Expr   string // as Grafana sends it, after variable substitution
	Legend string
	// VarLabel is the label a label_values() variable reads.
	VarLabel string
}

// varSubst stands in for the variables when parsing: Grafana replaces
// $__rate_interval and $__range by durations and the others by values.
var varSubst = map[string]string{"__rate_interval": "2m", "__range": "3h", "__interval": "30s"}

// labelValues is a query variable's label_values(selector, label).
var labelValues = regexp.MustCompile(`^label_values\((.+), *(\w+)\)$`)

// substVars replaces each variable reference as Grafana would: the
// built-in intervals by durations, a dashboard variable $x by the value
// "value-of-x".
func substVars(s string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		name := strings.Trim(m, "${}")
		if v, ok := varSubst[name]; ok {
			return v
		}
		return "value-of-" + name
	})
}

// dashboardQueries lists every query and variable query of the committed
// dashboards, each variable replaced as Grafana would.
func dashboardQueries(t *testing.T) []pquery {
	t.Helper()
	subst := substVars
	var out []pquery
	for _, d := range loadDashboards(t) {
		for _, p := range d.allPanels() {
			for _, tg := range p.Targets {
				out = append(out, pquery{Where: d.file + ": " + p.Title + " " + tg.RefID, Expr: subst(tg.Expr), Legend: tg.Legend})
			}
		}
		for _, v := range d.Templating.List {
			q, ok := v.Query.(string)
			if !ok || v.Type != "query" {
				continue
			}
			m := labelValues.FindStringSubmatch(q)
			if m == nil {
				t.Errorf("%s: variable %s: %q is not label_values(selector, label)", d.file, v.Name, q)
				continue
			}
			out = append(out, pquery{Where: d.file + ": variable " + v.Name, Expr: subst(m[1]), VarLabel: m[2]})
		}
	}
	if len(out) < 100 {
		t.Fatalf("only %d queries in the dashboards", len(out))
	}
	return out
}

func parse(q pquery) (parser.Expr, error) {
	return parser.NewParser(parser.Options{}).ParseExpr(q.Expr)
}

// TestDashboardQueriesParse: every expression is valid PromQL for
// Prometheus's own parser (the variables substituted), of a type a panel
// can draw, and every histogram_quantile reads _bucket series aggregated
// by le, the only grouping under which the quantile is right.
func TestDashboardQueriesParse(t *testing.T) {
	for _, q := range dashboardQueries(t) {
		expr, err := parse(q)
		if err != nil {
			t.Errorf("%s: %s: %v", q.Where, q.Expr, err)
			continue
		}
		if typ := expr.Type(); typ != parser.ValueTypeVector && typ != parser.ValueTypeScalar {
			t.Errorf("%s: %s is a %s, not an instant vector", q.Where, q.Expr, typ)
		}
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			c, ok := n.(*parser.Call)
			if !ok || c.Func.Name != "histogram_quantile" {
				return nil
			}
			agg, ok := unparen(c.Args[1]).(*parser.AggregateExpr)
			if !ok || agg.Op != parser.SUM || agg.Without || !slices.Contains(agg.Grouping, "le") {
				t.Errorf("%s: histogram_quantile over %s: want sum by (le, ...) (rate(..._bucket[...]))", q.Where, c.Args[1])
				return nil
			}
			parser.Inspect(agg.Expr, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok && !strings.HasSuffix(vs.Name, "_bucket") {
					t.Errorf("%s: histogram_quantile reads %s, not a _bucket series", q.Where, vs.Name)
				}
				return nil
			})
			return nil
		})
	}
}

func unparen(e parser.Expr) parser.Expr {
	for {
		p, ok := e.(*parser.ParenExpr)
		if !ok {
			return e
		}
		e = p.Expr
	}
}

// TestSharedMetricsArePinned: a metric other exporters expose too (up,
// controller_runtime_*, workqueue_*, leader_election_*, apiserver_*) is
// only ever selected pinned to this project: by a job variable that
// offers no "All", by a literal label value naming inferencecache, or by a
// literal controller name. Otherwise "All" would sum every operator's
// reconciles, or every target's up.
func TestSharedMetricsArePinned(t *testing.T) {
	for _, d := range loadDashboards(t) {
		vars := d.vars()
		check := func(where, raw string) {
			q := pquery{Where: where, Expr: substVars(raw)}
			expr, err := parse(q)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				return
			}
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				vs, ok := n.(*parser.VectorSelector)
				if !ok || strings.HasPrefix(vs.Name, "inferencecache_") {
					return nil
				}
				for _, m := range vs.LabelMatchers {
					v, isVar := strings.CutPrefix(m.Value, "value-of-")
					switch {
					case m.Name == "job" && isVar && !vars[v].IncludeAll:
						return nil
					case !isVar && strings.Contains(m.Value, "inferencecache"):
						return nil
					case !isVar && m.Name == "controller" && m.Type == labels.MatchEqual:
						return nil
					}
				}
				t.Errorf("%s: %s is not pinned to this project (a job variable without All, or a literal matcher)", where, vs)
				return nil
			})
		}
		for _, p := range d.allPanels() {
			for _, tg := range p.Targets {
				check(d.file+": "+p.Title, tg.Expr)
			}
		}
		for _, v := range d.Templating.List {
			if q, ok := v.Query.(string); ok && v.Type == "query" {
				if m := labelValues.FindStringSubmatch(q); m != nil {
					check(d.file+": variable "+v.Name, m[1])
				}
			}
		}
	}
}
