package svgplot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
)

func draw(w io.Writer) error {
	c := New(w, 300, 200)
	f := Frame{Left: 40, Top: 30, W: 200, H: 120}
	c.Title(40, 20, `a <b> & "c" 'd'`)
	ys := Scale{Lo: 0, Hi: 10, From: float64(f.Bottom()), To: float64(f.Top)}
	xs := Scale{Lo: 0, Hi: 4, From: float64(f.Left), To: float64(f.Right())}
	for _, t := range []float64{0, 5, 10} {
		c.YGrid(f, ys.Map(t), "y<")
	}
	c.Axes(f)
	c.XTick(f, xs.Map(2), "2&")
	c.XLabel(140, 190, "x")
	c.YLabel(12, 90, "y")
	nan := math.NaN()
	c.Polyline([]float64{xs.Map(0), xs.Map(1), nan}, []float64{ys.Map(1), math.Inf(1), ys.Map(3)}, Color(-1), "6 4")
	c.Dot(nan, 1, "red")
	c.HLine(f, math.Inf(-1), "black", "1.5", "")
	c.Rect(1, 2, -3, nan, "#123456", 0.5)
	c.Text(1, 2, "end", "t")
	c.Label(nan, 2, "l")
	c.LegendLine(250, 40, 18, 1, "line", "blue", "2 3")
	c.LegendBox(250, 40, 18, 2, "box", "green")
	return c.Close()
}

func TestCanvas(t *testing.T) {
	var a, b bytes.Buffer
	if err := draw(&a); err != nil {
		t.Fatal(err)
	}
	if err := draw(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("the same calls drew different bytes")
	}
	dec := xml.NewDecoder(bytes.NewReader(a.Bytes()))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, a.String())
		}
	}
	s := a.String()
	for _, want := range []string{
		`a &lt;b&gt; &amp; &#34;c&#34; &#39;d&#39;`,
		`<line x1="40" y1="150" x2="240" y2="150" stroke="black"/>`,
		`stroke="#aec7e8" stroke-width="2" stroke-dasharray="6 4" points="40.0,138.0 90.0,0.0 0.0,114.0"/>`,
		`<rect x="1.0" y="2.0" width="0.0" height="0.0" fill="#123456" fill-opacity="0.50"/>`,
		`<text x="1.0" y="2.0" text-anchor="end">t</text>`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %s:\n%s", want, s)
		}
	}
	if strings.Contains(s, "NaN") || strings.Contains(s, "Inf") {
		t.Errorf("non-finite coordinates printed:\n%s", s)
	}
	if !strings.HasSuffix(s, "</svg>\n") {
		t.Error("document not closed")
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestCloseReportsWriteError(t *testing.T) {
	if err := draw(failWriter{}); err == nil {
		t.Error("a failed write went unreported")
	}
}

func TestScale(t *testing.T) {
	s := Scale{Lo: 0, Hi: 10, From: 100, To: 0}
	if s.Map(0) != 100 || s.Map(10) != 0 || s.Map(5) != 50 {
		t.Errorf("Map: %v %v %v", s.Map(0), s.Map(10), s.Map(5))
	}
	for _, d := range []Scale{{Lo: 1, Hi: 1, From: 0, To: 10}, {Lo: 2, Hi: 1, From: 0, To: 10}, {Lo: 0, Hi: math.Inf(1), From: 0, To: 10}, {Lo: math.NaN(), Hi: 1, From: 0, To: 10}} {
		if got := d.Map(3); got != 5 {
			t.Errorf("degenerate %+v maps to %v, want the middle", d, got)
		}
	}
}

func TestNiceStep(t *testing.T) {
	for _, c := range []struct {
		hi        float64
		n         int
		step, top float64
	}{
		{10, 5, 2, 10},
		{11, 5, 5, 15},
		{0.7, 4, 0.2, 0.8},
		{3, 0, 5, 5},
		{100, 4, 50, 100},
		{0, 4, 1, 1},
		{-3, 4, 1, 1},
		{math.NaN(), 4, 1, 1},
		{math.Inf(1), 4, 1, 1},
	} {
		step, top := NiceStep(c.hi, c.n)
		if math.Abs(step-c.step) > 1e-12 || math.Abs(top-c.top) > 1e-12 {
			t.Errorf("NiceStep(%v, %d) = %v, %v; want %v, %v", c.hi, c.n, step, top, c.step, c.top)
		}
	}
}
