package modeldir

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/ardanlabs/jinja"

	"github.com/inferencecache/inferencecache/chattemplate"
	"github.com/inferencecache/inferencecache/picker/request"
	"github.com/inferencecache/inferencecache/tokenizer"
)

// DefaultPrefixCacheBytes bounds each model's cache of recent renderings
// (text, ids and cuts), which makes the next turn of a conversation cost
// only its new tokens.
const DefaultPrefixCacheBytes = 64 << 20

// RequestTokens returns the prompt token ids the engine computes for an
// OpenAI request: for a chat, the whole conversation rendered with the
// model's chat template (chattemplate.RenderChat) and tokenized with the
// special tokens the rendering writes matched as specials and nothing
// added (the template writes the BOS); for a completion, a text prompt
// tokenized with add_special_tokens=True (the post-processor's tokens, as
// vLLM's /v1/completions does) or a token-id prompt as is. A request's
// "add_special_tokens" overrides either default. The next turn
// of a recently seen conversation tokenizes only what follows the last
// cut its rendering shares with the earlier one, with the same ids as a
// full tokenization. Failures are *Error with a Reason. The returned
// slice belongs to the caller.
func (d *Dir) RequestTokens(ctx context.Context, modelID string, r *request.Request) ([]uint32, error) {
	start := d.now()
	ids, reason, err := d.requestTokens(ctx, modelID, r)
	if err != nil {
		if ctx.Err() != nil && reason != ReasonInvalidModel {
			reason = ReasonCanceled
		}
		d.obs.TokenizeFailed(reason)
		var e *Error
		if errors.As(err, &e) && e.Reason == reason {
			return nil, err
		}
		return nil, &Error{modelID, reason, err}
	}
	d.obs.Tokenized(d.now().Sub(start))
	return ids, nil
}

func (d *Dir) requestTokens(ctx context.Context, modelID string, r *request.Request) ([]uint32, string, error) {
	if r == nil {
		return nil, ReasonRenderFailed, errors.New("no request")
	}
	m, err := d.model(ctx, modelID)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return nil, e.Reason, err
		}
		return nil, ReasonCanceled, err
	}
	switch r.Kind {
	case request.KindCompletion:
		if r.HasPromptTokens {
			return slices.Clone(r.PromptTokens), "", nil
		}
		dst := make([]uint32, 0, len(r.Prompt)/3+4)
		var err error
		if r.AddSpecialTokens {
			dst, err = m.special.EncodeSpecial(ctx, dst, r.Prompt)
		} else {
			dst, err = m.tok.Encode(ctx, dst, r.Prompt)
		}
		ids := dst
		if err != nil {
			return nil, ReasonEncodeFailed, err
		}
		return ids, "", nil
	case request.KindChat:
	default:
		return nil, ReasonRenderFailed, fmt.Errorf("request kind %s", r.Kind)
	}
	if m.tmpl == nil {
		return nil, ReasonNoTemplate, m.tmplErr
	}
	chat := chatOf(r)
	var text string
	if m.msgs != nil {
		var msgs []jinja.Value
		if msgs, err = m.msgs.convert(chat.Messages, m.tmpl.ContentFormat()); err == nil {
			text, err = m.tmpl.RenderConverted(chat, msgs)
		}
	} else {
		text, err = m.tmpl.RenderChat(chat)
	}
	if err != nil {
		return nil, ReasonRenderFailed, err
	}
	if err := ctx.Err(); err != nil {
		return nil, ReasonCanceled, err
	}
	ids, err := m.encodeRendered(ctx, text)
	if err != nil {
		return nil, ReasonEncodeFailed, err
	}
	if r.AddSpecialTokens {
		// The post-processor's tokens around the rendering, as the
		// engine adds them when the request asks.
		prefix, suffix, err := m.special.SpecialTokens()
		if err != nil {
			return nil, ReasonEncodeFailed, err
		}
		if len(prefix)+len(suffix) > 0 {
			ids = append(append(append(make([]uint32, 0, len(prefix)+len(ids)+len(suffix)), prefix...), ids...), suffix...)
		}
	}
	return ids, "", nil
}

// encodeRendered tokenizes a chat rendering through the model's prefix
// cache.
func (m *model) encodeRendered(ctx context.Context, text string) ([]uint32, error) {
	offs := m.tok.CutOffsets(nil, text)
	hashes := m.prefix.prefixHashes(text, offs, make([]uint64, 0, len(offs)))
	at, prev, ok := m.prefix.lookup(text, offs, hashes)
	var ids []uint32
	var cuts []tokenizer.Cut
	var err error
	extends := false
	if ok {
		from := prev.cuts[at]
		ids = make([]uint32, from.Tokens, from.Tokens+(len(text)-from.Offset)/3+16)
		copy(ids, prev.ids[:from.Tokens])
		cuts = append(make([]tokenizer.Cut, 0, len(offs)), prev.cuts[:at+1]...)
		ids, cuts, err = m.tok.EncodeFrom(ctx, ids, text, from, cuts)
		extends = at == len(prev.cuts)-1
	} else {
		ids, cuts, err = m.tok.EncodeFrom(ctx, make([]uint32, 0, len(text)/3+16), text, tokenizer.Cut{}, make([]tokenizer.Cut, 0, len(offs)))
	}
	if err != nil {
		return nil, err
	}
	if len(cuts) != len(offs) {
		// Cannot happen (EncodeFrom reports the cuts CutOffsets finds);
		// a mismatch only skips the insert.
		hashes = nil
	}
	m.prefix.insert(text, ids, cuts, hashes, prev, extends)
	return slices.Clone(ids), nil
}

// chatOf is the chat of a parsed request.
func chatOf(r *request.Request) *chattemplate.Chat {
	chat := &chattemplate.Chat{
		Tools:                r.Tools,
		AddGenerationPrompt:  r.AddGenerationPrompt,
		ContinueFinalMessage: r.ContinueFinalMessage,
		Kwargs:               r.ChatTemplateKwargs,
		Documents:            r.Documents,
		ReasoningEffort:      r.ReasoningEffort,
		Messages:             make([]json.RawMessage, len(r.Messages)),
	}
	for i, msg := range r.Messages {
		chat.Messages[i] = msg.Raw
	}
	return chat
}
