package wire

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// mp builds msgpack payloads value by value, so tests say exactly which
// bytes go on the wire.
type mp struct {
	t   testing.TB
	buf bytes.Buffer
	enc *msgpack.Encoder
}

func newMP(t testing.TB) *mp {
	m := &mp{t: t}
	m.enc = msgpack.NewEncoder(&m.buf)
	return m
}

func (m *mp) check(err error) *mp {
	m.t.Helper()
	if err != nil {
		m.t.Fatal(err)
	}
	return m
}

func (m *mp) arr(n int) *mp      { return m.check(m.enc.EncodeArrayLen(n)) }
func (m *mp) mapn(n int) *mp     { return m.check(m.enc.EncodeMapLen(n)) }
func (m *mp) str(s string) *mp   { return m.check(m.enc.EncodeString(s)) }
func (m *mp) bin(b []byte) *mp   { return m.check(m.enc.EncodeBytes(b)) }
func (m *mp) u(v uint64) *mp     { return m.check(m.enc.EncodeUint(v)) }
func (m *mp) u64(v uint64) *mp   { return m.check(m.enc.EncodeUint64(v)) }
func (m *mp) i(v int64) *mp      { return m.check(m.enc.EncodeInt(v)) }
func (m *mp) f(v float64) *mp    { return m.check(m.enc.EncodeFloat64(v)) }
func (m *mp) null() *mp          { return m.check(m.enc.EncodeNil()) }
func (m *mp) boolean(b bool) *mp { return m.check(m.enc.EncodeBool(b)) }
func (m *mp) bytes() []byte      { return bytes.Clone(m.buf.Bytes()) }

func (m *mp) ints(vs ...uint64) *mp {
	m.arr(len(vs))
	for _, v := range vs {
		m.u(v)
	}
	return m
}

func seqTokens(n int, base uint32) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(base) + uint64(i)
	}
	return out
}

func decodeOK(t *testing.T, payload []byte) *Batch {
	t.Helper()
	var b Batch
	if err := NewDecoder().Decode(payload, &b); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	return &b
}

func TestDecodeArrayLayoutLegacy(t *testing.T) {
	// The first vLLM release: BlockStored ends at lora_id, BlockRemoved at
	// block_hashes; batch [ts, events] without dp rank.
	m := newMP(t).arr(2).f(1700000000.25).arr(3)
	m.arr(6).str("BlockStored").ints(11, 12).null().ints(seqTokens(32, 100)...).u(16).null()
	m.arr(2).str("BlockRemoved").ints(11)
	m.arr(1).str("AllBlocksCleared")
	b := decodeOK(t, m.bytes())

	if b.TS != 1700000000.25 || b.HasDPRank {
		t.Fatalf("ts=%v dp=%v", b.TS, b.HasDPRank)
	}
	if len(b.Events) != 3 {
		t.Fatalf("events=%d", len(b.Events))
	}
	st := b.Events[0]
	if st.Kind != KindBlockStored || !slices.Equal(st.BlockHashes, []uint64{11, 12}) || st.HasParent ||
		len(st.TokenIDs) != 32 || st.TokenIDs[31] != 131 || st.BlockSize != 16 || st.HasLoRAID ||
		st.Medium != nil || st.LoRAName != nil {
		t.Fatalf("stored: %+v", st)
	}
	if rm := b.Events[1]; rm.Kind != KindBlockRemoved || !slices.Equal(rm.BlockHashes, []uint64{11}) || rm.Medium != nil {
		t.Fatalf("removed: %+v", rm)
	}
	if b.Events[2].Kind != KindAllBlocksCleared {
		t.Fatalf("cleared: %+v", b.Events[2])
	}
}

func TestDecodeArrayLayoutNewerFieldsAndUnknownTrailing(t *testing.T) {
	// [ts, events, dp_rank, <unknown>]; BlockStored with every known field,
	// extra_keys, group_idx, spec kind, window and two fields from the
	// future; BlockRemoved with medium, group_idx and an unknown field.
	m := newMP(t).arr(4).f(2.5).arr(3)
	m.arr(14).str("BlockStored").ints(21).u(20).ints(seqTokens(16, 5)...).u(16).u(7).str("CPU").str("sql-lora").
		arr(1).null(). // extra_keys
		u(0).          // group_idx
		str("full_attention").null().
		mapn(1).str("future").arr(2).u(1).u(2). // future field 1
		str("locality")                         // future field 2
	m.arr(5).str("BlockRemoved").ints(21).str("GPU").u(0).mapn(0)
	m.arr(3).str("AllBlocksCleared").u(1).str("x")
	m.u(3).mapn(1).str("k").str("v")
	b := decodeOK(t, m.bytes())

	if !b.HasDPRank || b.DPRank != 3 {
		t.Fatalf("dp=%v %v", b.HasDPRank, b.DPRank)
	}
	st := b.Events[0]
	if !st.HasParent || st.ParentHash != 20 || !st.HasLoRAID || st.LoRAID != 7 ||
		string(st.Medium) != "CPU" || string(st.LoRAName) != "sql-lora" {
		t.Fatalf("stored: %+v", st)
	}
	if rm := b.Events[1]; string(rm.Medium) != "GPU" {
		t.Fatalf("removed: %+v", rm)
	}
	if b.Events[2].Kind != KindAllBlocksCleared {
		t.Fatalf("cleared: %+v", b.Events[2])
	}
}

func TestDecodeMapLayout(t *testing.T) {
	// Newer vLLM: events are maps with "type"; the batch is an array.
	m := newMP(t).arr(3).f(10).arr(4)
	m.mapn(9).
		str("type").str("BlockStored").
		str("block_hashes").ints(31, 32).
		str("parent_block_hash").null().
		str("token_ids").ints(seqTokens(32, 0)...).
		str("block_size").u(16).
		str("lora_id").null().
		str("medium").str("GPU").
		str("lora_name").null().
		str("kv_cache_spec_sliding_window").u(4096)
	// Keys in another order, tag last, fields missing (no block_size).
	m.mapn(3).
		str("token_ids").ints(seqTokens(16, 9)...).
		str("block_hashes").ints(33).
		str("type").str("BlockStored")
	m.mapn(3).str("type").str("BlockRemoved").str("block_hashes").ints(31).str("group_idx").u(1)
	m.mapn(2).str("type").str("AllBlocksCleared").str("extra").arr(0)
	m.u(0)
	b := decodeOK(t, m.bytes())

	if len(b.Events) != 4 {
		t.Fatalf("events=%d", len(b.Events))
	}
	e0, e1 := b.Events[0], b.Events[1]
	if e0.Kind != KindBlockStored || e0.HasParent || !slices.Equal(e0.BlockHashes, []uint64{31, 32}) ||
		string(e0.Medium) != "GPU" || e0.BlockSize != 16 || len(e0.TokenIDs) != 32 {
		t.Fatalf("e0: %+v", e0)
	}
	if e1.Kind != KindBlockStored || e1.BlockSize != 0 || e1.TokenIDs[0] != 9 || !slices.Equal(e1.BlockHashes, []uint64{33}) {
		t.Fatalf("e1: %+v", e1)
	}
	if b.Events[2].Kind != KindBlockRemoved || b.Events[3].Kind != KindAllBlocksCleared {
		t.Fatalf("kinds: %v %v", b.Events[2].Kind, b.Events[3].Kind)
	}
}

func TestDecodeMapBatch(t *testing.T) {
	m := newMP(t).mapn(4).
		str("data_parallel_rank").u(2).
		str("events").arr(1).arr(2).str("BlockRemoved").ints(1).
		str("something_new").arr(3).u(1).null().boolean(true).
		str("ts").f(99.5)
	b := decodeOK(t, m.bytes())
	if b.TS != 99.5 || b.DPRank != 2 || len(b.Events) != 1 || b.Events[0].Kind != KindBlockRemoved {
		t.Fatalf("batch: %+v", b)
	}

	// SGLang names the third slot attn_dp_rank; nil rank is allowed.
	m = newMP(t).mapn(3).str("ts").u(5).str("events").arr(0).str("attn_dp_rank").null()
	b = decodeOK(t, m.bytes())
	if b.TS != 5 || b.HasDPRank || len(b.Events) != 0 {
		t.Fatalf("batch: %+v", b)
	}
}

func TestDecodeHashForms(t *testing.T) {
	digest := []byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8} // 12 bytes: last 8 count
	m := newMP(t).arr(2).f(0).arr(1).arr(4).str("BlockRemoved")
	m.arr(6).
		u64(math.MaxUint64). // uint64 max
		i(-1).               // negative → two's complement
		i(math.MinInt64).
		bin(digest).
		bin([]byte{1, 2}). // short digest: zero-extended
		str("\x00\x00\x00\x00\x00\x00\x01\x00")
	m.null().u(0) // medium nil, group_idx
	b := decodeOK(t, m.bytes())
	want := []uint64{math.MaxUint64, math.MaxUint64, 1 << 63, 0x0102030405060708, 0x0102, 0x100}
	if got := b.Events[0].BlockHashes; !slices.Equal(got, want) {
		t.Fatalf("hashes %x, want %x", got, want)
	}

	// Byte-string parent on a stored event.
	m = newMP(t).arr(2).f(0).arr(1).arr(5).str("BlockStored").arr(1).bin(digest).bin(digest[:8]).ints(seqTokens(4, 0)...).u(4)
	b = decodeOK(t, m.bytes())
	if ev := b.Events[0]; !ev.HasParent || ev.ParentHash != 0xdeadbeef01020304 || ev.BlockHashes[0] != 0x0102030405060708 {
		t.Fatalf("event %+v", ev)
	}
}

func TestDecodeUnknownEventsTolerated(t *testing.T) {
	m := newMP(t).arr(2).f(0).arr(4)
	m.arr(3).str("BlockMoved").ints(1, 2).mapn(1).str("deep").arr(1).arr(1).arr(0)
	m.mapn(2).str("type").str("CacheResized").str("blocks").u(100)
	m.arr(2).u(7).str("int-tagged") // non-string tag
	m.mapn(1).str("no_type").u(1)
	b := decodeOK(t, m.bytes())
	if len(b.Events) != 4 {
		t.Fatalf("events=%d", len(b.Events))
	}
	for i, ev := range b.Events {
		if ev.Kind != KindUnknown {
			t.Fatalf("event %d kind %v", i, ev.Kind)
		}
	}
}

func TestDecodeMapEventIgnoresFieldsOfOtherKinds(t *testing.T) {
	// msgspec writes the tag first. Once it is known, fields that another
	// kind would read are skipped whatever their shape: an event type from
	// the future reusing a known name, or a removal or clear carrying a
	// field it does not have, must not cost the batch its other events.
	m := newMP(t).arr(2).f(1).arr(4)
	m.mapn(4).str("type").str("BlockUpdated").
		str("block_hashes").str("not-a-list").
		str("token_ids").mapn(1).str("k").u(1).
		str("medium").u(3)
	m.mapn(3).str("type").str("BlockRemoved").str("block_hashes").ints(5).str("token_ids").str("none")
	m.mapn(2).str("type").str("AllBlocksCleared").str("medium").boolean(true)
	m.mapn(3).str("type").str("BlockStored").str("block_hashes").ints(6).str("token_ids").ints(seqTokens(16, 0)...)
	b := decodeOK(t, m.bytes())
	kinds := []EventKind{KindUnknown, KindBlockRemoved, KindAllBlocksCleared, KindBlockStored}
	if len(b.Events) != len(kinds) {
		t.Fatalf("events=%d", len(b.Events))
	}
	for i, want := range kinds {
		if b.Events[i].Kind != want {
			t.Fatalf("event %d kind %v, want %v", i, b.Events[i].Kind, want)
		}
	}
	if rm := b.Events[1]; !slices.Equal(rm.BlockHashes, []uint64{5}) || rm.TokenIDs != nil {
		t.Fatalf("removed: %+v", rm)
	}
	if st := b.Events[3]; !slices.Equal(st.BlockHashes, []uint64{6}) || len(st.TokenIDs) != 16 {
		t.Fatalf("stored: %+v", st)
	}
}

func TestDecodeMalformed(t *testing.T) {
	good := newMP(t).arr(2).f(1).arr(1).arr(5).str("BlockStored").ints(1).null().ints(seqTokens(16, 0)...).u(16).bytes()
	f := func(name string, payload []byte, reason string) {
		t.Helper()
		var b Batch
		err := NewDecoder().Decode(payload, &b)
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
		if !errors.Is(err, ErrDecode) {
			t.Fatalf("%s: %v does not wrap ErrDecode", name, err)
		}
		if got := DecodeReason(err); got != reason {
			t.Fatalf("%s: reason %q (%v), want %q", name, got, err, reason)
		}
	}
	f("empty", nil, ReasonTruncated)
	f("scalar batch", newMP(t).u(1).bytes(), ReasonEnvelope)
	f("short array batch", newMP(t).arr(1).f(1).bytes(), ReasonEnvelope)
	f("string ts", newMP(t).arr(2).str("now").arr(0).bytes(), ReasonEnvelope)
	f("events not array", newMP(t).arr(2).f(1).u(3).bytes(), ReasonEnvelope)
	f("map batch without events", newMP(t).mapn(1).str("ts").f(1).bytes(), ReasonEnvelope)
	f("event scalar", newMP(t).arr(2).f(1).arr(1).u(1).bytes(), ReasonEvent)
	f("empty event array", newMP(t).arr(2).f(1).arr(1).arr(0).bytes(), ReasonEvent)
	f("stored too short", newMP(t).arr(2).f(1).arr(1).arr(3).str("BlockStored").ints(1).null().bytes(), ReasonEvent)
	f("stored map without tokens", newMP(t).arr(2).f(1).arr(1).mapn(2).str("type").str("BlockStored").str("block_hashes").ints(1).bytes(), ReasonEvent)
	f("hash float", newMP(t).arr(2).f(1).arr(1).arr(2).str("BlockRemoved").arr(1).f(1.5).bytes(), ReasonFieldType)
	f("hash nil", newMP(t).arr(2).f(1).arr(1).arr(2).str("BlockRemoved").arr(1).null().bytes(), ReasonFieldType)
	f("hashes nil", newMP(t).arr(2).f(1).arr(1).arr(2).str("BlockRemoved").null().bytes(), ReasonFieldType)
	f("negative token", newMP(t).arr(2).f(1).arr(1).arr(5).str("BlockStored").ints(1).null().arr(1).i(-3).u(16).bytes(), ReasonTokenID)
	f("huge token", newMP(t).arr(2).f(1).arr(1).arr(5).str("BlockStored").ints(1).null().arr(1).u(1<<32).u(16).bytes(), ReasonTokenID)
	f("nil token", newMP(t).arr(2).f(1).arr(1).arr(5).str("BlockStored").ints(1).null().arr(1).null().u(16).bytes(), ReasonFieldType)
	f("negative block size", newMP(t).arr(2).f(1).arr(1).arr(5).str("BlockStored").ints(1).null().arr(0).i(-16).bytes(), ReasonFieldType)
	f("medium int", newMP(t).arr(2).f(1).arr(1).arr(3).str("BlockRemoved").ints(1).u(5).bytes(), ReasonFieldType)
	f("trailing bytes", append(good[:len(good):len(good)], 0xc0), ReasonTrailing)
	for cut := 1; cut < len(good); cut += 7 {
		f("truncated", good[:cut], ReasonTruncated)
	}
	// Lengths that claim more than the payload holds must not allocate.
	f("array32 claims 4G", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}, ReasonTruncated)
	f("str32 claims 4G", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff}, ReasonTruncated)
	f("unknown code", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x92, 0xa1, 'X', 0xc1}, ReasonEvent)

	d := NewDecoder()
	d.MaxPayloadBytes = 4
	var b Batch
	if err := d.Decode(good, &b); DecodeReason(err) != ReasonTooLarge {
		t.Fatalf("too large: %v", err)
	}
}

func TestDecodeDeepNestingDoesNotRecurse(t *testing.T) {
	// An unknown field holding a million nested arrays: skipped iteratively.
	const depth = 1 << 20
	m := newMP(t).arr(2).f(1).arr(1).arr(2).str("Unknown")
	payload := m.bytes()
	payload = append(payload, bytes.Repeat([]byte{0x91}, depth)...)
	payload = append(payload, 0xc0)
	b := decodeOK(t, payload)
	if len(b.Events) != 1 || b.Events[0].Kind != KindUnknown {
		t.Fatalf("events %+v", b.Events)
	}
}

func TestParseMessage(t *testing.T) {
	seqFrame := []byte{0, 0, 0, 0, 0, 0, 1, 2}
	seq, ok, payload, err := ParseMessage([][]byte{[]byte("kv-events"), seqFrame, {0x90}})
	if err != nil || !ok || seq != 0x102 || !bytes.Equal(payload, []byte{0x90}) {
		t.Fatalf("3 frames: %v %v %v %v", seq, ok, payload, err)
	}
	_, ok, payload, err = ParseMessage([][]byte{{0x90}})
	if err != nil || ok || len(payload) != 1 {
		t.Fatalf("1 frame: %v %v %v", ok, payload, err)
	}
	if _, _, _, err := ParseMessage(nil); DecodeReason(err) != ReasonFrames {
		t.Fatalf("0 frames: %v", err)
	}
}

func TestDecodeReusesBatchWithoutAllocating(t *testing.T) {
	payload := benchPayload(t, 32, 16, false)
	d := NewDecoder()
	var b Batch
	if err := d.Decode(payload, &b); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(50, func() {
		if err := d.Decode(payload, &b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Decode allocates %.1f times per batch in steady state", allocs)
	}
	mapPayload := benchPayload(t, 32, 16, true)
	if err := d.Decode(mapPayload, &b); err != nil {
		t.Fatal(err)
	}
	allocs = testing.AllocsPerRun(50, func() {
		if err := d.Decode(mapPayload, &b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Decode (map layout) allocates %.1f times per batch in steady state", allocs)
	}
}

// benchPayload is a realistic batch: events BlockStored of blocks blocks
// each (block size 16), chained, with a medium and a lora_name, in the
// array or map layout.
func benchPayload(t testing.TB, events, blocks int, mapLayout bool) []byte {
	m := newMP(t).arr(3).f(1700000000.5).arr(events)
	for e := range events {
		hashes := make([]uint64, blocks)
		for i := range hashes {
			hashes[i] = uint64(e*blocks+i) * 0x9e3779b97f4a7c15
		}
		toks := seqTokens(blocks*16, uint32(e*1000))
		if mapLayout {
			m.mapn(8).str("type").str("BlockStored").str("block_hashes").ints(hashes...).
				str("parent_block_hash").u(uint64(e)).str("token_ids").ints(toks...).str("block_size").u(16).
				str("lora_id").null().str("medium").str("GPU").str("lora_name").str("adapter-a")
		} else {
			m.arr(8).str("BlockStored").ints(hashes...).u(uint64(e)).ints(toks...).u(16).null().str("GPU").str("adapter-a")
		}
	}
	m.u(0)
	return m.bytes()
}

func BenchmarkDecodeBatch(b *testing.B) {
	for _, tc := range []struct {
		name   string
		mapped bool
	}{{"array", false}, {"map", true}} {
		b.Run(tc.name, func(b *testing.B) {
			const events = 32
			payload := benchPayload(b, events, 16, tc.mapped)
			d := NewDecoder()
			var batch Batch
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := d.Decode(payload, &batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
