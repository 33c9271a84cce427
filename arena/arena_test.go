package arena

import (
	"testing"
	"unsafe"
)

func TestAllocFreeReuse(t *testing.T) {
	var a Arena
	x, err := a.Alloc(8)
	if err != nil || x < FirstOffset {
		t.Fatalf("Alloc = %d, %v", x, err)
	}
	y, _ := a.Alloc(8)
	if y != x+8 {
		t.Fatalf("bump: got %d want %d", y, x+8)
	}
	a.Word(x).Store(42)
	a.Free(x, 8)
	z, _ := a.Alloc(8)
	if z != x {
		t.Fatalf("freed block not reused: got %d want %d", z, x)
	}
	if a.Word(z).Load() != 42 {
		t.Fatal("reused block's first word changed (the free link must live in the last word)")
	}
	w, _ := a.Alloc(5)
	if w == x {
		t.Fatal("a block of another size reused an 8-word block")
	}
	st := a.Stats()
	if st.SlabBytes != SlabBytes || st.LiveBytes != (8+8+5)*4 || st.FreeBytes != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSlabBoundary(t *testing.T) {
	var a Arena
	// Fill the first slab so the next block cannot fit and must start slab 1.
	big := uint32(SlabWords - FirstOffset - 10)
	if _, err := a.Alloc(big); err != nil {
		t.Fatal(err)
	}
	off, err := a.Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	if off>>SlabShift != 1 || off&slabMask != 0 {
		t.Fatalf("block crossing a slab boundary placed at %d", off)
	}
	a.Word(off + 15).Store(7)
	if a.Word(off+15).Load() != 7 {
		t.Fatal("word round trip")
	}
	st := a.Stats()
	if st.WasteBytes != (FirstOffset+10)*4 || st.SlabBytes != 2*SlabBytes {
		t.Fatalf("stats %+v", st)
	}
	if _, err := a.Alloc(0); err == nil {
		t.Fatal("Alloc(0) succeeded")
	}
	if _, err := a.Alloc(MaxBlockWords + 1); err == nil {
		t.Fatal("oversized Alloc succeeded")
	}
}

// TestNoPointers pins that a slab holds no Go pointers, so the collector
// never scans arena memory.
func TestNoPointers(t *testing.T) {
	var s slab
	if unsafe.Sizeof(s) != SlabBytes {
		t.Fatalf("slab is %d bytes, want %d", unsafe.Sizeof(s), SlabBytes)
	}
	// atomic.Uint32 is a struct of a noCopy and a uint32: no pointers. A
	// change there would show up as a size change.
	if unsafe.Sizeof(s[0]) != 4 {
		t.Fatalf("word is %d bytes", unsafe.Sizeof(s[0]))
	}
}

func BenchmarkAllocFree(b *testing.B) {
	var a Arena
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		off, _ := a.Alloc(8)
		a.Free(off, 8)
	}
}

// TestTryBlock pins the view readers use for offsets they could not
// validate: an offset in a slab never allocated is refused, and reads past
// the end of the slab wrap inside it instead of faulting.
func TestTryBlock(t *testing.T) {
	var a Arena
	if _, ok := a.TryBlock(FirstOffset); ok {
		t.Fatal("TryBlock on an empty arena succeeded")
	}
	off, _ := a.Alloc(4)
	a.Word(off).Store(11)
	b, ok := a.TryBlock(off)
	if !ok || b.Load(0) != 11 {
		t.Fatalf("TryBlock(%d) = %v, %v", off, b, ok)
	}
	if _, ok := a.TryBlock(SlabWords + 5); ok {
		t.Fatal("TryBlock in an unallocated slab succeeded")
	}
	end, _ := a.TryBlock(SlabWords - 1)
	if end.Load(1+off) != 11 {
		t.Fatal("a read past the slab's end did not wrap inside the slab")
	}
}

// TestBlockWords pins Words: the slice starts at the block's first word and
// a length running past the slab's end is refused rather than wrapped.
func TestBlockWords(t *testing.T) {
	var a Arena
	off, _ := a.Alloc(5)
	for k := uint32(0); k < 5; k++ {
		a.Word(off + k).Store(100 + k)
	}
	ws, ok := a.Block(off).Words(5)
	if !ok || len(ws) != 5 || cap(ws) != 5 || ws[0].Load() != 100 || ws[4].Load() != 104 {
		t.Fatalf("Words(5) = len %d, ok %v", len(ws), ok)
	}
	end := a.Block(SlabWords - 2)
	if _, ok := end.Words(2); !ok {
		t.Fatal("Words up to the slab's last word was refused")
	}
	if _, ok := end.Words(3); ok {
		t.Fatal("Words past the slab's end was accepted")
	}
}
