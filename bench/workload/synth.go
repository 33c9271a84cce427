package workload

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// segment is a run of prompt tokens with one identity: a system prompt, a
// corpus chunk, one user turn, one assistant reply. Two prompts share KV
// for a block exactly when the block holds the same pieces of the same
// segments after the same parent block.
type segment struct {
	id     uint64
	tokens int
}

// blockKey identifies a prefix block: its parent's id (plus one; zero is
// the root) and a hash of the pieces of segments it holds.
type blockKey struct {
	parent  uint64
	content uint64
}

// chainBuilder turns segment lists into prefix block chains. It interns
// (parent, content) pairs, so equal prefixes get equal ids and any
// difference gives every later block a new id, as a rolling engine hash
// would. Content is hashed to 64 bits (FNV-1a); a collision between two
// different blocks under the same parent is possible in principle and
// negligible at simulator scale (n²/2⁶⁵ for n blocks).
//
// A chainBuilder is not safe for concurrent use.
type chainBuilder struct {
	blockSize int
	ids       map[blockKey]uint64
	nextID    uint64
	nextSeg   uint64
}

func newChainBuilder(blockSize int) *chainBuilder {
	return &chainBuilder{blockSize: blockSize, ids: make(map[blockKey]uint64)}
}

// newSegment returns a segment of the given length that no other segment
// shares.
func (b *chainBuilder) newSegment(tokens int) segment {
	s := segment{id: b.nextSeg, tokens: tokens}
	b.nextSeg++
	return s
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvMix(h, v uint64) uint64 {
	for i := 0; i < 8; i++ {
		h ^= v & 0xff
		h *= fnvPrime
		v >>= 8
	}
	return h
}

// chain returns the prefix block ids of the prompt made of segs, appended
// to dst[:0], and the prompt length in tokens. Empty segments are ignored.
func (b *chainBuilder) chain(segs []segment, dst []uint64) ([]uint64, int) {
	dst = dst[:0]
	total := 0
	for _, s := range segs {
		total += s.tokens
	}
	var parent uint64 // id+1 of the previous block; 0 at the root
	h := uint64(fnvOffset)
	fill := 0
	flush := func() {
		key := blockKey{parent: parent, content: h}
		id, ok := b.ids[key]
		if !ok {
			id = b.nextID
			b.nextID++
			b.ids[key] = id
		}
		dst = append(dst, id)
		parent = id + 1
		h = fnvOffset
		fill = 0
	}
	for _, s := range segs {
		off := 0
		for off < s.tokens { // each pass consumes at least one token
			n := min(s.tokens-off, b.blockSize-fill)
			h = fnvMix(fnvMix(fnvMix(h, s.id), uint64(off)), uint64(n))
			off += n
			fill += n
			if fill == b.blockSize {
				flush()
			}
		}
	}
	if fill > 0 {
		flush()
	}
	return dst, total
}

// Range is an inclusive range of integers, drawn uniformly.
type Range struct {
	Min, Max int
}

func (r Range) valid(allowZero bool) bool {
	lo := 1
	if allowZero {
		lo = 0
	}
	return r.Min >= lo && r.Max >= r.Min
}

func (r Range) draw(rng *rand.Rand) int {
	return r.Min + rng.IntN(r.Max-r.Min+1)
}

// expGap draws an exponential gap with the given mean.
func expGap(rng *rand.Rand, mean time.Duration) time.Duration {
	return time.Duration(rng.ExpFloat64() * float64(mean))
}

// finish sorts requests by arrival (ties keep generation order) and
// numbers them.
func finish(reqs []Request) []Request {
	slices.SortStableFunc(reqs, func(a, b Request) int {
		switch {
		case a.Arrival < b.Arrival:
			return -1
		case a.Arrival > b.Arrival:
			return 1
		}
		return 0
	})
	for i := range reqs {
		reqs[i].ID = i
	}
	return reqs
}

// rateGap converts a rate per second into the mean gap between arrivals.
func rateGap(perSecond float64) time.Duration {
	return time.Duration(float64(time.Second) / perSecond)
}

// Chat describes multi-turn chat: sessions arrive as a Poisson process;
// each opens with a system prompt shared by every session, and every turn
// resends the whole conversation so far (system prompt, earlier user turns
// and assistant replies) plus a new user message, so a session's block
// chain grows turn by turn and each turn can reuse the previous turn's
// full blocks.
type Chat struct {
	Seed               uint64
	Sessions           int
	Turns              Range         // turns per session
	SessionRate        float64       // new sessions per second
	ThinkTime          time.Duration // mean gap between turns of a session
	SystemPromptTokens int           // shared by all sessions; may be 0
	UserTokens         Range         // new user tokens per turn
	OutputTokens       Range         // reply tokens per turn
	BlockSize          int
}

// DefaultChat returns a chat workload of about 1,000 requests with 16-token
// blocks.
func DefaultChat() Chat {
	return Chat{
		Seed: 1, Sessions: 200, Turns: Range{2, 8}, SessionRate: 0.5,
		ThinkTime: 30 * time.Second, SystemPromptTokens: 1024,
		UserTokens: Range{50, 400}, OutputTokens: Range{100, 500}, BlockSize: 16,
	}
}

func (c Chat) validate() error {
	switch {
	case c.Sessions <= 0 || !c.Turns.valid(false):
		return fmt.Errorf("%w: chat needs sessions > 0 and 1 <= turns.min <= turns.max", ErrInvalid)
	case c.SessionRate <= 0 || c.ThinkTime < 0:
		return fmt.Errorf("%w: chat needs a positive session rate and non-negative think time", ErrInvalid)
	case c.SystemPromptTokens < 0 || !c.UserTokens.valid(false) || !c.OutputTokens.valid(true) || c.BlockSize <= 0:
		return fmt.Errorf("%w: chat token ranges or block size out of range", ErrInvalid)
	}
	return nil
}

// Generate returns the chat requests sorted by arrival. It is
// deterministic for a given Chat value.
func (c Chat) Generate() ([]Request, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x63686174))
	b := newChainBuilder(c.BlockSize)
	sys := b.newSegment(c.SystemPromptTokens)
	var reqs []Request
	var start time.Duration
	segs := make([]segment, 0, 2*c.Turns.Max+1)
	for s := 0; s < c.Sessions; s++ {
		start += expGap(rng, rateGap(c.SessionRate))
		at := start
		segs = append(segs[:0], sys)
		turns := c.Turns.draw(rng)
		for k := 0; k < turns; k++ {
			segs = append(segs, b.newSegment(c.UserTokens.draw(rng)))
			blocks, n := b.chain(segs, nil)
			out := c.OutputTokens.draw(rng)
			reqs = append(reqs, Request{Arrival: at, Blocks: blocks, BlockSize: c.BlockSize, InputTokens: n, OutputTokens: out})
			segs = append(segs, b.newSegment(out))
			at += expGap(rng, c.ThinkTime)
		}
	}
	return finish(reqs), nil
}

// RAG describes retrieval-augmented generation: a shared system prompt,
// then ChunksPerQuery distinct corpus chunks drawn with Zipf(ZipfS)
// popularity in retrieval order, then a query no other request shares.
// Requests that retrieve the same leading chunks share those blocks.
type RAG struct {
	Seed               uint64
	Requests           int
	Rate               float64 // requests per second, Poisson
	SystemPromptTokens int
	CorpusChunks       int
	ChunkTokens        int
	ChunksPerQuery     int
	ZipfS              float64 // > 1; larger means more skewed popularity
	QueryTokens        Range
	OutputTokens       Range
	BlockSize          int
}

// DefaultRAG returns a RAG workload of 2,000 requests with 16-token blocks.
func DefaultRAG() RAG {
	return RAG{
		Seed: 1, Requests: 2000, Rate: 4, SystemPromptTokens: 256,
		CorpusChunks: 500, ChunkTokens: 512, ChunksPerQuery: 4, ZipfS: 1.2,
		QueryTokens: Range{20, 100}, OutputTokens: Range{50, 300}, BlockSize: 16,
	}
}

func (c RAG) validate() error {
	switch {
	case c.Requests <= 0 || c.Rate <= 0:
		return fmt.Errorf("%w: rag needs requests > 0 and a positive rate", ErrInvalid)
	case c.CorpusChunks <= 0 || c.ChunkTokens <= 0 || c.ChunksPerQuery <= 0 || c.ChunksPerQuery > c.CorpusChunks:
		return fmt.Errorf("%w: rag needs 1 <= chunks per query <= corpus chunks and positive chunk tokens", ErrInvalid)
	case !(c.ZipfS > 1):
		return fmt.Errorf("%w: rag zipf exponent must be > 1, got %v", ErrInvalid, c.ZipfS)
	case c.SystemPromptTokens < 0 || !c.QueryTokens.valid(false) || !c.OutputTokens.valid(true) || c.BlockSize <= 0:
		return fmt.Errorf("%w: rag token ranges or block size out of range", ErrInvalid)
	}
	return nil
}

// Generate returns the RAG requests sorted by arrival. It is deterministic
// for a given RAG value.
func (c RAG) Generate() ([]Request, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x726167))
	zipf := rand.NewZipf(rng, c.ZipfS, 1, uint64(c.CorpusChunks-1))
	b := newChainBuilder(c.BlockSize)
	sys := b.newSegment(c.SystemPromptTokens)
	chunks := make([]segment, c.CorpusChunks)
	for i := range chunks {
		chunks[i] = b.newSegment(c.ChunkTokens)
	}
	reqs := make([]Request, 0, c.Requests)
	picked := make([]bool, c.CorpusChunks)
	segs := make([]segment, 0, c.ChunksPerQuery+2)
	var at time.Duration
	for i := 0; i < c.Requests; i++ {
		at += expGap(rng, rateGap(c.Rate))
		segs = append(segs[:0], sys)
		clear(picked)
		// Draw distinct chunks; after a bounded number of repeats fall back
		// to the most popular chunks not yet taken.
		for tries := 0; len(segs)-1 < c.ChunksPerQuery && tries < 64*c.ChunksPerQuery; tries++ {
			if k := int(zipf.Uint64()); !picked[k] {
				picked[k] = true
				segs = append(segs, chunks[k])
			}
		}
		for k := 0; len(segs)-1 < c.ChunksPerQuery && k < c.CorpusChunks; k++ {
			if !picked[k] {
				picked[k] = true
				segs = append(segs, chunks[k])
			}
		}
		segs = append(segs, b.newSegment(c.QueryTokens.draw(rng)))
		blocks, n := b.chain(segs, nil)
		reqs = append(reqs, Request{Arrival: at, Blocks: blocks, BlockSize: c.BlockSize, InputTokens: n, OutputTokens: c.OutputTokens.draw(rng)})
	}
	return finish(reqs), nil
}

// SharedPrompt describes diffuse single-turn traffic: every request is one
// of Prompts system prompts (chosen uniformly) followed by a user message
// that no other request shares, so only the system prompt's full blocks
// can be reused.
type SharedPrompt struct {
	Seed               uint64
	Requests           int
	Rate               float64 // requests per second, Poisson
	Prompts            int     // distinct system prompts
	SystemPromptTokens int
	UserTokens         Range
	OutputTokens       Range
	BlockSize          int
}

// DefaultSharedPrompt returns 2,000 single-turn requests behind one
// 2,048-token system prompt, with 16-token blocks.
func DefaultSharedPrompt() SharedPrompt {
	return SharedPrompt{
		Seed: 1, Requests: 2000, Rate: 4, Prompts: 1, SystemPromptTokens: 2048,
		UserTokens: Range{100, 1000}, OutputTokens: Range{50, 400}, BlockSize: 16,
	}
}

func (c SharedPrompt) validate() error {
	switch {
	case c.Requests <= 0 || c.Rate <= 0 || c.Prompts <= 0:
		return fmt.Errorf("%w: shared-prompt needs requests, rate and prompts > 0", ErrInvalid)
	case c.SystemPromptTokens < 0 || !c.UserTokens.valid(false) || !c.OutputTokens.valid(true) || c.BlockSize <= 0:
		return fmt.Errorf("%w: shared-prompt token ranges or block size out of range", ErrInvalid)
	}
	return nil
}

// Generate returns the requests sorted by arrival. It is deterministic for
// a given SharedPrompt value.
func (c SharedPrompt) Generate() ([]Request, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x737973))
	b := newChainBuilder(c.BlockSize)
	prompts := make([]segment, c.Prompts)
	for i := range prompts {
		prompts[i] = b.newSegment(c.SystemPromptTokens)
	}
	reqs := make([]Request, 0, c.Requests)
	var segs [2]segment
	var at time.Duration
	for i := 0; i < c.Requests; i++ {
		at += expGap(rng, rateGap(c.Rate))
		segs[0] = prompts[rng.IntN(c.Prompts)]
		segs[1] = b.newSegment(c.UserTokens.draw(rng))
		blocks, n := b.chain(segs[:], nil)
		reqs = append(reqs, Request{Arrival: at, Blocks: blocks, BlockSize: c.BlockSize, InputTokens: n, OutputTokens: c.OutputTokens.draw(rng)})
	}
	return finish(reqs), nil
}
