package loadgen

import (
	"math"
	"sync/atomic"
	"time"
)

// The timeline splits the run (warm-up and measured window) into at most
// maxSlices slices of equal length, at least minSlice each, and counts
// per slice: responses by reason code, errors, the modeled block hits, and
// latency in a coarse histogram. Lookups fall in the slice of their
// intended send time, so a slice is what the schedule sent in it.
//
// The counters are shared by every worker and preallocated when the run
// starts, so recording is a few atomic adds: no allocation and no lock on
// the request path, and memory independent of Concurrency.
const (
	maxSlices = 60
	minSlice  = 100 * time.Millisecond
	// sliceRound is what the slice length is rounded up to, so the axis
	// reads in round numbers.
	sliceRound = 10 * time.Millisecond

	// coarseShift merges 2^coarseShift adjacent Histogram buckets into one
	// timeline bucket: 16 sub-buckets per power of two, at most 1/32
	// relative error at the bucket midpoint, 560 buckets per slice.
	coarseShift   = 2
	coarseBuckets = (histBuckets + 1<<coarseShift - 1) >> coarseShift
)

// timelineReasons are the reason codes the timeline counts one by one, in
// the order the SVG stacks them; any other code counts as reasonOther.
var timelineReasons = [...]string{
	"PREFIX_MATCH", "AFFINITY_HINT", "TENANT_HOT", "NO_HINT", "POLICY_REQUIRES_CHAIN", "TIMEOUT",
	"UNKNOWN_TENANT", "UNKNOWN_MODEL", "UNKNOWN_HASH_SCHEME",
}

// reasonOther is the timeline's name for a reason code it does not know.
const reasonOther = "other"

const numReasons = len(timelineReasons) + 1 // the last index is reasonOther

// reasonIndex returns the timeline index of a reason code without
// allocating.
func reasonIndex(code string) int {
	for i, r := range timelineReasons {
		if r == code {
			return i
		}
	}
	return len(timelineReasons)
}

type sliceCounters struct {
	reasons              [numReasons]atomic.Int64
	errs                 atomic.Int64
	hitBlocks, allBlocks atomic.Int64
}

type timeline struct {
	slice    time.Duration
	counters []sliceCounters
	lat      []atomic.Uint64 // len(counters) × coarseBuckets: client latency
	srv      []atomic.Uint64 // the same for the server's lookup_latency_us
}

// sliceLength returns the slice length for a run of span.
func sliceLength(span time.Duration) time.Duration {
	d := max((span+maxSlices-1)/maxSlices, minSlice)
	return (d + sliceRound - 1) / sliceRound * sliceRound
}

func newTimeline(span time.Duration) *timeline {
	slice := sliceLength(span)
	n := int(max((span+slice-1)/slice, 1))
	return &timeline{slice: slice, counters: make([]sliceCounters, n),
		lat: make([]atomic.Uint64, n*coarseBuckets), srv: make([]atomic.Uint64, n*coarseBuckets)}
}

// index returns the slice of a lookup sent at offset off into the run;
// offsets outside the run are clamped into the first or last slice.
func (t *timeline) index(off time.Duration) int {
	i := int(max(off, 0) / t.slice)
	return min(i, len(t.counters)-1)
}

// coarseBucket returns the timeline bucket of a latency.
func coarseBucket(d time.Duration) int {
	v := uint64(max(d, 0))
	return bucketOf(min(v, histMax)) >> coarseShift
}

// recordOK counts one response in slice i: its client latency, the
// server's lookup latency, its reason code and modeled block hits.
func (t *timeline) recordOK(i int, lat, srv time.Duration, reason string, hitBlocks, allBlocks int) {
	c := &t.counters[i]
	c.reasons[reasonIndex(reason)].Add(1)
	c.hitBlocks.Add(int64(hitBlocks))
	c.allBlocks.Add(int64(allBlocks))
	t.lat[i*coarseBuckets+coarseBucket(lat)].Add(1)
	t.srv[i*coarseBuckets+coarseBucket(srv)].Add(1)
}

// recordErr counts one failed call in slice i.
func (t *timeline) recordErr(i int) { t.counters[i].errs.Add(1) }

// quantile returns the latency at nearest rank ceil(q*n) of slice i's
// responses in h (t.lat or t.srv), as its bucket's midpoint (0 without
// responses).
func (t *timeline) quantile(h []atomic.Uint64, i int, q float64) time.Duration {
	b := h[i*coarseBuckets : (i+1)*coarseBuckets]
	var n uint64
	for k := range b {
		n += b[k].Load()
	}
	if n == 0 {
		return 0
	}
	rank := max(uint64(math.Ceil(q*float64(n))), 1)
	var seen uint64
	for k := range b {
		seen += b[k].Load()
		if seen >= rank {
			lo, _ := bucketRange(k << coarseShift)
			last := min((k+1)<<coarseShift, histBuckets) - 1
			hlo, hw := bucketRange(last)
			return time.Duration(lo + (hlo+hw-lo)/2)
		}
	}
	return 0
}

// Timeline is the run cut into equal time slices, warm-up included:
// what the SVG plots.
type Timeline struct {
	SliceSec  float64     `json:"sliceSec"`
	WarmupSec float64     `json:"warmupSec"`
	Slices    []TimeSlice `json:"slices"`
}

// TimeSlice counts the lookups sent in one slice of the run.
type TimeSlice struct {
	StartSec  float64 `json:"startSec"`
	Responses int64   `json:"responses"`
	Errors    int64   `json:"errors"`
	// P50Us and P99Us are the client latency percentiles of the slice's
	// responses (coarse buckets: within about 3 %).
	P50Us float64 `json:"p50Us"`
	P99Us float64 `json:"p99Us"`
	// ServerP99Us is the p99 of the responses' lookup_latency_us: what of
	// P99Us the server spent.
	ServerP99Us float64 `json:"serverP99Us"`
	// Reasons counts responses by reason code; codes the timeline does not
	// track count as "other".
	Reasons map[string]int64 `json:"reasons,omitempty"`
	// HitBlocks of RoutedBlocks were held by the replica each lookup was
	// routed to (the modeled block hit ratio).
	HitBlocks    int64 `json:"hitBlocks"`
	RoutedBlocks int64 `json:"routedBlocks"`
}

// report summarizes the slices that started within elapsed.
func (t *timeline) report(warmup, elapsed time.Duration) *Timeline {
	out := &Timeline{SliceSec: t.slice.Seconds(), WarmupSec: warmup.Seconds()}
	for i := range t.counters {
		start := time.Duration(i) * t.slice
		if i > 0 && start >= elapsed {
			break
		}
		c := &t.counters[i]
		s := TimeSlice{StartSec: start.Seconds(), Errors: c.errs.Load(),
			HitBlocks: c.hitBlocks.Load(), RoutedBlocks: c.allBlocks.Load()}
		for k := range c.reasons {
			n := c.reasons[k].Load()
			if n == 0 {
				continue
			}
			if s.Reasons == nil {
				s.Reasons = map[string]int64{}
			}
			name := reasonOther
			if k < len(timelineReasons) {
				name = timelineReasons[k]
			}
			s.Reasons[name] = n
			s.Responses += n
		}
		us := func(d time.Duration) float64 { return float64(d) / 1e3 }
		s.P50Us, s.P99Us = us(t.quantile(t.lat, i, 0.5)), us(t.quantile(t.lat, i, 0.99))
		s.ServerP99Us = us(t.quantile(t.srv, i, 0.99))
		out.Slices = append(out.Slices, s)
	}
	return out
}
