// Package svgplot writes small, hand-made SVG charts: a canvas, plot
// frames with grid lines and ticks, polylines, markers, rectangles (for
// stacked bars) and legends. The output has no scripts or external
// references and depends only on the calls made, so a chart drawn from
// the same data is the same bytes. Callers that iterate maps must sort
// the keys first.
//
// Coordinates follow one convention: positions of the layout (frame edges,
// legend rows) are whole pixels and print as integers; positions mapped
// from data print with one decimal. A coordinate that is NaN or infinite
// prints as 0, so bad data cannot make the document invalid.
package svgplot

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
)

// Palette is a list of distinguishable series colors.
var Palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8"}

// Color returns the palette color of series i (it wraps around).
func Color(i int) string { return Palette[((i%len(Palette))+len(Palette))%len(Palette)] }

// Escape escapes s for XML text and attribute values.
func Escape(s string) string { return html.EscapeString(s) }

// Canvas writes one SVG document. Write errors are sticky: the first one
// is returned by Close.
type Canvas struct {
	bw *bufio.Writer
}

// New starts a document of width×height pixels on a white background.
func New(w io.Writer, width, height int) *Canvas {
	c := &Canvas{bw: bufio.NewWriter(w)}
	c.Printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	c.Printf(`<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	return c
}

// Close ends the document and flushes it.
func (c *Canvas) Close() error {
	c.Printf("</svg>\n")
	return c.bw.Flush()
}

// Printf writes raw markup; arguments that are text must be escaped.
// Float arguments should go through F.
func (c *Canvas) Printf(format string, args ...any) { fmt.Fprintf(c.bw, format, args...) }

// F maps a non-finite float to 0 so that it never prints as NaN or Inf.
func F(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// dashAttr is the stroke-dasharray attribute of dash ("" for solid).
func dashAttr(dash string) string {
	if dash == "" {
		return ""
	}
	return ` stroke-dasharray="` + Escape(dash) + `"`
}

// Title writes a bold heading with its baseline at (x, y).
func (c *Canvas) Title(x, y int, s string) {
	c.Printf(`<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", x, y, Escape(s))
}

// Text writes s at (x, y); anchor is "", "middle" or "end".
func (c *Canvas) Text(x, y float64, anchor, s string) {
	a := ""
	if anchor != "" {
		a = ` text-anchor="` + Escape(anchor) + `"`
	}
	c.Printf(`<text x="%.1f" y="%.1f"%s>%s</text>`+"\n", F(x), F(y), a, Escape(s))
}

// Label writes s at (x, y) on a white halo, readable over data.
func (c *Canvas) Label(x, y float64, s string) {
	c.Printf(`<text x="%.1f" y="%.1f" stroke="white" stroke-width="3" paint-order="stroke">%s</text>`+"\n", F(x), F(y), Escape(s))
}

// Frame is a plot area in whole pixels: its top-left corner and size.
type Frame struct {
	Left, Top, W, H int
}

// Bottom returns the y of the frame's x axis.
func (f Frame) Bottom() int { return f.Top + f.H }

// Right returns the x of the frame's right edge.
func (f Frame) Right() int { return f.Left + f.W }

// YGrid draws a horizontal grid line at y with label left of the frame.
func (c *Canvas) YGrid(f Frame, y float64, label string) {
	y = F(y)
	c.Printf(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", f.Left, y, f.Right(), y)
	c.Printf(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", f.Left-6, y+4, Escape(label))
}

// Axes draws the frame's x axis (bottom) and y axis (left).
func (c *Canvas) Axes(f Frame) {
	c.Printf(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", f.Left, f.Bottom(), f.Right(), f.Bottom())
	c.Printf(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", f.Left, f.Top, f.Left, f.Bottom())
}

// XTick draws a tick below the x axis at x with label under it.
func (c *Canvas) XTick(f Frame, x float64, label string) {
	x = F(x)
	c.Printf(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>`+"\n", x, f.Bottom(), x, f.Bottom()+5)
	c.Printf(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, f.Bottom()+18, Escape(label))
}

// XLabel writes an axis title centered at (x, y).
func (c *Canvas) XLabel(x, y int, s string) {
	c.Printf(`<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", x, y, Escape(s))
}

// YLabel writes an axis title centered at (x, y), rotated to read upwards.
func (c *Canvas) YLabel(x, y int, s string) {
	c.Printf(`<text x="%d" y="%d" text-anchor="middle" transform="rotate(-90 %d %d)">%s</text>`+"\n", x, y, x, y, Escape(s))
}

// Polyline draws the points (xs[i], ys[i]) joined, 2 px wide; dash is a
// stroke-dasharray value or "" for a solid line.
func (c *Canvas) Polyline(xs, ys []float64, color, dash string) {
	c.Printf(`<polyline fill="none" stroke="%s" stroke-width="2"%s points="`, Escape(color), dashAttr(dash))
	for i := range min(len(xs), len(ys)) {
		if i > 0 {
			c.Printf(" ")
		}
		c.Printf("%.1f,%.1f", F(xs[i]), F(ys[i]))
	}
	c.Printf(`"/>` + "\n")
}

// Dot draws a filled circle of radius 3 at (x, y).
func (c *Canvas) Dot(x, y float64, color string) {
	c.Printf(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", F(x), F(y), Escape(color))
}

// HLine draws a horizontal line across the frame at y.
func (c *Canvas) HLine(f Frame, y float64, color, width, dash string) {
	y = F(y)
	c.Printf(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="%s"%s/>`+"\n",
		f.Left, y, f.Right(), y, Escape(color), Escape(width), dashAttr(dash))
}

// Rect draws a filled rectangle (a bar segment or a shaded band); opacity
// 1 omits the attribute.
func (c *Canvas) Rect(x, y, w, h float64, color string, opacity float64) {
	op := ""
	if opacity < 1 {
		op = fmt.Sprintf(` fill-opacity="%.2f"`, max(F(opacity), 0))
	}
	c.Printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"%s/>`+"\n", F(x), F(y), max(F(w), 0), max(F(h), 0), Escape(color), op)
}

// LegendLine writes legend row k at x, rows step apart below y0: a line
// sample and the label.
func (c *Canvas) LegendLine(x, y0, step, k int, label, color, dash string) {
	y := y0 + k*step
	c.Printf(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", x, y-4, x+24, y-4, Escape(color), dashAttr(dash))
	c.Printf(`<text x="%d" y="%d">%s</text>`+"\n", x+30, y, Escape(label))
}

// LegendBox writes legend row k like LegendLine with a filled square.
func (c *Canvas) LegendBox(x, y0, step, k int, label, color string) {
	y := y0 + k*step
	c.Printf(`<rect x="%d" y="%d" width="12" height="12" fill="%s"/>`+"\n", x+6, y-10, Escape(color))
	c.Printf(`<text x="%d" y="%d">%s</text>`+"\n", x+30, y, Escape(label))
}

// Scale maps data values in [Lo, Hi] linearly onto pixels [From, To]
// (To may be smaller than From, as for a y axis). A degenerate range maps
// every value to the middle.
type Scale struct {
	Lo, Hi   float64
	From, To float64
}

// Map returns the pixel of v.
func (s Scale) Map(v float64) float64 {
	if !(s.Hi > s.Lo) || math.IsInf(s.Hi-s.Lo, 0) {
		return (s.From + s.To) / 2
	}
	return s.From + (F(v)-s.Lo)/(s.Hi-s.Lo)*(s.To-s.From)
}

// NiceStep returns a tick step of the form 1, 2 or 5 times a power of ten
// that divides [0, hi] into at most n intervals (n >= 1), and the axis top:
// the smallest multiple of the step at or above hi. A hi that is not
// positive and finite gives the step 1 and top 1.
func NiceStep(hi float64, n int) (step, top float64) {
	if !(hi > 0) || math.IsInf(hi, 0) {
		return 1, 1
	}
	n = max(n, 1)
	raw := hi / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step = 10 * mag
	for _, m := range []float64{1, 2, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	top = math.Ceil(hi/step-1e-9) * step
	return step, max(top, step)
}
