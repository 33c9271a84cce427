package prefetch

import "unsafe"

// Line hints that the cache line holding p will be read soon (PREFETCHT0).
// p may be any address: a prefetch never faults.
//
//go:noescape
func Line(p unsafe.Pointer)
