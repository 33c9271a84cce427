package engine

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/inferencecache/inferencecache/policy"
)

// FuzzIngest decodes arbitrary bytes into a sequence of updates, events and
// lookups over a tiny key space (so they collide), applies it to the engine
// and to the reference model, and requires the same state and answers. It
// also must never panic, whatever the hashes, counts, tiers or stats.
func FuzzIngest(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3})
	f.Add([]byte{0xff, 0x80, 0x7f, 0x01, 0x00, 0x33, 0x44, 0x90, 0x12, 0xaa, 0xbb, 0xcc, 0xdd})
	f.Fuzz(func(t *testing.T, data []byte) {
		store := policy.NewStore()
		e := New(Config{Policies: store, MaxEntries: 12})
		ref := newRef(store, 12)
		r := &byteReader{b: data}
		now := tT
		var res LookupResult
		for op := 0; op < 64 && r.more(); op++ {
			now += int64(r.u8()) * 1_000_000
			switch r.u8() % 6 {
			case 0, 1:
				u := r.update(now)
				e.Ingest(u, now)
				ref.Ingest(u, now)
			case 2:
				ev := &Event{Type: EventType(r.u8() % 6), TenantID: r.pick("t", "u", policy.ReservedTenantID), ModelID: "m",
					ReplicaID: r.pick("a", "b", ""), PrefixHash: r.hash(), AdapterID: r.pick("", "x")}
				e.ApplyEvent(ev, now)
				ref.ApplyEvent(ev, now)
			case 3:
				req := &LookupRequest{TenantID: r.pick("t", "u", ""), ModelID: "m", HashScheme: r.pick("v", "s", ""), AdapterID: r.pick("", "x"), SLOTTFTMs: int32(r.u8())}
				if r.u8()%2 == 0 {
					req.PrefixHash = r.hash()
				} else {
					n := int(r.u8() % 4)
					for i := 0; i < n; i++ {
						req.BlockHashes = append(req.BlockHashes, r.hash())
						req.BlockTokenCounts = append(req.BlockTokenCounts, int32(int8(r.u8())))
					}
					if r.u8()%8 == 0 {
						req.BlockTokenCounts = append(req.BlockTokenCounts, 1)
					}
				}
				e.LookupRoute(req, now, &res)
				want := ref.LookupRoute(req, now)
				compareLookup(t, op, req, &res, want)
				e.Credit(&res)
				ref.Credit(req, want, want.scores)
			case 4:
				e.Sweep(now)
				ref.Sweep(now)
				compareReclaimed(t, op, e, ref)
			case 5:
				b := &policy.Body{Version: 7}
				if r.u8()%2 == 0 {
					b.Policies = append(b.Policies, policy.ResolvedPolicy{Namespace: "t", Eviction: r.pick("lru", "lfu")})
				}
				if r.u8()%2 == 0 {
					b.Tenants = append(b.Tenants, policy.ResolvedTenant{TenantID: "u", MaxIndexEntries: int64(r.u8() % 5)})
				}
				store.Apply(b)
			}
		}
		compareState(t, -1, e, ref)
		checkInvariants(t, e)
	})
}

type byteReader struct {
	b []byte
	i int
}

func (r *byteReader) more() bool { return r.i < len(r.b) }

func (r *byteReader) u8() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

func (r *byteReader) pick(s ...string) string { return s[int(r.u8())%len(s)] }

// hash returns one of a few hashes of varied lengths, or an invalid one.
func (r *byteReader) hash() []byte {
	switch v := r.u8(); v % 8 {
	case 0:
		return nil
	case 1:
		return []byte{v}
	case 2:
		return make([]byte, MaxHashBytes+1)
	default:
		return binary.BigEndian.AppendUint64(nil, uint64(v%5))
	}
}

func (r *byteReader) update(now int64) *Update {
	u := &Update{TenantID: r.pick("t", "u", policy.ReservedTenantID, ""), ModelID: "m", HashScheme: r.pick("v", "s", ""),
		ReplicaID: r.pick("a", "b", "c", ""), AdapterID: r.pick("", "x")}
	if r.u8()%2 == 0 {
		u.TimestampUs = now - int64(r.u8())*10_000_000
	}
	for n := int(r.u8() % 3); n > 0; n-- {
		p := PrefixEntry{Tier: int32(int8(r.u8())), AdapterID: r.pick("", "", "x")}
		if r.u8()%2 == 0 {
			p.PrefixHash = r.hash()
			p.TokenCount = int32(int8(r.u8()))
		} else {
			for k := int(r.u8() % 4); k > 0; k-- {
				p.BlockHashes = append(p.BlockHashes, r.hash())
				p.BlockTokenCounts = append(p.BlockTokenCounts, int32(int8(r.u8())))
			}
			if r.u8()%8 == 0 {
				p.BlockTokenCounts = append(p.BlockTokenCounts, 16)
			}
		}
		u.Prefixes = append(u.Prefixes, p)
	}
	if r.u8()%3 == 0 {
		u.Stats = &ReplicaStats{HitRate: float32(r.u8()) / 255, Pressure: []float32{0, 0.5, float32(math.NaN()), float32(math.Inf(-1))}[r.u8()%4]}
	}
	return u
}
