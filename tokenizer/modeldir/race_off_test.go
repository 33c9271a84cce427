//go:build !race

package modeldir

const raceEnabled = false
