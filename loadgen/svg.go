package loadgen

import (
	"fmt"
	"io"
	"math"

	"github.com/inferencecache/inferencecache/internal/svgplot"
)

// SVG layout: three panels stacked over a shared time axis, legends on the
// right.
const (
	svgWidth, svgHeight = 800, 760
	svgLeft, svgRight   = 70, 190
	svgPlotW, svgPlotH  = svgWidth - svgLeft - svgRight, 160
	svgFirstTop         = 84  // top of the first panel's frame
	svgPanelStep        = 230 // from one panel's frame top to the next
	svgLegendX          = svgWidth - svgRight + 16
	svgLegendRow        = 17
)

// Panel titles, also what the tests look for.
const (
	svgLatencyTitle = "LookupRoute latency per slice"
	svgReasonTitle  = "Reason codes per slice (share of calls)"
	svgHitTitle     = "Modeled block hit ratio per slice"
)

// errorColor marks failed calls in the reason panel.
const errorColor = "#444444"

// WriteSVG draws rep's timeline in three panels over the run's time, the
// warm-up shaded: client latency p50 and p99 per slice (and the server's
// own p99), the shares of
// reason codes (and errors) per slice as stacked bars, and the modeled
// block hit ratio per slice against the whole run's. Slices without
// responses leave gaps. The SVG has no scripts or external references and
// is the same bytes for the same Report; a report without a timeline (an
// older JSON report, or a run with no lookups) draws empty panels.
func (rep *Report) WriteSVG(w io.Writer) error {
	c := svgplot.New(w, svgWidth, svgHeight)
	var slices []TimeSlice
	sliceSec, warmupSec := 1.0, rep.Scenario.WarmupSec
	if tl := rep.Timeline; tl != nil {
		slices, warmupSec = tl.Slices, tl.WarmupSec
		if tl.SliceSec > 0 && !math.IsInf(tl.SliceSec, 0) {
			sliceSec = tl.SliceSec
		}
	}
	span := max(float64(len(slices))*sliceSec, sliceSec)
	xs := svgplot.Scale{Lo: 0, Hi: span, From: svgLeft, To: svgLeft + svgPlotW}
	mid := func(i int) float64 { return xs.Map((float64(i) + 0.5) * sliceSec) }

	s := rep.Scenario
	head := fmt.Sprintf("loadgen: %s workload, ", s.Workload)
	switch {
	case s.Mode == ClosedLoop:
		head += fmt.Sprintf("closed loop at concurrency %d", s.Concurrency)
	case s.Arrival == ArrivalTrace:
		head += fmt.Sprintf("open loop, trace arrivals x%g", s.Speedup)
	default:
		head += fmt.Sprintf("open loop, %s arrivals at %g/s", s.Arrival, s.Rate)
	}
	c.Title(svgLeft, 22, head)
	c.Printf(`<text x="%d" y="40" fill="#555">%s</text>`+"\n", svgLeft, svgplot.Escape(fmt.Sprintf(
		"%d replicas of %d blocks, seed %d; %d slices of %gs; throughput %.0f/s, p99 %s over the measured window",
		s.Replicas, s.ReplicaCacheBlocks, s.Seed, len(slices), sliceSec, svgplot.F(rep.Lookups.ThroughputPerSec), fmtUs(svgplot.F(rep.Latency.P99Us)))))

	frames := [3]svgplot.Frame{}
	for k := range frames {
		frames[k] = svgplot.Frame{Left: svgLeft, Top: svgFirstTop + k*svgPanelStep, W: svgPlotW, H: svgPlotH}
	}
	// panel draws what every panel shares: title, warm-up band, y grid,
	// axes and time ticks.
	panel := func(f svgplot.Frame, title, ylabel string, ys svgplot.Scale, ticks []float64, labels []string) {
		c.Title(f.Left, f.Top-10, title)
		if warmupSec > 0 {
			c.Rect(float64(f.Left), float64(f.Top), xs.Map(min(warmupSec, span))-float64(f.Left), float64(f.H), "#000000", 0.06)
		}
		for k, t := range ticks {
			c.YGrid(f, ys.Map(t), labels[k])
		}
		c.Axes(f)
		tstep, _ := svgplot.NiceStep(span, 10)
		for t := 0.0; t <= span*(1+1e-9); t += tstep {
			c.XTick(f, xs.Map(t), fmt.Sprintf("%gs", roundTick(t)))
		}
		c.YLabel(18, f.Top+f.H/2, ylabel)
		if len(slices) == 0 {
			c.Text(float64(f.Left+f.W/2), float64(f.Top+f.H/2), "middle", "no lookups")
		}
	}
	// warmLabel names the warm-up band, over the panel's data.
	warmLabel := func(f svgplot.Frame) {
		if warmupSec > 0 {
			c.Label(float64(f.Left)+4, float64(f.Top)+14, "warm-up")
		}
	}
	// series draws a line through the points where ok holds, broken at the
	// others; a point alone gets a dot.
	series := func(ys func(i int) float64, ok func(i int) bool, color, dash string) {
		var px, py []float64
		flush := func() {
			if len(px) == 1 {
				c.Dot(px[0], py[0], color)
			} else if len(px) > 1 {
				c.Polyline(px, py, color, dash)
			}
			px, py = px[:0], py[:0]
		}
		for i := range slices {
			if !ok(i) {
				flush()
				continue
			}
			px, py = append(px, mid(i)), append(py, ys(i))
		}
		flush()
	}

	// Latency: p50 and p99 on a log scale, whole decades from below the
	// lowest p50 to above the highest p99.
	f := frames[0]
	loUs, hiUs := math.Inf(1), 0.0
	for i := range slices {
		if slices[i].Responses == 0 {
			continue
		}
		for _, v := range []float64{slices[i].P50Us, slices[i].P99Us, slices[i].ServerP99Us} {
			if v = svgplot.F(v); v > 0 {
				loUs, hiUs = min(loUs, v), max(hiUs, v)
			}
		}
	}
	decLo, decHi := 2.0, 3.0 // 100 µs to 1 ms when there is nothing to show
	if hiUs > 0 {
		decLo, decHi = math.Floor(math.Log10(loUs)), math.Ceil(math.Log10(hiUs))
		decHi = max(decHi, decLo+1)
	}
	logUs := func(us float64) float64 { return math.Log10(max(svgplot.F(us), math.Pow(10, decLo))) }
	ys := svgplot.Scale{Lo: decLo, Hi: decHi, From: float64(f.Bottom()), To: float64(f.Top)}
	var ticks []float64
	var labels []string
	mults := []float64{1, 2, 5}
	if decHi-decLo >= 3 {
		mults = []float64{1, 3} // fewer labels when the decades are narrow
	}
	for d := decLo; d <= decHi; d++ {
		for _, m := range mults {
			if m > 1 && d == decHi {
				break
			}
			ticks = append(ticks, d+math.Log10(m))
			labels = append(labels, fmtTickUs(m*math.Pow(10, d)))
		}
	}
	panel(f, svgLatencyTitle+" (client, from intended send)", "latency (log scale)", ys, ticks, labels)
	hasResp := func(i int) bool { return slices[i].Responses > 0 }
	series(func(i int) float64 { return ys.Map(logUs(slices[i].P50Us)) }, hasResp, svgplot.Color(0), "")
	series(func(i int) float64 { return ys.Map(logUs(slices[i].P99Us)) }, hasResp, svgplot.Color(3), "")
	series(func(i int) float64 { return ys.Map(logUs(slices[i].ServerP99Us)) }, hasResp, svgplot.Color(7), "4 3")
	warmLabel(f)
	c.LegendLine(svgLegendX, f.Top+10, svgLegendRow, 0, "p50", svgplot.Color(0), "")
	c.LegendLine(svgLegendX, f.Top+10, svgLegendRow, 1, "p99", svgplot.Color(3), "")
	c.LegendLine(svgLegendX, f.Top+10, svgLegendRow, 2, "server p99", svgplot.Color(7), "4 3")
	c.Printf(`<text x="%d" y="%d" font-size="10" fill="#555">(lookup_latency_us)</text>`+"\n", svgLegendX+30, f.Top+10+3*svgLegendRow)

	// Reason codes: stacked shares of each slice's calls, errors on top.
	f = frames[1]
	ys = svgplot.Scale{Lo: 0, Hi: 100, From: float64(f.Bottom()), To: float64(f.Top)}
	pctTicks, pctLabels := []float64{0, 25, 50, 75, 100}, []string{"0%", "25%", "50%", "75%", "100%"}
	panel(f, svgReasonTitle, "share of calls", ys, pctTicks, pctLabels)
	names := append(timelineReasons[:len(timelineReasons):len(timelineReasons)], reasonOther)
	seen := make([]bool, len(names)+1) // the last entry: errors
	barW := max(xs.Map(sliceSec)-xs.Map(0), 0) * 0.85
	for i := range slices {
		sl := &slices[i]
		calls := sl.Responses + sl.Errors
		if calls <= 0 {
			continue
		}
		acc, opacity := 0.0, 1.0
		if sl.StartSec < warmupSec {
			opacity = 0.55 // warm-up bars are paler
		}
		stack := func(n int64, color string) {
			if n <= 0 {
				return
			}
			share := 100 * float64(n) / float64(calls)
			y0, y1 := ys.Map(acc), ys.Map(acc+share)
			c.Rect(mid(i)-barW/2, y1, barW, y0-y1, color, opacity)
			acc += share
		}
		for k, name := range names {
			if n := sl.Reasons[name]; n > 0 {
				seen[k] = true
				stack(n, svgplot.Color(k))
			}
		}
		if sl.Errors > 0 {
			seen[len(names)] = true
			stack(sl.Errors, errorColor)
		}
	}
	warmLabel(f)
	row := 0
	for k, name := range names {
		if seen[k] {
			c.LegendBox(svgLegendX, f.Top+10, svgLegendRow, row, name, svgplot.Color(k))
			row++
		}
	}
	if seen[len(names)] {
		c.LegendBox(svgLegendX, f.Top+10, svgLegendRow, row, "errors", errorColor)
	}

	// Modeled block hit ratio: per slice, and the whole run's.
	f = frames[2]
	ys = svgplot.Scale{Lo: 0, Hi: 100, From: float64(f.Bottom()), To: float64(f.Top)}
	panel(f, svgHitTitle, "block hit ratio", ys, pctTicks, pctLabels)
	series(func(i int) float64 {
		return ys.Map(100 * float64(slices[i].HitBlocks) / float64(slices[i].RoutedBlocks))
	}, func(i int) bool { return slices[i].RoutedBlocks > 0 }, svgplot.Color(2), "")
	c.HLine(f, ys.Map(100*rep.Feedback.ModeledBlockHitRatio), "black", "1.5", "6 4")
	warmLabel(f)
	c.LegendLine(svgLegendX, f.Top+10, svgLegendRow, 0, "per slice", svgplot.Color(2), "")
	c.LegendLine(svgLegendX, f.Top+10, svgLegendRow, 1, "whole run", "black", "6 4")
	c.XLabel(svgLeft+svgPlotW/2, svgHeight-12, "seconds since the lookups started (warm-up shaded; a lookup counts in the slice it was sent in)")
	return c.Close()
}

// fmtTickUs formats a latency tick given in microseconds.
func fmtTickUs(us float64) string {
	switch {
	case us >= 1e6:
		return fmt.Sprintf("%gs", roundTick(us/1e6))
	case us >= 1e3:
		return fmt.Sprintf("%gms", roundTick(us/1e3))
	default:
		return fmt.Sprintf("%gµs", roundTick(us))
	}
}

// roundTick removes the float noise of summed tick steps (0.30000000000000004).
func roundTick(t float64) float64 { return math.Round(t*1e6) / 1e6 }
