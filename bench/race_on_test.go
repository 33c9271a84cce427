//go:build race

package bench

// raceEnabled reports whether the race detector is on; the slowest
// single-goroutine checks skip under it to keep the package fast.
const raceEnabled = true
