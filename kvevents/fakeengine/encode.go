// Package fakeengine publishes vLLM-shaped KV events over ZMQ, as an engine
// would: a PUB socket sending [topic, seq, msgpack batch] and a replay
// ROUTER serving recent batches from a ring buffer. Workloads are synthetic
// sessions or the Mooncake conversation trace. Knobs drop or reorder
// messages so gap recovery can be exercised. Tests run it in-process; the
// kvevent-fake-engine command wraps it.
package fakeengine

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Layout is the msgpack shape of events.
type Layout string

const (
	// LayoutArray is the tag-first array layout of vLLM releases before
	// PR #42892: ["BlockStored", block_hashes, parent, token_ids, ...].
	LayoutArray Layout = "array"
	// LayoutMap is the newer layout: {"type": "BlockStored", ...}.
	LayoutMap Layout = "map"
)

// ParseLayout accepts "array" or "map".
func ParseLayout(s string) (Layout, error) {
	switch Layout(s) {
	case LayoutArray, LayoutMap:
		return Layout(s), nil
	}
	return "", fmt.Errorf("fakeengine: unknown layout %q (want array or map)", s)
}

// Event kinds, as the engine tags them.
const (
	BlockStored      = "BlockStored"
	BlockRemoved     = "BlockRemoved"
	AllBlocksCleared = "AllBlocksCleared"
)

// Event is one engine event. Parent and LoRAID are nil when absent.
type Event struct {
	Kind        string
	BlockHashes []uint64
	Parent      *uint64
	TokenIDs    []uint32
	BlockSize   int
	LoRAID      *int64
	Medium      string // "" encodes as nil
	LoRAName    string // "" encodes as nil
}

// Batch is one EventBatch.
type Batch struct {
	TS     float64
	Events []Event
	DPRank int
}

// Encoding chooses the wire shapes.
type Encoding struct {
	Layout Layout
	// HashBytes sends block hashes as 32-byte digests whose last 8 bytes
	// hold the hash (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0); else uint64.
	HashBytes bool
	// MapBatch sends the envelope as a map {ts, events, data_parallel_rank}
	// instead of the array [ts, events, dp_rank].
	MapBatch bool
	// SGLang sends SGLang's shapes: the array envelope
	// [ts, events, attn_dp_rank], BlockStored as the 6-field tuple
	// [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id]
	// and BlockRemoved as [tag, block_hashes] (no medium, no lora_name). It
	// requires the array layout and no MapBatch.
	SGLang bool
}

// Encode returns the msgpack payload of b.
func (e Encoding) Encode(b Batch) ([]byte, error) {
	if e.SGLang && (e.MapBatch || e.Layout == LayoutMap) {
		return nil, fmt.Errorf("fakeengine: SGLang events are array-like only (no map layout or map batch)")
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	w := &writer{enc: enc, hashBytes: e.HashBytes, sglang: e.SGLang}
	if e.MapBatch {
		w.mapLen(3)
		w.str("ts")
		w.float(b.TS)
		w.str("events")
	} else {
		w.arrLen(3)
		w.float(b.TS)
	}
	w.arrLen(len(b.Events))
	for i := range b.Events {
		if e.Layout == LayoutMap {
			w.mapEvent(&b.Events[i])
		} else {
			w.arrayEvent(&b.Events[i])
		}
	}
	if e.MapBatch {
		w.str("data_parallel_rank")
	}
	w.int(int64(b.DPRank))
	if w.err != nil {
		return nil, fmt.Errorf("cannot encode event batch: %w", w.err)
	}
	return buf.Bytes(), nil
}

// writer keeps the first encoding error so call sites stay linear.
type writer struct {
	enc       *msgpack.Encoder
	hashBytes bool
	sglang    bool
	err       error
}

func (w *writer) do(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *writer) arrLen(n int)    { w.do(w.enc.EncodeArrayLen(n)) }
func (w *writer) mapLen(n int)    { w.do(w.enc.EncodeMapLen(n)) }
func (w *writer) str(s string)    { w.do(w.enc.EncodeString(s)) }
func (w *writer) float(f float64) { w.do(w.enc.EncodeFloat64(f)) }
func (w *writer) int(v int64)     { w.do(w.enc.EncodeInt(v)) }
func (w *writer) null()           { w.do(w.enc.EncodeNil()) }

func (w *writer) optStr(s string) {
	if s == "" {
		w.null()
		return
	}
	w.str(s)
}

func (w *writer) hash(h uint64) {
	if !w.hashBytes {
		w.do(w.enc.EncodeUint(h))
		return
	}
	var digest [32]byte
	binary.BigEndian.PutUint64(digest[:8], ^h) // noise the decoder must ignore
	binary.BigEndian.PutUint64(digest[24:], h)
	w.do(w.enc.EncodeBytes(digest[:]))
}

func (w *writer) hashes(hs []uint64) {
	w.arrLen(len(hs))
	for _, h := range hs {
		w.hash(h)
	}
}

func (w *writer) parent(p *uint64) {
	if p == nil {
		w.null()
		return
	}
	w.hash(*p)
}

func (w *writer) tokens(ts []uint32) {
	w.arrLen(len(ts))
	for _, t := range ts {
		w.do(w.enc.EncodeUint(uint64(t)))
	}
}

func (w *writer) loraID(id *int64) {
	if id == nil {
		w.null()
		return
	}
	w.int(*id)
}

func (w *writer) arrayEvent(ev *Event) {
	switch {
	case w.sglang && ev.Kind == BlockStored:
		w.arrLen(6)
		w.str(ev.Kind)
		w.hashes(ev.BlockHashes)
		w.parent(ev.Parent)
		w.tokens(ev.TokenIDs)
		w.int(int64(ev.BlockSize))
		w.loraID(ev.LoRAID)
		return
	case w.sglang && ev.Kind == BlockRemoved:
		w.arrLen(2)
		w.str(ev.Kind)
		w.hashes(ev.BlockHashes)
		return
	}
	switch ev.Kind {
	case BlockStored:
		w.arrLen(8)
		w.str(ev.Kind)
		w.hashes(ev.BlockHashes)
		w.parent(ev.Parent)
		w.tokens(ev.TokenIDs)
		w.int(int64(ev.BlockSize))
		w.loraID(ev.LoRAID)
		w.optStr(ev.Medium)
		w.optStr(ev.LoRAName)
	case BlockRemoved:
		w.arrLen(3)
		w.str(ev.Kind)
		w.hashes(ev.BlockHashes)
		w.optStr(ev.Medium)
	default:
		w.arrLen(1)
		w.str(ev.Kind)
	}
}

func (w *writer) mapEvent(ev *Event) {
	switch ev.Kind {
	case BlockStored:
		w.mapLen(8)
		w.str("type")
		w.str(ev.Kind)
		w.str("block_hashes")
		w.hashes(ev.BlockHashes)
		w.str("parent_block_hash")
		w.parent(ev.Parent)
		w.str("token_ids")
		w.tokens(ev.TokenIDs)
		w.str("block_size")
		w.int(int64(ev.BlockSize))
		w.str("lora_id")
		w.loraID(ev.LoRAID)
		w.str("medium")
		w.optStr(ev.Medium)
		w.str("lora_name")
		w.optStr(ev.LoRAName)
	case BlockRemoved:
		w.mapLen(3)
		w.str("type")
		w.str(ev.Kind)
		w.str("block_hashes")
		w.hashes(ev.BlockHashes)
		w.str("medium")
		w.optStr(ev.Medium)
	default:
		w.mapLen(1)
		w.str("type")
		w.str(ev.Kind)
	}
}
