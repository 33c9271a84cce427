package main

import "fmt"

// The default shares of the container memory limit. The index gets half:
// its hash tables double when they grow (old and new live together for a
// moment) and gRPC buffers, snapshots and the NATS consumer need the rest.
// The GC's soft limit sits at 90 % so the collector works hard before the
// kernel's OOM killer would act, with headroom for memory Go does not
// account (stacks of exiting goroutines, fragmentation).
const (
	defaultIndexFraction = 0.5
	defaultGCFraction    = 0.9
)

// memoryLimit derives the index budget and the GC soft limit from the
// container's memory limit.
type memoryLimit struct {
	limit         int64   // --memory-limit, bytes; 0 = unknown
	indexFraction float64 // --memory-limit-index-fraction
	gcFraction    float64 // --memory-limit-gc-fraction
	indexSet      bool    // --max-index-bytes given explicitly: keep it
	gcSet         bool    // GOMEMLIMIT in the environment: the runtime applied it
}

// derivedLimits are the values to apply; 0 means leave as is.
type derivedLimits struct {
	indexBytes, gcBytes int64
}

func (m memoryLimit) derive() (derivedLimits, error) {
	switch {
	case m.limit < 0:
		return derivedLimits{}, fmt.Errorf("--memory-limit must not be negative, got %d", m.limit)
	case !(m.indexFraction > 0 && m.indexFraction < 1):
		return derivedLimits{}, fmt.Errorf("--memory-limit-index-fraction must be in (0, 1), got %v", m.indexFraction)
	case !(m.gcFraction > 0 && m.gcFraction <= 1):
		return derivedLimits{}, fmt.Errorf("--memory-limit-gc-fraction must be in (0, 1], got %v", m.gcFraction)
	case m.indexFraction >= m.gcFraction:
		return derivedLimits{}, fmt.Errorf("--memory-limit-index-fraction (%v) must be below --memory-limit-gc-fraction (%v)", m.indexFraction, m.gcFraction)
	}
	var d derivedLimits
	if m.limit == 0 {
		return d, nil
	}
	if !m.indexSet {
		d.indexBytes = int64(float64(m.limit) * m.indexFraction)
	}
	if !m.gcSet {
		d.gcBytes = int64(float64(m.limit) * m.gcFraction)
	}
	return d, nil
}
