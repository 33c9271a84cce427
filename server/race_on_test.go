//go:build race

package server_test

// raceEnabled reports whether the race detector is on: it multiplies the
// process's memory, so RSS bounds are only checked without it.
const raceEnabled = true
