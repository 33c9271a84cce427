//go:build !race

package rpc

// raceEnabled reports whether the race detector is on (it makes sync.Pool drop
// items, so allocation counts are pinned without it).
const raceEnabled = false
