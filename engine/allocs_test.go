package engine

import "testing"

// TestHotPathAllocs pins the hot paths to zero allocations once their
// scratch is warm: LookupRoute on every strategy path, Credit, AffinityHint,
// and Ingest of an update that refreshes existing entries.
func TestHotPathAllocs(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("allocation counts are only meaningful without -race")
	}
	x := newTix(t)
	x.store.Apply(lfuBody("team"))
	x.chain("a", tT, 0, 1, 2, 3)
	x.chain("b", tT, 0, 1, 2)
	x.chain("c", tT, 0, 9)
	x.stats("a", tT, 0.5, 0.1)
	reqs := map[string]LookupRequest{
		"chain":      {TenantID: "team", ModelID: "m", HashScheme: "vllm", BlockHashes: chainOf(1, 2, 3), BlockTokenCounts: sixteens(3)},
		"exact":      {TenantID: "team", ModelID: "m", HashScheme: "vllm", PrefixHash: h8(2)},
		"tenant-hot": {TenantID: "team", ModelID: "m", HashScheme: "vllm", PrefixHash: h8(77)},
		"miss":       {TenantID: "nobody", ModelID: "m", HashScheme: "vllm", PrefixHash: h8(1)},
	}
	for name, req := range reqs {
		var res LookupResult
		x.e.LookupRoute(&req, tT, &res)
		if n := testing.AllocsPerRun(200, func() { x.e.LookupRoute(&req, tT, &res); x.e.Credit(&res) }); n != 0 {
			t.Errorf("%s: LookupRoute+Credit allocates %.1f times", name, n)
		}
	}
	seed := []byte("seed")
	if n := testing.AllocsPerRun(200, func() { x.e.AffinityHint("team", "m", "vllm", seed) }); n != 0 {
		t.Errorf("AffinityHint allocates %.1f times", n)
	}
	up := &Update{TenantID: "team", ModelID: "m", HashScheme: "vllm", ReplicaID: "a", TimestampUs: tT,
		Prefixes: []PrefixEntry{{BlockHashes: chainOf(1, 2, 3), BlockTokenCounts: sixteens(3)}}}
	x.e.Ingest(up, tT)
	if n := testing.AllocsPerRun(200, func() { x.e.Ingest(up, tT) }); n != 0 {
		t.Errorf("refreshing Ingest allocates %.1f times", n)
	}
}
