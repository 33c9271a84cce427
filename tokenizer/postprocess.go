package tokenizer

import (
	"context"
	"encoding/json"
	"fmt"
)

// postProcessor is what tokenizer.json's post_processor adds around a
// single sequence when a caller asks for special tokens
// (add_special_tokens=True: vLLM's /v1/completions text prompts). Only the
// ids matter here: ByteLevel post-processing changes offsets alone.
type postProcessor struct {
	prefix, suffix []uint32
	// err is set when the post_processor is one this package does not
	// implement; EncodeSpecial then fails with it (Encode does not need
	// it, so the load does not fail).
	err error
}

func buildPostProcessor(raw json.RawMessage) postProcessor {
	var p postProcessor
	if err := p.add(raw); err != nil {
		return postProcessor{err: err}
	}
	return p
}

func (p *postProcessor) add(raw json.RawMessage) error {
	typ, ok, err := typed(raw)
	if err != nil || !ok {
		return err
	}
	switch typ {
	case "ByteLevel":
		return nil
	case "Sequence":
		var c struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return fmt.Errorf("cannot parse Sequence post-processor: %w", err)
		}
		for _, r := range c.Processors {
			if err := p.add(r); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		var c struct {
			Single []struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			} `json:"single"`
			SpecialTokens map[string]struct {
				IDs []uint32 `json:"ids"`
			} `json:"special_tokens"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return fmt.Errorf("cannot parse TemplateProcessing post-processor: %w", err)
		}
		seen := false
		for _, piece := range c.Single {
			switch {
			case piece.Sequence != nil:
				if seen || piece.Sequence.ID != "A" {
					return fmt.Errorf("%w: TemplateProcessing single template with a sequence other than one $A", ErrUnsupported)
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := c.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("cannot load TemplateProcessing: special token %q has no ids", piece.SpecialToken.ID)
				}
				if seen {
					p.suffix = append(p.suffix, st.IDs...)
				} else {
					p.prefix = append(p.prefix, st.IDs...)
				}
			default:
				return fmt.Errorf("cannot load TemplateProcessing: a piece that is neither SpecialToken nor Sequence")
			}
		}
		if !seen {
			return fmt.Errorf("%w: TemplateProcessing single template without $A", ErrUnsupported)
		}
		return nil
	case "RobertaProcessing", "BertProcessing":
		var c struct {
			Sep [2]json.RawMessage `json:"sep"`
			Cls [2]json.RawMessage `json:"cls"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return fmt.Errorf("cannot parse %s post-processor: %w", typ, err)
		}
		var sep, cls uint32
		if json.Unmarshal(c.Sep[1], &sep) != nil || json.Unmarshal(c.Cls[1], &cls) != nil {
			return fmt.Errorf("cannot load %s post-processor: want sep and cls as [token, id]", typ)
		}
		p.prefix = append(p.prefix, cls)
		p.suffix = append([]uint32{sep}, p.suffix...)
		return nil
	}
	return fmt.Errorf("%w: post-processor %q", ErrUnsupported, typ)
}

// EncodeSpecial is Encode with the post-processor's special tokens, as
// Hugging Face encodes with add_special_tokens=True (for example Llama 3's
// TemplateProcessing puts <|begin_of_text|> first). A post-processor this
// package does not implement is an ErrUnsupported error naming it.
func (t *Tokenizer) EncodeSpecial(ctx context.Context, dst []uint32, text string) ([]uint32, error) {
	if t.post.err != nil {
		return dst, t.post.err
	}
	dst = append(dst, t.post.prefix...)
	dst, err := t.Encode(ctx, dst, text)
	if err != nil {
		return dst, err
	}
	return append(dst, t.post.suffix...), nil
}

// WithSpecialTokens returns a Tokenizer sharing t's tables whose
// EncodeSpecial adds bos before and eos after the text when asked, in
// place of tokenizer.json's post-processor: what transformers'
// LlamaTokenizerFast (and the Gemma and Cohere ones) do from
// tokenizer_config.json's add_bos_token and add_eos_token.
func (t *Tokenizer) WithSpecialTokens(bos string, addBOS bool, eos string, addEOS bool) (*Tokenizer, error) {
	c := *t
	c.post = postProcessor{}
	if addBOS {
		id, ok := t.Token(bos)
		if !ok {
			return nil, fmt.Errorf("cannot add bos_token %q: not a token", bos)
		}
		c.post.prefix = []uint32{id}
	}
	if addEOS {
		id, ok := t.Token(eos)
		if !ok {
			return nil, fmt.Errorf("cannot add eos_token %q: not a token", eos)
		}
		c.post.suffix = []uint32{id}
	}
	return &c, nil
}

// SpecialTokens returns the ids EncodeSpecial puts before and after the
// text (shared: read only), or the post-processor's ErrUnsupported error.
func (t *Tokenizer) SpecialTokens() (prefix, suffix []uint32, err error) {
	return t.post.prefix, t.post.suffix, t.post.err
}
