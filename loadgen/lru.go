package loadgen

// lru is a bounded set of block keys in recency order, the KV cache of one
// emulated replica. Nodes live in a slice and link by index, so a touch
// allocates nothing once the cache is full. Not safe for concurrent use.
//
// Every key remembers its parent (the previous block of its chain; block
// keys are prefix ids, so a key has exactly one parent). An evicted key is
// an orphan when its parent is no longer cached: the server's chain walk
// already stops at the parent for this replica, so removing the orphan from
// the index changes no routing decision. Unless reportOrphans is set,
// orphans are counted instead of returned, which turns a chain evicted
// block by block into one event.
type lru struct {
	capacity      int
	reportOrphans bool
	idx           *u64map
	nodes         []lruNode
	head          int32 // most recently used; -1 when empty
	tail          int32 // least recently used; -1 when empty
}

type lruNode struct {
	key        uint64
	parent     uint64 // the previous block's key; meaningless when root
	root       bool   // the first block of a chain
	tokens     int32  // cumulative prompt tokens through this block
	prev, next int32
}

func newLRU(capacity int, reportOrphans bool) *lru {
	return &lru{capacity: capacity, reportOrphans: reportOrphans, idx: newU64Map(max(capacity, 1)), head: -1, tail: -1}
}

func (l *lru) len() int { return l.idx.len() }

func (l *lru) contains(k uint64) bool {
	_, ok := l.idx.get(k)
	return ok
}

// leadingRun returns how many leading keys of chain the cache holds, without
// changing recency.
func (l *lru) leadingRun(chain []uint64) int {
	for i, k := range chain {
		if !l.contains(k) {
			return i
		}
	}
	return len(chain)
}

func (l *lru) unlink(i int32) {
	n := &l.nodes[i]
	if n.prev >= 0 {
		l.nodes[n.prev].next = n.next
	} else {
		l.head = n.next
	}
	if n.next >= 0 {
		l.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
}

func (l *lru) pushFront(i int32) {
	n := &l.nodes[i]
	n.prev, n.next = -1, l.head
	if l.head >= 0 {
		l.nodes[l.head].prev = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

// touch makes k the most recent key, inserting it (with its parent and
// cumulative token count) if absent. An insertion into a full cache evicts
// the least recent key: it is appended to evicted, or only counted in
// orphans when it is an orphan and orphans are not reported. touch reports
// whether k was inserted.
func (l *lru) touch(k, parent uint64, root bool, tokens int32, evicted []uint64) (inserted bool, _ []uint64, orphans int) {
	if i, ok := l.idx.get(k); ok {
		if l.head != i {
			l.unlink(i)
			l.pushFront(i)
		}
		return false, evicted, 0
	}
	if l.capacity <= 0 {
		return false, evicted, 0
	}
	var i int32
	if l.idx.len() >= l.capacity {
		i = l.tail
		l.unlink(i)
		v := &l.nodes[i]
		l.idx.del(v.key)
		if l.reportOrphans || v.root || l.contains(v.parent) {
			evicted = append(evicted, v.key)
		} else {
			orphans++
		}
	} else {
		i = int32(len(l.nodes))
		l.nodes = append(l.nodes, lruNode{})
	}
	l.nodes[i] = lruNode{key: k, parent: parent, root: root, tokens: tokens}
	l.pushFront(i)
	l.idx.put(k, i)
	return true, evicted, orphans
}

// reset empties the cache and keeps its memory.
func (l *lru) reset() {
	l.idx.reset()
	l.nodes = l.nodes[:0]
	l.head, l.tail = -1, -1
}

// appendAll appends every key and its token count, least recent first.
func (l *lru) appendAll(keys []uint64, tokens []int32) ([]uint64, []int32) {
	for i := l.tail; i >= 0; i = l.nodes[i].prev {
		keys = append(keys, l.nodes[i].key)
		tokens = append(tokens, l.nodes[i].tokens)
	}
	return keys, tokens
}
