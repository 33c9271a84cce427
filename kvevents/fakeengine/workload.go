package fakeengine

import (
	"bufio"
	"container/list"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"time"
)

// Workload produces the engine's event batches one step at a time.
type Workload interface {
	// Next returns the next batch and how long after the previous one the
	// engine would publish it; ok is false when the workload is exhausted.
	Next() (b Batch, after time.Duration, ok bool)
}

// cache simulates the engine's block cache: engine hash → LRU position. It
// evicts the least recently used blocks beyond its capacity.
type cache struct {
	capacity int
	lru      *list.List // of uint64, front = most recent
	pos      map[uint64]*list.Element
}

func newCache(capacity int) *cache {
	return &cache{capacity: capacity, lru: list.New(), pos: make(map[uint64]*list.Element)}
}

func (c *cache) has(h uint64) bool { _, ok := c.pos[h]; return ok }

func (c *cache) touch(h uint64) {
	if e, ok := c.pos[h]; ok {
		c.lru.MoveToFront(e)
		return
	}
	c.pos[h] = c.lru.PushFront(h)
}

// evict removes blocks beyond capacity, sparing the keep set (blocks of the
// request being served), and returns them.
func (c *cache) evict(keep map[uint64]bool) []uint64 {
	var out []uint64
	for e := c.lru.Back(); e != nil && c.lru.Len() > c.capacity; {
		prev := e.Prev()
		h := e.Value.(uint64)
		if !keep[h] {
			c.lru.Remove(e)
			delete(c.pos, h)
			out = append(out, h)
		}
		e = prev
	}
	return out
}

// splitmix64 is a small deterministic mixer for synthetic ids and tokens.
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// BlockTokens returns the deterministic token ids of a synthetic block id:
// the same id always yields the same tokens, so our fingerprint yields the
// same key for it.
func BlockTokens(id uint64, blockSize int) []uint32 {
	out := make([]uint32, blockSize)
	for i := range out {
		out[i] = uint32(splitmix64(id*uint64(blockSize)+uint64(i)) % 128000)
	}
	return out
}

// engineHash chains like an engine does: a block's hash depends on its
// parent's hash and its own content id.
func engineHash(parent uint64, hasParent bool, id uint64) uint64 {
	if !hasParent {
		return splitmix64(id ^ 0xa5a5a5a5a5a5a5a5)
	}
	return splitmix64(parent*31 + id)
}

// SyntheticConfig shapes the synthetic workload.
type SyntheticConfig struct {
	Sessions       int           // concurrent conversations (default 32)
	BlocksPerTurn  int           // blocks each turn appends (default 4)
	BlockSize      int           // tokens per block (default 16)
	CapacityBlocks int           // simulated cache size (default 4096)
	Interval       time.Duration // time between batches (default 10 ms)
	Turns          int           // batches to produce; 0 = unlimited
	// LoRAIDs, when set, gives each session one of these adapter ids.
	LoRAIDs []int64
	Seed    uint64
	// Start is the timestamp of the first batch; zero means 2026-01-01
	// 00:00 UTC (deterministic). A real server only matches entries
	// younger than its TTL, so tests against one start near now.
	Start time.Time
}

// Synthetic grows per-session block chains: each step one session appends
// BlocksPerTurn blocks chained on its last block; when the cache is full
// the least recently used blocks are removed. A session whose last block
// was evicted starts a new conversation.
type Synthetic struct {
	cfg      SyntheticConfig
	rng      *rand.Rand
	cache    *cache
	sessions []session
	turn     int
	nextID   uint64
	ts       float64
}

type session struct {
	last    uint64
	hasLast bool
	lora    *int64
}

// NewSynthetic returns a synthetic workload.
func NewSynthetic(cfg SyntheticConfig) *Synthetic {
	if cfg.Sessions <= 0 {
		cfg.Sessions = 32
	}
	if cfg.BlocksPerTurn <= 0 {
		cfg.BlocksPerTurn = 4
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = 16
	}
	if cfg.CapacityBlocks <= 0 {
		cfg.CapacityBlocks = 4096
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Millisecond
	}
	start := cfg.Start
	if start.IsZero() {
		start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	w := &Synthetic{
		cfg:      cfg,
		rng:      rand.New(rand.NewPCG(cfg.Seed, 0x5e55)),
		cache:    newCache(cfg.CapacityBlocks),
		sessions: make([]session, cfg.Sessions),
		ts:       float64(start.UnixMicro()) / 1e6,
	}
	for i := range w.sessions {
		if len(cfg.LoRAIDs) > 0 {
			w.sessions[i].lora = &cfg.LoRAIDs[i%len(cfg.LoRAIDs)]
		}
	}
	return w
}

// CachedBlocks returns how many blocks the simulated cache holds.
func (w *Synthetic) CachedBlocks() int { return w.cache.lru.Len() }

// Holds reports whether the simulated cache holds the block with engine
// hash h.
func (w *Synthetic) Holds(h uint64) bool { return w.cache.has(h) }

// Next implements Workload.
func (w *Synthetic) Next() (Batch, time.Duration, bool) {
	if w.cfg.Turns > 0 && w.turn >= w.cfg.Turns {
		return Batch{}, 0, false
	}
	w.turn++
	w.ts += w.cfg.Interval.Seconds()
	s := &w.sessions[w.rng.IntN(len(w.sessions))]
	if s.hasLast && !w.cache.has(s.last) {
		s.hasLast = false // its prefix is gone: a new conversation
	}
	ev := Event{Kind: BlockStored, BlockSize: w.cfg.BlockSize, LoRAID: s.lora}
	if s.hasLast {
		p := s.last
		ev.Parent = &p
		w.cache.touch(p)
	}
	keep := map[uint64]bool{}
	if s.hasLast {
		keep[s.last] = true
	}
	for range w.cfg.BlocksPerTurn {
		w.nextID++
		h := engineHash(s.last, s.hasLast, w.nextID)
		ev.BlockHashes = append(ev.BlockHashes, h)
		ev.TokenIDs = append(ev.TokenIDs, BlockTokens(w.nextID, w.cfg.BlockSize)...)
		w.cache.touch(h)
		keep[h] = true
		s.last, s.hasLast = h, true
	}
	b := Batch{TS: w.ts, Events: []Event{ev}}
	if gone := w.cache.evict(keep); len(gone) > 0 {
		b.Events = append(b.Events, Event{Kind: BlockRemoved, BlockHashes: gone})
	}
	return b, w.cfg.Interval, true
}

// MooncakeBlockSize is the trace's block size in tokens.
const MooncakeBlockSize = 512

// TraceRequest is one line of the Mooncake trace.
type TraceRequest struct {
	Timestamp    int64    `json:"timestamp"` // ms from the trace start
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// LoadTrace reads a Mooncake JSONL trace; limit > 0 stops after that many
// requests.
func LoadTrace(path string, limit int) ([]TraceRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot open trace: %w", err)
	}
	defer f.Close()
	var out []TraceRequest
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<24)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var r TraceRequest
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("cannot parse trace line %d: %w", line, err)
		}
		out = append(out, r)
		if limit > 0 && len(out) >= limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cannot read trace: %w", err)
	}
	return out, nil
}

// MooncakeConfig shapes the trace replay.
type MooncakeConfig struct {
	CapacityBlocks int     // simulated cache size in 512-token blocks (default 8192)
	Speedup        float64 // trace time / wall time (default 1)
	// Start is the timestamp of the trace's time 0; a request is stamped
	// Start + its trace offset / Speedup, when it would be published. Zero
	// means 2026-01-01 00:00 UTC (deterministic); a real server only
	// matches entries younger than its TTL, so runs against one start near
	// now.
	Start time.Time
}

// Mooncake replays the Mooncake conversation trace as an engine would
// publish it: each request's leading cached run of hash_ids is a hit, the
// rest of its full blocks are stored chained on the hit (hash_ids are
// prefix ids, used as the engine's block hashes), and the least recently
// used blocks are removed when the cache is full. Token ids are synthesized
// per hash id (BlockTokens), so a block always fingerprints to one key.
type Mooncake struct {
	cfg   MooncakeConfig
	reqs  []TraceRequest
	i     int
	cache *cache
	t0    float64 // cfg.Start in seconds
}

// NewMooncake returns a trace workload over reqs.
func NewMooncake(reqs []TraceRequest, cfg MooncakeConfig) *Mooncake {
	if cfg.CapacityBlocks <= 0 {
		cfg.CapacityBlocks = 8192
	}
	if cfg.Speedup <= 0 {
		cfg.Speedup = 1
	}
	start := cfg.Start
	if start.IsZero() {
		start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return &Mooncake{cfg: cfg, reqs: reqs, cache: newCache(cfg.CapacityBlocks),
		t0: float64(start.UnixMicro()) / 1e6}
}

// CachedBlocks returns how many blocks the simulated cache holds.
func (w *Mooncake) CachedBlocks() int { return w.cache.lru.Len() }

// Next implements Workload. Requests with no full block produce an empty
// batch (the engine would publish nothing; the fake keeps the pacing).
func (w *Mooncake) Next() (Batch, time.Duration, bool) {
	if w.i >= len(w.reqs) {
		return Batch{}, 0, false
	}
	r := w.reqs[w.i]
	var after time.Duration
	if w.i > 0 {
		dms := r.Timestamp - w.reqs[w.i-1].Timestamp
		after = time.Duration(float64(dms) * float64(time.Millisecond) / w.cfg.Speedup)
	}
	w.i++
	b := Batch{TS: w.t0 + float64(r.Timestamp)/1000/w.cfg.Speedup}
	ids := r.HashIDs[:min(len(r.HashIDs), r.InputLength/MooncakeBlockSize)]
	hit := 0
	for hit < len(ids) && w.cache.has(ids[hit]) {
		w.cache.touch(ids[hit])
		hit++
	}
	if hit < len(ids) {
		ev := Event{Kind: BlockStored, BlockSize: MooncakeBlockSize, BlockHashes: append([]uint64(nil), ids[hit:]...)}
		if hit > 0 {
			p := ids[hit-1]
			ev.Parent = &p
		}
		for _, id := range ids[hit:] {
			ev.TokenIDs = append(ev.TokenIDs, BlockTokens(id, MooncakeBlockSize)...)
			w.cache.touch(id)
		}
		b.Events = append(b.Events, ev)
	}
	keep := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		keep[id] = true
	}
	if gone := w.cache.evict(keep); len(gone) > 0 {
		b.Events = append(b.Events, Event{Kind: BlockRemoved, BlockHashes: gone})
	}
	return b, after, true
}
