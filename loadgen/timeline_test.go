package loadgen

import (
	"math"
	"testing"
	"time"
)

func TestSliceLength(t *testing.T) {
	for _, c := range []struct {
		span, slice time.Duration
		n           int
	}{
		{0, minSlice, 1},
		{time.Second, 100 * time.Millisecond, 10},
		{6 * time.Second, 100 * time.Millisecond, 60},
		{12 * time.Second, 200 * time.Millisecond, 60},
		{7 * time.Second, 120 * time.Millisecond, 59},
		{time.Hour, time.Minute, 60},
	} {
		tl := newTimeline(c.span)
		if tl.slice != c.slice || len(tl.counters) != c.n || len(tl.counters) > maxSlices {
			t.Errorf("span %v: %d slices of %v, want %d of %v", c.span, len(tl.counters), tl.slice, c.n, c.slice)
		}
	}
	tl := newTimeline(time.Second)
	for off, want := range map[time.Duration]int{-time.Second: 0, 0: 0, 99 * time.Millisecond: 0, 100 * time.Millisecond: 1, time.Hour: 9} {
		if got := tl.index(off); got != want {
			t.Errorf("index(%v) = %d, want %d", off, got, want)
		}
	}
}

// TestTimelineQuantile: the coarse buckets keep a slice's percentiles
// within 1/32 of the exact ones, and the counters add up.
func TestTimelineQuantile(t *testing.T) {
	tl := newTimeline(time.Second)
	var exact Histogram
	for k := range 1000 {
		d := time.Duration(50_000+k*k*7) * time.Nanosecond
		exact.Record(d)
		tl.recordOK(3, d, d/10, "PREFIX_MATCH", 3, 4)
	}
	tl.recordOK(3, time.Duration(math.MaxInt64), 0, "SOMETHING_NEW", 0, 2)
	tl.recordOK(3, -time.Second, -1, "NO_HINT", 0, 0)
	tl.recordErr(3)
	for _, q := range []float64{0.5, 0.99} {
		got, want := tl.quantile(tl.lat, 3, q), exact.Quantile(q)
		if math.Abs(float64(got-want)) > float64(want)/32 {
			t.Errorf("q%v = %v, exact %v", q, got, want)
		}
		if got, want := tl.quantile(tl.srv, 3, q), exact.Quantile(q)/10; math.Abs(float64(got-want)) > float64(want)/32 {
			t.Errorf("server q%v = %v, exact %v", q, got, want)
		}
	}
	rep := tl.report(200*time.Millisecond, 450*time.Millisecond)
	if len(rep.Slices) != 5 || rep.SliceSec != 0.1 || rep.WarmupSec != 0.2 {
		t.Fatalf("timeline %+v: want 5 slices of 0.1s", rep)
	}
	s := rep.Slices[3]
	if s.Responses != 1002 || s.Errors != 1 || s.Reasons["PREFIX_MATCH"] != 1000 || s.Reasons[reasonOther] != 1 ||
		s.Reasons["NO_HINT"] != 1 || s.HitBlocks != 3000 || s.RoutedBlocks != 4002 || s.StartSec != 0.3 {
		t.Errorf("slice 3: %+v", s)
	}
	if e := rep.Slices[0]; e.Responses != 0 || e.Reasons != nil || e.P99Us != 0 {
		t.Errorf("empty slice: %+v", e)
	}
}

// TestTimelineRecordAllocs: recording on the request path allocates
// nothing.
func TestTimelineRecordAllocs(t *testing.T) {
	tl := newTimeline(10 * time.Second)
	reason := string([]byte("AFFINITY_HINT")) // not the constant's pointer
	if n := testing.AllocsPerRun(1000, func() {
		i := tl.index(1500 * time.Millisecond)
		tl.recordOK(i, 123*time.Microsecond, 9*time.Microsecond, reason, 2, 5)
		tl.recordErr(i)
	}); n != 0 {
		t.Errorf("recording allocates %v times per lookup", n)
	}
}

func BenchmarkTimelineRecord(b *testing.B) {
	tl := newTimeline(10 * time.Second)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var k int
		for pb.Next() {
			k++
			tl.recordOK(tl.index(time.Duration(k)*time.Millisecond), time.Duration(k%5000)*time.Microsecond, 20*time.Microsecond, "PREFIX_MATCH", 3, 4)
		}
	})
}
