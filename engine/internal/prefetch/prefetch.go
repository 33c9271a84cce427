// Package prefetch asks the CPU to bring a cache line in ahead of its use.
//
// A plain load of a value the code then ignores does not do that well: the
// load still has to complete before it retires, so a cache miss stalls the
// instructions behind it once the reorder window fills. A prefetch
// instruction retires at once and the line arrives in the background.
package prefetch
