package rpc

import (
	"context"
	"sync"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Reason codes of LookupPDRoute (docs/pd.md). Clients read a code they do
// not know as NO_HINT.
const (
	// ReasonPDDisaggregated: prefill_replica_id computes the prompt and
	// decode_replica_id generates from the transferred KV cache.
	ReasonPDDisaggregated = "PD_DISAGGREGATED"
	// ReasonPDPrefillSkipped: decode_replica_id does both; the part of
	// the prompt it would compute is small, or the prefill pool is
	// backlogged. prefill_replica_id is empty.
	ReasonPDPrefillSkipped = "PD_PREFILL_SKIPPED"
	// ReasonNoPrefillPool: no live replica of the topology's prefill
	// pools; decode_replica_id is set, to run the request there alone.
	ReasonNoPrefillPool = "NO_PREFILL_POOL"
	// ReasonNoDecodePool: no live replica of its decode pools; nothing
	// is set.
	ReasonNoDecodePool = "NO_DECODE_POOL"
	// ReasonUnknownTopology: pd_topology_ref names no PDTopology the
	// controller pushed (or it is empty and the tenant's namespace has
	// none, or several).
	ReasonUnknownTopology = "UNKNOWN_TOPOLOGY"
)

// PDReasons lists every LookupPDRoute reason code, for metrics.
var PDReasons = []string{ReasonPDDisaggregated, ReasonPDPrefillSkipped, ReasonNoPrefillPool, ReasonNoDecodePool,
	ReasonUnknownTopology, ReasonNoHint, ReasonTimeout}

// pdScratch is one LookupPDRoute call's reusable memory.
type pdScratch struct {
	lookup lookupScratch
	req    engine.PDRequest
	res    engine.PDResult
}

var pdScratches = sync.Pool{New: func() any { return new(pdScratch) }}

// LookupPDRoute picks the replicas of a disaggregated request (docs/pd.md),
// in this order:
//
//  1. the reserved probe tenant, an id over MaxIDBytes, or an empty tenant
//     or model: NO_HINT;
//  2. a caller context already done: TIMEOUT;
//  3. the PDTopology (pd_topology_ref, resolved in the tenant's namespace)
//     unknown: UNKNOWN_TOPOLOGY;
//  4. the prompt's prefix resolved as LookupRoute resolves it (chain >
//     token_ids > prefix_hash; an unbalanced chain or oversized token_ids
//     is NO_HINT); its length is prefix_token_count when set, else the
//     chain's or the tokens' sum;
//  5. engine.PickPD: PD_DISAGGREGATED, PD_PREFILL_SKIPPED,
//     NO_PREFILL_POOL or NO_DECODE_POOL; transport_hint is the topology's
//     transport on PD_DISAGGREGATED;
//  6. the caller's deadline passed meanwhile: TIMEOUT (nothing counted).
//
// A delivered pick counts as routed for load-aware routing: one request on
// each named replica, and the uncached tokens on the one that prefills. The
// pick reads the index without locks and allocates only the response.
func (s *Service) LookupPDRoute(ctx context.Context, req *pb.LookupPDRouteRequest) (*pb.LookupPDRouteResponse, error) {
	start := s.now()
	resp := new(pb.LookupPDRouteResponse)
	resp.ReasonCode = s.lookupPD(ctx, req, resp)
	elapsed := s.now().Sub(start)
	resp.LookupLatencyUs = elapsed.Microseconds()
	s.features.ObservePDRoute(resp.ReasonCode, elapsed)
	return resp, nil
}

func (s *Service) lookupPD(ctx context.Context, req *pb.LookupPDRouteRequest, resp *pb.LookupPDRouteResponse) string {
	tenant, model := req.GetTenantId(), req.GetModelId()
	switch {
	case tenant == policy.ReservedTenantID, tenant == "", model == "",
		len(tenant) > MaxIDBytes, len(model) > MaxIDBytes, len(req.GetHashScheme()) > MaxIDBytes,
		len(req.GetAdapterId()) > MaxIDBytes, len(req.GetPdTopologyRef()) > 2*MaxIDBytes:
		return ReasonNoHint
	case ctx.Err() != nil:
		return ReasonTimeout
	}
	snap := s.policies.Load()
	top := snap.Topology(req.GetPdTopologyRef(), tenant)
	if top == nil {
		return ReasonUnknownTopology
	}
	pt := snap.Tenant(tenant)

	sc := pdScratches.Get().(*pdScratch)
	defer func() {
		sc.req = engine.PDRequest{}
		sc.lookup.in = lookupInput{}
		sc.lookup.req = engine.LookupRequest{}
		if oversized(sc.lookup.sums) || oversized(sc.lookup.wire) || oversized(sc.lookup.hashes) || oversized(sc.lookup.counts) {
			sc.lookup.sums, sc.lookup.wire, sc.lookup.hashes, sc.lookup.counts = nil, nil, nil, nil
		}
		pdScratches.Put(sc)
	}()
	in := &sc.lookup.in
	bh, btc := req.GetBlockHashes(), req.GetBlockTokenCounts()
	switch {
	case len(bh) > 0 || len(btc) > 0:
		if len(bh) != len(btc) {
			return ReasonNoHint
		}
		*in = lookupInput{hashes: bh, counts: btc, exact: req.GetPrefixHash()}
		if !pt.EnableChainMatching {
			in.hashes, in.counts = nil, nil
		}
	case len(req.GetTokenIds()) > 0:
		if len(req.GetTokenIds()) > MaxLookupTokens {
			return ReasonNoHint
		}
		s.fingerprintInput(req.GetTokenIds(), pt.EnableChainMatching, &sc.lookup)
		if in.failOpen {
			*in = lookupInput{} // shorter than a block: no prefix credit, still routable
		}
	default:
		*in = lookupInput{exact: req.GetPrefixHash()}
	}
	tokens := int64(req.GetPrefixTokenCount())
	if tokens <= 0 {
		switch {
		case len(bh) > 0:
			tokens = effectivePrefixTokensOf(btc)
		default:
			tokens = int64(len(req.GetTokenIds()))
		}
	}
	sc.req = engine.PDRequest{
		Lookup: engine.LookupRequest{
			TenantID: tenant, ModelID: model, HashScheme: req.GetHashScheme(), AdapterID: req.GetAdapterId(),
			PrefixHash: in.exact, BlockHashes: in.hashes, BlockTokenCounts: in.counts, Policy: pt,
		},
		Tokens:   tokens,
		Topology: top,
	}
	now := s.now().UnixMicro()
	res := &sc.res
	s.index.PickPD(&sc.req, now, res)
	if ctx.Err() != nil {
		return ReasonTimeout
	}
	resp.DecodeReplicaId, resp.DecodeMatchedTokens = res.Decode, res.DecodeMatched
	resp.UncachedTokens = clampInt32(res.Uncached)
	var reason string
	switch res.Outcome {
	case engine.PDDisaggregated:
		resp.PrefillReplicaId, resp.PrefillMatchedTokens = res.Prefill, res.PrefillMatched
		resp.TransportHint = top.Transport
		reason = ReasonPDDisaggregated
	case engine.PDPrefillSkipped:
		reason = ReasonPDPrefillSkipped
	case engine.PDNoPrefillPool:
		reason = ReasonNoPrefillPool
	default:
		resp.DecodeReplicaId, resp.DecodeMatchedTokens, resp.UncachedTokens = "", 0, 0
		return ReasonNoDecodePool
	}
	s.index.NotePDRouted(res, now)
	return reason
}

// effectivePrefixTokensOf sums a chain's counts in 64 bits (negative
// counts as 0).
func effectivePrefixTokensOf(counts []int32) int64 {
	var sum int64
	for _, c := range counts {
		sum += int64(max(c, 0))
	}
	return sum
}

func clampInt32(v int64) int32 {
	return int32(min(max(v, 0), 1<<31-1))
}
