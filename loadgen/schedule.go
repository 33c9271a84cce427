package loadgen

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Arrival names an open-loop arrival process.
type Arrival string

const (
	// ArrivalConstant sends request i at exactly i/rate.
	ArrivalConstant Arrival = "constant"
	// ArrivalPoisson draws independent exponential gaps of mean 1/rate.
	ArrivalPoisson Arrival = "poisson"
	// ArrivalTrace replays the workload's own arrival times (a Mooncake
	// trace's timestamps), divided by Config.Speedup.
	ArrivalTrace Arrival = "trace"
)

// Schedule yields the intended send times of an open-loop run as offsets
// from the start of the run. Latency is measured from these times, not from
// when a request actually left, so a server that stalls the sender is still
// charged for the wait (no coordinated omission). A Schedule is
// deterministic for its arguments and not safe for concurrent use.
type Schedule struct {
	kind  Arrival
	gapNs float64 // mean gap, constant and poisson
	rng   *rand.Rand
	i     uint64
	t     float64 // poisson: running offset in ns

	at func(i uint64) time.Duration // trace: offset of request i
}

// NewSchedule returns a constant or Poisson schedule at rate requests per
// second; seed drives the Poisson draws.
func NewSchedule(kind Arrival, rate float64, seed uint64) (*Schedule, error) {
	if !(rate > 0) || rate > 1e7 {
		return nil, fmt.Errorf("%w: rate %v per second out of (0, 1e7]", ErrInvalidConfig, rate)
	}
	s := &Schedule{kind: kind, gapNs: 1e9 / rate}
	switch kind {
	case ArrivalConstant:
	case ArrivalPoisson:
		s.rng = rand.New(rand.NewPCG(seed, 0x706f6973736f6e))
	default:
		return nil, fmt.Errorf("%w: arrival %q is not constant or poisson", ErrInvalidConfig, kind)
	}
	return s, nil
}

// newTraceSchedule replays offsets given by at, which must not decrease.
func newTraceSchedule(at func(i uint64) time.Duration) *Schedule {
	return &Schedule{kind: ArrivalTrace, at: at}
}

// Next returns the offset of the next request. Offsets never decrease.
func (s *Schedule) Next() time.Duration {
	i := s.i
	s.i++
	switch s.kind {
	case ArrivalPoisson:
		s.t += s.rng.ExpFloat64() * s.gapNs
		return time.Duration(s.t)
	case ArrivalTrace:
		return s.at(i)
	default:
		// Computed from i, not accumulated, so rounding never drifts.
		return time.Duration(float64(i) * s.gapNs)
	}
}
