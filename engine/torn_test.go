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

// lfuOf returns the LFU counts of a node's holders by replica name.
func lfuOf(e *Engine, off uint32) map[string]uint32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]uint32{}
	meta, block := e.w(off+nMeta), e.w(off+nHolders)
	slots := e.lookupDomain("team", "m").replicaSlots()
	for i := uint32(0); i < metaCount(meta); i++ {
		h := holderAt(block, i)
		out[slots[uint16(e.w(h+hRidTier))].name] = e.w(h+hLFU) & lfuCountMask
	}
	return out
}

// TestChainWalkRaceEndsTheWalk pins issue 12 item 4: after the strict
// passes are used up, a step that races a writer ends the walk at that
// block. No runner may be counted as holding the raced block or anything
// after it, and Credit must not land on the nodes after it.
func TestChainWalkRaceEndsTheWalk(t *testing.T) {
	x := newTix(t)
	x.store.Apply(lfuBody("team"))
	x.chain("b", tT, 0, 1, 3) // b never holds block 2
	x.chain("a", tT, 0, 1, 2, 3)
	n1, n2, n3 := nodeOf(t, x.e, 1), nodeOf(t, x.e, 2), nodeOf(t, x.e, 3)
	seq := x.e.arena.Word(n2 + nSeq)
	s := seq.Load()
	seq.Store(s + 1) // every pass races at block 2
	defer seq.Store(s + 2)
	res := x.lookup(LookupRequest{BlockHashes: chainOf(1, 2, 3), BlockTokenCounts: sixteens(3)})
	if res.Strategy != StrategyPrefixMatch || len(res.Scores) != 2 {
		t.Fatalf("got %v %+v, want both replicas on block 1", res.Strategy, res.Scores)
	}
	for _, sc := range res.Scores {
		if sc.MatchedTokens != 16 {
			t.Errorf("%s matched %d tokens past a raced block (want 16)", sc.ReplicaID, sc.MatchedTokens)
		}
	}
	x.e.Credit(res)
	if got := lfuOf(x.e, n1); got["a"] != 1 || got["b"] != 1 {
		t.Errorf("block 1 credits %v, want a:1 b:1", got)
	}
	if got := lfuOf(x.e, n3); got["a"] != 0 || got["b"] != 0 {
		t.Errorf("block 3 credits %v, want none", got)
	}
}
