package bench

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
)

// svgPalette colors policies in report order; bounds are drawn in black.
var svgPalette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8"}

// WriteSVG plots block hit ratio against per-replica cache size, one line
// per policy plus the pooled LRU bound (dashed) and the infinite-cache
// bound (dotted). The x axis is logarithmic. The SVG is hand-written, has
// no scripts or external references, and is deterministic for a Report.
func (r *Report) WriteSVG(w io.Writer) error {
	const (
		width, height        = 800, 420
		left, right          = 60, 250 // plot margins; the legend sits on the right
		top, bottom          = 40, 50
		plotW, plotH         = width - left - right, height - top - bottom
		legendX, legendLineH = width - right + 20, 18
	)
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }

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

	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	p(`<text x="%d" y="22" font-size="14" font-weight="bold">%s: block hit ratio vs cache size (%d replicas)</text>`+"\n",
		left, html.EscapeString(r.Workload), r.Replicas)
	// Axes, y grid and ticks.
	for t := 0.0; t <= yMax+1e-9; t += yMax / 5 {
		y := yOf(t)
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, left+plotW, y)
		p(`<text x="%d" y="%.1f" text-anchor="end">%.0f%%</text>`+"\n", left-6, y+4, t)
	}
	p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top+plotH, left+plotW, top+plotH)
	p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top, left, top+plotH)
	for i := range r.Sizes {
		x := xOf(r.Sizes[i].CacheBlocks)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>`+"\n", x, top+plotH, x, top+plotH+5)
		p(`<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x, top+plotH+18, r.Sizes[i].CacheBlocks)
	}
	p(`<text x="%d" y="%d" text-anchor="middle">cache blocks per replica (log scale)</text>`+"\n", left+plotW/2, height-10)
	p(`<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">block hit ratio</text>`+"\n", top+plotH/2, top+plotH/2)

	line := func(ys []float64, color, dash string) {
		p(`<polyline fill="none" stroke="%s" stroke-width="2"%s points="`, color, dash)
		for i := range r.Sizes {
			if i > 0 {
				p(" ")
			}
			p("%.1f,%.1f", xOf(r.Sizes[i].CacheBlocks), yOf(ys[i]))
		}
		p(`"/>` + "\n")
		for i := range r.Sizes {
			p(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", xOf(r.Sizes[i].CacheBlocks), yOf(ys[i]), color)
		}
	}
	legend := func(k int, label, color, dash string) {
		y := top + 10 + k*legendLineH
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", legendX, y-4, legendX+24, y-4, color, dash)
		p(`<text x="%d" y="%d">%s</text>`+"\n", legendX+30, y, html.EscapeString(label))
	}

	ys := make([]float64, len(r.Sizes))
	k := 0
	if len(r.Sizes) > 0 {
		for j := range r.Sizes[0].Results {
			color := svgPalette[j%len(svgPalette)]
			for i := range r.Sizes {
				ys[i] = 0
				if j < len(r.Sizes[i].Results) {
					ys[i] = 100 * r.Sizes[i].Results[j].BlockHitRatio()
				}
			}
			line(ys, color, "")
			legend(k, r.Sizes[0].Results[j].Policy, color, "")
			k++
		}
	}
	for i := range r.Sizes {
		ys[i] = 100 * r.Sizes[i].Pooled.BlockHitRatio()
	}
	line(ys, "black", ` stroke-dasharray="6 4"`)
	legend(k, "pooled LRU bound", "black", ` stroke-dasharray="6 4"`)
	k++
	yi := yOf(100 * r.Infinite.BlockHitRatio())
	p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="black" stroke-width="1.5" stroke-dasharray="2 3"/>`+"\n", left, yi, left+plotW, yi)
	legend(k, "infinite cache", "black", ` stroke-dasharray="2 3"`)
	p("</svg>\n")
	return bw.Flush()
}
