package engine

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/policy"
)

// The change stream (events.go): what each write reports, with which
// reason, to whom, and what a slow subscriber gets.

// changeReplay rebuilds the index's (key, replica) -> tier from a change
// stream alone.
type changeReplay struct {
	held map[refKey]map[string]Tier
	buf  []IndexChange
}

func newChangeReplay() *changeReplay { return &changeReplay{held: map[refKey]map[string]Tier{}} }

func (c *changeReplay) apply(t *testing.T, op int, ch *IndexChange) {
	t.Helper()
	k := refKey{ch.TenantID, ch.ModelID, ch.HashScheme, ch.AdapterID, string(ch.Hash)}
	switch ch.Type {
	case EventPrefixAdded:
		if c.held[k] == nil {
			c.held[k] = map[string]Tier{}
		}
		c.held[k][ch.ReplicaID] = ch.Tier
	case EventPrefixEvicted:
		if _, ok := c.held[k][ch.ReplicaID]; !ok {
			t.Fatalf("op %d: eviction of %+v, which the stream never added", op, ch)
		}
		if ch.Reason == "" {
			t.Fatalf("op %d: eviction without a reason: %+v", op, ch)
		}
		delete(c.held[k], ch.ReplicaID)
		if len(c.held[k]) == 0 {
			delete(c.held, k)
		}
	case EventAllCleared:
		for k, hs := range c.held {
			if k.tenant == ch.TenantID && k.model == ch.ModelID {
				delete(hs, ch.ReplicaID)
				if len(hs) == 0 {
					delete(c.held, k)
				}
			}
		}
	case EventReplicaRemoved:
		for k, hs := range c.held {
			if _, ok := hs[ch.ReplicaID]; ok && k.tenant == ch.TenantID && k.model == ch.ModelID {
				t.Fatalf("op %d: replica %s/%s/%s removed while it still holds %+v", op, ch.TenantID, ch.ModelID, ch.ReplicaID, k)
			}
		}
	default:
		t.Fatalf("op %d: unexpected change %+v", op, ch)
	}
	if ch.TenantID == policy.ReservedTenantID {
		t.Fatalf("op %d: a change of the reserved tenant was delivered: %+v", op, ch)
	}
}

func (c *changeReplay) drain(t *testing.T, op int, sub *Subscription) {
	t.Helper()
	var over bool
	c.buf, over = sub.Next(c.buf)
	if over {
		t.Fatalf("op %d: the subscription overflowed", op)
	}
	for i := range c.buf {
		c.apply(t, op, &c.buf[i])
	}
}

// compare checks the replay against the reference model (reserved tenant
// excluded: the stream never carries it).
func (c *changeReplay) compare(t *testing.T, op int, ref *refModel) {
	t.Helper()
	var want, got []string
	for _, d := range ref.dump() {
		if d.key.tenant != policy.ReservedTenantID {
			want = append(want, fmt.Sprintf("%v %s %d", d.key, d.replica, d.tier))
		}
	}
	for k, hs := range c.held {
		for r, tier := range hs {
			got = append(got, fmt.Sprintf("%v %s %d", k, r, tier))
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("op %d: the change stream describes %d entries, the index holds %d\nstream: %v\nindex:  %v", op, len(got), len(want), got, want)
	}
}

func drainAll(t *testing.T, sub *Subscription) []IndexChange {
	t.Helper()
	out, over := sub.Next(nil)
	if over {
		t.Fatal("the subscription overflowed")
	}
	return out
}

type wantChange struct {
	typ     EventType
	reason  string
	replica string
	hash    uint64 // 0: no hash
	tier    Tier
}

func expectChanges(t *testing.T, got []IndexChange, want ...wantChange) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d changes %+v, want %d", len(got), got, len(want))
	}
	for i, w := range want {
		g := got[i]
		var h []byte
		if w.hash != 0 {
			h = h8(w.hash)
		}
		if g.Type != w.typ || g.Reason != w.reason || g.ReplicaID != w.replica || string(g.Hash) != string(h) || (w.typ == EventPrefixAdded && g.Tier != w.tier) {
			t.Errorf("change %d: got %+v, want %+v", i, g, w)
		}
	}
}

func TestChangesOfEachWrite(t *testing.T) {
	t.Run("stored, refreshed, re-tiered, evicted by the producer", func(t *testing.T) {
		x := newTix(t)
		x.chain("a", tT, 0, 9) // before the subscription: not delivered
		sub := x.e.SubscribeChanges(ChangeFilter{}, 0)
		defer sub.Close()
		x.chainIn("team", "m", "vllm", "lora", "a", tT, 0, 1, 2)
		got := drainAll(t, sub)
		expectChanges(t, got,
			wantChange{EventPrefixAdded, "", "a", 1, TierT1},
			wantChange{EventPrefixAdded, "", "a", 2, TierT1})
		if g := got[1]; g.TenantID != "team" || g.ModelID != "m" || g.HashScheme != "vllm" || g.AdapterID != "lora" || g.Tokens != 32 || g.At != tT {
			t.Errorf("PREFIX_ADDED fields: %+v", g)
		}
		// A refresh at the same tier is no change; a tier change is.
		x.chainIn("team", "m", "vllm", "lora", "a", tT+1, 0, 1, 2)
		expectChanges(t, drainAll(t, sub))
		x.chainIn("team", "m", "vllm", "lora", "a", tT+2, 2, 1)
		expectChanges(t, drainAll(t, sub), wantChange{EventPrefixAdded, "", "a", 1, TierT2})
		// A second holder.
		x.chainIn("team", "m", "vllm", "lora", "b", tT, 0, 1)
		expectChanges(t, drainAll(t, sub), wantChange{EventPrefixAdded, "", "b", 1, TierT1})
		x.e.ApplyEvent(&Event{Type: EventPrefixEvicted, TenantID: "team", ModelID: "m", ReplicaID: "b", PrefixHash: h8(1)}, tT+5)
		got = drainAll(t, sub)
		expectChanges(t, got,
			wantChange{EventPrefixEvicted, ReasonEngine, "b", 1, 0},
			wantChange{EventReplicaRemoved, ReasonEngine, "b", 0, 0})
		if got[0].At != tT+5 || got[0].AdapterID != "lora" {
			t.Errorf("PREFIX_EVICTED fields: %+v", got[0])
		}
	})

	t.Run("ALL_CLEARED is one change, then the replica is gone", func(t *testing.T) {
		x := newTix(t)
		sub := x.e.SubscribeChanges(ChangeFilter{}, 0)
		defer sub.Close()
		x.chain("a", tT, 0, 1, 2, 3)
		x.stats("a", tT, 0.5, 0)
		drainAll(t, sub)
		x.e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: "team", ModelID: "m", ReplicaID: "a"}, tT)
		expectChanges(t, drainAll(t, sub),
			wantChange{EventAllCleared, ReasonEngine, "a", 0, 0},
			wantChange{EventReplicaRemoved, ReasonEngine, "a", 0, 0})
		// Clearing what holds nothing reports nothing.
		x.e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: "team", ModelID: "m", ReplicaID: "a"}, tT)
		expectChanges(t, drainAll(t, sub))
	})

	t.Run("TTL sweep and stats expiry", func(t *testing.T) {
		x := newTix(t)
		sub := x.e.SubscribeChanges(ChangeFilter{}, 0)
		defer sub.Close()
		x.chain("a", tT, 0, 1)
		x.stats("b", tT, 0.5, 0)
		drainAll(t, sub)
		x.e.Sweep(tT + (31 * time.Minute).Microseconds())
		got := drainAll(t, sub)
		expectChanges(t, got,
			wantChange{EventPrefixEvicted, ReasonTTL, "a", 1, 0},
			wantChange{EventReplicaRemoved, ReasonTTL, "a", 0, 0},
			wantChange{EventReplicaRemoved, ReasonExpired, "b", 0, 0})
	})

	t.Run("entry cap", func(t *testing.T) {
		store := policy.NewStore()
		e := New(Config{Policies: store, MaxEntries: 2})
		sub := e.SubscribeChanges(ChangeFilter{Types: 1 << EventPrefixEvicted}, 0)
		defer sub.Close()
		for i, r := range []string{"a", "b", "c"} {
			e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: r, TimestampUs: tT + int64(i),
				Prefixes: []PrefixEntry{{PrefixHash: h8(uint64(10 + i)), TokenCount: 16}}}, tT)
		}
		expectChanges(t, drainAll(t, sub), wantChange{EventPrefixEvicted, ReasonCap, "a", 10, 0})
	})

	t.Run("tenant quota", func(t *testing.T) {
		x := newTix(t)
		x.store.Apply(&policy.Body{Version: 8, Tenants: []policy.ResolvedTenant{{TenantID: "team", MaxIndexEntries: 1}}})
		sub := x.e.SubscribeChanges(ChangeFilter{Types: 1 << EventPrefixEvicted}, 0)
		defer sub.Close()
		x.legacy("a", tT, 1, 16)
		x.legacy("a", tT+1, 2, 32)
		expectChanges(t, drainAll(t, sub), wantChange{EventPrefixEvicted, ReasonQuota, "a", 1, 0})
	})
}

func TestChangeFilters(t *testing.T) {
	x := newTix(t)
	byTenant := x.e.SubscribeChanges(ChangeFilter{TenantID: "other"}, 0)
	byModel := x.e.SubscribeChanges(ChangeFilter{ModelID: "m2"}, 0)
	byType := x.e.SubscribeChanges(ChangeFilter{Types: 1<<EventPrefixEvicted | 1<<EventAllCleared}, 0)
	all := x.e.SubscribeChanges(ChangeFilter{}, 0)
	for _, s := range []*Subscription{byTenant, byModel, byType, all} {
		defer s.Close()
	}
	x.chainIn("team", "m", "vllm", "", "a", tT, 0, 1)
	x.chainIn("other", "m", "vllm", "", "a", tT, 0, 1)
	x.chainIn("team", "m2", "vllm", "", "a", tT, 0, 1)
	x.chainIn(policy.ReservedTenantID, "m", "vllm", "", "a", tT, 0, 1)
	x.e.ApplyEvent(&Event{Type: EventPrefixEvicted, TenantID: "team", ModelID: "m", ReplicaID: "a", PrefixHash: h8(1)}, tT)
	x.e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: policy.ReservedTenantID, ModelID: "m", ReplicaID: "a"}, tT)

	if got := drainAll(t, byTenant); len(got) != 1 || got[0].TenantID != "other" {
		t.Errorf("tenant filter: %+v", got)
	}
	if got := drainAll(t, byModel); len(got) != 1 || got[0].ModelID != "m2" {
		t.Errorf("model filter: %+v", got)
	}
	if got := drainAll(t, byType); len(got) != 1 || got[0].Type != EventPrefixEvicted {
		t.Errorf("type filter: %+v", got)
	}
	// Three adds, one eviction, one replica removal; nothing of the
	// reserved tenant.
	got := drainAll(t, all)
	if len(got) != 5 {
		t.Fatalf("unfiltered: %d changes %+v, want 5", len(got), got)
	}
	for _, c := range got {
		if c.TenantID == policy.ReservedTenantID {
			t.Errorf("reserved tenant change delivered: %+v", c)
		}
	}
}

func TestChangeOverflowNeverBlocks(t *testing.T) {
	x := newTix(t)
	slow := x.e.SubscribeChanges(ChangeFilter{}, 4)
	defer slow.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 100 {
			x.legacy("a", tT, uint64(100+i), 16)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("writes blocked behind a subscriber that does not read")
	}
	select {
	case <-slow.Ready():
	default:
		t.Fatal("an overflowed subscription was not signaled")
	}
	got, over := slow.Next(nil)
	if !over || len(got) != 4 || string(got[0].Hash) != string(h8(100)) || string(got[3].Hash) != string(h8(103)) {
		t.Fatalf("overflowed subscription: %d changes (first %x), overflowed %v; want the first 4 and true", len(got), got[0].Hash, over)
	}
	// Nothing more arrives once it overflowed.
	x.legacy("a", tT, 999, 16)
	if got, over := slow.Next(got); len(got) != 0 || !over {
		t.Errorf("after overflow: %d changes, overflowed %v", len(got), over)
	}
}

func TestChangeSubscriptionLifecycle(t *testing.T) {
	x := newTix(t)
	if x.e.Subscriptions() != 0 || x.e.subs != nil {
		t.Fatal("a new engine has subscriptions")
	}
	a := x.e.SubscribeChanges(ChangeFilter{}, 0)
	b := x.e.SubscribeChanges(ChangeFilter{}, MaxChangeBuffer*4)
	if n := len(b.ring); n != MaxChangeBuffer {
		t.Errorf("ring of %d, want the cap %d", n, MaxChangeBuffer)
	}
	if x.e.Subscriptions() != 2 {
		t.Fatalf("%d subscriptions, want 2", x.e.Subscriptions())
	}
	a.Close()
	x.legacy("a", tT, 1, 16)
	if got, _ := a.Next(nil); len(got) != 0 {
		t.Errorf("a closed subscription received %+v", got)
	}
	if got, _ := b.Next(nil); len(got) != 1 {
		t.Errorf("the open subscription received %d changes, want 1", len(got))
	}
	b.Close()
	b.Close() // harmless
	if x.e.subs != nil {
		t.Error("the engine keeps a subscription list with none open: writes would keep recording")
	}
}

// TestChangesConcurrent runs writers, a sweeper and subscribers that come
// and go, under -race.
func TestChangesConcurrent(t *testing.T) {
	x := newTix(t)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := fmt.Sprint("r", w)
				x.chain(r, tT, int32(i%2), uint64(i%50), uint64(i%50+1))
				if i%7 == 0 {
					x.e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: "team", ModelID: "m", ReplicaID: r}, tT)
				}
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			var buf []IndexChange
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				s := x.e.SubscribeChanges(ChangeFilter{}, 64)
				for range 20 {
					buf, _ = s.Next(buf)
				}
				s.Close()
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if x.e.Subscriptions() != 0 {
		t.Errorf("%d subscriptions left open", x.e.Subscriptions())
	}
}

// BenchmarkIngestChanges is the change stream's cost on ingest: 8-block
// chains of new keys into a fresh index, with nobody subscribed (the path
// every server takes: one test of a field per change site; compare with
// BenchmarkIngestBlocks/fresh of a build without the stream) and with one
// subscriber a goroutine drains (every change recorded and fanned out).
// cpu-ns/op is per 8-block update.
func BenchmarkIngestChanges(b *testing.B) {
	for _, mode := range []string{"none", "subscribed"} {
		b.Run(mode, func(b *testing.B) {
			e := New(Config{})
			stop := make(chan struct{})
			var wg sync.WaitGroup
			if mode == "subscribed" {
				sub := e.SubscribeChanges(ChangeFilter{}, MaxChangeBuffer)
				wg.Go(func() {
					var buf []IndexChange
					for {
						select {
						case <-stop:
							return
						case <-sub.Ready():
							buf, _ = sub.Next(buf)
						}
					}
				})
				defer sub.Close()
			}
			u := &Update{TenantID: "t", ModelID: "m", HashScheme: "vllm", ReplicaID: "r",
				Prefixes: []PrefixEntry{{BlockHashes: make([][]byte, 8), BlockTokenCounts: sixteens(8)}}}
			keys := make([]byte, 8*8)
			b.ReportAllocs()
			cpu := startCPU()
			for i := 0; b.Loop(); i++ {
				for j := range 8 {
					k := keys[8*j : 8*j+8 : 8*j+8]
					binary.BigEndian.PutUint64(k, uint64(i*8+j+1))
					u.Prefixes[0].BlockHashes[j] = k
				}
				e.Ingest(u, tT)
			}
			cpu.report(b, b.N)
			close(stop)
			wg.Wait()
		})
	}
}

// BenchmarkLookupRouteSubscribed is BenchmarkLookupRouteChain64's engine
// lookup with a change subscription open: lookups never look at the
// stream, so it costs them nothing.
func BenchmarkLookupRouteSubscribed(b *testing.B) {
	w, e := benchFixture()
	reqs := lookupRequests(w, 4096)
	now := benchNow + 1_000_000
	for _, mode := range []string{"none", "subscribed"} {
		b.Run(mode, func(b *testing.B) {
			if mode == "subscribed" {
				sub := e.SubscribeChanges(ChangeFilter{}, 0)
				defer sub.Close()
			}
			var res LookupResult
			b.ReportAllocs()
			cpu := startCPU()
			for i := 0; b.Loop(); i++ {
				e.LookupRoute(&reqs[i&4095], now, &res)
			}
			cpu.report(b, b.N)
		})
	}
}
