package tokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

func withPost(t *testing.T, post any) *Tokenizer {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(byteLevelJSON(t, nil, false, false, []map[string]any{
		{"id": 300, "content": "<bos>", "special": true}, {"id": 301, "content": "<eos>", "special": true},
	}, nil), &doc); err != nil {
		t.Fatal(err)
	}
	doc["post_processor"] = post
	b, _ := json.Marshal(doc)
	return mustLoad(t, b)
}

func TestEncodeSpecial(t *testing.T) {
	tmpl := map[string]any{"type": "TemplateProcessing",
		"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<bos>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
		"pair":           []any{},
		"special_tokens": map[string]any{"<bos>": map[string]any{"id": "<bos>", "ids": []int{300}, "tokens": []string{"<bos>"}}}}
	ctx := context.Background()
	for _, c := range []struct {
		name string
		post any
		want []uint32
	}{
		{"none", nil, []uint32{'h', 'i'}},
		{"ByteLevel", map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false}, []uint32{'h', 'i'}},
		{"TemplateProcessing", tmpl, []uint32{300, 'h', 'i'}},
		{"Sequence", map[string]any{"type": "Sequence", "processors": []any{map[string]any{"type": "ByteLevel"}, tmpl}}, []uint32{300, 'h', 'i'}},
		{"Roberta", map[string]any{"type": "RobertaProcessing", "sep": []any{"<eos>", 301}, "cls": []any{"<bos>", 300}}, []uint32{300, 'h', 'i', 301}},
	} {
		tk := withPost(t, c.post)
		got, err := tk.EncodeSpecial(ctx, nil, "hi")
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, %v; want %v", c.name, got, err, c.want)
		}
		if plain, _ := tk.Encode(ctx, nil, "hi"); !slices.Equal(plain, []uint32{'h', 'i'}) {
			t.Errorf("%s: Encode %v", c.name, plain)
		}
	}
	tk := withPost(t, map[string]any{"type": "Nope"})
	if _, err := tk.EncodeSpecial(ctx, nil, "hi"); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), `"Nope"`) {
		t.Errorf("unsupported post-processor: %v", err)
	}
	if ids, err := tk.Encode(ctx, nil, "hi"); err != nil || len(ids) != 2 {
		t.Errorf("Encode with an unsupported post-processor: %v %v", ids, err)
	}
	// The Llama tokenizer classes' add_bos_token / add_eos_token.
	ll, err := tk.WithSpecialTokens("<bos>", true, "<eos>", true)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ll.EncodeSpecial(ctx, nil, "hi"); err != nil || !slices.Equal(got, []uint32{300, 'h', 'i', 301}) {
		t.Errorf("WithSpecialTokens: %v %v", got, err)
	}
	if _, err := tk.WithSpecialTokens("<nope>", true, "", false); err == nil {
		t.Error("WithSpecialTokens with an unknown bos")
	}
}
