package prefetch_test

import (
	"testing"
	"unsafe"

	"github.com/inferencecache/inferencecache/engine/internal/prefetch"
)

// TestLineNeverFaults: a prefetch of any address, mapped or not, is only a
// hint (the engine prefetches offsets it has not validated yet).
func TestLineNeverFaults(t *testing.T) {
	buf := make([]uint64, 64)
	prefetch.Line(unsafe.Pointer(&buf[0]))
	prefetch.Line(nil) // page 0 is never mapped
}

func BenchmarkLine(b *testing.B) {
	buf := make([]uint64, 1<<20)
	for i := 0; b.Loop(); i++ {
		prefetch.Line(unsafe.Pointer(&buf[(i*97)&(len(buf)-1)]))
	}
}
