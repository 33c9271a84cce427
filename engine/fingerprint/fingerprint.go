// Package fingerprint turns token ids into the block-hash chain that
// LookupRoute matches against the index.
//
// The scheme is fixed by the wire contract so that gateways, engine-event
// subscribers and the server all agree on a block's key without talking to
// each other:
//
//   - XXH3-64 with seed 1337 everywhere.
//   - content[i] = XXH3(le_u32(token) for every token of block i).
//   - prefix[0] = content[0]; with a parent prefix P (a suffix event),
//     prefix[0] = XXH3(le_u64(P) ++ le_u64(content[0])).
//   - prefix[i] = XXH3(le_u64(prefix[i-1]) ++ le_u64(content[i])) for i > 0.
//   - A trailing partial block is dropped.
//   - On the wire each prefix hash is 8 bytes, big-endian.
//
// Every function here is safe for concurrent use and allocation-free when
// the caller supplies destination slices with enough capacity.
package fingerprint

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// Seed is the XXH3-64 seed of the wire contract.
const Seed = 1337

// DefaultBlockSize is the engine block size, in tokens, that the server
// assumes when it fingerprints token ids itself (--engine-block-size).
const DefaultBlockSize = 16

// WireSize is the length of a prefix hash on the wire.
const WireSize = 8

// maxStackBlock is the largest block size hashed from a stack buffer; larger
// blocks are hashed in stackBlock-sized pieces through the streaming hasher.
const maxStackBlock = 64

// Content returns the content hash of one block of token ids.
func Content(tokens []uint32) uint64 {
	if len(tokens) <= maxStackBlock {
		var buf [maxStackBlock * 4]byte
		n := 0
		for _, t := range tokens {
			binary.LittleEndian.PutUint32(buf[n:], t)
			n += 4
		}
		return xxh3.HashSeed(buf[:n], Seed)
	}
	return contentLarge(tokens)
}

// contentLarge hashes blocks larger than maxStackBlock. It allocates a
// streaming hasher; such block sizes are unusual (engines use 16 to 64).
func contentLarge(tokens []uint32) uint64 {
	h := xxh3.NewSeed(Seed)
	var buf [maxStackBlock * 4]byte
	for len(tokens) > 0 {
		n := min(len(tokens), maxStackBlock)
		for i, t := range tokens[:n] {
			binary.LittleEndian.PutUint32(buf[i*4:], t)
		}
		_, _ = h.Write(buf[:n*4])
		tokens = tokens[n:]
	}
	return h.Sum64()
}

// Link chains a content hash onto the previous prefix hash.
func Link(prev, content uint64) uint64 {
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[0:], prev)
	binary.LittleEndian.PutUint64(buf[8:], content)
	return xxh3.HashSeed(buf[:], Seed)
}

// Blocks reports how many full blocks n tokens make at blockSize.
// A non-positive blockSize makes no blocks.
func Blocks(n, blockSize int) int {
	if blockSize <= 0 || n <= 0 {
		return 0
	}
	return n / blockSize
}

// AppendChain appends the prefix hash of every full block of tokens to dst
// and returns the extended slice. With hasParent, block 0 is chained from
// parent. A trailing partial block is dropped.
func AppendChain(dst []uint64, tokens []uint32, blockSize int, parent uint64, hasParent bool) []uint64 {
	n := Blocks(len(tokens), blockSize)
	prev, chained := parent, hasParent
	for i := 0; i < n; i++ {
		c := Content(tokens[i*blockSize : (i+1)*blockSize])
		if chained {
			c = Link(prev, c)
		}
		dst = append(dst, c)
		prev, chained = c, true
	}
	return dst
}

// PutWire writes h in its 8-byte big-endian wire form into b, which must be
// at least WireSize long.
func PutWire(b []byte, h uint64) { binary.BigEndian.PutUint64(b, h) }

// AppendWire appends the wire form of h to dst.
func AppendWire(dst []byte, h uint64) []byte { return binary.BigEndian.AppendUint64(dst, h) }

// FromWire decodes an 8-byte big-endian wire hash. It reports false when b
// is not exactly WireSize bytes long.
func FromWire(b []byte) (uint64, bool) {
	if len(b) != WireSize {
		return 0, false
	}
	return binary.BigEndian.Uint64(b), true
}
