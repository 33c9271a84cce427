package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The state file (--state-file) keeps what a restarted subscriber needs to
// continue where the previous one stopped: the positional index and the
// engine sequence it reflects. Layout, little-endian, version 1:
//
//	magic        8 bytes  "ICKVSTAT"
//	version      u16      1
//	flags        u16      bit 0: started (Next is meaningful)
//	next         u64      first engine sequence number not applied
//	lastSum      u32      CRC-32C of the payload of batch next-1
//	historyFrom  u64      first sequence of the history the index was built from
//	savedAt      i64      µs since the epoch
//	blockSize    u32      --block-size
//	identity     4 × (u16 length, bytes): replica, tenant, model, hash scheme
//	adapters     u32 count, then count × (u16 length, bytes)
//	entries      u32 count, then count × 25 bytes, most recently used first:
//	             engine hash u64, key u64, tokens u32, media u8, adapter index u32
//	checksum     u32      CRC-32C of everything before it
//
// Every length is checked against the bytes left before anything is
// allocated, and the checksum is checked before anything is parsed.
const (
	stateMagic      = "ICKVSTAT"
	stateVersion    = 1
	stateHeaderLen  = 8 + 2 + 2 + 8 + 4 + 8 + 8 + 4
	stateEntryLen   = 8 + 8 + 4 + 1 + 4
	maxStateString  = 4096 // identity strings and adapter names
	maxStateNames   = 1 << 16
	stateFlagStart  = 1 << 0
	stateFlagsKnown = stateFlagStart
)

// MaxStateFileBytes bounds a state file: DefaultMaxIndexBlocks entries and a
// full adapter table fit with room to spare (~27 MiB + 16 MiB).
const MaxStateFileBytes = 64 << 20

// ErrStateInvalid is wrapped by every error of DecodeState: the file is
// truncated, corrupt, of another version or over a bound.
var ErrStateInvalid = errors.New("kvevents: invalid state file")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// payloadSum is the checksum the subscriber keeps of the last batch it
// applied, to recognize the same batch in a replay (CRC-32C).
func payloadSum(p []byte) uint32 { return crc32.Checksum(p, castagnoli) }

// StateEntry is one positional-index entry in a state file.
type StateEntry struct {
	Engine  uint64 // engine block hash
	Key     uint64 // our fingerprint key
	Tokens  int32  // cumulative tokens up to and including the block
	Media   uint8  // mediaGPU | mediaOther
	Adapter string // LoRA partition, "" = default
}

// State is the content of a state file.
type State struct {
	// Identity: a file whose identity differs from the subscriber's flags
	// is someone else's and is ignored.
	ReplicaID, TenantID, ModelID, HashScheme string
	BlockSize                                int

	// Started is false when no sequence-numbered batch was applied yet;
	// then Next, LastSum and HistoryFrom mean nothing.
	Started bool
	// Next is the first engine sequence number the index does not reflect.
	Next uint64
	// LastSum is payloadSum of batch Next-1: a replay that returns another
	// payload under that number comes from a restarted engine.
	LastSum uint32
	// HistoryFrom is the first sequence number of the contiguous history
	// the index was built from (0: the engine's whole life).
	HistoryFrom uint64
	SavedAt     time.Time

	// Entries, most recently used first.
	Entries []StateEntry
}

// AppendBinary appends the encoded state to b.
func (s *State) AppendBinary(b []byte) ([]byte, error) {
	for _, v := range []string{s.ReplicaID, s.TenantID, s.ModelID, s.HashScheme} {
		if len(v) > maxStateString {
			return b, fmt.Errorf("cannot encode the state: identity string of %d bytes (max %d)", len(v), maxStateString)
		}
	}
	if s.BlockSize < 0 || s.BlockSize > math.MaxUint32 {
		return b, fmt.Errorf("cannot encode the state: block size %d", s.BlockSize)
	}
	adapters := map[string]uint32{}
	var names []string
	for i := range s.Entries {
		a := s.Entries[i].Adapter
		if _, ok := adapters[a]; !ok {
			if len(a) > maxStateString {
				return b, fmt.Errorf("cannot encode the state: adapter name of %d bytes (max %d)", len(a), maxStateString)
			}
			adapters[a] = uint32(len(names))
			names = append(names, a)
		}
	}
	if len(names) > maxStateNames {
		return b, fmt.Errorf("cannot encode the state: %d adapter names (max %d)", len(names), maxStateNames)
	}
	start := len(b)
	b = append(b, stateMagic...)
	b = binary.LittleEndian.AppendUint16(b, stateVersion)
	var flags uint16
	if s.Started {
		flags |= stateFlagStart
	}
	b = binary.LittleEndian.AppendUint16(b, flags)
	b = binary.LittleEndian.AppendUint64(b, s.Next)
	b = binary.LittleEndian.AppendUint32(b, s.LastSum)
	b = binary.LittleEndian.AppendUint64(b, s.HistoryFrom)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.SavedAt.UnixMicro()))
	b = binary.LittleEndian.AppendUint32(b, uint32(s.BlockSize))
	for _, v := range []string{s.ReplicaID, s.TenantID, s.ModelID, s.HashScheme} {
		b = appendStateString(b, v)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(names)))
	for _, n := range names {
		b = appendStateString(b, n)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.Entries)))
	for i := range s.Entries {
		e := &s.Entries[i]
		b = binary.LittleEndian.AppendUint64(b, e.Engine)
		b = binary.LittleEndian.AppendUint64(b, e.Key)
		b = binary.LittleEndian.AppendUint32(b, uint32(e.Tokens))
		b = append(b, e.Media)
		b = binary.LittleEndian.AppendUint32(b, adapters[e.Adapter])
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli)), nil
}

func appendStateString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// stateReader reads the fields of a state file; the first failure sticks.
type stateReader struct {
	b   []byte
	err error
}

func (r *stateReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format, append([]any{ErrStateInvalid}, args...)...)
	}
}

func (r *stateReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.fail("truncated (%d bytes wanted, %d left)", n, len(r.b))
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

func (r *stateReader) u8() uint8 {
	if p := r.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (r *stateReader) u16() uint16 {
	if p := r.take(2); p != nil {
		return binary.LittleEndian.Uint16(p)
	}
	return 0
}

func (r *stateReader) u32() uint32 {
	if p := r.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (r *stateReader) u64() uint64 {
	if p := r.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (r *stateReader) str(what string) string {
	n := int(r.u16())
	if n > maxStateString {
		r.fail("%s of %d bytes (max %d)", what, n, maxStateString)
		return ""
	}
	return string(r.take(n))
}

// DecodeState decodes a state file's bytes. It never panics; any problem is
// an error wrapping ErrStateInvalid. maxEntries bounds the entries accepted
// (0 means DefaultMaxIndexBlocks).
func DecodeState(data []byte, maxEntries int) (*State, error) {
	if maxEntries <= 0 {
		maxEntries = DefaultMaxIndexBlocks
	}
	if len(data) > MaxStateFileBytes {
		return nil, fmt.Errorf("%w: %d bytes (max %d)", ErrStateInvalid, len(data), MaxStateFileBytes)
	}
	if len(data) < stateHeaderLen+4 {
		return nil, fmt.Errorf("%w: truncated (%d bytes)", ErrStateInvalid, len(data))
	}
	if string(data[:len(stateMagic)]) != stateMagic {
		return nil, fmt.Errorf("%w: not a subscriber state file (magic %q)", ErrStateInvalid, data[:len(stateMagic)])
	}
	if v := binary.LittleEndian.Uint16(data[8:]); v != stateVersion {
		return nil, fmt.Errorf("%w: version %d (this subscriber reads %d)", ErrStateInvalid, v, stateVersion)
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, fmt.Errorf("%w: checksum %08x, want %08x (truncated or corrupt)", ErrStateInvalid, got, sum)
	}
	r := &stateReader{b: body[len(stateMagic)+2:]}
	s := &State{}
	flags := r.u16()
	if flags&^stateFlagsKnown != 0 {
		r.fail("unknown flags %#x", flags)
	}
	s.Started = flags&stateFlagStart != 0
	s.Next = r.u64()
	s.LastSum = r.u32()
	s.HistoryFrom = r.u64()
	s.SavedAt = time.UnixMicro(int64(r.u64())).UTC()
	s.BlockSize = int(r.u32())
	s.ReplicaID = r.str("replica id")
	s.TenantID = r.str("tenant id")
	s.ModelID = r.str("model id")
	s.HashScheme = r.str("hash scheme")
	nAdapters := r.u32()
	// Each name takes at least its 2-byte length.
	if r.err == nil && (nAdapters > maxStateNames || uint64(nAdapters)*2 > uint64(len(r.b))) {
		r.fail("%d adapter names in %d bytes (max %d names)", nAdapters, len(r.b), maxStateNames)
	}
	var names []string
	if r.err == nil {
		names = make([]string, nAdapters)
	}
	for i := range names {
		names[i] = r.str("adapter name")
	}
	nEntries := r.u32()
	switch {
	case r.err != nil:
	case uint64(nEntries) > uint64(maxEntries):
		r.fail("%d entries (max %d)", nEntries, maxEntries)
	case uint64(nEntries)*stateEntryLen != uint64(len(r.b)):
		r.fail("%d entries in %d bytes (want %d)", nEntries, len(r.b), uint64(nEntries)*stateEntryLen)
	}
	if r.err != nil {
		return nil, r.err
	}
	s.Entries = make([]StateEntry, nEntries)
	seen := make(map[uint64]struct{}, nEntries)
	for i := range s.Entries {
		e := &s.Entries[i]
		e.Engine = r.u64()
		e.Key = r.u64()
		tokens := r.u32()
		e.Media = r.u8()
		ai := r.u32()
		switch {
		case r.err != nil:
			return nil, r.err
		case tokens == 0 || tokens > math.MaxInt32:
			return nil, fmt.Errorf("%w: entry %d: %d tokens", ErrStateInvalid, i, tokens)
		case e.Media == 0 || e.Media&^(mediaGPU|mediaOther) != 0:
			return nil, fmt.Errorf("%w: entry %d: media %#x", ErrStateInvalid, i, e.Media)
		case uint64(ai) >= uint64(len(names)):
			return nil, fmt.Errorf("%w: entry %d: adapter %d of %d", ErrStateInvalid, i, ai, len(names))
		}
		if _, dup := seen[e.Engine]; dup {
			return nil, fmt.Errorf("%w: entry %d: engine hash %x twice", ErrStateInvalid, i, e.Engine)
		}
		seen[e.Engine] = struct{}{}
		e.Tokens = int32(tokens)
		e.Adapter = names[ai]
	}
	return s, nil
}

// ReadStateFile reads and decodes a state file (see DecodeState); a file
// that does not exist is an error satisfying errors.Is(err, fs.ErrNotExist).
func ReadStateFile(path string, maxEntries int) (*State, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxStateFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read state file %s: %w", path, err)
	}
	s, err := DecodeState(data, maxEntries)
	if err != nil {
		return nil, fmt.Errorf("cannot use state file %s: %w", path, err)
	}
	return s, nil
}

// stateTempPrefix is how WriteStateFile names its temporary files in the
// state file's directory: the prefix, then os.CreateTemp's random digits.
func stateTempPrefix(base string) string { return "." + base + ".tmp-" }

// RemoveStaleStateTemps removes the temporary files a crash during
// WriteStateFile left beside path (.<name>.tmp-<digits>), and returns their
// names. Only one process may write path: the subscriber calls it at start,
// before its first write.
func RemoveStaleStateTemps(path string) ([]string, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // nothing was ever written there
	}
	if err != nil {
		return nil, fmt.Errorf("cannot list the state file's directory: %w", err)
	}
	prefix := stateTempPrefix(base)
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		digits, ok := strings.CutPrefix(name, prefix)
		if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" || !e.Type().IsRegular() {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("cannot remove a stale temporary state file: %w", err)
	}
	return removed, nil
}

// WriteStateFile replaces path with data atomically: it writes a temporary
// file in the same directory, syncs it, renames it over path and syncs the
// directory, so a crash at any point leaves either the old file or the new
// one, never a mix.
func WriteStateFile(path string, data []byte) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, stateTempPrefix(base)+"*")
	if err != nil {
		return fmt.Errorf("cannot create a temporary state file: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("cannot write the state file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("cannot sync the state file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("cannot close the state file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("cannot move the state file into place: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		// Best effort: makes the rename itself durable.
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
