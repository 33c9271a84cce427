package bench

import (
	"fmt"
	"io"
	"math"

	"github.com/inferencecache/inferencecache/internal/svgplot"
)

// WriteSVG plots block hit ratio against per-replica cache size, one line
// per policy plus the pooled LRU bound (dashed) and the infinite-cache
// bound (dotted). The x axis is logarithmic. The SVG is hand-written, has
// no scripts or external references, and is deterministic for a Report.
// Policies take svgplot's palette in report order; bounds are black.
func (r *Report) WriteSVG(w io.Writer) error {
	const (
		width, height        = 800, 420
		left, right          = 60, 250 // plot margins; the legend sits on the right
		top, bottom          = 40, 50
		plotW, plotH         = width - left - right, height - top - bottom
		legendX, legendLineH = width - right + 20, 18
	)
	frame := svgplot.Frame{Left: left, Top: top, W: plotW, H: plotH}
	c := svgplot.New(w, width, height)

	yMax := 100 * r.Infinite.BlockHitRatio()
	for i := range r.Sizes {
		yMax = max(yMax, 100*r.Sizes[i].Pooled.BlockHitRatio())
		for j := range r.Sizes[i].Results {
			yMax = max(yMax, 100*r.Sizes[i].Results[j].BlockHitRatio())
		}
	}
	yMax = math.Max(10, math.Ceil(yMax*1.1/10)*10)

	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range r.Sizes {
		v := math.Log(float64(r.Sizes[i].CacheBlocks))
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	xOf := func(blocks int) float64 {
		if len(r.Sizes) == 0 || hi == lo {
			return left + plotW/2
		}
		pad := 0.08 * plotW
		return left + pad + (math.Log(float64(blocks))-lo)/(hi-lo)*(plotW-2*pad)
	}
	yOf := func(pct float64) float64 { return top + plotH - pct/yMax*plotH }

	c.Title(left, 22, fmt.Sprintf("%s: block hit ratio vs cache size (%d replicas)", r.Workload, r.Replicas))
	for t := 0.0; t <= yMax+1e-9; t += yMax / 5 {
		c.YGrid(frame, yOf(t), fmt.Sprintf("%.0f%%", t))
	}
	c.Axes(frame)
	for i := range r.Sizes {
		c.XTick(frame, xOf(r.Sizes[i].CacheBlocks), fmt.Sprint(r.Sizes[i].CacheBlocks))
	}
	c.XLabel(left+plotW/2, height-10, "cache blocks per replica (log scale)")
	c.YLabel(16, top+plotH/2, "block hit ratio")

	xs := make([]float64, len(r.Sizes))
	for i := range r.Sizes {
		xs[i] = xOf(r.Sizes[i].CacheBlocks)
	}
	ys := make([]float64, len(r.Sizes))
	line := func(color, dash string) {
		c.Polyline(xs, ys, color, dash)
		for i := range xs {
			c.Dot(xs[i], ys[i], color)
		}
	}
	legend := func(k int, label, color, dash string) {
		c.LegendLine(legendX, top+10, legendLineH, k, label, color, dash)
	}

	k := 0
	if len(r.Sizes) > 0 {
		for j := range r.Sizes[0].Results {
			color := svgplot.Color(j)
			for i := range r.Sizes {
				ys[i] = yOf(0)
				if j < len(r.Sizes[i].Results) {
					ys[i] = yOf(100 * r.Sizes[i].Results[j].BlockHitRatio())
				}
			}
			line(color, "")
			legend(k, r.Sizes[0].Results[j].Policy, color, "")
			k++
		}
	}
	for i := range r.Sizes {
		ys[i] = yOf(100 * r.Sizes[i].Pooled.BlockHitRatio())
	}
	line("black", "6 4")
	legend(k, "pooled LRU bound", "black", "6 4")
	k++
	c.HLine(frame, yOf(100*r.Infinite.BlockHitRatio()), "black", "1.5", "2 3")
	legend(k, "infinite cache", "black", "2 3")
	return c.Close()
}
