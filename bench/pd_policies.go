package bench

import (
	"context"
	"fmt"

	"github.com/inferencecache/inferencecache/bench/workload"
	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// P/D policies. The baselines share one replica choice, so that what they
// compare is the rule deciding whether to take the prefill hop: the
// prefill replica with the least queued prefill work plus uncached prompt
// (exact loads, cache from the KV events), the decode replica with the
// fewest requests, ties to the one caching more of the prompt. Their rules:
//
//   - always-disaggregate: every request takes the hop;
//   - llm-d threshold (the prefix-based P/D decider): the hop when the
//     prompt tokens the decode replica does not cache reach nonCachedTokens
//     (128 here, the value llm-d's guides configure; its default, 0, turns
//     disaggregation off);
//   - Dynamo bypass (conditional disaggregation): the hop when the prompt
//     less its prefix hit on the decode worker exceeds 2,048 tokens.
//
// inferencecache is the server: the production LookupPDRoute handler
// (rpc.Service) over an engine fed with both pools' KV events, the
// subscribers' refresh of held blocks, and each replica's load report (as
// the kvevent subscriber scrapes it: DefaultStatsInterval, delivered
// DefaultStatsLag late, counts only).

// PDEngineName names the inferencecache rows.
const PDEngineName = "inferencecache"

// DefaultPDPolicies returns the server at its default threshold and the
// three baselines.
func DefaultPDPolicies() []PDPolicy {
	return []PDPolicy{
		PDEnginePolicy(policy.DefaultSkipPrefillBelowTokens, false),
		PDEnginePolicy(policy.DefaultSkipPrefillBelowTokens, true),
		PDAlwaysPolicy(),
		PDThresholdPolicy("llm-d threshold (128)", 128),
		PDThresholdPolicy("Dynamo bypass (2048)", 2048),
	}
}

// PDSweep is the default set of other thresholds the P/D report runs the
// server at (cmd/bench pd -sweep).
var PDSweep = []int32{0, 256, 1024, 2048}

// PDPoliciesWithSweep is DefaultPDPolicies followed by the server at each
// threshold of sweep (both load-report variants), the default skipped.
func PDPoliciesWithSweep(sweep []int32) []PDPolicy {
	ps := DefaultPDPolicies()
	for _, t := range sweep {
		if t != policy.DefaultSkipPrefillBelowTokens {
			ps = append(ps, PDEnginePolicy(t, false), PDEnginePolicy(t, true))
		}
	}
	return ps
}

// pdBaseline is the shared replica choice of the baselines.
type pdBaseline struct {
	name string
	idx  *PrefixIndex
	// rule reports whether to take the prefill hop for uncached tokens on
	// the decode replica (prompt less its cached prefix).
	rule    func(uncached int) bool
	prefill int
	scratch []int
}

func (b *pdBaseline) Name() string      { return b.name }
func (b *pdBaseline) Observe(ev *Event) { b.idx.Apply(ev) }

func (b *pdBaseline) Route(req *workload.Request, v *PDView) PDRoute {
	b.scratch = b.idx.Overlaps(req.Blocks, b.scratch[:0])
	ov := b.scratch // cached blocks per replica
	dec := 0
	for i := range v.Decode {
		li, lb := v.Decode[i].InFlight(), v.Decode[dec].InFlight()
		if li < lb || (li == lb && ov[b.prefill+i] > ov[b.prefill+dec]) {
			dec = i
		}
	}
	uncached := req.InputTokens - req.PrefixTokens(ov[b.prefill+dec])
	if !b.rule(uncached) {
		return PDRoute{Prefill: -1, Decode: dec}
	}
	pre, best := 0, 0
	for i := range v.Prefill {
		c := v.Prefill[i].PendingPrefillTokens + req.InputTokens - req.PrefixTokens(ov[i])
		if i == 0 || c < best {
			pre, best = i, c
		}
	}
	return PDRoute{Prefill: pre, Decode: dec}
}

func newPDBaseline(name string, cfg PDConfig, rule func(int) bool) *pdBaseline {
	return &pdBaseline{name: name, idx: NewPrefixIndex(cfg.Prefill + cfg.Decode), rule: rule, prefill: cfg.Prefill}
}

// PDAlwaysPolicy takes the prefill hop for every request.
func PDAlwaysPolicy() PDPolicy {
	const name = "always disaggregate"
	return PDPolicy{Name: name, New: func(cfg PDConfig) PDRouter {
		return newPDBaseline(name, cfg, func(int) bool { return true })
	}}
}

// PDThresholdPolicy takes the hop when at least threshold prompt tokens
// are uncached on the decode replica (llm-d's rule; Dynamo's, which
// compares with >, differs by one token, immaterial here).
func PDThresholdPolicy(name string, threshold int) PDPolicy {
	return PDPolicy{Name: name, New: func(cfg PDConfig) PDRouter {
		return newPDBaseline(name, cfg, func(u int) bool { return u >= threshold })
	}}
}

// PDEnginePolicy is the server with skipPrefillBelowTokens skip. With
// queuedTokens the load reports also carry each replica's queued prefill
// tokens (an engine or exporter that publishes them,
// --engine-queued-tokens-metric); without, counts only, as stock vLLM and
// SGLang metrics give, and the server estimates the queues.
func PDEnginePolicy(skip int32, queuedTokens bool) PDPolicy {
	name := fmt.Sprintf("%s, skip below %d", PDEngineName, skip)
	if queuedTokens {
		name += ", queued tokens reported"
	}
	return PDPolicy{Name: name, New: func(cfg PDConfig) PDRouter { return newPDEngineRouter(name, cfg, skip, queuedTokens) }}
}

type pdEngineRouter struct {
	*engineRouter
	prefill int
	req     pb.LookupPDRouteRequest
}

const pdTopologyRef = "bench/pd"

func newPDEngineRouter(name string, cfg PDConfig, skip int32, queuedTokens bool) *pdEngineRouter {
	r := &pdEngineRouter{engineRouter: newEngineRouter(cfg.Prefill+cfg.Decode, engine.DefaultLoadConfig()), prefill: cfg.Prefill}
	r.name, r.statsEvery, r.statsLag, r.refresh = name, DefaultStatsInterval, DefaultStatsLag, DefaultRefresh
	r.queuedTokens = queuedTokens
	r.store.Apply(&policy.Body{Version: policy.PropagationVersion, PDTopologies: []policy.PDTopology{{
		Namespace: engineTenant, Name: "pd", PrefillPools: []policy.PDPool{{Name: "prefill"}}, DecodePools: []policy.PDPool{{Name: "decode"}},
		Transport: policy.TransportNIXL, SkipPrefillBelowTokens: &skip,
	}}})
	// Each replica's subscriber reports its role (--role, --pd-pool).
	for i, n := range r.names {
		role, pool := engine.RolePrefill, "prefill"
		if i >= cfg.Prefill {
			role, pool = engine.RoleDecode, "decode"
		}
		r.eng.Ingest(&engine.Update{ReplicaID: n, TenantID: engineTenant, ModelID: engineModel, HashScheme: engineScheme,
			TimestampUs: r.micros(), Placement: &engine.Placement{Role: role, Pool: pool}, Stats: &engine.ReplicaStats{}}, r.micros())
	}
	return r
}

// Tick reports every replica's load, as the subscribers' scrapes do.
func (r *pdEngineRouter) Tick(v *PDView) {
	for i, l := range v.Prefill {
		r.pending = append(r.pending, statsSample{at: v.Now, deliver: v.Now + r.statsLag, replica: i, load: l})
	}
	for i, l := range v.Decode {
		r.pending = append(r.pending, statsSample{at: v.Now, deliver: v.Now + r.statsLag, replica: r.prefill + i, load: l})
	}
}

func (r *pdEngineRouter) Route(req *workload.Request, v *PDView) PDRoute {
	r.deliverStats(v.Now)
	r.now = v.Now
	r.refreshHeld(&View{Now: v.Now})
	full := len(req.Blocks)
	if last := req.InputTokens - req.BlockSize*(len(req.Blocks)-1); len(req.Blocks) > 0 && last < req.BlockSize {
		full--
	}
	buf := r.hashBuf[:0]
	r.hashes, r.counts = r.hashes[:0], r.counts[:0]
	for _, id := range req.Blocks[:max(full, 0)] {
		buf = blockHash(buf, id)
		r.counts = append(r.counts, int32(req.BlockSize))
	}
	for k := range r.counts {
		r.hashes = append(r.hashes, buf[8*k:8*k+8])
	}
	r.hashBuf = buf
	r.req = pb.LookupPDRouteRequest{ModelId: engineModel, TenantId: engineTenant, HashScheme: engineScheme, PdTopologyRef: pdTopologyRef,
		BlockHashes: r.hashes, BlockTokenCounts: r.counts, PrefixTokenCount: int32(req.InputTokens)}
	resp, err := r.svc.LookupPDRoute(context.Background(), &r.req)
	if err != nil {
		panic("BUG: LookupPDRoute: " + err.Error())
	}
	dec, ok := r.byID[resp.GetDecodeReplicaId()]
	if !ok || dec < r.prefill {
		// No decode replica known yet (nothing reported): the least loaded.
		d := 0
		for i := range v.Decode {
			if v.Decode[i].InFlight() < v.Decode[d].InFlight() {
				d = i
			}
		}
		return PDRoute{Prefill: -1, Decode: d}
	}
	route := PDRoute{Prefill: -1, Decode: dec - r.prefill}
	if resp.GetReasonCode() == rpc.ReasonPDDisaggregated {
		if p, ok := r.byID[resp.GetPrefillReplicaId()]; ok && p < r.prefill {
			route.Prefill = p
		}
	}
	return route
}

var _ PDTicker = (*pdEngineRouter)(nil)
