// The classic dashboard model (package dashboard) is what every Grafana
// release imports and what the dashboard sidecar provisions; the SDK marks
// it deprecated in favour of dashboardv2, the schema of Grafana 12's new
// dashboard API, which older Grafanas cannot read.
//
//lint:file-ignore SA1019 the classic model is the portable one (see above)

package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// dataSource is what every panel, query and query variable reads: the
// Prometheus the dashboard's ${datasource} variable selects.
var dataSource = dashboard.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// A board is one dashboard: its variables and its rows of panels.
type board struct {
	UID, Title, Desc string
	Vars             []cog.Builder[dashboard.VariableModel]
	Rows             []row
}

type row struct {
	Title  string
	Panels []panel
}

// A panel is a time series, or a stat when Stat is set. W and H are its
// grid size (24 columns); 0 means 12 x 8 (a stat: 4 x 4).
type panel struct {
	Title, Desc string
	Unit        string // a Grafana unit id
	Queries     []query
	W, H        uint32
	Stat        bool
	Stack       bool
	// Max caps the axis (ratios: 1); nil leaves it to the data. The
	// minimum is always 0: every series here is a count, a rate, a
	// duration or a ratio.
	Max *float64
	// Steps are the thresholds, base first; a time series draws them as
	// dashed lines, a stat colours its value by them. Nil: none (a
	// single base colour).
	Steps []step
}

type step struct {
	// From is where the colour starts; the first step's is ignored (it
	// starts at -Infinity).
	From  float64
	Color string
}

type query struct {
	Expr, Legend string
}

// Common threshold shapes.
var (
	// zeroIsGood: any value above 0 is an incident (panics, failures).
	zeroIsGood = []step{{0, "green"}, {1e-9, "red"}}
	// oneIsGood: a 0/1 health gauge or a count that must be at least 1.
	oneIsGood = []step{{0, "red"}, {1, "green"}}
)

func ratioMax() *float64 { return cog.ToPtr(1.0) }

// build turns the board into a Grafana dashboard. Panel ids are their
// position in the dashboard, so they are stable as long as the order is.
func (b board) build() (dashboard.Dashboard, error) {
	d := dashboard.NewDashboardBuilder(b.Title).
		Uid(b.UID).
		Description(b.Desc).
		Tags([]string{"inferencecache"}).
		Editable().
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Time("now-3h", "now").
		Timezone(common.TimeZoneBrowser).
		Refresh("30s").
		Link(dashboard.NewDashboardLinkBuilder("inferencecache").
			Type(dashboard.DashboardLinkTypeDashboards).
			Tags([]string{"inferencecache"}).
			Icon("external link").
			Tooltip("The other inferencecache dashboards").
			AsDropdown(true).IncludeVars(false).KeepTime(true)).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").
			Label("Data source").
			Type("prometheus"))
	for _, v := range b.Vars {
		d.WithVariable(v)
	}
	for _, r := range b.Rows {
		d.WithRow(dashboard.NewRowBuilder(r.Title))
		for _, p := range r.Panels {
			if p.Stat {
				d.WithPanel(p.stat())
			} else {
				d.WithPanel(p.timeseries())
			}
		}
	}
	out, err := d.Build()
	if err != nil {
		return out, fmt.Errorf("cannot build dashboard %s: %w", b.UID, err)
	}
	for i, pr := range out.Panels {
		id := uint32(i + 1)
		switch {
		case pr.Panel != nil:
			pr.Panel.Id = &id
		case pr.RowPanel != nil:
			pr.RowPanel.Id = id
		}
	}
	return out, nil
}

// render is the dashboard's committed form: indented JSON and a final
// newline.
func (b board) render() ([]byte, error) {
	d, err := b.build()
	if err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("cannot encode dashboard %s: %w", b.UID, err)
	}
	return append(out, '\n'), nil
}

func (p panel) targets() []cog.Builder[variants.Dataquery] {
	var out []cog.Builder[variants.Dataquery]
	for i, q := range p.Queries {
		t := prometheus.NewDataqueryBuilder().
			Datasource(dataSource).
			Expr(q.Expr).
			RefId(string(rune('A' + i))).
			Range()
		if q.Legend != "" {
			t.LegendFormat(q.Legend)
		}
		out = append(out, t)
	}
	return out
}

// thresholds are p.Steps; without them a single base colour: green for
// a time series (drawn nowhere), blue for a stat (a neutral figure).
func (p panel) thresholds() *dashboard.ThresholdsConfigBuilder {
	steps := p.Steps
	switch {
	case steps != nil:
	case p.Stat:
		steps = []step{{0, "blue"}}
	default:
		steps = []step{{0, "green"}}
	}
	var out []dashboard.Threshold
	for i, s := range steps {
		t := dashboard.Threshold{Color: s.Color}
		if i > 0 {
			t.Value = cog.ToPtr(s.From)
		}
		out = append(out, t)
	}
	return dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(out)
}

func (p panel) size(w, h uint32) (uint32, uint32) {
	if p.W != 0 {
		w = p.W
	}
	if p.H != 0 {
		h = p.H
	}
	return w, h
}

func (p panel) timeseries() *timeseries.PanelBuilder {
	w, h := p.size(12, 8)
	b := timeseries.NewPanelBuilder().
		Title(p.Title).
		Description(p.Desc).
		Datasource(dataSource).
		Targets(p.targets()).
		Unit(p.Unit).
		Min(0).
		Span(w).Height(h).
		Thresholds(p.thresholds()).
		LineWidth(1).
		FillOpacity(10).
		ShowPoints(common.VisibilityModeNever).
		Legend(common.NewVizLegendOptionsBuilder().
			DisplayMode(common.LegendDisplayModeList).
			Placement(common.LegendPlacementBottom).
			ShowLegend(true)).
		Tooltip(common.NewVizTooltipOptionsBuilder().
			Mode(common.TooltipDisplayModeMulti).
			Sort(common.SortOrderDescending))
	if p.Max != nil {
		b.Max(*p.Max)
	}
	if p.Stack {
		b.Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)).FillOpacity(40)
	}
	if p.Steps != nil {
		b.ThresholdsStyle(common.NewGraphThresholdsStyleConfigBuilder().Mode(common.GraphThresholdsStyleModeDashed))
	}
	return b
}

func (p panel) stat() *stat.PanelBuilder {
	w, h := p.size(4, 4)
	b := stat.NewPanelBuilder().
		Title(p.Title).
		Description(p.Desc).
		Datasource(dataSource).
		Targets(p.targets()).
		Unit(p.Unit).
		Span(w).Height(h).
		Thresholds(p.thresholds()).
		ColorMode(common.BigValueColorModeValue).
		Orientation(common.VizOrientationAuto).
		GraphMode(common.BigValueGraphModeArea).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}))
	if p.Max != nil {
		b.Max(*p.Max)
	}
	return b
}

// queryVar is a variable of label values from Prometheus, refreshed with
// the time range. With all, "All" is offered and selected by default and
// means ".*", which also matches series without the label.
func queryVar(name, label, query string, all bool) *dashboard.QueryVariableBuilder {
	v := dashboard.NewQueryVariableBuilder(name).
		Label(label).
		Datasource(dataSource).
		Query(dashboard.StringOrMap{String: cog.ToPtr(query)}).
		Definition(query).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Sort(dashboard.VariableSortAlphabeticalAsc)
	if all {
		v.Multi(true).IncludeAll(true).AllValue(".*").
			Current(dashboard.VariableOption{
				Selected: cog.ToPtr(true),
				Text:     dashboard.StringOrArrayOfString{String: cog.ToPtr("All")},
				Value:    dashboard.StringOrArrayOfString{String: cog.ToPtr("$__all")},
			})
	}
	return v
}

// scope is the matchers every selector of one component carries: the
// dashboard's variables for its scrape job, namespace and pod.
type scope string

// of is metric{scope, more...}.
func (s scope) of(metric string, more ...string) string {
	m := append([]string{string(s)}, more...)
	return metric + "{" + strings.Join(m, ", ") + "}"
}

// rate is rate(sel[$__rate_interval]), the window Grafana widens to at
// least four scrape intervals.
func rate(sel string) string { return "rate(" + sel + "[$__rate_interval])" }

// increase is increase(sel[$__rate_interval]): the events of each rate
// window ("per rate window" in the descriptions), for rare ones a rate
// would show as tiny fractions.
func increase(sel string) string { return "increase(" + sel + "[$__rate_interval])" }

// agg is op by (by) (x), or op(x) without grouping.
func agg(op, by, x string) string {
	if by == "" {
		return op + "(" + x + ")"
	}
	return op + " by (" + by + ") (" + x + ")"
}

func sumBy(by, x string) string { return agg("sum", by, x) }
func maxBy(by, x string) string { return agg("max", by, x) }
func minBy(by, x string) string { return agg("min", by, x) }

// quantile is the q-quantile of the histogram whose _bucket series sel
// selects, grouped by by (besides le).
func quantile(q, by, bucketSel string) string {
	g := "le"
	if by != "" {
		g = "le, " + by
	}
	return "histogram_quantile(" + q + ", " + agg("sum", g, rate(bucketSel)) + ")"
}
