package engine

import (
	"os"
	"runtime/debug"
	"strconv"
	"testing"
)

// TestInstrLookup runs N lookups on a small in-cache workload so that
// callgrind can count instructions per lookup, a figure that, unlike time on
// a shared machine, does not move with the neighbors:
//
//	go test -c -o /tmp/eng.test ./engine
//	INSTR_LOOKUPS=10000 valgrind --tool=callgrind --toggle-collect='*instrLoop*' \
//	    /tmp/eng.test -test.run TestInstrLookup
//
// Skipped unless INSTR_LOOKUPS is set.
func TestInstrLookup(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("INSTR_LOOKUPS"))
	if n == 0 {
		t.Skip()
	}
	w := newBenchWorkload(200)
	e := New(Config{})
	w.forEachUpdate(benchNow, func(u *Update) { e.Ingest(u, benchNow) })
	reqs := lookupRequests(w, 256)
	debug.SetGCPercent(-1)
	instrLoop(e, reqs, n)
}

//go:noinline
func instrLoop(e *Engine, reqs []LookupRequest, n int) {
	var res LookupResult
	for i := 0; i < n; i++ {
		e.LookupRoute(&reqs[i&255], benchNow+1, &res)
	}
}
