package engine

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/arena"
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

// TestReaderSurvivesTornNode pins issue 12 item 3: a reader may combine
// words of two lives of a node (the writer reused it between two loads), so
// every offset it follows may be garbage. Here each such view is left in
// place and read: a hash offset into an unallocated slab (the low word of
// an 8-byte key read as the offset of a long key's bytes), a holder offset
// there, and a holder count far past its block at the end of a slab. Readers
// must not fault, and must not match what they cannot validate.
func TestReaderSurvivesTornNode(t *testing.T) {
	long := make([]byte, 20)
	for i := range long {
		long[i] = byte(i + 1)
	}
	const unallocated = 0xFFF0_0000 // in slab 4095, never allocated in a test
	cases := []struct {
		name  string
		twist func(e *Engine, off uint32)
	}{
		{"hash offset into an unallocated slab", func(e *Engine, off uint32) { e.setWord(off+nHashLo, unallocated) }},
		{"holder offset into an unallocated slab", func(e *Engine, off uint32) { e.setWord(off+nHolders, unallocated) }},
		{"holder count past the end of the slab", func(e *Engine, off uint32) {
			e.setWord(off+nHolders, arena.SlabWords-2*holderWord)
			e.setWord(off+nMeta, makeMeta(metaCountMask, 0, metaKind(e.w(off+nMeta))))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := newTix(t)
			x.store.Apply(lfuBody("team"))
			x.e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: "a", TimestampUs: tT,
				Prefixes: []PrefixEntry{{BlockHashes: [][]byte{long}, BlockTokenCounts: []int32{16}}}}, tT)
			x.chain("a", tT, 0, 7)
			x.e.mu.Lock()
			sc := x.e.lookupDomain("team", "m").findScheme("vllm").findScope("")
			var offs []uint32
			x.e.forEachNodeLocked(sc, func(off uint32) { offs = append(offs, off) })
			var creds []*LookupResult
			for _, off := range offs {
				// A reader that validated the node earlier holds it for Credit.
				res := &LookupResult{lfu: true, d: sc.d, Strategy: StrategyPrefixMatch, nodes: []uint64{uint64(x.e.w(off+nGen))<<32 | uint64(off)},
					Scores: []Score{{ReplicaID: "a", MatchedTokens: 16, run: -1}}}
				creds = append(creds, res)
				c.twist(x.e, off)
			}
			x.e.mu.Unlock()
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("reader panicked on a torn node: %v", p)
				}
			}()
			reqs := []LookupRequest{
				{PrefixHash: long}, {PrefixHash: h8(7)},
				{BlockHashes: [][]byte{long}, BlockTokenCounts: sixteens(1)},
				{BlockHashes: chainOf(7), BlockTokenCounts: sixteens(1)},
			}
			// Every node is twisted (the 8-byte key's hash word too), so
			// nothing may match.
			for _, req := range reqs {
				if res := x.lookup(req); res.Strategy == StrategyPrefixMatch {
					t.Errorf("lookup %+v matched a torn node: %+v", req, res.Scores)
				}
			}
			for _, res := range creds {
				x.e.Credit(res)
			}
		})
	}
}

// TestDelayedCreditNeverLandsOnHashBytes pins the other half of item 3: a
// credit validates a holder's LFU word, then CASes it. If the writer moves
// the holder meanwhile and frees its block, that memory must never hold
// anything but holder records, whose LFU words are retagged on every move,
// so the late CAS fails. Were the block reused for hash bytes, a hash chosen
// to look like the old LFU word would be incremented, corrupting the key.
func TestDelayedCreditNeverLandsOnHashBytes(t *testing.T) {
	x := newTix(t)
	x.store.Apply(lfuBody("team"))
	x.chain("a", tT, 0, 1, 2)
	off := nodeOf(t, x.e, 1)
	// The first half of credit: the LFU word of a's holder and its value.
	x.e.mu.Lock()
	word := x.e.w(off+nHolders) + hLFU
	old := x.e.w(word)
	x.e.mu.Unlock()
	// The writer adds b to both keys: their one-holder blocks are outgrown
	// and freed, block 1's first. Then a key with a 20-byte hash (5 words,
	// the size of those blocks) is stored, its bytes 8..11 equal to the old
	// LFU word: its holder block takes the block freed last, and its hash
	// bytes would take block 1's.
	x.chain("b", tT, 0, 1, 2)
	long := make([]byte, 20)
	for i := range long {
		long[i] = 0xA0 + byte(i)
	}
	binary.LittleEndian.PutUint32(long[8:], old)
	x.e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: "a", TimestampUs: tT,
		Prefixes: []PrefixEntry{{PrefixHash: long, TokenCount: 16}}}, tT)
	// The second half, late.
	x.e.arena.Word(word).CompareAndSwap(old, old+1)
	if res := x.lookup(LookupRequest{PrefixHash: long}); res.Strategy != StrategyPrefixMatch {
		t.Fatalf("the long key no longer matches after a late credit CAS: %v", res.Strategy)
	}
	checkInvariants(t, x.e)
	// The key can still be removed (its table slot still hashes to it).
	x.e.ApplyEvent(&Event{Type: EventPrefixEvicted, TenantID: "team", ModelID: "m", ReplicaID: "a", PrefixHash: long}, tT)
	checkInvariants(t, x.e)
}
