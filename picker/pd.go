package picker

import (
	"context"

	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Disaggregated prefill/decode (docs/pd.md). With Config.PD set, the pool
// is a P/D pool: each request's pick is LookupPDRoute's, in process, and
// the answer follows llm-d's routing-sidecar protocol: the destination is
// the decode endpoint (no fallbacks: another endpoint may be a prefill-only
// one), and PrefillHeader names the prefill endpoint when the prefill hop
// runs; the decode pod's sidecar reads it, has the prefill endpoint compute
// the prompt and pulls its KV cache. When the hop is skipped the header is
// removed, so a client cannot force one. When LookupPDRoute has no pick
// (no decode replica, unknown topology, no tokens) the request is picked
// as in an aggregated pool, with the header removed too.

// PrefillHeader names the prefill endpoint ("ip:port") of a disaggregated
// request.
const PrefillHeader = "x-prefiller-host-port"

// PDLookuper answers a LookupPDRoute in process: *rpc.Service.
type PDLookuper interface {
	LookupPDRoute(ctx context.Context, req *pb.LookupPDRouteRequest) (*pb.LookupPDRouteResponse, error)
}

// PDConfig turns the P/D pick on for the picker's pool.
type PDConfig struct {
	// Lookup answers LookupPDRoute. Required.
	Lookup PDLookuper
	// Topology is the pool's PDTopology, "namespace/name" (or "name" in
	// the pool's tenant namespace; empty: that namespace's only one).
	Topology string
}

// Outcome and reasons of a P/D pick (Observer.Picked).
const (
	OutcomePD = "pd"
	// ReasonPDDisaggregated: decode endpoint, prefill endpoint in
	// PrefillHeader.
	ReasonPDDisaggregated = "disaggregated"
	// ReasonPDPrefillSkipped: decode endpoint alone (the uncached part is
	// small, the prefill pool is backlogged, or no prefill replica is
	// live).
	ReasonPDPrefillSkipped = "prefill_skipped"
	// ReasonPDUnmappedPrefill: the prefill replica is no endpoint of the
	// pool; the decode endpoint alone.
	ReasonPDUnmappedPrefill = "unmapped_prefill"
)

// pdPicks are the P/D (outcome, reason) pairs, listed in Picks.
var pdPicks = [][2]string{
	{OutcomePD, ReasonPDDisaggregated}, {OutcomePD, ReasonPDPrefillSkipped}, {OutcomePD, ReasonPDUnmappedPrefill},
}

// pickPD asks LookupPDRoute for the request's tokens and, when it names a
// decode replica that is an eligible endpoint, fills d with it (and the
// prefill endpoint) and returns the pick's reason. "" means no P/D pick:
// the caller picks as in an aggregated pool.
func (p *Picker) pickPD(ctx context.Context, d *decision, pool *endpoints.Pool, m endpoints.Model, toks []uint32, eligible []endpoints.Endpoint, subset bool) string {
	if len(toks) > rpc.MaxLookupTokens {
		toks = toks[:rpc.MaxLookupTokens]
	}
	q := &d.pdreq
	q.Reset()
	q.TenantId, q.ModelId, q.AdapterId, q.HashScheme, q.TokenIds = pool.Tenant, m.ModelID, m.AdapterID, pool.HashScheme, toks
	q.PdTopologyRef = p.pd.Topology
	resp, err := p.pd.Lookup.LookupPDRoute(ctx, q)
	q.TokenIds = nil
	if err != nil {
		return ""
	}
	switch resp.GetReasonCode() {
	case rpc.ReasonPDDisaggregated, rpc.ReasonPDPrefillSkipped, rpc.ReasonNoPrefillPool:
	default:
		return ""
	}
	dec, ok := pool.ByReplica(resp.GetDecodeReplicaId())
	if !ok || (subset && !containsAddr(eligible, dec.Address)) {
		return ""
	}
	d.add(candidate{ep: dec, matched: resp.GetDecodeMatchedTokens()})
	d.scored = append(d.scored, candidate{ep: dec, matched: resp.GetDecodeMatchedTokens()})
	if resp.GetReasonCode() != rpc.ReasonPDDisaggregated {
		return ReasonPDPrefillSkipped
	}
	pre, ok := pool.ByReplica(resp.GetPrefillReplicaId())
	if !ok {
		return ReasonPDUnmappedPrefill
	}
	d.prefill = pre.Address
	return ReasonPDDisaggregated
}
