package kvevents

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/kvevents/wire"
)

func toks(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func stored(hashes []uint64, parent *uint64, tokens []uint32, bs int) *wire.Event {
	ev := &wire.Event{Kind: wire.KindBlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: bs}
	if parent != nil {
		ev.ParentHash, ev.HasParent = *parent, true
	}
	return ev
}

func ptr[T any](v T) *T { return &v }

func TestIndexParentChaining(t *testing.T) {
	x := NewIndex(16, 0, nil)
	all := toks(48, 1000)
	want := fingerprint.AppendChain(nil, all, 16, 0, false)

	got, reason := x.Store(stored([]uint64{101, 102}, nil, all[:32], 16), nil)
	if reason != "" {
		t.Fatal(reason)
	}
	got, reason = x.Store(stored([]uint64{103}, ptr[uint64](102), all[32:], 0 /* falls back to 16 */), got)
	if reason != "" {
		t.Fatal(reason)
	}
	if len(got) != 3 {
		t.Fatalf("prefixes %+v", got)
	}
	for i, p := range got {
		if p.Key != want[i] || p.Tokens != int32(16*(i+1)) || p.Tier != TierT1 || p.Adapter != "" {
			t.Fatalf("prefix %d = %+v, want key %x tokens %d", i, p, want[i], 16*(i+1))
		}
	}

	// A parent the index never saw: our keys cannot be computed.
	if _, reason := x.Store(stored([]uint64{201}, ptr[uint64](999), all[:16], 16), nil); reason != DropUnknownParent {
		t.Fatalf("unknown parent: reason %q", reason)
	}
	// Full blocks of token_ids must match the hashes (a trailing partial
	// block is ignored).
	if _, reason := x.Store(stored([]uint64{301, 302}, nil, all[:20], 16), nil); reason != DropBlockCount {
		t.Fatalf("block count: reason %q", reason)
	}
	if _, reason := x.Store(stored([]uint64{301}, nil, all[:20], 16), nil); reason != "" {
		t.Fatalf("partial tail: reason %q", reason)
	}
	if _, reason := NewIndex(0, 0, nil).Store(stored([]uint64{1}, nil, all[:16], 0), nil); reason != DropBlockSize {
		t.Fatalf("no block size: reason %q", reason)
	}
	if x.Len() != 4 {
		t.Fatalf("len %d", x.Len())
	}
}

func TestIndexRemoveMapping(t *testing.T) {
	x := NewIndex(16, 0, nil)
	all := toks(48, 0)
	keys := fingerprint.AppendChain(nil, all, 16, 0, false)
	x.Store(stored([]uint64{1, 2, 3}, nil, all, 16), nil)

	rm := &wire.Event{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{3, 77, 1}}
	evicted, demoted, unknown := x.Remove(rm, false, nil, nil)
	if unknown != 1 || len(demoted) != 0 {
		t.Fatalf("unknown %d demoted %v", unknown, demoted)
	}
	want := []Prefix{{Key: keys[2], Tokens: 48, Tier: TierT2}, {Key: keys[0], Tokens: 16, Tier: TierT2}}
	if !slices.Equal(evicted, want) {
		t.Fatalf("evicted %+v, want %+v", evicted, want)
	}
	// Forgotten: removing again is unknown; block 2 is still chainable.
	if _, _, unknown := x.Remove(rm, false, nil, nil); unknown != 3 {
		t.Fatalf("second remove unknown %d", unknown)
	}
	if _, reason := x.Store(stored([]uint64{4}, ptr[uint64](2), toks(16, 9), 16), nil); reason != "" {
		t.Fatalf("chain from surviving block: %q", reason)
	}

	// With L2 the removal re-reports at T2 instead of evicting.
	evicted, demoted, _ = x.Remove(&wire.Event{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{2}}, true, nil, nil)
	if len(evicted) != 0 || !slices.Equal(demoted, []Prefix{{Key: keys[1], Tokens: 32, Tier: TierT2}}) {
		t.Fatalf("l2: evicted %+v demoted %+v", evicted, demoted)
	}
	if x.Len() != 1 {
		t.Fatalf("len %d", x.Len())
	}
}

func TestIndexMedia(t *testing.T) {
	x := NewIndex(16, 0, nil)
	ev := stored([]uint64{1}, nil, toks(16, 0), 16)
	if ps, _ := x.Store(ev, nil); ps[0].Tier != TierT1 {
		t.Fatalf("GPU store tier %v", ps[0].Tier)
	}
	ev.Medium = []byte("CPU")
	if ps, _ := x.Store(ev, nil); ps[0].Tier != TierT1 {
		t.Fatalf("GPU+CPU tier %v", ps[0].Tier)
	}
	// Removed from the GPU but still offloaded: re-reported at T2, kept.
	evicted, demoted, _ := x.Remove(&wire.Event{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{1}, Medium: []byte("gpu")}, false, nil, nil)
	if len(evicted) != 0 || len(demoted) != 1 || demoted[0].Tier != TierT2 || x.Len() != 1 {
		t.Fatalf("demote: evicted %+v demoted %+v len %d", evicted, demoted, x.Len())
	}
	// Removing it from the GPU again changes nothing.
	evicted, demoted, _ = x.Remove(&wire.Event{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{1}}, false, nil, nil)
	if len(evicted)+len(demoted) != 0 {
		t.Fatalf("no-op remove: %+v %+v", evicted, demoted)
	}
	evicted, _, _ = x.Remove(&wire.Event{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{1}, Medium: []byte("CPU")}, false, nil, nil)
	if len(evicted) != 1 || x.Len() != 0 {
		t.Fatalf("last medium: evicted %+v len %d", evicted, x.Len())
	}
	// A block only ever offloaded is reported at T2.
	ev.Medium = []byte("LMCACHE")
	if ps, _ := x.Store(ev, nil); ps[0].Tier != TierT2 {
		t.Fatalf("offload-only tier %v", ps[0].Tier)
	}
}

func TestIndexLoRA(t *testing.T) {
	x := NewIndex(16, 0, map[int64]string{1: "sql", 2: "chat"})
	base := stored([]uint64{1}, nil, toks(16, 0), 16)

	f := func(name string, ev wire.Event, wantAdapter, wantReason string) {
		t.Helper()
		ps, reason := x.Store(&ev, nil)
		if reason != wantReason {
			t.Fatalf("%s: reason %q, want %q", name, reason, wantReason)
		}
		if reason == "" && ps[0].Adapter != wantAdapter {
			t.Fatalf("%s: adapter %q, want %q", name, ps[0].Adapter, wantAdapter)
		}
	}
	ev := *base
	f("nil lora", ev, "", "")
	ev.LoRAID, ev.HasLoRAID = 2, true
	f("mapped id", ev, "chat", "")
	ev.LoRAID = 9
	f("unmapped id fails closed", ev, "", DropUnmappedLoRA)
	ev.LoRAName = []byte("named")
	f("lora_name wins", ev, "named", "")
	ev.HasLoRAID = false
	f("lora_name alone", ev, "named", "")

	// The adapter travels with removals.
	_, _, _ = x.Remove(&wire.Event{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{1}}, false, nil, nil)
	ev = *base
	ev.LoRAID, ev.HasLoRAID = 1, true
	x.Store(&ev, nil)
	evicted, _, _ := x.Remove(&wire.Event{Kind: wire.KindBlockRemoved, BlockHashes: []uint64{1}}, false, nil, nil)
	if len(evicted) != 1 || evicted[0].Adapter != "sql" {
		t.Fatalf("evicted %+v", evicted)
	}
}

func TestIndexCapEvictsLeastRecentlyUsed(t *testing.T) {
	x := NewIndex(16, 3, nil)
	x.Store(stored([]uint64{1}, nil, toks(16, 0), 16), nil)
	x.Store(stored([]uint64{2}, nil, toks(16, 100), 16), nil)
	x.Store(stored([]uint64{3}, nil, toks(16, 200), 16), nil)
	// Chaining from 1 makes it recent; 2 is now the oldest.
	if _, r := x.Store(stored([]uint64{4}, ptr[uint64](1), toks(16, 300), 16), nil); r != "" {
		t.Fatal(r)
	}
	if x.Len() != 3 || x.CapEvictions() != 1 {
		t.Fatalf("len %d evictions %d", x.Len(), x.CapEvictions())
	}
	if _, r := x.Store(stored([]uint64{5}, ptr[uint64](2), toks(16, 400), 16), nil); r != DropUnknownParent {
		t.Fatalf("2 should have been evicted, got %q", r)
	}
	snap := x.AppendSnapshot(nil)
	if len(snap) != 3 || snap[0].Tokens != 32 { // 4 (chained, 32 tokens) is most recent
		t.Fatalf("snapshot %+v", snap)
	}
	x.Clear()
	if x.Len() != 0 || len(x.AppendSnapshot(nil)) != 0 {
		t.Fatal("clear left entries")
	}
}

// TestIndexRandomAgainstModel drives the index with random stores and
// removals and checks it against a plain map (no cap, GPU only).
func TestIndexRandomAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := NewIndex(4, 0, nil)
	model := map[uint64]Prefix{} // engine hash → prefix
	for step := range 5000 {
		switch rng.IntN(10) {
		case 0:
			x.Clear()
			clear(model)
		case 1, 2, 3:
			var hs []uint64
			for range 1 + rng.IntN(3) {
				hs = append(hs, uint64(rng.IntN(64)))
			}
			evicted, _, unknown := x.Remove(&wire.Event{Kind: wire.KindBlockRemoved, BlockHashes: hs}, false, nil, nil)
			wantUnknown := 0
			var want []Prefix
			for _, h := range hs {
				p, ok := model[h]
				if !ok {
					wantUnknown++
					continue
				}
				p.Tier = TierT2
				want = append(want, p)
				delete(model, h)
			}
			if unknown != wantUnknown || !slices.Equal(evicted, want) {
				t.Fatalf("step %d: remove %v: got %+v/%d want %+v/%d", step, hs, evicted, unknown, want, wantUnknown)
			}
		default:
			n := 1 + rng.IntN(3)
			hs := make([]uint64, n)
			for i := range hs {
				hs[i] = uint64(rng.IntN(64))
			}
			var parent *uint64
			var pp Prefix
			if rng.IntN(2) == 0 {
				h := uint64(rng.IntN(64))
				parent = &h
				var ok bool
				if pp, ok = model[h]; !ok {
					if _, r := x.Store(stored(hs, parent, toks(4*n, uint32(step)), 4), nil); r != DropUnknownParent {
						t.Fatalf("step %d: want unknown_parent, got %q", step, r)
					}
					continue
				}
			}
			tk := toks(4*n, uint32(step))
			keys := fingerprint.AppendChain(nil, tk, 4, pp.Key, parent != nil)
			got, r := x.Store(stored(hs, parent, tk, 4), nil)
			if r != "" {
				t.Fatalf("step %d: %q", step, r)
			}
			for i, h := range hs {
				p := Prefix{Key: keys[i], Tokens: pp.Tokens + int32(4*(i+1)), Tier: TierT1}
				if got[i] != p {
					t.Fatalf("step %d: got %+v want %+v", step, got[i], p)
				}
				model[h] = p
			}
		}
		if x.Len() != len(model) {
			t.Fatalf("step %d: len %d, model %d", step, x.Len(), len(model))
		}
	}
	snap := x.AppendSnapshot(nil)
	if len(snap) != len(model) {
		t.Fatalf("snapshot %d, model %d", len(snap), len(model))
	}
}
