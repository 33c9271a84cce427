package loadgen

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestConstantSchedule(t *testing.T) {
	s, err := NewSchedule(ArrivalConstant, 1000, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for off := s.Next(); off < 10*time.Second; off = s.Next() {
		if want := time.Duration(n) * time.Millisecond; off != want {
			t.Fatalf("request %d at %v, want %v", n, off, want)
		}
		n++
	}
	if n != 10_000 {
		t.Fatalf("%d requests in 10s at 1000/s, want 10000", n)
	}
	// A rate whose gap is not a whole number of nanoseconds does not drift.
	s, _ = NewSchedule(ArrivalConstant, 3, 1)
	var off time.Duration
	for i := 0; i <= 3_000_000; i++ {
		off = s.Next()
	}
	if want := 1_000_000 * time.Second; off < want-time.Microsecond || off > want+time.Microsecond {
		t.Fatalf("request 3,000,000 at 3/s lands at %v, want %v", off, want)
	}
}

func TestPoissonSchedule(t *testing.T) {
	const rate, n = 2000.0, 200_000
	s, err := NewSchedule(ArrivalPoisson, rate, 42)
	if err != nil {
		t.Fatal(err)
	}
	var sum, sumSq float64
	prev := time.Duration(0)
	inWindow := 0
	for i := 0; i < n; i++ {
		off := s.Next()
		if off < prev {
			t.Fatalf("offsets decrease: %v after %v", off, prev)
		}
		gap := float64(off - prev)
		sum += gap
		sumSq += gap * gap
		prev = off
		if off < 50*time.Second {
			inWindow++
		}
	}
	mean := sum / n
	wantMean := 1e9 / rate
	if math.Abs(mean-wantMean)/wantMean > 0.01 {
		t.Errorf("mean gap %.0f ns, want %.0f ns ±1%%", mean, wantMean)
	}
	// Exponential gaps have a coefficient of variation of 1.
	cv := math.Sqrt(sumSq/n-mean*mean) / mean
	if math.Abs(cv-1) > 0.02 {
		t.Errorf("gap coefficient of variation %.3f, want 1 ±0.02", cv)
	}
	// Arrivals in 50 s: Poisson(100,000), sd 316; allow 4 sd.
	if d := math.Abs(float64(inWindow) - 100_000); d > 4*316 {
		t.Errorf("%d arrivals in 50s, want 100000 ±1264", inWindow)
	}

	a, _ := NewSchedule(ArrivalPoisson, rate, 7)
	b, _ := NewSchedule(ArrivalPoisson, rate, 7)
	c, _ := NewSchedule(ArrivalPoisson, rate, 8)
	same, differ := true, false
	for i := 0; i < 1000; i++ {
		x, y, z := a.Next(), b.Next(), c.Next()
		same = same && x == y
		differ = differ || x != z
	}
	if !same || !differ {
		t.Fatalf("seeded schedules: same seed equal %v, other seed differs %v", same, differ)
	}
}

func TestScheduleErrors(t *testing.T) {
	for _, c := range []struct {
		kind Arrival
		rate float64
	}{{ArrivalConstant, 0}, {ArrivalPoisson, -1}, {ArrivalPoisson, math.NaN()}, {ArrivalConstant, 2e7}, {ArrivalTrace, 10}, {"burst", 10}} {
		if _, err := NewSchedule(c.kind, c.rate, 1); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewSchedule(%q, %v) error %v, want ErrInvalidConfig", c.kind, c.rate, err)
		}
	}
}

func TestTraceSchedule(t *testing.T) {
	src, err := newSource(WorkloadConfig{Kind: WorkloadTrace, TracePath: "../bench/workload/testdata/tiny_trace.jsonl"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := uint64(len(src.reqs))
	// Offsets are relative to the first request and repeat, shifted by the
	// span, in the next epoch.
	if got := src.arrival(1, 1); got != 0 {
		t.Fatalf("arrival(1, 1) = %v, want 0", got)
	}
	for i := uint64(0); i < n; i++ {
		want := src.reqs[i].Arrival - src.reqs[0].Arrival
		if got := src.arrival(i, 0); got != want {
			t.Fatalf("arrival(%d) = %v, want %v", i, got, want)
		}
		if got := src.arrival(i+n, 0); got != want+src.span {
			t.Fatalf("arrival(%d) = %v, want %v", i+n, got, want+src.span)
		}
	}
	s := newTraceSchedule(func(i uint64) time.Duration { return src.arrival(i, 0) / 2 })
	for i := uint64(0); i < 2*n; i++ {
		if got, want := s.Next(), src.arrival(i, 0)/2; got != want {
			t.Fatalf("trace schedule %d = %v, want %v", i, got, want)
		}
	}
}
