package rpc

import (
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	// Registers the "proto" CodecV2 that Codec falls back to.
	_ "google.golang.org/grpc/encoding/proto"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Codec is the server's gRPC codec (grpc.ForceServerCodecV2, see
// ServerOptions). It is the "proto" codec with fast paths for the hot
// messages, which the service's own handlers hand it:
//
//   - a LookupRoute call (*lookupCall): the request is decoded into the
//     call's reused memory (block hashes and the prefix hash alias one
//     reused copy of the message; counts and token ids go to reused
//     slices), and the response is marshaled into a buffer of grpc's pool,
//     after which the whole call goes back to its pool;
//   - a ReportCacheState update (*updateMsg): the same, into the stream's
//     one message.
//
// Ids are interned (see internTable), so a string that outlives the call
// (a replica name the index keeps, a metric label) never aliases reused
// memory. Anything the fast paths do not cover exactly — an unknown field,
// a known field with an unexpected wire type, a repeated singular message,
// invalid UTF-8 in a string, a malformed message — is decoded by
// proto.Unmarshal instead, so every message decodes to what proto would
// give (FuzzCodecDifferential). Every other message type goes to the proto
// codec unchanged.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// protoCodec is grpc's own proto codec, the fallback.
var protoCodec = encoding.GetCodecV2("proto")

// Name is "proto": clients keep using the standard content subtype.
func (Codec) Name() string { return "proto" }

// Marshal marshals v. A pooled LookupRoute response is released to its pool
// once its bytes are written (grpc sends them later; they are in the buffer,
// which does not alias the call).
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*lookupReply)
	if !ok {
		return protoCodec.Marshal(v)
	}
	out := marshalLookupResponse(&r.LookupRouteResponse)
	putLookupCall(r.call)
	return out, nil
}

// Unmarshal decodes data into v.
//
// A request that does not decode is the client's error, InvalidArgument,
// but grpc-go answers Internal for any error a codec returns, and sends
// that status itself before the handler runs (serverStream.RecvMsg writes
// it). So for the messages the service's own handlers receive into (a
// pooled call or update, or the decodeTarget the other handlers wrap their
// request in) Unmarshal does not return the error: it records it in the
// message and reports success, and the handler answers InvalidArgument
// (decodeError). Every other message gets the proto codec's error.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *lookupCall:
		m.decodeErr = nil
		m.buf = materialize(m.buf[:0], data)
		if m.decode() {
			return nil
		}
		m.decodeErr = proto.Unmarshal(m.buf, &m.LookupRouteRequest)
		return nil
	case *updateMsg:
		m.decodeErr = nil
		m.buf = materialize(m.buf[:0], data)
		if m.decode() {
			return nil
		}
		m.decodeErr = proto.Unmarshal(m.buf, &m.CacheStateUpdate)
		return nil
	case *decodeTarget:
		m.err = protoCodec.Unmarshal(data, m.Message)
		return nil
	}
	return protoCodec.Unmarshal(data, v)
}

// decodeTarget is a request message handed to the codec by a handler that
// answers an undecodable request itself (decodeError). It is a proto message
// itself, through the embedded one, so under the standard proto codec it
// decodes the same (and err stays nil: that codec's errors are grpc-go's
// Internal).
type decodeTarget struct {
	proto.Message
	// err is the decode error Codec.Unmarshal recorded; written by the
	// codec, read by the handler's goroutine after the receive returns.
	err error
}

// decodeError returns the InvalidArgument status of a request the codec
// could not decode, recv being what the handler received into, or nil when
// it decoded. A handler calls it after every successful receive into one of
// the types Codec.Unmarshal records errors in.
func decodeError(recv any) error {
	var (
		err  error
		name string
	)
	switch m := recv.(type) {
	case *lookupCall:
		err, name = m.decodeErr, "LookupRouteRequest"
	case *updateMsg:
		err, name = m.decodeErr, "CacheStateUpdate"
	case *decodeTarget:
		err, name = m.err, string(m.ProtoReflect().Descriptor().Name())
	}
	if err == nil {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "cannot decode the %s: %v", name, err)
}

// materialize appends the bytes of data to dst.
func materialize(dst []byte, data mem.BufferSlice) []byte {
	for _, b := range data {
		dst = append(dst, b.ReadOnlyData()...)
	}
	return dst
}

// maxRetainedMsg bounds, in bytes, the copy of a message a pooled call or a
// stream keeps between messages (a rare 4 MiB report must not stay pinned).
const maxRetainedMsg = 256 << 10

// lookupCall is one LookupRoute call's memory, pooled: the request (decoded
// into reused buffers; *lookupCall is itself a proto.Message through the
// embedded request, so the proto fallback decodes into it), the response,
// and the storage both alias. It is taken by the handler and released by
// Codec.Marshal after the response is written (or dropped to the GC if the
// call ends otherwise).
type lookupCall struct {
	pb.LookupRouteRequest
	reply lookupReply

	buf    []byte   // the message's bytes; hashes alias it
	hashes [][]byte // block_hashes
	counts []int32  // block_token_counts
	toks   []uint32 // token_ids
	slo    pb.SLO
	// decodeErr is set by Codec.Unmarshal when the message does not
	// decode (decodeError); reset by the next Unmarshal and by the pool.
	decodeErr error
}

// lookupReply is a pooled LookupRoute response; *lookupReply is a
// proto.Message through the embedded response.
type lookupReply struct {
	pb.LookupRouteResponse
	call   *lookupCall
	scores scoreBuf
}

var lookupCalls = sync.Pool{New: func() any {
	c := new(lookupCall)
	c.reply.call = c
	return c
}}

func getLookupCall() *lookupCall { return lookupCalls.Get().(*lookupCall) }

// putLookupCall drops c's references to other memory and pools it, unless
// a buffer grew beyond what a pooled call may keep.
func putLookupCall(c *lookupCall) {
	c.decodeErr = nil
	c.LookupRouteRequest.Reset()
	c.reply.LookupRouteResponse.Reset()
	if cap(c.buf) > maxRetainedMsg || oversized(c.hashes) || oversized(c.counts) || oversized(c.toks) ||
		oversized(c.reply.scores.ptrs) || oversized(c.reply.scores.vals) {
		return
	}
	clear(c.reply.scores.vals[:cap(c.reply.scores.vals)]) // replica names
	lookupCalls.Put(c)
}

// decode is the fast path of a LookupRouteRequest; false means "use
// proto.Unmarshal" (the request may then hold partial fields).
func (c *lookupCall) decode() bool {
	m := &c.LookupRouteRequest
	m.Reset()
	hashes, counts, toks := c.hashes[:0], c.counts[:0], c.toks[:0]
	b := c.buf
	for len(b) > 0 {
		// Most of a chain request is its block hashes: one-byte tags of
		// field 7 (wire type 2) with one-byte lengths. Take those without
		// the general tag and varint decoding.
		if len(b) >= 2 && b[0] == blockHashTag && b[1] < 0x80 {
			end := 2 + int(b[1])
			if end > len(b) {
				return false
			}
			hashes = append(hashes, b[2:end:end])
			b = b[end:]
			continue
		}
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var ok bool
		switch {
		case typ == protowire.BytesType && (num == 1 || num == 2 || num == 5 || num == 11):
			var v []byte
			if v, b, ok = field(b); !ok {
				return false
			}
			s, ok := ids.intern(v)
			if !ok {
				return false
			}
			switch num {
			case 1:
				m.ModelId = s
			case 2:
				m.TenantId = s
			case 5:
				m.HashScheme = s
			default:
				m.AdapterId = s
			}
		case typ == protowire.BytesType && num == 3:
			var v []byte
			if v, b, ok = field(b); !ok {
				return false
			}
			m.PrefixHash = v
		case typ == protowire.VarintType && num == 4:
			var x uint64
			if x, b, ok = varint(b); !ok {
				return false
			}
			m.PrefixTokenCount = int32(x)
		case typ == protowire.BytesType && num == 6:
			if m.Slo != nil {
				return false // a repeated message merges: proto's job
			}
			var v []byte
			if v, b, ok = field(b); !ok || !decodeSLO(&c.slo, v) {
				return false
			}
			m.Slo = &c.slo
		case typ == protowire.BytesType && num == 7:
			var v []byte
			if v, b, ok = field(b); !ok {
				return false
			}
			hashes = append(hashes, v)
		case num == 8:
			if counts, b, ok = appendInt32s(counts, typ, b); !ok {
				return false
			}
		case num == 9:
			if toks, b, ok = appendUint32s(toks, typ, b); !ok {
				return false
			}
		case typ == protowire.BytesType && num == 10:
			var v []byte
			if v, b, ok = field(b); !ok || !utf8.Valid(v) {
				return false
			}
			m.PromptText = string(v) // rare, possibly large: not interned
		case typ == protowire.VarintType && num == 12:
			var x uint64
			if x, b, ok = varint(b); !ok {
				return false
			}
			m.FollowsAnswer = x != 0
		default:
			return false
		}
	}
	c.hashes, c.counts, c.toks = hashes, counts, toks
	if len(hashes) > 0 {
		m.BlockHashes = hashes
	}
	if len(counts) > 0 {
		m.BlockTokenCounts = counts
	}
	if len(toks) > 0 {
		m.TokenIds = toks
	}
	return true
}

// blockHashTag is the one-byte tag of LookupRouteRequest.block_hashes
// (field 7, length-delimited).
const blockHashTag = 7<<3 | byte(protowire.BytesType)

// decodeSLO decodes an SLO message into s (reset first); false means an
// unknown field or a malformed message.
func decodeSLO(s *pb.SLO, b []byte) bool {
	s.Reset()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.VarintType || (num != 1 && num != 2) {
			return false
		}
		b = b[n:]
		x, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		if num == 1 {
			s.TtftMs = int32(x)
		} else {
			s.TbtMs = int32(x)
		}
	}
	return true
}

// field consumes a length-delimited value; v keeps its capacity at its
// length, so an append to it can never write into the next field.
func field(b []byte) (v, rest []byte, ok bool) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return nil, nil, false
	}
	return v[:len(v):len(v)], b[n:], true
}

func varint(b []byte) (uint64, []byte, bool) {
	x, n := protowire.ConsumeVarint(b)
	if n < 0 {
		return 0, nil, false
	}
	return x, b[n:], true
}

// appendInt32s appends one occurrence of a repeated int32 field, packed or
// not, as proto does (int32 of the varint).
func appendInt32s(dst []int32, typ protowire.Type, b []byte) ([]int32, []byte, bool) {
	switch typ {
	case protowire.VarintType:
		x, rest, ok := varint(b)
		return append(dst, int32(x)), rest, ok
	case protowire.BytesType:
		v, rest, ok := field(b)
		if !ok {
			return dst, nil, false
		}
		// At most one value per byte: grow once, then store in place.
		i := len(dst)
		dst = slices.Grow(dst, len(v))[:i+len(v)]
		for len(v) > 0 {
			if v[0] < 0x80 { // a one-byte varint: counts below 128
				dst[i], v = int32(v[0]), v[1:]
				i++
				continue
			}
			x, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return dst[:i], nil, false
			}
			dst[i], v = int32(x), v[n:]
			i++
		}
		return dst[:i], rest, true
	}
	return dst, nil, false
}

// appendUint32s is appendInt32s for uint32.
func appendUint32s(dst []uint32, typ protowire.Type, b []byte) ([]uint32, []byte, bool) {
	switch typ {
	case protowire.VarintType:
		x, rest, ok := varint(b)
		return append(dst, uint32(x)), rest, ok
	case protowire.BytesType:
		v, rest, ok := field(b)
		if !ok {
			return dst, nil, false
		}
		for len(v) > 0 {
			x, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return dst, nil, false
			}
			dst, v = append(dst, uint32(x)), v[n:]
		}
		return dst, rest, true
	}
	return dst, nil, false
}

// updateMsg is a ReportCacheState stream's one message, decoded into reused
// memory: prefix entries, their hashes (aliasing one reused copy of the
// message) and counts, and the stats with their optional fields. The index
// copies what it keeps, and ids are interned, so nothing outlives the next
// receive.
type updateMsg struct {
	pb.CacheStateUpdate
	// decodeErr is set by Codec.Unmarshal when the message does not
	// decode (decodeError); reset by the next Unmarshal.
	decodeErr error

	buf     []byte
	entries []pb.PrefixEntry
	ptrs    []*pb.PrefixEntry
	hashes  [][]byte
	counts  []int32
	stats   pb.ReplicaStats
	waiting int32
	running int32
	queued  int64
}

// decode is the fast path of a CacheStateUpdate; false means "use
// proto.Unmarshal".
func (u *updateMsg) decode() bool {
	m := &u.CacheStateUpdate
	m.Reset()
	ne := 0
	hashes, counts := u.hashes[:0], u.counts[:0]
	b := u.buf
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var ok bool
		switch {
		case typ == protowire.BytesType && (num == 1 || num == 2 || num == 3 || num == 4 || num == 8 || num == 10 || num == 11 || num == 12):
			var v []byte
			if v, b, ok = field(b); !ok {
				return false
			}
			s, ok := ids.intern(v)
			if !ok {
				return false
			}
			switch num {
			case 1:
				m.ReplicaId = s
			case 2:
				m.ModelId = s
			case 3:
				m.TenantId = s
			case 4:
				m.HashScheme = s
			case 10:
				m.PdPool = s
			case 11:
				m.NodeName = s
			case 12:
				m.Zone = s
			default:
				m.AdapterId = s
			}
		case typ == protowire.VarintType && num == 5:
			var x uint64
			if x, b, ok = varint(b); !ok {
				return false
			}
			m.TimestampUs = int64(x)
		case typ == protowire.VarintType && num == 9:
			var x uint64
			if x, b, ok = varint(b); !ok {
				return false
			}
			m.Role = pb.ReplicaRole(int32(x)) // as proto: an open enum, truncated
		case typ == protowire.BytesType && num == 6:
			var v []byte
			if v, b, ok = field(b); !ok {
				return false
			}
			if ne == len(u.entries) {
				u.entries = append(u.entries, pb.PrefixEntry{})
				u.entries = u.entries[:cap(u.entries)]
				u.ptrs = u.ptrs[:0] // re-pointed below
			}
			e := &u.entries[ne]
			ne++
			if hashes, counts, ok = decodePrefixEntry(e, v, hashes, counts); !ok {
				return false
			}
		case typ == protowire.BytesType && num == 7:
			if m.Stats != nil {
				return false // a repeated message merges: proto's job
			}
			var v []byte
			if v, b, ok = field(b); !ok || !u.decodeStats(v) {
				return false
			}
			m.Stats = &u.stats
		default:
			return false
		}
	}
	u.hashes, u.counts = hashes, counts
	if ne > 0 {
		if len(u.ptrs) != len(u.entries) {
			u.ptrs = u.ptrs[:0]
			for i := range u.entries {
				u.ptrs = append(u.ptrs, &u.entries[i])
			}
		}
		m.Prefixes = u.ptrs[:ne:ne]
	}
	return true
}

// decodePrefixEntry decodes one PrefixEntry into e (reset first), appending
// its hashes and counts to the stream's shared slices; e's slices are
// full-capacity windows of them.
func decodePrefixEntry(e *pb.PrefixEntry, b []byte, hashes [][]byte, counts []int32) ([][]byte, []int32, bool) {
	e.Reset()
	h0, c0 := len(hashes), len(counts)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return hashes, counts, false
		}
		b = b[n:]
		var ok bool
		switch {
		case typ == protowire.BytesType && num == 1:
			if e.PrefixHash, b, ok = field(b); !ok {
				return hashes, counts, false
			}
		case typ == protowire.VarintType && num == 2:
			var x uint64
			if x, b, ok = varint(b); !ok {
				return hashes, counts, false
			}
			e.TokenCount = int32(x)
		case typ == protowire.BytesType && num == 3:
			var v []byte
			if v, b, ok = field(b); !ok {
				return hashes, counts, false
			}
			hashes = append(hashes, v)
		case num == 4:
			if counts, b, ok = appendInt32s(counts, typ, b); !ok {
				return hashes, counts, false
			}
		case typ == protowire.VarintType && num == 5:
			var x uint64
			if x, b, ok = varint(b); !ok {
				return hashes, counts, false
			}
			e.Tier = pb.CacheTier(int32(x))
		case typ == protowire.BytesType && num == 6:
			var v []byte
			if v, b, ok = field(b); !ok {
				return hashes, counts, false
			}
			s, ok := ids.intern(v)
			if !ok {
				return hashes, counts, false
			}
			e.AdapterId = s
		default:
			return hashes, counts, false
		}
	}
	if len(hashes) > h0 {
		e.BlockHashes = hashes[h0:len(hashes):len(hashes)]
	}
	if len(counts) > c0 {
		e.BlockTokenCounts = counts[c0:len(counts):len(counts)]
	}
	return hashes, counts, true
}

// decodeStats decodes ReplicaStats into u.stats (reset first).
func (u *updateMsg) decodeStats(b []byte) bool {
	s := &u.stats
	s.Reset()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var ok bool
		switch {
		case typ == protowire.BytesType && (num == 1 || num == 5):
			var v []byte
			if v, b, ok = field(b); !ok {
				return false
			}
			str, ok := ids.intern(v)
			if !ok {
				return false
			}
			if num == 1 {
				s.ReplicaId = str
			} else {
				s.ClientVersion = str
			}
		case typ == protowire.Fixed32Type && (num == 3 || num == 4):
			x, n := protowire.ConsumeFixed32(b)
			if n < 0 {
				return false
			}
			b = b[n:]
			if num == 3 {
				s.HitRate = math.Float32frombits(x)
			} else {
				s.Pressure = math.Float32frombits(x)
			}
		case typ == protowire.VarintType && num >= 2 && num <= 10 && num != 3 && num != 4 && num != 5:
			var x uint64
			if x, b, ok = varint(b); !ok {
				return false
			}
			switch num {
			case 2:
				s.CacheMemoryBytes = int64(x)
			case 6:
				s.T2HitTokens = int64(x)
			case 7:
				s.T2QueryTokens = int64(x)
			case 8:
				u.waiting = int32(x)
				s.WaitingRequests = &u.waiting
			case 9:
				u.running = int32(x)
				s.RunningRequests = &u.running
			default:
				u.queued = int64(x)
				s.QueuedPrefillTokens = &u.queued
			}
		default:
			return false
		}
	}
	return true
}

// poolingThreshold is the largest capacity grpc's mem.NewBuffer does not pool.
const poolingThreshold = 1 << 10

// marshalLookupResponse writes m as proto.Marshal would (field order, no
// zero scalars, packed token ids, unknown fields last) into one buffer of grpc's pool. The only
// allocation is the one-element BufferSlice grpc frees the buffer through.
func marshalLookupResponse(m *pb.LookupRouteResponse) mem.BufferSlice {
	size := lookupResponseSize(m)
	pool := mem.DefaultBufferPool()
	// grpc returns a buffer to the pool only above poolingThreshold bytes
	// (mem.NewBuffer); a smaller one would be garbage after every call.
	bp := pool.Get(max(size, poolingThreshold+1))
	b := (*bp)[:0]
	for _, sc := range m.ReplicaScores {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(replicaScoreSize(sc)))
		b = appendReplicaScore(b, sc)
	}
	if m.ReasonCode != "" {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, m.ReasonCode)
	}
	if m.LookupLatencyUs != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(m.LookupLatencyUs))
	}
	if len(m.TokenIds) > 0 {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(packedUint32Size(m.TokenIds)))
		for _, t := range m.TokenIds {
			b = protowire.AppendVarint(b, uint64(t))
		}
	}
	if m.AdapterId != "" {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendString(b, m.AdapterId)
	}
	b = append(b, m.ProtoReflect().GetUnknown()...)
	*bp = b
	return mem.BufferSlice{mem.NewBuffer(bp, pool)}
}

func lookupResponseSize(m *pb.LookupRouteResponse) int {
	n := 0
	for _, sc := range m.ReplicaScores {
		k := replicaScoreSize(sc)
		n += 1 + protowire.SizeVarint(uint64(k)) + k
	}
	if m.ReasonCode != "" {
		n += 1 + protowire.SizeBytes(len(m.ReasonCode))
	}
	if m.LookupLatencyUs != 0 {
		n += 1 + protowire.SizeVarint(uint64(m.LookupLatencyUs))
	}
	if len(m.TokenIds) > 0 {
		n += 1 + protowire.SizeBytes(packedUint32Size(m.TokenIds))
	}
	if m.AdapterId != "" {
		n += 1 + protowire.SizeBytes(len(m.AdapterId))
	}
	return n + len(m.ProtoReflect().GetUnknown())
}

func packedUint32Size(v []uint32) int {
	n := 0
	for _, t := range v {
		n += protowire.SizeVarint(uint64(t))
	}
	return n
}

// replicaScoreSize is the encoded size of sc. Floats are written when their
// bits are not zero (so -0 is written), as proto3 does.
func replicaScoreSize(sc *pb.ReplicaScore) int {
	n := 0
	if sc.ReplicaId != "" {
		n += 1 + protowire.SizeBytes(len(sc.ReplicaId))
	}
	if math.Float32bits(sc.Score) != 0 {
		n += 5
	}
	if sc.MatchedTokens != 0 {
		n += 1 + protowire.SizeVarint(uint64(int64(sc.MatchedTokens)))
	}
	if math.Float32bits(sc.EstimatedCacheHitProb) != 0 {
		n += 5
	}
	if sc.Tier != 0 {
		n += 1 + protowire.SizeVarint(uint64(int64(sc.Tier)))
	}
	return n + len(sc.ProtoReflect().GetUnknown())
}

func appendReplicaScore(b []byte, sc *pb.ReplicaScore) []byte {
	if sc.ReplicaId != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, sc.ReplicaId)
	}
	if x := math.Float32bits(sc.Score); x != 0 {
		b = protowire.AppendTag(b, 2, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, x)
	}
	if sc.MatchedTokens != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(sc.MatchedTokens)))
	}
	if x := math.Float32bits(sc.EstimatedCacheHitProb); x != 0 {
		b = protowire.AppendTag(b, 4, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, x)
	}
	if sc.Tier != 0 {
		b = protowire.AppendTag(b, 5, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(sc.Tier)))
	}
	return append(b, sc.ProtoReflect().GetUnknown()...)
}

// internTable maps id bytes to a shared string without allocating when the
// id was seen recently: a fixed cache of strings in two-slot sets, each slot
// an atomic pointer (a reader loads it and compares; a miss stores a new
// string). A new id goes into its set's first slot and moves the previous
// first to the second, so two ids that share a set (about one pair in 2,048
// under a random seed, and then for the life of the process) both stay
// interned; only three hot ids in one set cost allocations. Only valid UTF-8
// is interned (proto3 strings must be), and ids longer than maxInterned are
// copied.
type internTable struct {
	seed  maphash.Seed
	slots [internSets][2]atomic.Pointer[string]
}

const (
	internSets  = 2048
	maxInterned = 256
)

// ids interns every id the codec decodes.
var ids = &internTable{seed: maphash.MakeSeed()}

// intern returns b as a string; ok is false when b is not valid UTF-8.
func (t *internTable) intern(b []byte) (string, bool) {
	if len(b) == 0 {
		return "", true
	}
	if len(b) > maxInterned {
		if !utf8.Valid(b) {
			return "", false
		}
		return string(b), true
	}
	set := &t.slots[maphash.Bytes(t.seed, b)&(internSets-1)]
	first := set[0].Load()
	if first != nil && *first == string(b) {
		return *first, true
	}
	if p := set[1].Load(); p != nil && *p == string(b) {
		return *p, true
	}
	if !utf8.Valid(b) {
		return "", false
	}
	// A fresh variable: a named result whose address escapes would be moved
	// to the heap on every call, hits included.
	s := string(b)
	// Racing misses may lose a demotion or store twice; a slot only ever
	// holds some valid id, and every hit is checked by comparison.
	set[1].Store(first)
	set[0].Store(&s)
	return s, true
}
