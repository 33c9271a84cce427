package loadgen

import (
	"fmt"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
)

// Workload kinds.
const (
	WorkloadChat         = "chat"          // multi-turn sessions whose chains grow turn by turn
	WorkloadRAG          = "rag"           // shared system prompt, Zipf-popular corpus chunks, distinct query
	WorkloadSharedPrompt = "shared-prompt" // diffuse single-turn behind a few shared system prompts
	WorkloadTrace        = "trace"         // Mooncake JSON Lines replay (TracePath)
)

// WorkloadConfig selects the request stream.
type WorkloadConfig struct {
	// Kind is one of WorkloadChat, WorkloadRAG, WorkloadSharedPrompt,
	// WorkloadTrace.
	Kind string
	// TracePath is the Mooncake JSONL file for WorkloadTrace (block ids of
	// workload.MooncakeBlockSize tokens).
	TracePath string
	// Size is the number of requests generated (or read from the trace)
	// per epoch; 0 means the whole trace, and for generators about as many
	// requests as an open-loop run sends at its rate (MinWorkloadSize to
	// MaxWorkloadSize; MaxWorkloadSize in closed loop).
	Size int
}

// Bounds of the default epoch size of generated workloads. Generating
// MaxWorkloadSize requests takes about a second and 50 MB.
const (
	MinWorkloadSize = 4000
	MaxWorkloadSize = 40000
)

// chatThinkTime spaces a session's turns in the generated chat workload.
// With 0.5 new sessions a second and 5 turns a session on average, the
// workload runs 2.5 requests a second, so consecutive turns of a session
// are about 1,000 requests apart: at a few thousand lookups a second a
// session's previous turn has finished its modeled prefill (and been
// reported) before the next one arrives. The generator's own 30 s would
// put turns 75 requests apart, closer than a prefill at such rates.
const chatThinkTime = 400 * time.Second

// source is a workload as an endless, deterministic stream. Request i is
// request i mod n of one epoch of the workload; epoch i / n renames every
// block (its wire hash mixes in the epoch), so a wrapped stream never
// replays an earlier epoch's cache state. A source is read-only after
// newSource and safe for concurrent use.
type source struct {
	reqs []workload.Request
	// salt separates the hashes of different seeds.
	salt uint64
	// span is the time one epoch of trace arrivals covers: the last arrival
	// plus the mean gap, so epochs follow each other at the trace's pace.
	span time.Duration
	// maxBlocks is the longest chain of any request; meanBlocks the mean.
	maxBlocks  int
	meanBlocks float64
}

func newSource(c WorkloadConfig, seed uint64) (*source, error) {
	n := c.Size
	if n < 0 {
		return nil, fmt.Errorf("%w: negative workload size %d", ErrInvalidConfig, n)
	}
	if n == 0 && c.Kind != WorkloadTrace {
		n = MinWorkloadSize
	}
	var (
		reqs []workload.Request
		err  error
	)
	switch c.Kind {
	case WorkloadChat:
		w := workload.DefaultChat()
		w.Seed = seed
		w.Sessions = max(1, n/5) // 2..8 turns, 5 on average
		w.ThinkTime = chatThinkTime
		reqs, err = w.Generate()
	case WorkloadRAG:
		w := workload.DefaultRAG()
		w.Seed, w.Requests = seed, n
		reqs, err = w.Generate()
	case WorkloadSharedPrompt:
		w := workload.DefaultSharedPrompt()
		w.Seed, w.Requests = seed, n
		w.Prompts = 8
		reqs, err = w.Generate()
	case WorkloadTrace:
		if c.TracePath == "" {
			return nil, fmt.Errorf("%w: the trace workload needs a trace path", ErrInvalidConfig)
		}
		reqs, err = workload.LoadTrace(c.TracePath, workload.MooncakeBlockSize, n)
	default:
		return nil, fmt.Errorf("%w: unknown workload %q (want chat, rag, shared-prompt or trace)", ErrInvalidConfig, c.Kind)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot build the %s workload: %w", c.Kind, err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: the %s workload has no requests", ErrInvalidConfig, c.Kind)
	}
	s := &source{reqs: reqs, salt: mix64(seed ^ 0x6c6f616467656e)}
	last := reqs[len(reqs)-1].Arrival
	s.span = last + last/time.Duration(len(reqs))
	if s.span <= 0 {
		s.span = time.Millisecond
	}
	total := 0
	for i := range reqs {
		s.maxBlocks = max(s.maxBlocks, len(reqs[i].Blocks))
		total += len(reqs[i].Blocks)
	}
	s.meanBlocks = float64(total) / float64(len(reqs))
	return s, nil
}

// at returns request i of the stream and its epoch.
func (s *source) at(i uint64) (*workload.Request, uint64) {
	n := uint64(len(s.reqs))
	return &s.reqs[i%n], i / n
}

// arrival returns the trace arrival of request i relative to request from.
func (s *source) arrival(i, from uint64) time.Duration {
	abs := func(j uint64) time.Duration {
		r, e := s.at(j)
		return r.Arrival + time.Duration(e)*s.span
	}
	return abs(i) - abs(from)
}

// hash returns the wire hash of block id in an epoch: a bijection of id for
// a fixed epoch (multiply by an odd constant, xor, then the splitmix64
// finalizer), so two blocks of one epoch never collide.
func (s *source) hash(epoch, id uint64) uint64 {
	return mix64(id*0x9e3779b97f4a7c15 ^ mix64(epoch+s.salt))
}

// fullBlocks returns how many leading blocks of r are full: engines hash
// only full blocks, so a partial last block is never sent.
func fullBlocks(r *workload.Request) int {
	n := len(r.Blocks)
	if n > 0 && r.BlockTokens(n-1) < r.BlockSize {
		n--
	}
	return n
}

// mix64 is the splitmix64 finalizer, a bijection on uint64.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// chainBuf builds wire chains without allocating once it has grown: one
// backing array of 8-byte hashes, the [][]byte view of it, and the token
// counts. The slices it returns are valid until the next build.
type chainBuf struct {
	raw    []byte
	hashes [][]byte
	counts []int32
	keys   []uint64
}

// build fills the buffer with the full-block chain of r in an epoch and
// returns the wire hashes, their token counts and the uint64 keys.
func (b *chainBuf) build(s *source, r *workload.Request, epoch uint64) ([][]byte, []int32, []uint64) {
	n := fullBlocks(r)
	b.raw = b.raw[:0]
	b.keys = b.keys[:0]
	for j := 0; j < n; j++ {
		k := s.hash(epoch, r.Blocks[j])
		b.keys = append(b.keys, k)
		b.raw = fingerprint.AppendWire(b.raw, k)
	}
	if cap(b.hashes) < n {
		b.hashes = make([][]byte, n)
		b.counts = make([]int32, n)
	}
	b.hashes, b.counts = b.hashes[:n], b.counts[:n]
	for j := 0; j < n; j++ {
		b.hashes[j] = b.raw[j*fingerprint.WireSize : (j+1)*fingerprint.WireSize : (j+1)*fingerprint.WireSize]
		b.counts[j] = int32(r.BlockSize)
	}
	return b.hashes, b.counts, b.keys
}

// wireChain returns a freshly allocated chain of the given keys (for
// messages handed to a stream, which may keep them after Send).
func wireChain(keys []uint64, blockSize int) ([][]byte, []int32) {
	raw := make([]byte, 0, len(keys)*fingerprint.WireSize)
	hashes := make([][]byte, len(keys))
	counts := make([]int32, len(keys))
	for j, k := range keys {
		raw = fingerprint.AppendWire(raw, k)
		hashes[j] = raw[j*fingerprint.WireSize : (j+1)*fingerprint.WireSize : (j+1)*fingerprint.WireSize]
		counts[j] = int32(blockSize)
	}
	return hashes, counts
}
