package fakeengine_test

import (
	"slices"
	"testing"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
)

// TestTruthFollowsTheWorkload: after every batch the truth holds exactly
// the blocks the workload's cache holds, each with a key.
func TestTruthFollowsTheWorkload(t *testing.T) {
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 8, CapacityBlocks: 64, Turns: 500, Seed: 3})
	tr := fakeengine.NewTruth(16)
	removed := 0
	for {
		b, _, ok := w.Next()
		if !ok {
			break
		}
		tr.Apply(b)
		for _, ev := range b.Events {
			if ev.Kind == fakeengine.BlockRemoved {
				removed += len(ev.BlockHashes)
			}
		}
		if keys, unkeyed := tr.Keys(); len(keys) != w.CachedBlocks() || unkeyed != 0 {
			t.Fatalf("truth holds %d keys (%d unkeyed), the workload %d blocks", len(keys), unkeyed, w.CachedBlocks())
		}
	}
	if removed == 0 {
		t.Fatal("BUG: the workload removed nothing")
	}
}

// TestTruthKeys: keys chain as the subscriber chains them; removals,
// clears and unknown parents.
func TestTruthKeys(t *testing.T) {
	tr := fakeengine.NewTruth(16)
	root, child := fakeengine.BlockTokens(1, 16), fakeengine.BlockTokens(2, 16)
	parent := uint64(10)
	tr.Apply(fakeengine.Batch{Events: []fakeengine.Event{
		{Kind: fakeengine.BlockStored, BlockHashes: []uint64{10}, TokenIDs: root}, // block size from the default
		{Kind: fakeengine.BlockStored, BlockHashes: []uint64{11}, Parent: &parent, TokenIDs: child, BlockSize: 16},
	}})
	k1 := fingerprint.AppendChain(nil, root, 16, 0, false)[0]
	k2 := fingerprint.AppendChain(nil, child, 16, k1, true)[0]
	want := []uint64{k1, k2}
	slices.Sort(want)
	if keys, _ := tr.Keys(); !slices.Equal(keys, want) {
		t.Fatalf("keys %x, want %x", keys, want)
	}
	unknown := uint64(99)
	tr.Apply(fakeengine.Batch{Events: []fakeengine.Event{
		{Kind: fakeengine.BlockRemoved, BlockHashes: []uint64{11}},
		{Kind: fakeengine.BlockStored, BlockHashes: []uint64{12}, Parent: &unknown, TokenIDs: child, BlockSize: 16},
	}})
	if keys, unkeyed := tr.Keys(); !slices.Equal(keys, []uint64{k1}) || unkeyed != 1 {
		t.Fatalf("after a removal and an unknown parent: keys %x, %d unkeyed", keys, unkeyed)
	}
	tr.Apply(fakeengine.Batch{Events: []fakeengine.Event{{Kind: fakeengine.AllBlocksCleared}}})
	if tr.Len() != 0 {
		t.Fatalf("%d keys after AllBlocksCleared", tr.Len())
	}
}
