// Package wire is the engines' KV-event wire format: the ZMQ multipart
// message ([topic, seq, payload]) and the msgpack batches vLLM and SGLang
// publish in it (array and map envelopes, tag-first array and map event
// layouts), decoded into a reusable Batch without allocating. It knows
// nothing of what the events mean for routing: kvevents applies them.
package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// EventKind is the type of one engine KV event.
type EventKind uint8

const (
	// KindUnknown is an event whose tag this decoder does not know; it is
	// counted and skipped.
	KindUnknown EventKind = iota
	// KindBlockStored reports blocks that entered the engine's cache.
	KindBlockStored
	// KindBlockRemoved reports blocks that left a cache medium.
	KindBlockRemoved
	// KindAllBlocksCleared reports that the engine dropped its whole cache.
	KindAllBlocksCleared
)

// String returns the engine's tag for k ("BlockStored", ...), or "unknown".
func (k EventKind) String() string {
	switch k {
	case KindBlockStored:
		return "BlockStored"
	case KindBlockRemoved:
		return "BlockRemoved"
	case KindAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Event is one decoded engine event. Its slices alias the Batch that holds
// it and are valid until that Batch is decoded into again.
type Event struct {
	Kind EventKind
	// BlockHashes are the engine's block identities, normalized to uint64:
	// integers as-is (negative ones in two's complement), byte strings by
	// their last 8 bytes read big-endian.
	BlockHashes []uint64
	// ParentHash is the engine hash of the block before BlockHashes[0];
	// meaningful only when HasParent (BlockStored only).
	ParentHash uint64
	HasParent  bool
	// TokenIDs are the tokens of the stored blocks (BlockStored only).
	TokenIDs []uint32
	// BlockSize is the event's block size in tokens; 0 when absent.
	BlockSize int
	// LoRAID is the deprecated integer adapter id; meaningful when HasLoRAID.
	LoRAID    int64
	HasLoRAID bool
	// LoRAName is the adapter name, nil when absent or nil on the wire.
	LoRAName []byte
	// Medium is the cache medium ("GPU", "CPU", ...), nil when absent.
	Medium []byte
}

// Batch is one decoded EventBatch. The zero value is ready for use; reusing
// one Batch across Decode calls reuses its storage, so steady-state decoding
// does not allocate.
type Batch struct {
	// TS is the engine's wall-clock time of the batch in seconds.
	TS float64
	// DPRank is the data-parallel rank; meaningful when HasDPRank.
	DPRank    int64
	HasDPRank bool
	// Events in engine order, including KindUnknown ones.
	Events []Event

	// Backing storage that Events' slices point into. A slice taken before
	// a reallocation keeps pointing at the old array, which stays valid.
	hashes []uint64
	tokens []uint32
	strs   []byte
}

func (b *Batch) reset() {
	b.TS, b.DPRank, b.HasDPRank = 0, 0, false
	b.Events = b.Events[:0]
	b.hashes = b.hashes[:0]
	b.tokens = b.tokens[:0]
	b.strs = b.strs[:0]
}

// ErrDecode is wrapped by every error Decode returns.
var ErrDecode = errors.New("kvevents: cannot decode event batch")

// DecodeError says why a batch was rejected. Reason is a short, stable label
// used for the dropped-batches counter.
type DecodeError struct {
	Reason string
	Err    error
}

// Drop reasons for whole batches.
const (
	ReasonTruncated = "truncated"   // payload ends inside a value
	ReasonEnvelope  = "envelope"    // batch is not [ts, events, ...] or a map with events
	ReasonEvent     = "event"       // an event is neither a tagged array nor a map
	ReasonFieldType = "field_type"  // a known field has the wrong msgpack type
	ReasonTokenID   = "token_range" // a token id does not fit uint32
	ReasonTooLarge  = "too_large"   // payload or a length exceeds the bounds
	ReasonTrailing  = "trailing"    // bytes after the batch value
	ReasonFrames    = "frames"      // ZMQ message without a payload frame
)

func (e *DecodeError) Error() string {
	return fmt.Sprintf("%v (%s): %v", ErrDecode, e.Reason, e.Err)
}

func (e *DecodeError) Unwrap() []error { return []error{ErrDecode, e.Err} }

// DecodeReason returns the drop reason of err, or "other".
func DecodeReason(err error) string {
	var de *DecodeError
	if errors.As(err, &de) {
		return de.Reason
	}
	return "other"
}

func decErr(reason string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		reason = ReasonTruncated
	}
	var de *DecodeError
	if errors.As(err, &de) {
		return err
	}
	return &DecodeError{Reason: reason, Err: err}
}

var (
	errNotArrayOrMap = errors.New("value is neither an array nor a map")
	errShortBatch    = errors.New("array batch has fewer than 2 elements")
	errNoEvents      = errors.New("map batch has no events")
	errNilHash       = errors.New("nil block hash")
	errBadHash       = errors.New("block hash is neither an integer nor bytes")
	errTokenRange    = errors.New("token id outside uint32")
	errNotInt        = errors.New("value is not an integer")
	errNotString     = errors.New("value is not a string or bytes")
	errLength        = errors.New("length exceeds the remaining payload")
	errTrailing      = errors.New("trailing bytes after the batch")
	errMissingField  = errors.New("event misses a required field")
	errNilArray      = errors.New("nil where an array is required")
)

// DefaultMaxPayloadBytes bounds one payload; engines send far smaller ones.
const DefaultMaxPayloadBytes = 16 << 20

// Decoder decodes vLLM/SGLang KV-event batches. It keeps its scratch
// buffers between calls, so a Decoder must not be used by two goroutines at
// once; the zero value is not usable, call NewDecoder.
type Decoder struct {
	r   bytes.Reader
	buf []byte // the payload r reads; integer arrays are parsed from it directly
	dec *msgpack.Decoder
	// scratch holds the current string (tag or key) being compared.
	scratch []byte
	// MaxPayloadBytes bounds a payload; larger ones are rejected whole.
	MaxPayloadBytes int
}

// NewDecoder returns a Decoder with DefaultMaxPayloadBytes.
func NewDecoder() *Decoder {
	d := &Decoder{MaxPayloadBytes: DefaultMaxPayloadBytes, scratch: make([]byte, 0, 64)}
	// bytes.Reader is an io.ByteScanner, so msgpack reads straight from it
	// without a bufio layer; skipValue relies on that to read the same
	// position.
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}

// ParseMessage splits a ZMQ multipart message into its sequence number and
// payload. The payload is the last frame; the sequence, when present, is
// the 8-byte big-endian frame just before it. hasSeq is false for a message
// without such a frame.
func ParseMessage(frames [][]byte) (seq uint64, hasSeq bool, payload []byte, err error) {
	if len(frames) == 0 {
		return 0, false, nil, &DecodeError{Reason: ReasonFrames, Err: errors.New("empty message")}
	}
	payload = frames[len(frames)-1]
	if len(frames) >= 2 && len(frames[len(frames)-2]) == 8 {
		return binary.BigEndian.Uint64(frames[len(frames)-2]), true, payload, nil
	}
	return 0, false, payload, nil
}

// Decode decodes one msgpack payload into b, replacing its content. On error
// b holds a partial batch that must not be applied; the error is a
// *DecodeError carrying the drop reason.
func (d *Decoder) Decode(payload []byte, b *Batch) error {
	b.reset()
	if d.MaxPayloadBytes > 0 && len(payload) > d.MaxPayloadBytes {
		return &DecodeError{Reason: ReasonTooLarge, Err: fmt.Errorf("payload of %d bytes", len(payload))}
	}
	d.r.Reset(payload)
	d.buf = payload
	defer func() { d.buf = nil }()
	if err := d.batch(b); err != nil {
		return err
	}
	if d.r.Len() != 0 {
		return &DecodeError{Reason: ReasonTrailing, Err: errTrailing}
	}
	return nil
}

func (d *Decoder) batch(b *Batch) error {
	c, err := d.dec.PeekCode()
	if err != nil {
		return decErr(ReasonEnvelope, err)
	}
	switch {
	case isArrayCode(c):
		n, err := d.arrayLen()
		if err != nil {
			return decErr(ReasonEnvelope, err)
		}
		if n < 2 {
			return &DecodeError{Reason: ReasonEnvelope, Err: errShortBatch}
		}
		if b.TS, err = d.float(); err != nil {
			return decErr(ReasonEnvelope, err)
		}
		if err := d.events(b); err != nil {
			return err
		}
		if n >= 3 {
			if err := d.dpRank(b); err != nil {
				return err
			}
		}
		return d.skipN(n - 3)
	case isMapCode(c):
		n, err := d.mapLen()
		if err != nil {
			return decErr(ReasonEnvelope, err)
		}
		seen := false
		for range n {
			key, err := d.str()
			if err != nil {
				return decErr(ReasonEnvelope, err)
			}
			switch string(key) {
			case "ts":
				if b.TS, err = d.float(); err != nil {
					return decErr(ReasonEnvelope, err)
				}
			case "events":
				if err := d.events(b); err != nil {
					return err
				}
				seen = true
			case "data_parallel_rank", "attn_dp_rank", "dp_rank":
				if err := d.dpRank(b); err != nil {
					return err
				}
			default:
				if err := d.skipValue(); err != nil {
					return decErr(ReasonEnvelope, err)
				}
			}
		}
		if !seen {
			return &DecodeError{Reason: ReasonEnvelope, Err: errNoEvents}
		}
		return nil
	}
	return &DecodeError{Reason: ReasonEnvelope, Err: errNotArrayOrMap}
}

func (d *Decoder) dpRank(b *Batch) error {
	isNil, err := d.peekNil()
	if err != nil {
		return decErr(ReasonEnvelope, err)
	}
	if isNil {
		return decErr(ReasonEnvelope, d.dec.DecodeNil())
	}
	v, err := d.int()
	if err != nil {
		return decErr(ReasonEnvelope, err)
	}
	b.DPRank, b.HasDPRank = v, true
	return nil
}

func (d *Decoder) events(b *Batch) error {
	n, err := d.arrayLen()
	if err != nil {
		return decErr(ReasonEnvelope, err)
	}
	if n < 0 {
		return &DecodeError{Reason: ReasonEnvelope, Err: errNilArray}
	}
	for range n {
		b.Events = append(b.Events, Event{})
		ev := &b.Events[len(b.Events)-1]
		c, err := d.dec.PeekCode()
		if err != nil {
			return decErr(ReasonEvent, err)
		}
		switch {
		case isArrayCode(c):
			err = d.arrayEvent(b, ev)
		case isMapCode(c):
			err = d.mapEvent(b, ev)
		default:
			err = &DecodeError{Reason: ReasonEvent, Err: errNotArrayOrMap}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Positional fields of BlockStored in the tag-first array layout, after
// the tag. Later engine versions append fields; earlier ones stop sooner.
// eventField decodes a field by this position, whatever the layout.
const (
	posStoredHashes = iota
	posStoredParent
	posStoredTokens
	posStoredBlockSize
	posStoredLoRAID
	posStoredMedium
	posStoredLoRAName
	numStoredKnown
)

// removedFields are BlockRemoved's positional fields in the array layout,
// as eventField positions: ["BlockRemoved", block_hashes, medium, ...].
var removedFields = [...]int{posStoredHashes, posStoredMedium}

func (d *Decoder) arrayEvent(b *Batch, ev *Event) error {
	n, err := d.arrayLen()
	if err != nil {
		return decErr(ReasonEvent, err)
	}
	if n < 1 {
		return &DecodeError{Reason: ReasonEvent, Err: errMissingField}
	}
	ev.Kind, err = d.tag()
	if err != nil {
		return err
	}
	fields := n - 1
	switch ev.Kind {
	case KindBlockStored:
		// block_hashes, parent and token_ids are required; block_size may
		// fall back to the configured one; LoRA and medium are optional.
		if fields < posStoredTokens+1 {
			return &DecodeError{Reason: ReasonEvent, Err: errMissingField}
		}
		for i := range min(fields, numStoredKnown) {
			if err := d.eventField(b, ev, i); err != nil {
				return err
			}
		}
		return d.skipN(fields - numStoredKnown)
	case KindBlockRemoved:
		if fields < 1 { // block_hashes
			return &DecodeError{Reason: ReasonEvent, Err: errMissingField}
		}
		for _, pos := range removedFields[:min(fields, len(removedFields))] {
			if err := d.eventField(b, ev, pos); err != nil {
				return err
			}
		}
		return d.skipN(fields - len(removedFields))
	default:
		return d.skipN(fields)
	}
}

// eventField decodes the field at BlockStored position i (posStored*)
// into ev; BlockRemoved's fields are a subset of those.
func (d *Decoder) eventField(b *Batch, ev *Event, i int) error {
	var err error
	switch i {
	case posStoredHashes:
		ev.BlockHashes, err = d.hashes(b)
	case posStoredParent:
		var isNil bool
		if isNil, err = d.peekNil(); err == nil && !isNil {
			ev.ParentHash, err = d.hash()
			ev.HasParent = err == nil
		} else if err == nil {
			err = d.dec.DecodeNil()
		}
	case posStoredTokens:
		ev.TokenIDs, err = d.tokens(b)
	case posStoredBlockSize:
		var v int64
		v, err = d.optInt()
		if err == nil && (v < 0 || v > math.MaxInt32) {
			err = &DecodeError{Reason: ReasonFieldType, Err: fmt.Errorf("block_size %d", v)}
		}
		ev.BlockSize = int(v)
	case posStoredLoRAID:
		var isNil bool
		if isNil, err = d.peekNil(); err == nil && !isNil {
			ev.LoRAID, err = d.int()
			ev.HasLoRAID = err == nil
		} else if err == nil {
			err = d.dec.DecodeNil()
		}
	case posStoredMedium:
		ev.Medium, err = d.optStr(b)
	case posStoredLoRAName:
		ev.LoRAName, err = d.optStr(b)
	}
	if err != nil {
		return decErr(ReasonFieldType, err)
	}
	return nil
}

// mapEvent decodes the map layout ({"type": "BlockStored", ...}). Keys may
// come in any order. Before the tag is known every known field is decoded;
// once it is known (msgspec writes it first) only the fields of that kind
// are, and the others are skipped whatever their shape, so an event type
// this decoder does not know cannot fail the batch by reusing a known name.
func (d *Decoder) mapEvent(b *Batch, ev *Event) error {
	n, err := d.mapLen()
	if err != nil {
		return decErr(ReasonEvent, err)
	}
	var haveHashes, haveTokens, haveTag bool
	for range n {
		key, err := d.str()
		if err != nil {
			return decErr(ReasonEvent, err)
		}
		if string(key) == "type" {
			if ev.Kind, err = d.tag(); err != nil {
				return err
			}
			haveTag = true
			continue
		}
		field := mapField(key)
		if field < 0 || (haveTag && !ev.Kind.hasField(field)) {
			if err := d.skipValue(); err != nil {
				return decErr(ReasonEvent, err)
			}
			continue
		}
		if err := d.eventField(b, ev, field); err != nil {
			return err
		}
		haveHashes = haveHashes || field == posStoredHashes
		haveTokens = haveTokens || field == posStoredTokens
	}
	if !haveTag {
		ev.Kind = KindUnknown
	}
	switch ev.Kind {
	case KindBlockStored:
		if !haveHashes || !haveTokens {
			return &DecodeError{Reason: ReasonEvent, Err: errMissingField}
		}
	case KindBlockRemoved:
		if !haveHashes {
			return &DecodeError{Reason: ReasonEvent, Err: errMissingField}
		}
		*ev = Event{Kind: ev.Kind, BlockHashes: ev.BlockHashes, Medium: ev.Medium}
	case KindAllBlocksCleared, KindUnknown:
		*ev = Event{Kind: ev.Kind}
	}
	return nil
}

// mapField returns the eventField position a map-layout key names, or -1
// for a key this decoder does not read.
func mapField(key []byte) int {
	switch string(key) {
	case "block_hashes":
		return posStoredHashes
	case "parent_block_hash":
		return posStoredParent
	case "token_ids":
		return posStoredTokens
	case "block_size":
		return posStoredBlockSize
	case "lora_id":
		return posStoredLoRAID
	case "medium":
		return posStoredMedium
	case "lora_name":
		return posStoredLoRAName
	}
	return -1
}

// hasField reports whether events of kind k carry the field at eventField
// position field.
func (k EventKind) hasField(field int) bool {
	switch k {
	case KindBlockStored:
		return true
	case KindBlockRemoved:
		return slices.Contains(removedFields[:], field)
	}
	return false
}

// tag reads an event tag. A non-string tag makes an unknown event.
func (d *Decoder) tag() (EventKind, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, decErr(ReasonEvent, err)
	}
	if !isStrCode(c) {
		if err := d.skipValue(); err != nil {
			return 0, decErr(ReasonEvent, err)
		}
		return KindUnknown, nil
	}
	s, err := d.str()
	if err != nil {
		return 0, decErr(ReasonEvent, err)
	}
	switch string(s) {
	case "BlockStored":
		return KindBlockStored, nil
	case "BlockRemoved":
		return KindBlockRemoved, nil
	case "AllBlocksCleared":
		return KindAllBlocksCleared, nil
	}
	return KindUnknown, nil
}

func (d *Decoder) hashes(b *Batch) ([]uint64, error) {
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, errNilArray
	}
	start := len(b.hashes)
	b.hashes = slices.Grow(b.hashes, n)
	for range n {
		// Fast path for integer hashes (the vLLM default).
		if v, _, k := fastInt(d.buf[len(d.buf)-d.r.Len():]); k > 0 {
			if _, err := d.r.Seek(int64(k), io.SeekCurrent); err != nil {
				return nil, err
			}
			b.hashes = append(b.hashes, v)
			continue
		}
		h, err := d.hash()
		if err != nil {
			return nil, err
		}
		b.hashes = append(b.hashes, h)
	}
	return b.hashes[start:len(b.hashes):len(b.hashes)], nil
}

// hash reads one engine block hash: an integer (two's complement when
// negative) or bytes, of which the last 8 are read big-endian.
func (d *Decoder) hash() (uint64, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Nil:
		return 0, errNilHash
	case isIntCode(c):
		// DecodeUint64 reinterprets negative integers as two's complement.
		return d.dec.DecodeUint64()
	case isStrCode(c) || isBinCode(c):
		s, err := d.str()
		if err != nil {
			return 0, err
		}
		if len(s) > 8 {
			s = s[len(s)-8:]
		}
		var v uint64
		for _, x := range s {
			v = v<<8 | uint64(x)
		}
		return v, nil
	}
	return 0, errBadHash
}

func (d *Decoder) tokens(b *Batch) ([]uint32, error) {
	n, err := d.arrayLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, errNilArray
	}
	start := len(b.tokens)
	b.tokens = slices.Grow(b.tokens, n)
	// Fast path: integers are parsed straight from the payload and the
	// reader is advanced once at the end.
	rest := d.buf[len(d.buf)-d.r.Len():]
	off := 0
	for range n {
		v, neg, k := fastInt(rest[off:])
		if k == 0 {
			// Not a complete integer: let msgpack report what it is.
			if _, err := d.r.Seek(int64(off), io.SeekCurrent); err != nil {
				return nil, err
			}
			if _, err := d.int(); err != nil {
				return nil, err
			}
			return nil, errNotInt
		}
		if neg || v > math.MaxUint32 {
			return nil, &DecodeError{Reason: ReasonTokenID, Err: errTokenRange}
		}
		b.tokens = append(b.tokens, uint32(v))
		off += k
	}
	if _, err := d.r.Seek(int64(off), io.SeekCurrent); err != nil {
		return nil, err
	}
	return b.tokens[start:len(b.tokens):len(b.tokens)], nil
}

// int reads an integer; nil and non-integers are errors. A uint64 above
// MaxInt64 comes back negative.
func (d *Decoder) int() (int64, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if !isIntCode(c) {
		return 0, errNotInt
	}
	return d.dec.DecodeInt64()
}

// optInt reads an integer or nil (as 0).
func (d *Decoder) optInt() (int64, error) {
	isNil, err := d.peekNil()
	if err != nil {
		return 0, err
	}
	if isNil {
		return 0, d.dec.DecodeNil()
	}
	return d.int()
}

func (d *Decoder) float() (float64, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return 0, err
	}
	if c != msgpcode.Float && c != msgpcode.Double && !isIntCode(c) {
		return 0, fmt.Errorf("ts: unexpected msgpack code 0x%x", c)
	}
	return d.dec.DecodeFloat64()
}

func (d *Decoder) peekNil() (bool, error) {
	c, err := d.dec.PeekCode()
	return c == msgpcode.Nil, err
}

// str reads a string or bytes value into d.scratch and returns it; the
// result is valid until the next str call.
func (d *Decoder) str() ([]byte, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return nil, err
	}
	if !isStrCode(c) && !isBinCode(c) && c != msgpcode.Nil {
		return nil, errNotString
	}
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return d.scratch[:0], nil
	}
	if n > d.r.Len() {
		return nil, &DecodeError{Reason: ReasonTruncated, Err: errLength}
	}
	if cap(d.scratch) < n {
		d.scratch = make([]byte, n)
	}
	d.scratch = d.scratch[:n]
	if err := d.dec.ReadFull(d.scratch); err != nil {
		return nil, err
	}
	return d.scratch, nil
}

// optStr reads a string, bytes or nil value and copies it into the batch's
// string storage; nil gives a nil slice.
func (d *Decoder) optStr(b *Batch) ([]byte, error) {
	isNil, err := d.peekNil()
	if err != nil {
		return nil, err
	}
	if isNil {
		return nil, d.dec.DecodeNil()
	}
	s, err := d.str()
	if err != nil {
		return nil, err
	}
	start := len(b.strs)
	b.strs = append(b.strs, s...)
	return b.strs[start:len(b.strs):len(b.strs)], nil
}

func (d *Decoder) arrayLen() (int, error) {
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n > d.r.Len() { // every element takes at least one byte
		return 0, &DecodeError{Reason: ReasonTruncated, Err: errLength}
	}
	return n, nil
}

func (d *Decoder) mapLen() (int, error) {
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, errNilArray
	}
	if 2*n > d.r.Len() {
		return 0, &DecodeError{Reason: ReasonTruncated, Err: errLength}
	}
	return n, nil
}

func (d *Decoder) skipN(n int) error {
	for range n {
		if err := d.skipValue(); err != nil {
			return decErr(ReasonEvent, err)
		}
	}
	return nil
}

// skipValue skips one msgpack value without recursion, so a hostile payload
// of deeply nested arrays cannot exhaust the stack (msgpack's own Skip
// recurses once per nesting level). It reads the bytes.Reader directly: the
// msgpack.Decoder over a bytes.Reader keeps no buffer of its own.
func (d *Decoder) skipValue() error {
	r := &d.r
	for pending := 1; pending > 0; pending-- {
		c, err := r.ReadByte()
		if err != nil {
			return err
		}
		var skip, elems int
		switch {
		case c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow:
		case c >= msgpcode.FixedMapLow && c <= msgpcode.FixedMapHigh:
			elems = 2 * int(c&msgpcode.FixedMapMask)
		case c >= msgpcode.FixedArrayLow && c <= msgpcode.FixedArrayHigh:
			elems = int(c & msgpcode.FixedArrayMask)
		case c >= msgpcode.FixedStrLow && c <= msgpcode.FixedStrHigh:
			skip = int(c & msgpcode.FixedStrMask)
		default:
			switch c {
			case msgpcode.Nil, msgpcode.False, msgpcode.True:
			case msgpcode.Uint8, msgpcode.Int8:
				skip = 1
			case msgpcode.Uint16, msgpcode.Int16:
				skip = 2
			case msgpcode.Uint32, msgpcode.Int32, msgpcode.Float:
				skip = 4
			case msgpcode.Uint64, msgpcode.Int64, msgpcode.Double:
				skip = 8
			case msgpcode.FixExt1:
				skip = 2
			case msgpcode.FixExt2:
				skip = 3
			case msgpcode.FixExt4:
				skip = 5
			case msgpcode.FixExt8:
				skip = 9
			case msgpcode.FixExt16:
				skip = 17
			case msgpcode.Str8, msgpcode.Bin8:
				skip, err = readLen(r, 1)
			case msgpcode.Str16, msgpcode.Bin16:
				skip, err = readLen(r, 2)
			case msgpcode.Str32, msgpcode.Bin32:
				skip, err = readLen(r, 4)
			case msgpcode.Ext8:
				skip, err = readLen(r, 1)
				skip++ // type byte
			case msgpcode.Ext16:
				skip, err = readLen(r, 2)
				skip++
			case msgpcode.Ext32:
				skip, err = readLen(r, 4)
				skip++
			case msgpcode.Array16:
				elems, err = readLen(r, 2)
			case msgpcode.Array32:
				elems, err = readLen(r, 4)
			case msgpcode.Map16:
				elems, err = readLen(r, 2)
				elems *= 2
			case msgpcode.Map32:
				elems, err = readLen(r, 4)
				elems *= 2
			default:
				return fmt.Errorf("unknown msgpack code 0x%x", c)
			}
			if err != nil {
				return err
			}
		}
		if skip > r.Len() || elems > r.Len() {
			return io.ErrUnexpectedEOF
		}
		if skip > 0 {
			if _, err := r.Seek(int64(skip), io.SeekCurrent); err != nil {
				return err
			}
		}
		pending += elems
	}
	return nil
}

func readLen(r *bytes.Reader, size int) (int, error) {
	var buf [4]byte
	if _, err := io.ReadFull(r, buf[:size]); err != nil {
		return 0, io.ErrUnexpectedEOF
	}
	switch size {
	case 1:
		return int(buf[0]), nil
	case 2:
		return int(binary.BigEndian.Uint16(buf[:2])), nil
	}
	return int(binary.BigEndian.Uint32(buf[:4])), nil
}

// fastInt decodes the msgpack integer at the start of b. v is the value's
// 64-bit two's complement and neg says it is negative; k is the number of
// bytes used, 0 when b does not start with a complete integer.
func fastInt(b []byte) (v uint64, neg bool, k int) {
	if len(b) == 0 {
		return 0, false, 0
	}
	c := b[0]
	switch {
	case c <= 0x7f:
		return uint64(c), false, 1
	case c >= 0xe0:
		return uint64(int64(int8(c))), true, 1
	}
	var size int
	switch c {
	case 0xcc, 0xd0:
		size = 1
	case 0xcd, 0xd1:
		size = 2
	case 0xce, 0xd2:
		size = 4
	case 0xcf, 0xd3:
		size = 8
	default:
		return 0, false, 0
	}
	if len(b) < 1+size {
		return 0, false, 0
	}
	p := b[1 : 1+size]
	switch c {
	case 0xcc:
		v = uint64(p[0])
	case 0xcd:
		v = uint64(binary.BigEndian.Uint16(p))
	case 0xce:
		v = uint64(binary.BigEndian.Uint32(p))
	case 0xcf:
		v = binary.BigEndian.Uint64(p)
	case 0xd0:
		x := int64(int8(p[0]))
		v, neg = uint64(x), x < 0
	case 0xd1:
		x := int64(int16(binary.BigEndian.Uint16(p)))
		v, neg = uint64(x), x < 0
	case 0xd2:
		x := int64(int32(binary.BigEndian.Uint32(p)))
		v, neg = uint64(x), x < 0
	case 0xd3:
		x := int64(binary.BigEndian.Uint64(p))
		v, neg = uint64(x), x < 0
	}
	return v, neg, 1 + size
}

func isArrayCode(c byte) bool {
	return (c >= msgpcode.FixedArrayLow && c <= msgpcode.FixedArrayHigh) ||
		c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMapCode(c byte) bool {
	return (c >= msgpcode.FixedMapLow && c <= msgpcode.FixedMapHigh) ||
		c == msgpcode.Map16 || c == msgpcode.Map32
}

func isStrCode(c byte) bool {
	return (c >= msgpcode.FixedStrLow && c <= msgpcode.FixedStrHigh) ||
		c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32
}

func isBinCode(c byte) bool {
	return c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32
}

func isIntCode(c byte) bool {
	if c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow {
		return true
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64,
		msgpcode.Int8, msgpcode.Int16, msgpcode.Int32, msgpcode.Int64:
		return true
	}
	return false
}
