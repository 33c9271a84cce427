//go:build race

package tokenizer

const raceEnabled = true
