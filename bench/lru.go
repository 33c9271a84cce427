package bench

// LRU is a bounded least-recently-used set of block ids: the KV cache of
// one simulated replica, or the pooled cache of the upper bound.
//
// Accounting (this is the accounting that reproduces the published
// Mooncake conversation-trace figures, 36.64 % for an infinite cache and
// 17.76 % for 8,000 blocks): a request hits the leading run of its chain
// that is in the cache before the request is served (LeadingRun); serving
// it then visits the whole chain in order (Access), moving present blocks
// to the most-recent end and inserting missing ones there, evicting the
// least recent block whenever the set exceeds its capacity. After Access
// every block of the chain is cached (if the capacity allows) and the last
// block is the most recent. Two variants give different figures on that
// trace at 8,000 blocks: refreshing the chain last-to-first gives 17.81 %,
// and not refreshing blocks that hit gives 15.79 %.
//
// An LRU is not safe for concurrent use. Its zero value is not usable;
// call NewLRU.
type LRU struct {
	capacity int // 0 = unbounded
	index    map[uint64]int32
	nodes    []lruNode // nodes[0] is the list sentinel
	free     int32     // head of the free-node list, 0 = none
	size     int
	gen      uint64 // Access call counter, to spot blocks inserted and evicted by one call
}

type lruNode struct {
	key        uint64
	prev, next int32
	insertGen  uint64
}

// NewLRU returns an empty cache of capacity blocks; capacity 0 means
// unbounded. It panics on a negative capacity (a programmer error).
func NewLRU(capacity int) *LRU {
	if capacity < 0 {
		panic("BUG: bench: negative LRU capacity")
	}
	c := &LRU{capacity: capacity, index: make(map[uint64]int32)}
	c.nodes = make([]lruNode, 1, min(capacity, 1<<16)+1)
	return c
}

// Len returns the number of cached blocks.
func (c *LRU) Len() int { return c.size }

// Capacity returns the capacity given to NewLRU (0 = unbounded).
func (c *LRU) Capacity() int { return c.capacity }

// Contains reports whether id is cached, without changing recency.
func (c *LRU) Contains(id uint64) bool {
	_, ok := c.index[id]
	return ok
}

// LeadingRun returns how many leading blocks of chain are cached, without
// changing recency.
func (c *LRU) LeadingRun(chain []uint64) int {
	for i, id := range chain {
		if _, ok := c.index[id]; !ok {
			return i
		}
	}
	return len(chain)
}

// Access serves chain: it visits the blocks in order, refreshing present
// ones and inserting missing ones as most recent, evicting as needed. It
// appends to inserted the positions (indexes into chain) of the blocks it
// inserted that are still cached when it returns, and to evicted the ids it
// evicted that were cached before the call; a block both inserted and
// evicted within the call (possible only when the chain is longer than the
// capacity) appears in neither. It returns the extended slices.
func (c *LRU) Access(chain []uint64, inserted []int, evicted []uint64) ([]int, []uint64) {
	c.gen++
	start := len(inserted)
	for i, id := range chain {
		if n, ok := c.index[id]; ok {
			c.unlink(n)
			c.pushFront(n)
			continue
		}
		n := c.alloc(id)
		c.index[id] = n
		c.pushFront(n)
		c.size++
		inserted = append(inserted, i)
		if c.capacity > 0 && c.size > c.capacity {
			victim := c.nodes[0].prev
			vk := c.nodes[victim].key
			if c.nodes[victim].insertGen != c.gen {
				evicted = append(evicted, vk)
			}
			c.unlink(victim)
			delete(c.index, vk)
			c.release(victim)
			c.size--
		}
	}
	// Drop positions whose block was evicted again within this call.
	kept := inserted[:start]
	for _, p := range inserted[start:] {
		if _, ok := c.index[chain[p]]; ok {
			kept = append(kept, p)
		}
	}
	return kept, evicted
}

// RefreshReverse makes the cached blocks of chain the most recent, last
// block first, so the first block ends most recent: a finished request's
// blocks released tail first (SimModel.TailFirstFree). Absent blocks are
// skipped; nothing is inserted or evicted.
func (c *LRU) RefreshReverse(chain []uint64) {
	for i := len(chain) - 1; i >= 0; i-- {
		if n, ok := c.index[chain[i]]; ok {
			c.unlink(n)
			c.pushFront(n)
		}
	}
}

// Clear drops every block.
func (c *LRU) Clear() {
	clear(c.index)
	c.nodes = c.nodes[:1]
	c.nodes[0] = lruNode{}
	c.free = 0
	c.size = 0
}

func (c *LRU) alloc(key uint64) int32 {
	var n int32
	if c.free != 0 {
		n = c.free
		c.free = c.nodes[n].next
	} else {
		c.nodes = append(c.nodes, lruNode{})
		n = int32(len(c.nodes) - 1)
	}
	c.nodes[n] = lruNode{key: key, insertGen: c.gen}
	return n
}

func (c *LRU) release(n int32) {
	c.nodes[n] = lruNode{next: c.free}
	c.free = n
}

// pushFront links n as the most recent node. The sentinel's next is the
// most recent node and its prev the least recent; an empty list points the
// sentinel at itself (index 0), which the zero value already does.
func (c *LRU) pushFront(n int32) {
	head := c.nodes[0].next
	c.nodes[n].prev = 0
	c.nodes[n].next = head
	c.nodes[head].prev = n
	c.nodes[0].next = n
}

func (c *LRU) unlink(n int32) {
	p, nx := c.nodes[n].prev, c.nodes[n].next
	c.nodes[p].next = nx
	c.nodes[nx].prev = p
}
