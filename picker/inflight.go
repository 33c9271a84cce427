package picker

import (
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v3"
)

// inflight is the picker's own exact count of requests in flight per
// endpoint address: incremented when a request is routed there,
// decremented exactly once when its response ends or its stream breaks.
// The least-loaded fallback reads it. Counters are created on first use
// and never removed (an address that left the pool keeps a counter that
// returns to 0; pools are small and addresses are reused).
type inflight struct {
	// m maps an address to its counter; lock-free for readers and for
	// the updates of existing counters.
	m *xsync.MapOf[string, *atomic.Int64]
}

func (f *inflight) counter(addr string) *atomic.Int64 {
	if f.m == nil {
		panic("BUG: inflight used before init")
	}
	if c, ok := f.m.Load(addr); ok {
		return c
	}
	c, _ := f.m.LoadOrCompute(addr, func() *atomic.Int64 { return new(atomic.Int64) })
	return c
}

func (f *inflight) load(addr string) int64 {
	if c, ok := f.m.Load(addr); ok {
		return c.Load()
	}
	return 0
}

func (f *inflight) total() int64 {
	var n int64
	f.m.Range(func(_ string, c *atomic.Int64) bool {
		n += c.Load()
		return true
	})
	return n
}
