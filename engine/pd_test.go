package engine

import (
	"strings"
	"testing"

	"github.com/inferencecache/inferencecache/policy"
)

// PickPD (pd.go, docs/pd.md): candidates by role and pool, the prefill
// cost, the decode choice with locality, the skip rules and every outcome.

func topo(t *testing.T, spec string) *policy.Topology {
	t.Helper()
	b := mustDecodePolicy(t, `{"version": 8, "pdTopologies": [`+spec+`]}`)
	snap := policy.Build(b)
	top := snap.Topology(b.PDTopologies[0].Namespace+"/"+b.PDTopologies[0].Name, "")
	if top == nil {
		t.Fatal("topology did not resolve")
	}
	return top
}

func mustDecodePolicy(t *testing.T, s string) *policy.Body {
	t.Helper()
	b, err := policy.Decode(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const pdSpec = `{"namespace": "team", "name": "pd", "prefillPools": [{"name": "prefill"}], "decodePools": [{"name": "decode"}], "transport": "NIXL", "skipPrefillBelowTokens": 64`

// place reports replica's placement (and a chain of hashes when given).
func (x *tix) place(replica string, role Role, pool, node, zone string, hashes ...uint64) {
	u := &Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: replica, TimestampUs: tT,
		Placement: &Placement{Role: role, Pool: pool, Node: node, Zone: zone}}
	if len(hashes) > 0 {
		u.Prefixes = []PrefixEntry{{BlockHashes: chainOf(hashes...), BlockTokenCounts: sixteens(len(hashes))}}
	} else {
		u.Stats = &ReplicaStats{}
	}
	x.e.Ingest(u, tT)
}

func (x *tix) pick(top *policy.Topology, tokens int64, hashes ...uint64) *PDResult {
	x.t.Helper()
	req := &PDRequest{Lookup: chainReq(hashes...), Tokens: tokens, Topology: top}
	req.Lookup.TenantID, req.Lookup.ModelID, req.Lookup.HashScheme = "team", "m", "vllm"
	res := &PDResult{}
	x.e.PickPD(req, tT, res)
	return res
}

func expectPD(t *testing.T, res *PDResult, outcome PDOutcome, prefill, decode string) {
	t.Helper()
	if res.Outcome != outcome || res.Prefill != prefill || res.Decode != decode {
		t.Fatalf("got outcome %d prefill %q decode %q, want %d %q %q", res.Outcome, res.Prefill, res.Decode, outcome, prefill, decode)
	}
}

func TestPickPDOutcomes(t *testing.T) {
	top := topo(t, pdSpec+`}`)
	chain := []uint64{1, 2, 3, 4, 5, 6, 7, 8} // 128 tokens

	t.Run("no replicas at all", func(t *testing.T) {
		x := newTix(t)
		expectPD(t, x.pick(top, 1000, chain...), PDNoDecodePool, "", "")
	})
	t.Run("prefill only: no decode pool", func(t *testing.T) {
		x := newTix(t)
		x.place("p1", RolePrefill, "prefill", "", "")
		expectPD(t, x.pick(top, 1000, chain...), PDNoDecodePool, "", "")
	})
	t.Run("decode only: no prefill pool, decode still named", func(t *testing.T) {
		x := newTix(t)
		x.place("d1", RoleDecode, "decode", "", "")
		res := x.pick(top, 1000, chain...)
		expectPD(t, res, PDNoPrefillPool, "", "d1")
		if res.Uncached != 1000 {
			t.Errorf("uncached %d, want 1000", res.Uncached)
		}
	})
	t.Run("disaggregated", func(t *testing.T) {
		x := newTix(t)
		x.place("p1", RolePrefill, "prefill", "", "")
		x.place("d1", RoleDecode, "decode", "", "")
		res := x.pick(top, 1000, chain...)
		expectPD(t, res, PDDisaggregated, "p1", "d1")
		if res.Uncached != 1000 || res.PrefillMatched != 0 {
			t.Errorf("uncached %d matched %d", res.Uncached, res.PrefillMatched)
		}
	})
	t.Run("unknown role, other pools and other models are no candidates", func(t *testing.T) {
		x := newTix(t)
		x.place("p1", RolePrefill, "elsewhere", "", "")
		x.place("d1", RoleDecode, "decode", "", "")
		x.place("u", RoleUnknown, "", "", "")
		x.chain("plain", tT, 0, 1) // no placement
		x.e.Ingest(&Update{TenantID: "team", ModelID: "m2", HashScheme: "vllm", ReplicaID: "p2",
			Placement: &Placement{Role: RolePrefill}, Stats: &ReplicaStats{}}, tT)
		expectPD(t, x.pick(top, 1000, chain...), PDNoPrefillPool, "", "d1")
	})
	t.Run("a replica of role both serving alone skips the hop", func(t *testing.T) {
		x := newTix(t)
		x.place("b", RoleBoth, "", "", "")
		expectPD(t, x.pick(top, 1000, chain...), PDPrefillSkipped, "", "b")
	})
}

func TestPickPDSkipRules(t *testing.T) {
	top := topo(t, pdSpec+`}`) // skip below 64 uncached tokens
	x := newTix(t)
	x.place("p1", RolePrefill, "prefill", "", "")
	x.place("d1", RoleDecode, "decode", "", "", 1, 2, 3, 4, 5, 6, 7, 8) // holds 128 tokens
	// 150-token prompt, 128 cached on the decode replica: 22 to compute.
	res := x.pick(top, 150, 1, 2, 3, 4, 5, 6, 7, 8)
	expectPD(t, res, PDPrefillSkipped, "", "d1")
	if res.Uncached != 22 || res.DecodeMatched != 128 {
		t.Errorf("uncached %d, decode matched %d; want 22, 128", res.Uncached, res.DecodeMatched)
	}
	// 1,000-token prompt: 872 to compute, well over the threshold.
	expectPD(t, x.pick(top, 1000, 1, 2, 3, 4, 5, 6, 7, 8), PDDisaggregated, "p1", "d1")

	// Threshold 0 never skips by size.
	zero := topo(t, `{"namespace": "team", "name": "pd", "prefillPools": [{"name": "prefill"}], "decodePools": [{"name": "decode"}], "skipPrefillBelowTokens": 0}`)
	expectPD(t, x.pick(zero, 150, 1, 2, 3, 4, 5, 6, 7, 8), PDDisaggregated, "p1", "d1")

	// A backlogged prefill pool: its queue exceeds what decode computes.
	lx := newLoadTix(t, DefaultLoadConfig())
	lx.place("p1", RolePrefill, "prefill", "", "")
	lx.place("d1", RoleDecode, "decode", "", "")
	lx.load("p1", tT, 2, 1, 5000) // 5,000 queued prefill tokens
	lx.load("d1", tT, 0, 1, 0)
	expectPD(t, lx.pick(zero, 1000, 1), PDPrefillSkipped, "", "d1")
	lx.load("p1", tT, 0, 1, 100)
	expectPD(t, lx.pick(zero, 1000, 1), PDDisaggregated, "p1", "d1")
}

func TestPickPDPrefillCost(t *testing.T) {
	top := topo(t, pdSpec+`}`)
	x := newLoadTix(t, DefaultLoadConfig())
	x.place("p1", RolePrefill, "prefill", "", "")
	x.place("p2", RolePrefill, "prefill", "", "", 1, 2, 3, 4) // holds 64 tokens
	x.place("d1", RoleDecode, "decode", "", "")
	x.load("d1", tT, 0, 0, 0)
	// Equal queues: the holder saves 64 × PDPrefillWeight prefill-token units.
	x.load("p1", tT, 0, 0, 0)
	x.load("p2", tT, 0, 0, 0)
	res := x.pick(top, 1000, 1, 2, 3, 4)
	expectPD(t, res, PDDisaggregated, "p2", "d1")
	if res.PrefillMatched != 64 || res.Uncached != 936 {
		t.Errorf("prefill matched %d, uncached %d; want 64, 936", res.PrefillMatched, res.Uncached)
	}
	// The holder's queue outweighs the 128 units its cache saves.
	x.load("p2", tT, 1, 0, 2000)
	expectPD(t, x.pick(top, 1000, 1, 2, 3, 4), PDDisaggregated, "p1", "d1")
	// Ties go by name.
	x.load("p2", tT, 0, 0, 0)
	expectPD(t, x.pick(top, 1000, 9), PDDisaggregated, "p1", "d1")
}

func TestPickPDDecodeChoice(t *testing.T) {
	x := newLoadTix(t, DefaultLoadConfig())
	x.place("p1", RolePrefill, "prefill", "n1", "z1")
	x.place("d-far", RoleDecode, "decode", "n9", "z9")
	x.place("d-zone", RoleDecode, "decode", "n2", "z1")
	x.place("d-node", RoleDecode, "decode", "n1", "z1")
	x.load("p1", tT, 0, 0, 0)
	x.load("d-far", tT, 0, 1, 0)
	x.load("d-zone", tT, 0, 3, 0)
	x.load("d-node", tT, 0, 4, 0)
	none := topo(t, pdSpec+`, "kvLocality": "None"}`)
	zone := topo(t, pdSpec+`, "kvLocality": "Zone"}`)
	node := topo(t, pdSpec+`, "kvLocality": "Node"}`)
	expectPD(t, x.pick(none, 1000, 1), PDDisaggregated, "p1", "d-far")  // least loaded
	expectPD(t, x.pick(zone, 1000, 1), PDDisaggregated, "p1", "d-zone") // least loaded in z1
	expectPD(t, x.pick(node, 1000, 1), PDDisaggregated, "p1", "d-node") // on n1
	// An overloaded local replica is passed over for the next tier.
	x.load("d-node", tT, 40, 4, 0)
	expectPD(t, x.pick(node, 1000, 1), PDDisaggregated, "p1", "d-zone")
	// Equal loads: the decode replica caching more of the prompt.
	y := newLoadTix(t, DefaultLoadConfig())
	y.place("p1", RolePrefill, "", "", "")
	y.place("d1", RoleDecode, "", "", "")
	y.place("d2", RoleDecode, "", "", "", 1, 2)
	expectPD(t, y.pick(none, 1000, 1, 2), PDDisaggregated, "p1", "d2")
}

func TestPlacementMerge(t *testing.T) {
	x := newTix(t)
	x.place("a", RolePrefill, "p", "n1", "z1")
	x.place("a", RoleUnknown, "p", "n2", "z1") // keeps the role
	got, ok := x.e.PlacementOf("team", "m", "a")
	if !ok || got != (Placement{RolePrefill, "p", "n2", "z1"}) {
		t.Errorf("placement %+v, %v", got, ok)
	}
	x.place("a", RoleDecode, "", "", "")
	if got, _ := x.e.PlacementOf("team", "m", "a"); got != (Placement{Role: RoleDecode}) {
		t.Errorf("placement %+v, want decode with nothing else", got)
	}
	// An update without a placement changes nothing.
	x.chain("a", tT, 0, 1)
	if got, _ := x.e.PlacementOf("team", "m", "a"); got.Role != RoleDecode {
		t.Errorf("placement %+v after a report without one", got)
	}
	if _, ok := x.e.PlacementOf("team", "m", "nobody"); ok {
		t.Error("an unknown replica has a placement")
	}
}

func TestPickPDAllocs(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("allocation counts need a normal build")
	}
	top := topo(t, pdSpec+`, "kvLocality": "Zone"}`)
	x := newLoadTix(t, DefaultLoadConfig())
	for _, r := range []string{"p1", "p2", "p3"} {
		x.place(r, RolePrefill, "prefill", "n1", "z1", 1, 2, 3)
		x.load(r, tT, 1, 1, 100)
	}
	for _, r := range []string{"d1", "d2"} {
		x.place(r, RoleDecode, "decode", "n2", "z1", 1)
		x.load(r, tT, 0, 2, 0)
	}
	req := &PDRequest{Lookup: chainReq(1, 2, 3, 4), Tokens: 2000, Topology: top}
	req.Lookup.TenantID, req.Lookup.ModelID, req.Lookup.HashScheme = "team", "m", "vllm"
	res := &PDResult{}
	x.e.PickPD(req, tT, res)
	if n := testing.AllocsPerRun(200, func() { x.e.PickPD(req, tT, res) }); n != 0 {
		t.Errorf("PickPD allocates %.1f times per call, want 0", n)
	}
	if res.Outcome != PDDisaggregated {
		t.Errorf("outcome %d", res.Outcome)
	}
}

func BenchmarkPickPD(b *testing.B) {
	store := policy.NewStore()
	e := New(Config{Policies: store, Load: DefaultLoadConfig()})
	body, _ := policy.Decode(strings.NewReader(`{"version": 8, "pdTopologies": [` + pdSpec + `}]}`))
	top := policy.Build(body).Topology("team/pd", "")
	for i := range 16 {
		role, pool := RolePrefill, "prefill"
		if i%2 == 1 {
			role, pool = RoleDecode, "decode"
		}
		r := "r" + string(rune('a'+i))
		e.Ingest(&Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: r, TimestampUs: tT,
			Placement: &Placement{Role: role, Pool: pool},
			Prefixes:  []PrefixEntry{{BlockHashes: chainOf(1, 2, uint64(3+i)), BlockTokenCounts: sixteens(3)}},
			Stats:     &ReplicaStats{Load: LoadStats{Reported: true, Waiting: int32(i % 3), Running: 2, QueuedTokens: int64(100 * i)}}}, tT)
	}
	req := &PDRequest{Lookup: chainReq(1, 2, 3, 4, 5, 6, 7, 8), Tokens: 4000, Topology: top}
	req.Lookup.TenantID, req.Lookup.ModelID, req.Lookup.HashScheme = "team", "m", "vllm"
	res := &PDResult{}
	b.ReportAllocs()
	for b.Loop() {
		e.PickPD(req, tT, res)
	}
}
