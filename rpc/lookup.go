package rpc

import (
	"context"
	"encoding/binary"
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/internal/ratelog"
	"github.com/inferencecache/inferencecache/policy"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// lookupScratch is one LookupRoute call's reusable memory, pooled by the
// Service. Nothing in a response points into it.
type lookupScratch struct {
	res engine.LookupResult
	req engine.LookupRequest
	in  lookupInput
	// Fingerprint conversion of token ids: prefix hashes, their wire bytes,
	// the [][]byte view over wire, and the per-block counts.
	sums   []uint64
	wire   []byte
	hashes [][]byte
	counts []int32
	// seed is the affinity seed (contract §3.8).
	seed []byte
}

// maxRetainedScratch bounds, in bytes, each buffer a pooled scratch keeps:
// a rare huge request (say 2^20 token ids, or a chain of 100,000 blocks)
// must not pin megabytes in the pool.
const maxRetainedScratch = 64 << 10

func (s *Service) getScratch() *lookupScratch { return s.scratch.Get().(*lookupScratch) }

// putScratch returns sc to the pool, first dropping its references to the
// request and every buffer the call grew beyond maxRetainedScratch.
func (s *Service) putScratch(sc *lookupScratch) {
	// The engine's result scratch is opaque here; it grows by at least 8
	// bytes per block of the request's chain (prefix sums, walked nodes)
	// and by one Score per replica scored.
	if len(sc.req.BlockHashes) > maxRetainedScratch/8 || oversized(sc.res.Scores) || sc.res.ScratchBytes() > 8*maxRetainedScratch {
		sc.res = engine.LookupResult{}
	}
	sc.req = engine.LookupRequest{}
	sc.in = lookupInput{}
	if oversized(sc.sums) || oversized(sc.wire) || oversized(sc.hashes) || oversized(sc.counts) || oversized(sc.seed) {
		sc.sums, sc.wire, sc.hashes, sc.counts, sc.seed = nil, nil, nil, nil, nil
	}
	s.scratch.Put(sc)
}

// oversized reports whether b's backing array exceeds maxRetainedScratch.
func oversized[T any](b []T) bool {
	var zero T
	return uintptr(cap(b))*unsafe.Sizeof(zero) > maxRetainedScratch
}

// lookupInput is the request's input after dual-input resolution (contract
// §3.6): the chain to walk (empty for an exact lookup), the exact key and
// its claimed token count, and the tokens to echo (prompt_text only).
type lookupInput struct {
	hashes     [][]byte
	counts     []int32
	exact      []byte
	exactCount int32
	echo       []uint32
	failOpen   bool
	timeout    bool
	// computed is set on the token_ids and prompt_text paths.
	computed bool
}

// LookupRoute answers which replicas hold the request's prefix, in the exact
// evaluation order of contract §2.2, with two steps of ours (4a, 11f):
//
//  1. the reserved probe tenant gets NO_HINT (metric latency 0);
//  2. the tenant's lookupTimeoutMs sets a budget from handler entry;
//  3. a caller context already done is TIMEOUT;
//  4. requireChain without a valid wire chain is POLICY_REQUIRES_CHAIN;
//     4a. an id (tenant, model, scheme, adapter) over MaxIDBytes: NO_HINT,
//     no index read;
//  5. input resolution (chain > token_ids > prompt_text); fail-open NO_HINT;
//  6. below minimumPrefixTokens with affinity disabled: NO_HINT, no lookup;
//  7. enableChainMatching=false strips the chain (done in step 5);
//  8. the index lookup;
//  9. caller deadline or budget passed: TIMEOUT;
//  10. TENANT_HOT with enableTenantHot=false: NO_HINT;
//  11. result gates: minimumPrefixTokens downgrade, matched-tokens floor,
//     routing floor, then the affinity fallback, LFU credit and the reason;
//     11f. load-aware routing's second opinion on the first replica
//     (docs/routing.md), which keeps the answer above unless loads differ.
//
// Deadlines are checked, not enforced by preemption: the index lookup is
// lock-free and bounded (microseconds), so the handler runs it inline and
// re-checks the caller's context and the budget afterwards (step 9) instead
// of paying a goroutine and a derived context per call. The answer is the
// same TIMEOUT; it can only arrive later than the deadline by the duration
// of one index lookup. Only the prompt_text path, whose tokenizer may be
// slow, runs bounded by a context.
//
// A direct call allocates its response, as the generated gRPC handler's
// path did; the server's own handler (Register) answers into pooled memory.
// It is not inlined, so the response a caller gets is on the heap whatever
// the caller does with it (the allocation tests pin that count).
//
//go:noinline
func (s *Service) LookupRoute(ctx context.Context, req *pb.LookupRouteRequest) (*pb.LookupRouteResponse, error) {
	resp := new(pb.LookupRouteResponse)
	s.lookupRoute(ctx, req, resp, nil)
	return resp, nil
}

// lookupRoute is LookupRoute answering into resp, which must be empty. With
// a nil sb the scores are allocated (two allocations, as the generated
// handler's callers expect); the codec's pooled path passes the call's own
// scoreBuf and allocates nothing.
func (s *Service) lookupRoute(ctx context.Context, req *pb.LookupRouteRequest, resp *pb.LookupRouteResponse, sb *scoreBuf) {
	start := s.now()
	tenant, model := req.GetTenantId(), req.GetModelId()

	// 1. The probe's scope is server-internal: never serve it.
	if tenant == policy.ReservedTenantID {
		s.observer.ObserveLookup(model, ReasonNoHint, false, 0)
		resp.ReasonCode = ReasonNoHint
		return
	}

	// 2. The budget is an absolute deadline from handler entry; the
	// caller's own deadline lives in ctx.
	pt := s.policies.Load().Tenant(tenant)
	var budgetEnd time.Time
	if pt.LookupTimeout > 0 {
		budgetEnd = start.Add(pt.LookupTimeout)
	}

	// 3.
	if ctx.Err() != nil {
		s.emptyResponse(resp, model, ReasonTimeout, start, nil)
		return
	}

	// 4. Checked on the wire fields, before any resolution.
	if pt.RequireChain && !validWireChain(req) {
		s.emptyResponse(resp, model, ReasonPolicyRequiresChain, start, nil)
		return
	}

	// An id over MaxIDBytes cannot be in the index (the producer RPCs
	// refuse them): NO_HINT before any work, after the checks the contract
	// ranks above it.
	if !lookupIDsFit(req) {
		if held, ok := s.oversizedLookupLog.Allow(); ok {
			s.log.Warn("lookups with an id over the limit answered NO_HINT (logged at most once a minute)",
				"limit", MaxIDBytes, "tenant", clip(req.GetTenantId()), "model", clip(model), ratelog.SuppressedKey, held)
		}
		s.emptyResponse(resp, model, ReasonNoHint, start, nil)
		return
	}

	sc := s.getScratch()
	defer s.putScratch(sc)

	// 5. (and 7.)
	in := &sc.in
	s.resolveInput(ctx, req, pt, budgetEnd, sc)
	// Only the fingerprint and tokenizer paths take measurable time; the
	// budget is re-read after them alone (step 9 covers the rest).
	if in.timeout || ctx.Err() != nil || (in.computed && expired(budgetEnd, s.now())) {
		s.emptyResponse(resp, model, ReasonTimeout, start, in.echo)
		return
	}
	if in.failOpen {
		s.emptyResponse(resp, model, ReasonNoHint, start, in.echo)
		return
	}

	// 6.
	eff := effectivePrefixTokens(in.counts, in.exactCount)
	belowMin := pt.MinimumPrefixTokens > 0 && eff < int64(pt.MinimumPrefixTokens)
	if belowMin && !pt.AffinityRouting {
		s.emptyResponse(resp, model, ReasonNoHint, start, in.echo)
		return
	}

	// 8.
	sc.req = engine.LookupRequest{
		TenantID:         tenant,
		ModelID:          model,
		HashScheme:       req.GetHashScheme(),
		AdapterID:        req.GetAdapterId(),
		PrefixHash:       in.exact,
		BlockHashes:      in.hashes,
		BlockTokenCounts: in.counts,
		SLOTTFTMs:        req.GetSlo().GetTtftMs(),
		Policy:           pt,
	}
	res := &sc.res
	s.index.LookupRoute(&sc.req, start.UnixMicro(), res)

	// 9. A result that arrives after the deadline is discarded (and
	// credits nothing).
	if ctx.Err() != nil || (!budgetEnd.IsZero() && expired(budgetEnd, s.now())) {
		s.emptyResponse(resp, model, ReasonTimeout, start, in.echo)
		return
	}

	strategy := res.Strategy
	// 10. The seed system sets StrategyNone here, which under enabled
	// affinity can still turn into AFFINITY_HINT; the documents
	// (policy-propagation.md: "tenant-hot disabled downgrades tenant-hot
	// results to NO_HINT") say NO_HINT, and we follow the documents: the
	// downgrade is final and skips the affinity fallback.
	if strategy == engine.StrategyTenantHot && !pt.EnableTenantHot {
		s.indexedResponse(resp, sb, req, model, ReasonNoHint, nil, start, in.echo)
		return
	}

	// 11a. Tiny prompts never surface a positive hint.
	if belowMin && (strategy == engine.StrategyPrefixMatch || strategy == engine.StrategyTenantHot) {
		strategy = engine.StrategyNone
	}
	if strategy == engine.StrategyNone && (res.Strategy != engine.StrategyPrefixMatch || belowMin) {
		// Only prefix matches are candidates for the load-aware ranking.
		res.Scores = res.Scores[:0]
	}
	if strategy == engine.StrategyPrefixMatch {
		// 11b. Matched-tokens floor, per replica, in place (order kept).
		if floor := pt.MinimumMatchedTokens; floor > 0 {
			kept := res.Scores[:0]
			for _, x := range res.Scores {
				if x.MatchedTokens >= floor {
					kept = append(kept, x)
				}
			}
			res.Scores = kept
			if len(kept) == 0 {
				strategy = engine.StrategyNone
			}
		}
		// 11c. Routing floor on the top survivor.
		if strategy == engine.StrategyPrefixMatch && belowFloor(pt, res.Scores) {
			strategy = engine.StrategyNone
		}
	}

	// The contract's first replica: the top score, or the affinity pin
	// (11d) on the None branch.
	var pick engine.ContractPick
	var pin string
	if strategy == engine.StrategyPrefixMatch {
		pick = engine.PickOfScore(&res.Scores[0])
	} else if strategy == engine.StrategyNone {
		pin, pick = s.affinity(req, pt, sc, engine.AffinityContract)
	}

	// Load-aware second opinion (docs/routing.md): it keeps the contract's
	// answer unless the pick is overloaded or a replica with a shorter
	// queue is cheaper. res.Scores holds the prefix candidates that passed
	// the matched-tokens floor (none below minimumPrefixTokens).
	// The prompt's size for the costs: the effective prefix tokens, at
	// least what a replica matched (a prefix-hash lookup may leave
	// prefix_token_count at 0; it only feeds the minimum-prefix gate).
	tokens := eff
	for i := range res.Scores {
		tokens = max(tokens, int64(res.Scores[i].MatchedTokens))
	}
	if pick.Has {
		switch s.index.AdviseByLoad(&sc.req, start.UnixMicro(), res, pick, tokens) {
		case engine.LoadRerank:
			strategy = engine.StrategyPrefixMatch
			if belowFloor(pt, res.Scores) {
				strategy = engine.StrategyNone
				pin, pick = s.affinity(req, pt, sc, engine.AffinityExplore)
			} else {
				pick = engine.PickOfScore(&res.Scores[0])
			}
		case engine.LoadExplore:
			strategy = engine.StrategyNone
			pin, pick = s.affinity(req, pt, sc, engine.AffinityExplore)
		case engine.LoadExpected:
			// The replica the chain was routed to holds more of it than
			// the contract's pick will by the time this request runs.
			strategy = engine.StrategyNone
			pin, pick = s.affinity(req, pt, sc, engine.AffinityExpected)
		}
	}

	// 11d. The consistent-hash fallback on the None branch.
	if strategy == engine.StrategyNone {
		if pick.Has {
			s.noteRouted(req, sc, pick, tokens, start)
			s.affinityResponse(resp, sb, req, model, pin, start, in.echo)
			return
		}
		s.indexedResponse(resp, sb, req, model, ReasonNoHint, nil, start, in.echo)
		return
	}

	// 11e. Delivered: credit LFU (prefix matches only) and answer.
	var scores []engine.Score
	switch strategy {
	case engine.StrategyPrefixMatch:
		s.index.Credit(res)
		scores = res.Scores
		s.noteRouted(req, sc, pick, tokens, start)
	case engine.StrategyTenantHot:
		scores = res.Scores
	}
	s.indexedResponse(resp, sb, req, model, strategy.String(), scores, start, in.echo)
}

// validWireChain is step 4's notion of a chain: block_hashes non-empty and
// as long as block_token_counts.
func validWireChain(req *pb.LookupRouteRequest) bool {
	n := len(req.GetBlockHashes())
	return n > 0 && n == len(req.GetBlockTokenCounts())
}

// expired reports whether a budget deadline is set and now is past it.
func expired(end, now time.Time) bool { return !end.IsZero() && now.After(end) }

// effectivePrefixTokens is contract §3.6: the sum of the resolved chain's
// counts when it is non-empty, else the exact count (prefix_token_count, or
// the token sum on the token_ids and prompt_text paths). The sum is taken in
// 64 bits so a hostile chain cannot wrap it.
func effectivePrefixTokens(counts []int32, exactCount int32) int64 {
	if len(counts) == 0 {
		return int64(exactCount)
	}
	var sum int64
	for _, c := range counts {
		sum += int64(c)
	}
	return sum
}

// resolveInput is step 5, the dual-input resolution of contract §3.6, with
// step 7 folded in (chain fields never reach the index when chain matching
// is disabled). It fills sc.in.
//
//  1. An explicit prefix_hash or chain is passed through; an unbalanced
//     chain fails open. With chain matching disabled, a set prefix_hash is
//     used alone and a chain-only request falls through to 2 and 3 (and
//     fails open if neither is set).
//  2. token_ids (at most MaxLookupTokens) are fingerprinted; fewer than one
//     block fails open.
//  3. prompt_text is tokenized, then as 2; the tokens are echoed.
func (s *Service) resolveInput(ctx context.Context, req *pb.LookupRouteRequest, pt *policy.Tenant, budgetEnd time.Time, sc *lookupScratch) {
	in := &sc.in
	bh, btc := req.GetBlockHashes(), req.GetBlockTokenCounts()
	exact := req.GetPrefixHash()
	ignoredChain := false
	if !pt.EnableChainMatching {
		if len(exact) > 0 {
			*in = lookupInput{exact: exact, exactCount: req.GetPrefixTokenCount()}
			return
		}
		if len(bh) > 0 || len(btc) > 0 {
			ignoredChain = true
			bh, btc = nil, nil
		}
	}
	if len(bh) > 0 || len(btc) > 0 || len(exact) > 0 {
		if len(bh) != len(btc) {
			in.failOpen = true
			return
		}
		*in = lookupInput{hashes: bh, counts: btc, exact: exact, exactCount: req.GetPrefixTokenCount()}
		return
	}
	if toks := req.GetTokenIds(); len(toks) > 0 {
		if len(toks) > MaxLookupTokens {
			in.failOpen = true
			return
		}
		s.fingerprintInput(toks, pt.EnableChainMatching, sc)
		return
	}
	if text := req.GetPromptText(); text != "" {
		s.tokenizeInput(ctx, req.GetModelId(), text, pt, budgetEnd, sc)
		return
	}
	if ignoredChain {
		in.failOpen = true
		return
	}
	// No input at all: an exact lookup of the empty key, which misses and
	// may still fall back to TENANT_HOT (the seed system's behavior).
	*in = lookupInput{exactCount: req.GetPrefixTokenCount()}
}

// fingerprintInput resolves token ids into the scratch chain: 8-byte
// big-endian wire hashes with blockSize tokens each; the exact key is the
// last block's hash and its count the token sum. Less than one full block
// fails open. With chain matching disabled only the exact key is kept.
func (s *Service) fingerprintInput(toks []uint32, chainOn bool, sc *lookupScratch) {
	in := &sc.in
	in.computed = true
	// Sized once: a long prompt (a 100k-token agentic request is 6,250
	// blocks of 16) would otherwise regrow each buffer a dozen times.
	blocks := len(toks) / max(s.blockSize, 1)
	sc.sums = fingerprint.AppendChain(slices.Grow(sc.sums[:0], blocks), toks, s.blockSize, 0, false)
	n := len(sc.sums)
	if n == 0 {
		in.failOpen = true
		return
	}
	wire := slices.Grow(sc.wire[:0], n*fingerprint.WireSize)
	for _, h := range sc.sums {
		wire = fingerprint.AppendWire(wire, h)
	}
	sc.wire = wire
	hashes, counts := slices.Grow(sc.hashes[:0], n), slices.Grow(sc.counts[:0], n)
	for i := 0; i < n; i++ {
		hashes = append(hashes, wire[i*fingerprint.WireSize:(i+1)*fingerprint.WireSize:(i+1)*fingerprint.WireSize])
		counts = append(counts, int32(s.blockSize))
	}
	sc.hashes, sc.counts = hashes, counts
	in.exact = hashes[n-1]
	in.exactCount = int32(min(int64(n)*int64(s.blockSize), math.MaxInt32))
	if chainOn {
		in.hashes, in.counts = hashes, counts
	}
}

// tokenizeInput is the prompt_text path. Without a tokenizer it fails open
// (counted, and logged at most once a minute). With one, tokenization runs
// bounded by the tightest of the caller's deadline, the tenant budget and,
// when neither is set, DefaultTokenizeTimeout; at most
// MaxConcurrentTokenize run at once and a busy tokenizer sheds to NO_HINT.
func (s *Service) tokenizeInput(ctx context.Context, model, text string, pt *policy.Tenant, budgetEnd time.Time, sc *lookupScratch) {
	in := &sc.in
	in.computed = true
	if len(text) > MaxPromptTextBytes || s.tokenizer == nil {
		s.promptFailedOpen(s.tokenizer == nil)
		in.failOpen = true
		return
	}
	select {
	case s.tokenizeSem <- struct{}{}:
	default:
		s.promptFailedOpen(false)
		in.failOpen = true
		return
	}
	var cancel context.CancelFunc
	switch _, has := ctx.Deadline(); {
	case !budgetEnd.IsZero():
		ctx, cancel = context.WithDeadline(ctx, budgetEnd)
	case !has:
		ctx, cancel = context.WithTimeout(ctx, s.tokTO)
	default:
		ctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	type result struct {
		toks []uint32
		err  error
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-s.tokenizeSem }()
		toks, err := s.tokenizer.Encode(ctx, model, text)
		done <- result{toks, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		in.timeout = true
		return
	}
	if ctx.Err() != nil {
		in.timeout = true
		in.echo = r.toks
		return
	}
	if r.err != nil || len(r.toks) == 0 || len(r.toks) > MaxLookupTokens {
		s.promptFailedOpen(false)
		in.failOpen = true
		return
	}
	s.fingerprintInput(r.toks, pt.EnableChainMatching, sc)
	// Echo the tokens whatever the outcome, so a tokenizer-less gateway can
	// forward exactly what was fingerprinted.
	in.echo = r.toks
}

// promptFailedOpen counts a prompt_text fail-open and logs at most once a
// minute.
func (s *Service) promptFailedOpen(noTokenizer bool) {
	n := s.promptFailOpen.Add(1)
	held, ok := s.promptLog.Allow()
	switch {
	case !ok:
	case noTokenizer:
		s.log.Warn("prompt_text lookups fail open to NO_HINT: this server has no tokenizer", "total", n, ratelog.SuppressedKey, held)
	default:
		s.log.Warn("prompt_text lookups fail open to NO_HINT (oversized, tokenizer busy or failed)", "total", n, ratelog.SuppressedKey, held)
	}
}

// affinity is step 11d: a consistent-hash pick among the replicas serving
// (tenant, model, scheme), when the tenant enables affinity routing, the
// three keys are set, the wire chain is balanced (or absent), and the
// resolved input yields a seed (contract §3.8). In AffinityExplore mode the
// walk skips overloaded and busier replicas (docs/routing.md).
func (s *Service) affinity(req *pb.LookupRouteRequest, pt *policy.Tenant, sc *lookupScratch, mode engine.AffinityMode) (string, engine.ContractPick) {
	if !pt.AffinityRouting || req.GetTenantId() == "" || req.GetModelId() == "" || req.GetHashScheme() == "" {
		return "", engine.ContractPick{}
	}
	if len(req.GetBlockHashes()) != len(req.GetBlockTokenCounts()) {
		return "", engine.ContractPick{}
	}
	seed := appendAffinitySeed(sc.seed[:0], &sc.in)
	sc.seed = seed
	if len(seed) == 0 {
		return "", engine.ContractPick{}
	}
	name, pick, ok := s.index.AffinityPick(&sc.res, req.GetTenantId(), req.GetModelId(), req.GetHashScheme(), seed, mode)
	if !ok {
		return "", engine.ContractPick{}
	}
	return name, pick
}

// belowFloor is step 11c: the routing floor, when set, on the top score.
func belowFloor(pt *policy.Tenant, scores []engine.Score) bool {
	return pt.RoutingFloorScore > 0 && scores[0].Score < pt.RoutingFloorScore
}

// noteRouted tells the index where the delivered answer sends the request
// and how much of its prompt is still to prefill there, so load-aware
// routing counts it until the replica's next load report.
//
// A caller that follows the answer (follows_answer: it sends the request to
// the first replica) also makes the chain expected there (routing-time
// entries, docs/routing.md).
func (s *Service) noteRouted(req *pb.LookupRouteRequest, sc *lookupScratch, pick engine.ContractPick, tokens int64, start time.Time) {
	res := &sc.res
	cached := s.index.RoutedCachedAt(&sc.req, res, pick, start.UnixMicro())
	s.index.NoteRouted(res, pick, tokens-cached, start.UnixMicro())
	if req.GetFollowsAnswer() {
		s.index.NoteFollowed(&sc.req, res, pick, start.UnixMicro())
	}
}

// appendAffinitySeed appends the seed of contract §3.8: for a non-empty
// resolved chain, each hash as a 4-byte big-endian length and its bytes;
// otherwise the resolved exact prefix hash; otherwise nothing.
func appendAffinitySeed(dst []byte, in *lookupInput) []byte {
	if len(in.hashes) > 0 {
		for _, h := range in.hashes {
			dst = binary.BigEndian.AppendUint32(dst, uint32(len(h)))
			dst = append(dst, h...)
		}
		return dst
	}
	return append(dst, in.exact...)
}

// emptyResponse answers before the index is consulted (TIMEOUT,
// POLICY_REQUIRES_CHAIN, input fail-open, the minimum-prefix short-circuit):
// no scores and no adapter echo.
func (s *Service) emptyResponse(resp *pb.LookupRouteResponse, model, reason string, start time.Time, echo []uint32) {
	resp.ReasonCode, resp.TokenIds = reason, echo
	s.finish(resp, model, start)
}

// indexedResponse answers after the index was consulted: ranked scores (if
// any) and the request's adapter partition echoed.
func (s *Service) indexedResponse(resp *pb.LookupRouteResponse, sb *scoreBuf, req *pb.LookupRouteRequest, model, reason string, scores []engine.Score, start time.Time, echo []uint32) {
	resp.ReasonCode, resp.TokenIds, resp.AdapterId = reason, echo, req.GetAdapterId()
	if n := len(scores); n > 0 {
		ptrs := sb.take(n)
		for i := range scores {
			v := ptrs[i]
			v.ReplicaId = scores[i].ReplicaID
			v.Score = scores[i].Score
			v.MatchedTokens = scores[i].MatchedTokens
			v.EstimatedCacheHitProb = scores[i].Prob
			v.Tier = pb.CacheTier(scores[i].Tier.Wire())
		}
		resp.ReplicaScores = ptrs
	}
	s.finish(resp, model, start)
}

// affinityResponse is AFFINITY_HINT: one replica, every score field zero.
func (s *Service) affinityResponse(resp *pb.LookupRouteResponse, sb *scoreBuf, req *pb.LookupRouteRequest, model, replica string, start time.Time, echo []uint32) {
	ptrs := sb.take(1)
	*ptrs[0] = pb.ReplicaScore{ReplicaId: replica}
	resp.ReasonCode, resp.ReplicaScores, resp.TokenIds, resp.AdapterId = ReasonAffinityHint, ptrs, echo, req.GetAdapterId()
	s.finish(resp, model, start)
}

// scoreBuf is the reusable memory of a pooled response's replica_scores:
// ptrs[i] points at vals[i] for every i below cap.
type scoreBuf struct {
	ptrs []*pb.ReplicaScore
	vals []pb.ReplicaScore
}

// take returns n score messages for the caller to fill (every field). A nil
// buffer allocates them: the pointer slice and one backing array.
func (b *scoreBuf) take(n int) []*pb.ReplicaScore {
	if b == nil || cap(b.ptrs) < n {
		ptrs := make([]*pb.ReplicaScore, n)
		vals := make([]pb.ReplicaScore, n)
		for i := range ptrs {
			ptrs[i] = &vals[i]
		}
		if b == nil {
			return ptrs
		}
		b.ptrs, b.vals = ptrs, vals
	}
	return b.ptrs[:n:n]
}

// finish stamps resp with the handler's latency and records the call. Every
// answer but the reserved tenant's goes through it exactly once, so the
// observer sees each call once, with hint_used true exactly when
// replica_scores is non-empty.
func (s *Service) finish(resp *pb.LookupRouteResponse, model string, start time.Time) {
	elapsed := s.now().Sub(start)
	resp.LookupLatencyUs = elapsed.Microseconds()
	s.observer.ObserveLookup(model, resp.ReasonCode, len(resp.ReplicaScores) > 0, elapsed)
}
