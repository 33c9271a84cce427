//go:build !race

package rpc_test

// raceEnabled reports whether the race detector is on: it makes sync.Pool
// drop items at random, so allocation counts are only pinned without it.
const raceEnabled = false
