package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketLayout(t *testing.T) {
	prevEnd := uint64(0)
	for i := 0; i < histBuckets; i++ {
		lo, w := bucketRange(i)
		if lo != prevEnd {
			t.Fatalf("bucket %d starts at %d, want %d (buckets must tile the range)", i, lo, prevEnd)
		}
		if got := bucketOf(lo); got != i {
			t.Fatalf("bucketOf(%d) = %d, want %d", lo, got, i)
		}
		if got := bucketOf(lo + w - 1); got != i {
			t.Fatalf("bucketOf(%d) = %d, want %d", lo+w-1, got, i)
		}
		if lo >= 2*histSub && float64(w)/float64(lo) > 1.0/histSub {
			t.Fatalf("bucket %d: width %d over %d exceeds 1/%d", i, w, lo, histSub)
		}
		prevEnd = lo + w
	}
	if prevEnd != histMax+1 {
		t.Fatalf("buckets end at %d, want %d", prevEnd, uint64(histMax)+1)
	}
}

// exactQuantile is the nearest-rank quantile of sorted samples.
func exactQuantile(sorted []time.Duration, q float64) time.Duration {
	rank := int(math.Ceil(q * float64(len(sorted))))
	return sorted[max(rank, 1)-1]
}

func TestHistogramAccuracy(t *testing.T) {
	for _, dist := range []struct {
		name string
		draw func(r *rand.Rand) time.Duration
	}{
		// Log-uniform from 100 ns to 10 s: every magnitude equally often.
		{"log-uniform", func(r *rand.Rand) time.Duration {
			return time.Duration(math.Exp(math.Log(100) + r.Float64()*math.Log(1e8)))
		}},
		// A typical latency shape: a body near 200 µs and a long tail.
		{"lognormal", func(r *rand.Rand) time.Duration {
			return time.Duration(200e3 * math.Exp(0.8*r.NormFloat64()))
		}},
		// Small integers, where buckets are exact.
		{"small", func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(128)) }},
	} {
		t.Run(dist.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, 11))
			const n = 200_000
			samples := make([]time.Duration, n)
			var h Histogram
			for i := range samples {
				samples[i] = dist.draw(r)
				h.Record(samples[i])
			}
			slices.Sort(samples)
			if h.Count() != n || h.Min() != samples[0] || h.Max() != samples[n-1] {
				t.Fatalf("count/min/max = %d/%v/%v, want %d/%v/%v", h.Count(), h.Min(), h.Max(), n, samples[0], samples[n-1])
			}
			for _, q := range []float64{0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999} {
				want, got := exactQuantile(samples, q), h.Quantile(q)
				rel := math.Abs(float64(got-want)) / float64(max(want, 1))
				if rel > 0.01 {
					t.Errorf("q%v = %v, exact %v: relative error %.4f > 1%%", q, got, want, rel)
				}
				if want >= 2*histSub && rel > 1.0/(2*histSub)+1e-9 {
					t.Errorf("q%v = %v, exact %v: relative error %.5f > 1/128", q, got, want, rel)
				}
			}
		})
	}
}

func TestHistogramMergeAndEdges(t *testing.T) {
	var empty Histogram
	if empty.Quantile(0.5) != 0 || empty.Mean() != 0 || empty.Max() != 0 {
		t.Fatal("an empty histogram must report zeros")
	}
	var a, b, all Histogram
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 10_000; i++ {
		d := time.Duration(r.Int64N(int64(50 * time.Millisecond)))
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	a.Merge(&b)
	a.Merge(&empty)
	if a.counts != all.counts || a.Count() != all.Count() || a.Min() != all.Min() || a.Max() != all.Max() {
		t.Fatal("merging two halves differs from recording everything")
	}
	if math.Abs(float64(a.Mean()-all.Mean())) > 1 {
		t.Fatalf("merged mean %v, want %v", a.Mean(), all.Mean())
	}

	var h Histogram
	h.Record(-time.Second) // counts as 0
	h.Record(time.Duration(1) << 50)
	if h.Min() != 0 || h.Max() != time.Duration(1)<<50 {
		t.Fatalf("min/max = %v/%v", h.Min(), h.Max())
	}
	if got := h.Quantile(1); got != time.Duration(1)<<50 {
		t.Fatalf("q1 = %v, want the exact max", got)
	}
	if got := h.Quantile(0.99); got != time.Duration(1)<<50 {
		t.Fatalf("q0.99 of an over-range sample = %v, want it clamped to the max", got)
	}
	h.Reset()
	if h.Count() != 0 {
		t.Fatal("Reset left samples")
	}

	// Nearest rank on exact small values: 1..100 ns.
	var s Histogram
	for v := 1; v <= 100; v++ {
		s.Record(time.Duration(v))
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0, 1}, {0.01, 1}, {0.5, 50}, {0.505, 51}, {0.99, 99}, {0.999, 100}, {1, 100}} {
		if got := s.Quantile(c.q); got != c.want {
			t.Errorf("q%v = %v, want %v", c.q, got, c.want)
		}
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	var h Histogram
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Record(time.Duration(i*7919) % time.Second)
	}
}
