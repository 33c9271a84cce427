package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// Histogram layout: log-linear buckets over nanoseconds, in the manner of an
// HDR histogram with 64 linear sub-buckets per power of two.
//
//   - Values below 2*histSub (128 ns) have a bucket each (exact).
//   - A larger value v with bit length L falls in magnitude shift = L-7: its
//     bucket is shift*histSub + (v >> shift), where v >> shift lies in
//     [64, 128). The bucket is 2^shift wide and starts at or above
//     64 * 2^shift, so its width is at most 1/64 of any value in it.
//
// Quantiles report the bucket midpoint, so the error against the exact
// sample at the same rank is at most half a bucket: 1/128 (0.78 %) of the
// value. Values at or above histMax are clamped into the last bucket (the
// exact maximum is still kept).
const (
	histSubBits = 6
	histSub     = 1 << histSubBits // linear sub-buckets per magnitude
	histMaxBits = 40               // 2^40 ns ≈ 18 minutes
	histMax     = 1<<histMaxBits - 1
	histBuckets = (histMaxBits-histSubBits)*histSub + histSub
)

// Histogram records durations with at most 1/128 relative error. The zero
// value is ready to use. A Histogram is not safe for concurrent use; the
// runner gives each worker its own and merges them.
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    float64 // nanoseconds
	min    uint64
	max    uint64
}

// bucketOf returns the bucket index of v (v <= histMax).
func bucketOf(v uint64) int {
	if v < 2*histSub {
		return int(v)
	}
	shift := bits.Len64(v) - (histSubBits + 1)
	return shift*histSub + int(v>>uint(shift))
}

// bucketRange returns the lowest value of bucket i and its width.
func bucketRange(i int) (lo, width uint64) {
	if i < 2*histSub {
		return uint64(i), 1
	}
	shift := i/histSub - 1
	sub := uint64(i - shift*histSub)
	return sub << uint(shift), 1 << uint(shift)
}

// Record adds one duration; negative durations count as 0.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(0)
	if d > 0 {
		v = uint64(d)
	}
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
	if v > histMax {
		v = histMax
	}
	h.counts[bucketOf(v)]++
}

// Merge adds every sample of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
	for i, c := range o.counts {
		h.counts[i] += c
	}
}

// Reset empties h.
func (h *Histogram) Reset() { *h = Histogram{} }

// Count returns the number of samples.
func (h *Histogram) Count() uint64 { return h.n }

// Min returns the exact smallest sample (0 when empty).
func (h *Histogram) Min() time.Duration { return time.Duration(h.min) }

// Max returns the exact largest sample (0 when empty).
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean returns the exact mean (0 when empty).
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the sample at nearest rank ceil(q*n), as the midpoint of
// its bucket clamped to the exact [min, max]; q <= 0 gives the minimum and
// q >= 1 the maximum. An empty histogram gives 0.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if q <= 0 {
		return time.Duration(h.min)
	}
	if q >= 1 {
		return time.Duration(h.max)
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			if i == histBuckets-1 {
				return time.Duration(h.max) // holds the clamped over-range samples
			}
			lo, w := bucketRange(i)
			v := lo + w/2
			return time.Duration(min(max(v, h.min), h.max))
		}
	}
	return time.Duration(h.max) // unreachable: counts sum to n
}
