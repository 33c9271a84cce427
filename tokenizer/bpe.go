package tokenizer

import (
	"encoding/json"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// bpe is the BPE model. Byte-level models are keyed by raw bytes: the
// GPT-2 byte-to-rune mapping is inverted once at load, so encoding never
// builds mapped strings.
type bpe struct {
	// vocab maps a word (raw bytes for byte-level models) to its id.
	vocab map[string]uint32
	// rawVocab is the vocabulary as spelled in tokenizer.json.
	rawVocab map[string]uint32
	// merges maps the pair (left<<32 | right) to rank<<32 | merged id.
	merges map[uint64]uint64

	byteLevel    bool
	byteID       [256]uint32 // byte-level: the id of each byte
	byteFallback bool
	fallbackID   [256]uint32 // <0xXX> ids when byteFallback
	hasFallback  [256]bool
	unk          uint32
	hasUnk       bool
	fuseUnk      bool
	ignoreMerges bool

	cache wordCache
}

type bpeJSON struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  json.RawMessage   `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Dropout                 *float64          `json:"dropout"`
}

func buildBPE(raw json.RawMessage, byteLevel bool) (*bpe, error) {
	// The type first: other models' vocabs (Unigram's is a list of
	// [piece, score]) do not parse as BPE's, and the error must name the
	// model, not the JSON shape.
	typ, ok, err := typed(raw)
	switch {
	case err != nil:
		return nil, fmt.Errorf("cannot parse model: %w", err)
	case !ok:
		return nil, fmt.Errorf("cannot load tokenizer.json: no model")
	case typ == "":
		return nil, fmt.Errorf("%w: a model with no type (this package implements \"BPE\")", ErrUnsupported)
	case typ != "BPE":
		return nil, fmt.Errorf("%w: model %q (this package implements \"BPE\")", ErrUnsupported, typ)
	}
	var c bpeJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("cannot parse BPE model: %w", err)
	}
	if c.Dropout != nil && *c.Dropout > 0 {
		return nil, fmt.Errorf("%w: BPE dropout", ErrUnsupported)
	}
	if c.ContinuingSubwordPrefix != nil && *c.ContinuingSubwordPrefix != "" ||
		c.EndOfWordSuffix != nil && *c.EndOfWordSuffix != "" {
		return nil, fmt.Errorf("%w: BPE continuing_subword_prefix or end_of_word_suffix", ErrUnsupported)
	}
	if len(c.Vocab) == 0 {
		return nil, fmt.Errorf("cannot load BPE model: empty vocab")
	}
	m := &bpe{
		rawVocab:     c.Vocab,
		vocab:        c.Vocab,
		byteLevel:    byteLevel,
		byteFallback: c.ByteFallback,
		fuseUnk:      c.FuseUnk,
		ignoreMerges: c.IgnoreMerges,
	}
	if c.UnkToken != nil {
		id, ok := c.Vocab[*c.UnkToken]
		if !ok {
			return nil, fmt.Errorf("cannot load BPE model: unk_token %q not in vocab", *c.UnkToken)
		}
		m.unk, m.hasUnk = id, true
	}
	if byteLevel {
		dec := byteDecoder()
		m.vocab = make(map[string]uint32, len(c.Vocab))
		buf := make([]byte, 0, 64)
	vocab:
		for tok, id := range c.Vocab {
			buf = buf[:0]
			for _, r := range tok {
				b, ok := dec[r]
				if !ok {
					continue vocab // not reachable from byte-level input
				}
				buf = append(buf, b)
			}
			m.vocab[string(buf)] = id
		}
		for b := 0; b < 256; b++ {
			id, ok := m.vocab[string([]byte{byte(b)})]
			if !ok {
				return nil, fmt.Errorf("cannot load byte-level BPE model: byte %#x has no token", b)
			}
			m.byteID[b] = id
		}
	}
	if c.ByteFallback {
		for b := 0; b < 256; b++ {
			m.fallbackID[b], m.hasFallback[b] = c.Vocab[fmt.Sprintf("<0x%02X>", b)]
		}
	}
	// merges: ["a b", ...] (older files) or [["a", "b"], ...].
	var pairs [][2]string
	if len(c.Merges) > 0 && string(c.Merges) != "null" {
		var flat []string
		if err := json.Unmarshal(c.Merges, &flat); err == nil {
			pairs = make([][2]string, len(flat))
			for i, s := range flat {
				a, b, ok := strings.Cut(s, " ")
				if !ok || strings.Contains(b, " ") {
					return nil, fmt.Errorf("cannot load BPE merge %d %q: want two tokens", i, s)
				}
				pairs[i] = [2]string{a, b}
			}
		} else {
			var nested [][]string
			if err := json.Unmarshal(c.Merges, &nested); err != nil {
				return nil, fmt.Errorf("cannot load BPE merges: want [\"a b\", ...] or [[a, b], ...]: %w", err)
			}
			pairs = make([][2]string, len(nested))
			for i, p := range nested {
				if len(p) != 2 {
					return nil, fmt.Errorf("cannot load BPE merge %d: want two tokens, got %d", i, len(p))
				}
				pairs[i] = [2]string{p[0], p[1]}
			}
		}
	}
	m.merges = make(map[uint64]uint64, len(pairs))
	for rank, p := range pairs {
		a, b := p[0], p[1]
		ia, ok1 := c.Vocab[a]
		ib, ok2 := c.Vocab[b]
		ic, ok3 := c.Vocab[a+b]
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("cannot load BPE merge %d (%q, %q): token not in vocab", rank, a, b)
		}
		key := uint64(ia)<<32 | uint64(ib)
		if _, dup := m.merges[key]; !dup {
			m.merges[key] = uint64(rank)<<32 | uint64(ic)
		}
	}
	m.cache.init()
	return m, nil
}

// byteDecoder inverts GPT-2's bytes_to_unicode: printable Latin-1 bytes map
// to themselves, the others to U+0100 onwards in byte order.
func byteDecoder() map[rune]byte {
	dec := make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			dec[rune(b)] = byte(b)
			continue
		}
		dec[rune(256+n)] = byte(b)
		n++
	}
	return dec
}

// symbol is one part of a word during merging; len 0 marks a merged-away
// symbol.
type symbol struct {
	id         uint32
	prev, next int32
	len        int32
}

// mergeCand is a candidate merge of the symbol at pos with its next.
type mergeCand struct {
	rank  uint32
	pos   int32
	newID uint32
}

func (a mergeCand) less(b mergeCand) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

// maxCachedWord is the longest word (bytes) the per-word cache keeps.
const maxCachedWord = 64

// encodeWord appends the ids of one pre-tokenized piece.
func (m *bpe) encodeWord(dst []uint32, w string, sc *scratch) ([]uint32, error) {
	if m.ignoreMerges {
		if id, ok := m.vocab[w]; ok {
			return append(dst, id), nil
		}
	}
	cacheable := len(w) <= maxCachedWord
	if cacheable {
		if ids, ok := m.cache.get(w); ok {
			return append(dst, ids...), nil
		}
	}
	syms := sc.syms[:0]
	if m.byteLevel {
		for i := 0; i < len(w); i++ {
			syms = append(syms, symbol{id: m.byteID[w[i]], len: 1})
		}
	} else {
		var err error
		if syms, err = m.initialChars(syms, w); err != nil {
			return dst, err
		}
	}
	for i := range syms {
		syms[i].prev = int32(i) - 1
		syms[i].next = int32(i) + 1
	}
	if n := len(syms); n > 0 {
		syms[n-1].next = -1
	}
	sc.heap = m.mergeAll(syms, sc.heap[:0])
	sc.syms = syms
	start := len(dst)
	for i := 0; i >= 0 && i < len(syms); i = int(syms[i].next) {
		dst = append(dst, syms[i].id)
	}
	if cacheable {
		m.cache.put(w, dst[start:])
	}
	return dst, nil
}

// initialChars makes one symbol per rune; a rune missing from the vocab
// becomes its <0xXX> byte tokens (byte_fallback) or unk (fused if
// fuse_unk).
func (m *bpe) initialChars(syms []symbol, w string) ([]symbol, error) {
	prevUnk := false
	for i := 0; i < len(w); {
		_, n := utf8.DecodeRuneInString(w[i:])
		if id, ok := m.vocab[w[i:i+n]]; ok {
			syms = append(syms, symbol{id: id, len: int32(n)})
			prevUnk = false
			i += n
			continue
		}
		if m.byteFallback {
			all := true
			for j := i; j < i+n; j++ {
				all = all && m.hasFallback[w[j]]
			}
			if all {
				for j := i; j < i+n; j++ {
					syms = append(syms, symbol{id: m.fallbackID[w[j]], len: 1})
				}
				prevUnk = false
				i += n
				continue
			}
		}
		if !m.hasUnk {
			return syms, fmt.Errorf("cannot encode %q: not in vocab and no unk_token", w[i:i+n])
		}
		if m.fuseUnk && prevUnk {
			syms[len(syms)-1].len += int32(n)
		} else {
			syms = append(syms, symbol{id: m.unk, len: int32(n)})
		}
		prevUnk = true
		i += n
	}
	return syms, nil
}

// mergeAll applies merges by rank (ties: leftmost), like Hugging Face's
// Word::merge_all: a heap of candidates, stale ones skipped when popped.
func (m *bpe) mergeAll(syms []symbol, h []mergeCand) []mergeCand {
	for i := 0; i+1 < len(syms); i++ {
		if v, ok := m.merges[uint64(syms[i].id)<<32|uint64(syms[i+1].id)]; ok {
			h = heapPush(h, mergeCand{rank: uint32(v >> 32), pos: int32(i), newID: uint32(v)})
		}
	}
	for len(h) > 0 {
		var top mergeCand
		top, h = heapPop(h)
		cur := &syms[top.pos]
		if cur.len == 0 || cur.next < 0 {
			continue
		}
		nx := &syms[cur.next]
		v, ok := m.merges[uint64(cur.id)<<32|uint64(nx.id)]
		if !ok || uint32(v>>32) != top.rank || uint32(v) != top.newID {
			continue
		}
		cur.id = top.newID
		cur.len += nx.len
		nx.len = 0
		cur.next = nx.next
		if cur.next >= 0 {
			syms[cur.next].prev = top.pos
		}
		if cur.prev >= 0 {
			p := &syms[cur.prev]
			if v, ok := m.merges[uint64(p.id)<<32|uint64(cur.id)]; ok {
				h = heapPush(h, mergeCand{rank: uint32(v >> 32), pos: cur.prev, newID: uint32(v)})
			}
		}
		if cur.next >= 0 {
			if v, ok := m.merges[uint64(cur.id)<<32|uint64(syms[cur.next].id)]; ok {
				h = heapPush(h, mergeCand{rank: uint32(v >> 32), pos: top.pos, newID: uint32(v)})
			}
		}
	}
	return h
}

func heapPush(h []mergeCand, c mergeCand) []mergeCand {
	h = append(h, c)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeCand) (mergeCand, []mergeCand) {
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		s := l
		if r := l + 1; r < n && h[r].less(h[l]) {
			s = r
		}
		if !h[s].less(h[i]) {
			break
		}
		h[i], h[s] = h[s], h[i]
		i = s
	}
	return top, h
}

// wordCache maps short words to their ids, sharded; it stops growing at
// maxCacheWords (a cache, not a record: a miss only costs a merge).
type wordCache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
	// size counts entries across shards; written under a shard lock, read
	// without one (a soft bound).
	size atomic.Int64
}

const (
	cacheShards   = 32
	maxCacheWords = 1 << 18
)

type cacheShard struct {
	// mu protects m.
	mu sync.RWMutex
	m  map[string][]uint32
	_  [40]byte // keep shards on separate cache lines
}

func (c *wordCache) init() {
	c.seed = maphash.MakeSeed()
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
	}
}

func (c *wordCache) shard(w string) *cacheShard {
	return &c.shards[maphash.String(c.seed, w)%cacheShards]
}

func (c *wordCache) get(w string) ([]uint32, bool) {
	s := c.shard(w)
	s.mu.RLock()
	ids, ok := s.m[w]
	s.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []uint32) {
	if c.size.Load() >= maxCacheWords {
		return
	}
	cp := append([]uint32(nil), ids...)
	key := strings.Clone(w)
	s := c.shard(w)
	s.mu.Lock()
	if _, ok := s.m[key]; !ok {
		s.m[key] = cp
		c.size.Add(1)
	}
	s.mu.Unlock()
}
