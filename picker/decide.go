package picker

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"time"

	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/picker/request"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// candidate is one endpoint of the destination list and the prefix
// tokens the lookup said it holds.
type candidate struct {
	ep      endpoints.Endpoint
	matched int32
}

// decision is one request's pick. Its slices are reused by the pooled
// stream.
type decision struct {
	// cands[:n] is the destination list, primary first.
	cands []candidate
	n     int
	// scored are the lookup's ranked replicas mapped to endpoints,
	// eligible or not, for the predicted cached tokens of whichever
	// endpoint serves.
	scored []candidate
	// eligible is the subset-filtered candidate set (unused without a
	// subset hint: the pool's endpoints are).
	eligible []endpoints.Endpoint
	dest     string
	// prefill is the prefill endpoint of a disaggregated pick ("" for
	// none); pd says the pick was made in P/D mode (the prefill header is
	// then set or removed).
	prefill string
	pd      bool
	buf     []byte
	tenant  string
	model   string
	outcome string
	reason  string

	lreq  pb.LookupRouteRequest
	pdreq pb.LookupPDRouteRequest
}

// reset empties d, keeping its buffers.
func (d *decision) reset() {
	d.cands, d.n, d.scored, d.eligible, d.buf = d.cands[:0], 0, d.scored[:0], d.eligible[:0], d.buf[:0]
	d.dest, d.tenant, d.model, d.outcome, d.reason = "", "", "", "", ""
	d.prefill, d.pd = "", false
	d.lreq.Reset()
	d.pdreq.Reset()
}

// matchedAt is the lookup's matched tokens for an endpoint address.
func (d *decision) matchedAt(addr string) int32 {
	for _, c := range d.scored {
		if c.ep.Address == addr {
			return c.matched
		}
	}
	return 0
}

func (d *decision) has(addr string) bool {
	for _, c := range d.cands[:d.n] {
		if c.ep.Address == addr {
			return true
		}
	}
	return false
}

// decide picks the endpoints of one request into s.d, or returns the
// ImmediateResponse to answer instead. body is the whole request body,
// nil when there is none to read (noBody names why).
func (p *Picker) decide(s *stream, body []byte, noBody string) *immediateResponse {
	start := p.now()
	d := s.d
	pool := p.src.Pool()
	if pool.Len() == 0 {
		p.obs.Picked(Outcome503, ReasonNoEndpoints, p.now().Sub(start))
		return &immediateResponse{503, ReasonNoEndpoints, "the endpoint picker knows no endpoints of this pool"}
	}
	eligible := pool.Endpoints
	if s.hasSubset {
		d.eligible = d.eligible[:0]
		for _, a := range s.subset {
			if ep, ok := pool.ByAddress(a); ok && !containsAddr(d.eligible, ep.Address) {
				d.eligible = append(d.eligible, ep)
			}
		}
		if len(d.eligible) == 0 {
			p.obs.Picked(Outcome503, ReasonEmptySubset, p.now().Sub(start))
			return &immediateResponse{503, ReasonEmptySubset, "no endpoint of the gateway's subset hint is in the pool"}
		}
		eligible = d.eligible
	}
	d.tenant = pool.Tenant
	d.n, d.scored, d.model = 0, d.scored[:0], ""
	d.prefill, d.pd = "", p.pd != nil
	maxN := 1 + p.maxFallbacks

	reason := noBody
	var resp *pb.LookupRouteResponse
	tieKey := fnv64(s.path, 0)
	if body != nil {
		r, err := request.Parse(s.path, body)
		switch {
		case errors.Is(err, request.ErrNotJSON):
			p.obs.Picked(Outcome400, ReasonNotJSON, p.now().Sub(start))
			return &immediateResponse{400, ReasonNotJSON, "the request body is not a JSON object"}
		case err != nil:
			reason = ReasonUnrecognized
			if r != nil && r.Model != "" {
				d.model = pool.Resolve(r.Model).ModelID
			}
		default:
			m := pool.Resolve(r.Model)
			d.model = m.ModelID
			tieKey = conversationKey(r)
			var toks []uint32
			toks, reason = p.tokens(s.ctx, m.ModelID, r)
			if reason == "" && p.pd != nil {
				if pdReason := p.pickPD(s.ctx, d, pool, m, toks, eligible, s.hasSubset); pdReason != "" {
					return p.decided(d, OutcomePD, pdReason, start)
				}
			}
			if reason == "" {
				resp = p.lookupTokens(s.ctx, d, pool, m, toks, !s.hasSubset)
			}
		}
	}

	outcome := OutcomeFallback
	if resp != nil {
		switch resp.GetReasonCode() {
		case rpc.ReasonPrefixMatch:
			outcome = OutcomePrefix
		case rpc.ReasonTenantHot:
			outcome = OutcomeTenantHot
		case rpc.ReasonAffinityHint:
			outcome = OutcomeAffinity
		case rpc.ReasonTimeout:
			reason = ReasonTimeout
		default:
			reason = ReasonNoHint
		}
		for _, sc := range resp.GetReplicaScores() {
			ep, ok := pool.ByReplica(sc.GetReplicaId())
			if !ok {
				continue
			}
			c := candidate{ep: ep, matched: sc.GetMatchedTokens()}
			d.scored = append(d.scored, c)
			if d.n < maxN && (!s.hasSubset || containsAddr(eligible, ep.Address)) && !d.has(ep.Address) {
				d.add(c)
			}
		}
		if outcome != OutcomeFallback && d.n == 0 {
			outcome, reason = OutcomeFallback, ReasonUnknownReplicas
		}
	}
	if outcome != OutcomeFallback {
		reason = ReasonNone
	}
	// Fill the list (or pick outright) by least load.
	for d.n < maxN {
		ep, ok := p.leastLoaded(eligible, d, tieKey)
		if !ok {
			break
		}
		d.add(candidate{ep: ep})
	}
	return p.decided(d, outcome, reason, start)
}

// decided writes d's destination list and records the pick.
func (p *Picker) decided(d *decision, outcome, reason string, start time.Time) *immediateResponse {
	d.outcome, d.reason = outcome, reason
	d.buf = d.buf[:0]
	for i, c := range d.cands[:d.n] {
		if i > 0 {
			d.buf = append(d.buf, ',')
		}
		d.buf = append(d.buf, c.ep.Address...)
	}
	d.dest = string(d.buf)
	p.obs.Picked(outcome, reason, p.now().Sub(start))
	return nil
}

func (d *decision) add(c candidate) {
	if d.n < len(d.cands) {
		d.cands[d.n] = c
	} else {
		d.cands = append(d.cands, c)
	}
	d.n++
}

// leastLoaded returns the eligible endpoint not yet in the list with the
// fewest requests in flight. Ties go to the highest rendezvous hash of the
// request's conversation key and the address: deterministic (every picker
// of an active-active set agrees), the same endpoint for every turn of a
// conversation while loads tie (so its later turns find their prefix even
// without a tokenizer), spread evenly over conversations, and stable when
// endpoints come and go.
func (p *Picker) leastLoaded(eligible []endpoints.Endpoint, d *decision, key uint64) (endpoints.Endpoint, bool) {
	var best endpoints.Endpoint
	var bestLoad int64
	var bestHash uint64
	found := false
	for _, ep := range eligible {
		if d.has(ep.Address) {
			continue
		}
		load := p.inflight.load(ep.Address)
		hh := mix(key ^ fnv64(ep.Address, 0))
		if !found || load < bestLoad || (load == bestLoad && hh > bestHash) {
			best, bestLoad, bestHash, found = ep, load, hh, true
		}
	}
	return best, found
}

// tokens returns the request's token ids, or the fallback reason.
func (p *Picker) tokens(ctx context.Context, modelID string, r *request.Request) ([]uint32, string) {
	if r.HasPromptTokens {
		if len(r.PromptTokens) == 0 {
			return nil, ReasonUnrecognized
		}
		return r.PromptTokens, ""
	}
	if p.tok == nil {
		return nil, ReasonNoTokenizer
	}
	// One deadline covers the wait for a slot and the tokenization: a
	// burst queues briefly (a 2k-token request tokenizes in about 0.1 ms)
	// instead of being misrouted, and only a tokenizer that stays saturated
	// for the whole timeout sheds to the fallback.
	ctx, cancel := context.WithTimeout(ctx, p.tokTimeout)
	defer cancel()
	select {
	case p.tokenizeSem <- struct{}{}:
	default:
		select {
		case p.tokenizeSem <- struct{}{}:
		case <-ctx.Done():
			return nil, ReasonTokenizerBusy
		}
	}
	defer func() { <-p.tokenizeSem }()
	start := p.now()
	toks, err := p.tok.RequestTokens(ctx, modelID, r)
	if err != nil || len(toks) == 0 {
		if err == nil {
			err = errors.New("no tokens")
		}
		p.rateLimitedWarn("cannot tokenize a request; picking the least-loaded endpoint", "model", clip(modelID), "err", err)
		return nil, ReasonTokenizeFailed
	}
	p.obs.Tokenized(p.now().Sub(start))
	return toks, ""
}

// lookupTokens asks the index in process, as a gateway's LookupRoute with
// token_ids would. follows says the picker will send the request to the
// answer's first replica (it does unless the gateway's subset hint may
// exclude it), which lets the server expect the prompt there until the
// replica's KV events store it (follows_answer; docs/routing.md,
// "Routing-time entries").
func (p *Picker) lookupTokens(ctx context.Context, d *decision, pool *endpoints.Pool, m endpoints.Model, toks []uint32, follows bool) *pb.LookupRouteResponse {
	if len(toks) > rpc.MaxLookupTokens {
		// The index reads the first MaxLookupTokens tokens' worth of
		// prefix no differently; a longer prompt is fingerprinted on its
		// head (the lookup fails open on more).
		toks = toks[:rpc.MaxLookupTokens]
	}
	q := &d.lreq
	q.Reset()
	q.TenantId, q.ModelId, q.AdapterId, q.HashScheme, q.TokenIds = pool.Tenant, m.ModelID, m.AdapterID, pool.HashScheme, toks
	q.FollowsAnswer = follows
	resp, err := p.lookup.LookupRoute(ctx, q)
	q.TokenIds = nil
	if err != nil {
		return nil
	}
	return resp
}

// conversationKey identifies a conversation across its turns: a hash of
// the model and the head of the first message (or of the completion
// prompt).
func conversationKey(r *request.Request) uint64 {
	const head = 512
	h := fnv64(r.Model, 0)
	switch {
	case len(r.Messages) > 0:
		raw := r.Messages[0].Raw
		h = fnv64b(raw[:min(len(raw), head)], h)
	case r.Prompt != "":
		h = fnv64(r.Prompt[:min(len(r.Prompt), head)], h)
	}
	return h
}

func containsAddr(eps []endpoints.Endpoint, addr string) bool {
	for _, ep := range eps {
		if ep.Address == addr {
			return true
		}
	}
	return false
}

// canonicalAddr writes an ip:port as the pool does (netip's form), so a
// gateway's "[::1]:8000" or zero-padded form matches.
func canonicalAddr(a string) string {
	ap, err := netip.ParseAddrPort(strings.TrimSpace(a))
	if err != nil {
		return a
	}
	if s := ap.String(); s != a {
		return s
	}
	return a
}

// fnv64 is FNV-1a over s, continuing from seed (0: a fresh hash): a
// fixed hash, the same in every process.
func fnv64(s string, seed uint64) uint64 {
	h := seed
	if h == 0 {
		h = 14695981039346656037
	}
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

func fnv64b(b []byte, seed uint64) uint64 {
	h := seed
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// mix is a 64-bit finalizer (splitmix64), so rendezvous scores of nearby
// keys are independent.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

func clip(s string) string {
	if len(s) > 128 {
		return s[:128]
	}
	return s
}
