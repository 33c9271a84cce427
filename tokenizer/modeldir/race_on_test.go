//go:build race

package modeldir

const raceEnabled = true
