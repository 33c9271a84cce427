package controlserver

import (
	"math"
	"slices"
	"time"

	"github.com/inferencecache/inferencecache/controlapi"
)

// The instants RFC 3339 (and so encoding/json's time.Time) can carry: years
// 0 to 9999. A time outside them fails the whole json.Marshal.
var (
	minJSONTime = time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)
	maxJSONTime = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
)

// sanitizeSnapshot makes s encodable whatever the index stored: times
// outside years 0–9999 (a producer timestamp of MaxInt64 µs is in year
// 294247) are clamped into that range and non-finite floats become 0. It
// returns how many values it changed. The slices of s are copied before the
// first change, so a source that hands out shared slices is not modified.
func sanitizeSnapshot(s *controlapi.CacheSnapshot) int {
	n := 0
	cloned := false
	for i := range s.Replicas {
		r := s.Replicas[i]
		c := clampTime(&r.LastUpdate) + clampTime(&r.LastEventAt) + finite(&r.HitRate) + finite(&r.Pressure)
		if c == 0 {
			continue
		}
		if !cloned {
			s.Replicas, cloned = slices.Clone(s.Replicas), true
		}
		s.Replicas[i] = r
		n += c
	}
	cloned = false
	for i := range s.Tenants {
		t := s.Tenants[i]
		if finite(&t.HitRate) == 0 {
			continue
		}
		if !cloned {
			s.Tenants, cloned = slices.Clone(s.Tenants), true
		}
		s.Tenants[i] = t
		n++
	}
	return n
}

// clampTime moves *t into [minJSONTime, maxJSONTime]; it reports 1 when it
// changed it.
func clampTime(t *time.Time) int {
	switch {
	case t.Before(minJSONTime):
		*t = minJSONTime
	case t.After(maxJSONTime):
		*t = maxJSONTime
	default:
		return 0
	}
	return 1
}

// finite replaces NaN and ±Inf with 0; it reports 1 when it did.
func finite(f *float32) int {
	if v := float64(*f); math.IsNaN(v) || math.IsInf(v, 0) {
		*f = 0
		return 1
	}
	return 0
}
