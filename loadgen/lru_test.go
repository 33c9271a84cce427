package loadgen

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestLRUHandComputed(t *testing.T) {
	for _, reportOrphans := range []bool{false, true} {
		l := newLRU(3, reportOrphans)
		var ev []uint64
		touch := func(k, parent uint64, root bool) (bool, int) {
			var ins bool
			var o int
			ins, ev, o = l.touch(k, parent, root, int32(16*k), ev[:0])
			return ins, o
		}
		// Chain a <- b <- c fills the cache.
		for _, c := range []struct {
			k, p uint64
			root bool
		}{{1, 0, true}, {2, 1, false}, {3, 2, false}} {
			if ins, _ := touch(c.k, c.p, c.root); !ins || len(ev) != 0 {
				t.Fatalf("touch %d: inserted %v, evicted %v", c.k, ins, ev)
			}
		}
		if got := l.leadingRun([]uint64{1, 2, 3, 4}); got != 3 {
			t.Fatalf("leading run %d, want 3", got)
		}
		if got := l.leadingRun([]uint64{2, 3}); got != 2 {
			t.Fatalf("leading run from block 2: %d, want 2", got)
		}
		// A new root evicts 1, the least recent, a root: always reported.
		if _, o := touch(10, 0, true); !slices.Equal(ev, []uint64{1}) || o != 0 {
			t.Fatalf("evicted %v (orphans %d), want [1]", ev, o)
		}
		// Refresh 3, then insert 11: evicts 2, whose parent 1 is gone, an
		// orphan.
		if ins, _ := touch(3, 2, false); ins {
			t.Fatal("touching a cached key inserted it")
		}
		_, o := touch(11, 10, false)
		if reportOrphans {
			if !slices.Equal(ev, []uint64{2}) || o != 0 {
				t.Fatalf("evicted %v (orphans %d), want [2]", ev, o)
			}
		} else if len(ev) != 0 || o != 1 {
			t.Fatalf("evicted %v (orphans %d), want the orphan 2 counted only", ev, o)
		}
		// Recency is now 10, 3, 11. Inserting 12 (child of 11) evicts the
		// root 10; then 13 evicts 3, whose parent 2 is gone: an orphan.
		if _, o := touch(12, 11, false); !slices.Equal(ev, []uint64{10}) || o != 0 {
			t.Fatalf("evicted %v (orphans %d), want [10]", ev, o)
		}
		_, o = touch(13, 0, true)
		if reportOrphans {
			if !slices.Equal(ev, []uint64{3}) || o != 0 {
				t.Fatalf("evicted %v (orphans %d), want [3]", ev, o)
			}
		} else if len(ev) != 0 || o != 1 {
			t.Fatalf("evicted %v (orphans %d), want the orphan 3 counted only", ev, o)
		}
		keys, toks := l.appendAll(nil, nil)
		if !slices.Equal(keys, []uint64{11, 12, 13}) || !slices.Equal(toks, []int32{176, 192, 208}) {
			t.Fatalf("contents %v %v, want [11 12 13] least recent first with their tokens", keys, toks)
		}
		l.reset()
		if l.len() != 0 || l.contains(11) {
			t.Fatal("reset left keys")
		}
		if ins, _ := touch(5, 0, true); !ins || l.len() != 1 {
			t.Fatal("cannot insert after reset")
		}
	}
}

// TestLRUAgainstModel checks membership and eviction order against a slice
// kept in recency order.
func TestLRUAgainstModel(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, capacity := range []int{1, 2, 7, 64} {
		l := newLRU(capacity, true)
		var model []uint64 // most recent last
		var ev []uint64
		for step := 0; step < 20_000; step++ {
			k := uint64(r.IntN(3 * capacity))
			var ins bool
			ins, ev, _ = l.touch(k, 0, true, 0, ev[:0])
			i := slices.Index(model, k)
			var wantEv []uint64
			if i >= 0 {
				model = append(slices.Delete(model, i, i+1), k)
			} else {
				if len(model) == capacity {
					wantEv = []uint64{model[0]}
					model = model[1:]
				}
				model = append(model, k)
			}
			if ins != (i < 0) || !slices.Equal(ev, wantEv) {
				t.Fatalf("cap %d step %d: touch %d inserted %v evicted %v; model: inserted %v evicted %v",
					capacity, step, k, ins, ev, i < 0, wantEv)
			}
			if l.len() != len(model) {
				t.Fatalf("cap %d step %d: %d keys, model %d", capacity, step, l.len(), len(model))
			}
		}
		keys, _ := l.appendAll(nil, nil)
		if !slices.Equal(keys, model) {
			t.Fatalf("cap %d: contents %v, model %v", capacity, keys, model)
		}
	}
}

func TestU64MapAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, capacity := range []int{1, 5, 100, 4096} {
		m := newU64Map(capacity)
		ref := map[uint64]int32{}
		// Keys from a small range collide in their home slots often; the
		// high range exercises clustering under Fibonacci hashing.
		key := func() uint64 {
			if r.IntN(2) == 0 {
				return uint64(r.IntN(2 * capacity))
			}
			return uint64(r.IntN(2*capacity)) << 40
		}
		for step := 0; step < 50_000; step++ {
			k := key()
			switch op := r.IntN(3); {
			case op == 0 && len(ref) < capacity:
				v := int32(r.IntN(1 << 20))
				m.put(k, v)
				ref[k] = v
			case op == 1:
				m.del(k)
				delete(ref, k)
			default:
				got, ok := m.get(k)
				want, wok := ref[k]
				if ok != wok || got != want {
					t.Fatalf("cap %d step %d: get(%d) = %d, %v; want %d, %v", capacity, step, k, got, ok, want, wok)
				}
			}
			if m.len() != len(ref) {
				t.Fatalf("cap %d step %d: len %d, want %d", capacity, step, m.len(), len(ref))
			}
		}
		for k, want := range ref {
			if got, ok := m.get(k); !ok || got != want {
				t.Fatalf("cap %d: final get(%d) = %d, %v; want %d", capacity, k, got, ok, want)
			}
		}
		m.reset()
		if _, ok := m.get(key()); ok || m.len() != 0 {
			t.Fatal("reset left keys")
		}
	}
}

func BenchmarkLRUTouch(b *testing.B) {
	l := newLRU(16384, false)
	var ev []uint64
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := mix64(uint64(i % 40000))
		_, ev, _ = l.touch(k, 0, true, 16, ev[:0])
	}
}
