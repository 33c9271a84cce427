package loadgen_test

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/inferencecache/inferencecache/loadgen"
)

// checkSVG fails unless svg is well-formed XML with an <svg> root, holds
// the three panels' titles, and prints no NaN or Inf.
func checkSVG(t *testing.T, svg []byte) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	root := ""
	for i := 0; ; i++ {
		if i > 100000 {
			t.Fatal("SVG has too many tokens")
		}
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	s := string(svg)
	for _, want := range []string{"LookupRoute latency per slice", "Reason codes per slice", "Modeled block hit ratio per slice"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks the panel title %q", want)
		}
	}
	for _, bad := range []string{"NaN", "Inf"} {
		if strings.Contains(s, bad) {
			t.Errorf("SVG prints %s:\n%s", bad, s)
		}
	}
}

func renderSVG(t *testing.T, rep *loadgen.Report) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := rep.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func sampleTimeline() *loadgen.Timeline {
	tl := &loadgen.Timeline{SliceSec: 0.5, WarmupSec: 1}
	for i := range 12 {
		s := loadgen.TimeSlice{StartSec: float64(i) * 0.5}
		if i != 7 { // a slice without responses leaves a gap
			s.Responses = 500
			s.Reasons = map[string]int64{"PREFIX_MATCH": int64(300 + 10*i), "AFFINITY_HINT": int64(150 - 10*i), "NO_HINT": 40, "other": 10}
			s.P50Us, s.P99Us, s.ServerP99Us = float64(200+10*i), float64(2500+100*i), 60
			s.HitBlocks, s.RoutedBlocks = int64(4000+100*i), 6000
		}
		if i == 3 {
			s.Errors = 25
		}
		tl.Slices = append(tl.Slices, s)
	}
	return tl
}

func TestWriteSVG(t *testing.T) {
	rep := sampleReport()
	rep.Scenario.Workload = `chat <&"'>`
	rep.Timeline = sampleTimeline()
	a, b := renderSVG(t, rep), renderSVG(t, rep)
	if !bytes.Equal(a, b) {
		t.Fatal("two renderings of the same report differ")
	}
	checkSVG(t, a)
	s := string(a)
	for _, want := range []string{"p50", "p99", ">PREFIX_MATCH<", ">AFFINITY_HINT<", ">errors<", "warm-up", ">10µs<", ">100µs<", ">1ms<", ">10ms<", "server p99", "whole run", "chat &lt;&amp;&#34;&#39;&gt;"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	// Reason codes that never occur get no legend row.
	if strings.Contains(s, "UNKNOWN_MODEL") {
		t.Error("the legend lists a reason code the run never saw")
	}
	// The gap at slice 7 breaks each of the four series in two.
	if n := strings.Count(s, "<polyline"); n != 8 {
		t.Errorf("%d polylines, want 2 per series", n)
	}
}

// TestWriteSVGEdges: empty and degenerate timelines draw without NaN,
// Inf or a panic.
func TestWriteSVGEdges(t *testing.T) {
	nan := math.NaN()
	for name, tl := range map[string]*loadgen.Timeline{
		"no timeline":  nil,
		"no slices":    {SliceSec: 0.1, WarmupSec: 1},
		"one slice":    {SliceSec: 0.1, Slices: []loadgen.TimeSlice{{Responses: 3, P50Us: 90, P99Us: 120, Reasons: map[string]int64{"NO_HINT": 3}, RoutedBlocks: 4, HitBlocks: 1}}},
		"zero lookups": {SliceSec: 1, WarmupSec: 1, Slices: []loadgen.TimeSlice{{}, {StartSec: 1}}},
		"only errors":  {SliceSec: 1, Slices: []loadgen.TimeSlice{{Errors: 4}}},
		"bad numbers":  {SliceSec: nan, WarmupSec: math.Inf(1), Slices: []loadgen.TimeSlice{{Responses: 1, P50Us: nan, P99Us: math.Inf(1), Reasons: map[string]int64{"NO_HINT": 1}}}},
		"zero slice":   {SliceSec: 0, Slices: []loadgen.TimeSlice{{Responses: 1, Reasons: map[string]int64{"NO_HINT": 1}}}},
	} {
		t.Run(name, func(t *testing.T) {
			rep := sampleReport()
			rep.Timeline = tl
			if name == "bad numbers" {
				rep.Feedback.ModeledBlockHitRatio = nan
				rep.Lookups.ThroughputPerSec = math.Inf(1)
			}
			checkSVG(t, renderSVG(t, rep))
		})
	}
	checkSVG(t, renderSVG(t, &loadgen.Report{}))
}
