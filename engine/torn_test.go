package engine

import (
	"testing"
	"time"
)

// nodeOf returns the node of an 8-byte key in the only scope of (team, m,
// vllm, "") (test helper; takes the writer lock).
func nodeOf(t *testing.T, e *Engine, hash uint64) uint32 {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	sc := e.lookupDomain("team", "m").findScheme("vllm").findScope("")
	k, _ := e.makeKey(h8(hash))
	off, _ := e.findLocked(sc.table.Load(), sc.id, &k)
	if off == 0 {
		t.Fatalf("no node for %x", hash)
	}
	return off
}

// TestReadersBoundedOnStuckNode pins issue 12 item 7: every reader loop is
// bounded. A node whose sequence word stays odd (a writer stopped
// mid-write) must not keep LookupRoute or Credit spinning: they give up on
// that node and answer as if it were absent.
func TestReadersBoundedOnStuckNode(t *testing.T) {
	x := newTix(t)
	x.store.Apply(lfuBody("team"))
	x.chain("a", tT, 0, 1, 2, 3)
	off := nodeOf(t, x.e, 2)
	seq := x.e.arena.Word(off + nSeq)
	s := seq.Load()
	seq.Store(s + 1) // stuck mid-write
	done := make(chan [2]*LookupResult)
	go func() {
		var exact, chain LookupResult
		x.e.LookupRoute(&LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "vllm", PrefixHash: h8(2)}, tT, &exact)
		x.e.LookupRoute(&LookupRequest{TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(1, 2, 3), BlockTokenCounts: sixteens(3)}, tT, &chain)
		x.e.Credit(&chain)
		done <- [2]*LookupResult{&exact, &chain}
	}()
	select {
	case res := <-done:
		if res[0].Strategy == StrategyPrefixMatch {
			t.Errorf("exact lookup matched a node stuck mid-write: %+v", res[0].Scores)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("LookupRoute did not return within 5 s while a node stayed mid-write")
		seq.Store(s + 2) // let the spinning reader finish
		<-done
	}
	seq.Store(s + 2)
}
