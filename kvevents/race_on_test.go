//go:build race

package kvevents

// raceEnabled scales the NATS end-to-end targets down under the race
// detector (full size: go test -run NATS ./kvevents without -race).
const raceEnabled = true
