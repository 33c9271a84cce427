package rpc

import (
	"context"
	"fmt"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/prompttemplate"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Reason codes of RenderTemplate beyond ReasonOK. Clients read a code they
// do not know as RENDER_ERROR.
const (
	ReasonTemplateNotFound = "TEMPLATE_NOT_FOUND"
	ReasonRenderError      = "RENDER_ERROR"
)

// RenderReasons lists every RenderTemplate reason code, for metrics.
var RenderReasons = []string{ReasonOK, ReasonTemplateNotFound, ReasonRenderError}

// TemplateTokenizer tokenizes a rendered template for a model the way the
// engine tokenizes a completion prompt (a /v1/completions "prompt", special
// tokens added as the engine adds them). The server wires it from
// --tokenizer-dir (tokenizer/modeldir); an error (no tokenizer for the
// model) makes RenderTemplate hash the text instead.
type TemplateTokenizer interface {
	EncodePrompt(ctx context.Context, model, text string) ([]uint32, error)
}

// templateCache holds compiled templates by "namespace/name", each with the
// revision it was compiled at; a pushed template with another revision is
// compiled again. Entries the current snapshot no longer has are pruned
// when the snapshot generation changes.
type templateCache struct {
	// mu guards m and gen.
	mu  sync.Mutex
	m   map[string]*prompttemplate.Template
	gen uint64
}

// get returns the compiled form of tp (from snapshot snap).
func (c *templateCache) get(snap *policy.Snapshot, tp *policy.Template) (*prompttemplate.Template, error) {
	key := policy.Ref(tp.Namespace, tp.Name)
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]*prompttemplate.Template{}
	}
	if g := snap.Generation(); g != c.gen {
		c.gen = g
		for k, v := range c.m {
			if cur := snap.Template(k, ""); cur == nil || cur.Revision != v.Revision() {
				delete(c.m, k)
			}
		}
	}
	ct, ok := c.m[key]
	c.mu.Unlock()
	if ok && ct.Revision() == tp.Revision {
		return ct, nil
	}
	ct, err := prompttemplate.Compile(tp)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.m[key] = ct
	c.mu.Unlock()
	return ct, nil
}

// RenderTemplate renders a PromptTemplate the controller pushed (docs/wire.md):
//
//   - template_ref "namespace/name" (or "name" in tenant_id's namespace)
//     naming no template: TEMPLATE_NOT_FOUND;
//   - a missing required slot, a variable that is no slot, a value that is
//     not UTF-8 text, an error the template raises, a body that does not
//     compile, or a caller deadline already past: RENDER_ERROR, with the
//     cause in message;
//   - otherwise OK with rendered_prompt, template_revision
//     (status.templateRevision), tenant_namespace (the template's
//     namespace) and stable_prefix_hash: with a tokenizer for model_id, the
//     block hash (8 bytes, the fingerprint the index keys on, at the
//     server's block size) of the last whole block of the rendering's
//     tokens that the Stable slots alone decide, with
//     stable_prefix_tokens and the rendering's token_ids; without one, the
//     XXH3-64 (seed 1337, 8 bytes big-endian) of the stable part's text,
//     which identifies it but matches no engine key. An empty stable part
//     (or one shorter than a block) has no hash.
//
// A gateway that looks up with the hash as prefix_hash (hash_scheme of its
// engines) gets PREFIX_MATCH from any replica that cached a prompt sharing
// the stable part, since producers report a prefix_hash per block.
func (s *Service) RenderTemplate(ctx context.Context, req *pb.RenderTemplateRequest) (*pb.RenderTemplateResponse, error) {
	start := s.now()
	resp := new(pb.RenderTemplateResponse)
	s.renderTemplate(ctx, req, resp)
	s.features.ObserveRender(resp.ReasonCode, s.now().Sub(start))
	return resp, nil
}

func (s *Service) renderTemplate(ctx context.Context, req *pb.RenderTemplateRequest, resp *pb.RenderTemplateResponse) {
	fail := func(reason, msg string) {
		resp.ReasonCode, resp.Message = reason, msg
	}
	if ctx.Err() != nil {
		fail(ReasonRenderError, "the caller's deadline passed before rendering")
		return
	}
	if len(req.GetTemplateRef()) > 2*MaxIDBytes || len(req.GetTenantId()) > MaxIDBytes || len(req.GetModelId()) > MaxIDBytes {
		fail(ReasonTemplateNotFound, "the template reference, tenant or model is over the id limit")
		return
	}
	snap := s.policies.Load()
	tp := snap.Template(req.GetTemplateRef(), req.GetTenantId())
	if tp == nil {
		fail(ReasonTemplateNotFound, fmt.Sprintf("no PromptTemplate %q (in tenant %q's namespace for a bare name) was pushed to this server", clipID(req.GetTemplateRef()), clipID(req.GetTenantId())))
		return
	}
	ct, err := s.templates.get(snap, tp)
	if err != nil {
		fail(ReasonRenderError, err.Error())
		return
	}
	r, err := ct.Render(req.GetVariables())
	if err != nil {
		fail(ReasonRenderError, err.Error())
		return
	}
	resp.ReasonCode = ReasonOK
	resp.RenderedPrompt = []byte(r.Text)
	resp.TemplateRevision = tp.Revision
	resp.TenantNamespace = []byte(tp.Namespace)
	stable := r.Text[:r.StableLen]
	if stable == "" {
		return
	}
	if toks, n, ok := s.stableTokens(ctx, req.GetModelId(), r.Text, stable); ok {
		resp.TokenIds = toks
		if blocks := n / s.blockSize; blocks > 0 {
			sums := fingerprint.AppendChain(nil, toks[:blocks*s.blockSize], s.blockSize, 0, false)
			resp.StablePrefixHash = fingerprint.AppendWire(nil, sums[len(sums)-1])
			resp.StablePrefixTokens = int32(blocks * s.blockSize)
		}
		return
	}
	resp.StablePrefixHash = fingerprint.AppendWire(nil, xxh3.HashSeed([]byte(stable), fingerprint.Seed))
}

// stableTokens tokenizes the rendering and its stable part with the
// model's tokenizer and returns the rendering's tokens and how many of
// them lead both tokenizations (the tokens the stable part alone decides,
// also where a tokenizer merges across the boundary). ok is false without a
// model, a tokenizer, a free tokenize slot, or when tokenization fails.
func (s *Service) stableTokens(ctx context.Context, model, text, stable string) ([]uint32, int, bool) {
	if model == "" || s.templateTok == nil {
		return nil, 0, false
	}
	select {
	case s.tokenizeSem <- struct{}{}:
	default:
		return nil, 0, false
	}
	defer func() { <-s.tokenizeSem }()
	if _, has := ctx.Deadline(); !has {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.tokTO)
		defer cancel()
	}
	toks, err := s.templateTok.EncodePrompt(ctx, model, text)
	if err != nil || len(toks) == 0 || len(toks) > MaxLookupTokens {
		return nil, 0, false
	}
	stoks := toks
	if len(stable) < len(text) {
		if stoks, err = s.templateTok.EncodePrompt(ctx, model, stable); err != nil {
			return nil, 0, false
		}
	}
	n := 0
	for n < len(toks) && n < len(stoks) && toks[n] == stoks[n] {
		n++
	}
	return toks, n, true
}

// clipID shortens an id for a message.
func clipID(s string) string {
	if len(s) > 128 {
		return s[:128] + "…"
	}
	return s
}
