package modeldir

import (
	"encoding/json"
	"fmt"

	"github.com/inferencecache/inferencecache/tokenizer"
)

// bosEOSClasses are the transformers tokenizer classes that replace
// tokenizer.json's post-processor with bos/eos from tokenizer_config.json's
// add_bos_token (default true) and add_eos_token (default false).
var bosEOSClasses = map[string]bool{
	"LlamaTokenizer": true, "LlamaTokenizerFast": true, "CodeLlamaTokenizer": true, "CodeLlamaTokenizerFast": true,
	"GemmaTokenizer": true, "GemmaTokenizerFast": true, "CohereTokenizerFast": true,
}

// specialTokenizer is the tokenizer a completion prompt is encoded with
// (add_special_tokens=True): tok itself, whose post-processor comes from
// tokenizer.json, unless the config's tokenizer_class is one of
// bosEOSClasses.
func specialTokenizer(tok *tokenizer.Tokenizer, config []byte) (*tokenizer.Tokenizer, error) {
	var c struct {
		Class  string          `json:"tokenizer_class"`
		AddBOS *bool           `json:"add_bos_token"`
		AddEOS *bool           `json:"add_eos_token"`
		BOS    json.RawMessage `json:"bos_token"`
		EOS    json.RawMessage `json:"eos_token"`
	}
	if err := json.Unmarshal(config, &c); err != nil {
		return nil, fmt.Errorf("cannot parse tokenizer_config.json: %w", err)
	}
	if !bosEOSClasses[c.Class] {
		return tok, nil
	}
	addBOS, addEOS := c.AddBOS == nil || *c.AddBOS, c.AddEOS != nil && *c.AddEOS
	bos, hasBOS := tokenString(c.BOS)
	eos, hasEOS := tokenString(c.EOS)
	return tok.WithSpecialTokens(bos, addBOS && hasBOS, eos, addEOS && hasEOS)
}

// tokenString reads a special token given as a string or an AddedToken
// object.
func tokenString(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}
