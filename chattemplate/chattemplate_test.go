package chattemplate

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func assetsDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("TOKENIZER_ASSETS")
	if dir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("TOKENIZER_ASSETS is not set: run the tests through make test (hack/tokenizer-assets.sh)")
		}
		t.Skip("TOKENIZER_ASSETS is not set (bash hack/tokenizer-assets.sh prints it)")
	}
	return dir
}

func load(t testing.TB, model string) *Template {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(assetsDir(t), model, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", model, err)
	}
	return tmpl
}

// TestReferenceRenderings compares with the renderings of @lenml/tokenizers
// (transformers.js's Jinja) recorded in the tokenizer golden files.
func TestReferenceRenderings(t *testing.T) {
	for _, model := range []string{"llama3", "deepseek_v3"} {
		t.Run(model, func(t *testing.T) {
			tmpl := load(t, model)
			raw, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", "golden", model+".json.gz"))
			if err != nil {
				t.Fatal(err)
			}
			zr, err := gzip.NewReader(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			var g struct {
				Chat []struct {
					Text     string `json:"text"`
					Rendered string `json:"rendered"`
				} `json:"chat"`
			}
			if err := json.NewDecoder(zr).Decode(&g); err != nil {
				t.Fatal(err)
			}
			if len(g.Chat) < 100 {
				t.Fatalf("only %d reference renderings", len(g.Chat))
			}
			match := 0
			for _, c := range g.Chat {
				got, err := tmpl.RenderUser(c.Text)
				if err != nil {
					t.Errorf("%q: %v", c.Text, err)
					continue
				}
				if got != c.Rendered {
					t.Errorf("%q:\n got %q\nwant %q", c.Text, got, c.Rendered)
					continue
				}
				match++
			}
			t.Logf("%s: %d/%d renderings match", model, match, len(g.Chat))
		})
	}
}

// TestQwen3 pins the Qwen 3 rendering: @lenml/tokenizers cannot parse this
// template (its Jinja lacks the [::-1] slice), so the expected text is the
// documented Qwen chat format.
func TestQwen3(t *testing.T) {
	tmpl := load(t, "qwen3")
	for _, text := range []string{"Hi there", "", "  spaced  \n", "<tool_response>x</tool_response>"} {
		got, err := tmpl.RenderUser(text)
		if err != nil {
			t.Fatal(err)
		}
		want := "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n"
		if got != want {
			t.Errorf("%q:\n got %q\nwant %q", text, got, want)
		}
	}
}

func TestLlama3TrimsContent(t *testing.T) {
	tmpl := load(t, "llama3")
	got, err := tmpl.RenderUser("  hi \n")
	if err != nil {
		t.Fatal(err)
	}
	want := "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func cfg(t *testing.T, tmpl string, extra map[string]any) []byte {
	t.Helper()
	m := map[string]any{"chat_template": tmpl}
	for k, v := range extra {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHelpers covers what real templates use beyond plain output: a
// Llama 3.1-style date header, namespace, loop variables, string methods,
// tojson, AddedToken-object special tokens and named template lists.
func TestHelpers(t *testing.T) {
	f := func(name, tmpl string, extra map[string]any, want string) {
		t.Helper()
		tp, err := Parse(cfg(t, tmpl, extra))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := tp.RenderUser(" Hello World ")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got != want {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
	f("date", `{%- if not date_string is defined %}{%- if strftime_now is defined %}{%- set date_string = strftime_now("%Y") %}{%- else %}{%- set date_string = "x" %}{%- endif %}{%- endif %}{{ date_string }}`,
		nil, time.Now().Format("2006"))
	f("namespace", `{%- set ns = namespace(n=0) %}{%- for m in messages %}{%- set ns.n = ns.n + 1 %}{%- endfor %}{{ ns.n }}`, nil, "1")
	f("loop", `{% for m in messages %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{% endfor %}`, nil, "0TrueTrue")
	f("methods", `{{ messages[0].content.strip().lower() }}|{{ messages[0]['content'].startswith(' H') }}|{{ messages[0].content | trim }}`, nil, "hello world|True|Hello World")
	f("tojson", `{{ messages[0] | tojson }}`, nil, `{"role": "user", "content": " Hello World "}`)
	f("bos object", `{{ bos_token }}{{ eos_token }}`, map[string]any{
		"bos_token": map[string]any{"__type": "AddedToken", "content": "<B>"}, "eos_token": "<E>"}, "<B><E>")
	f("generation prompt", `{% if add_generation_prompt %}A:{% endif %}{% if tools %}T{% endif %}`, nil, "A:")
	f("reverse slice", `{% for m in messages[::-1] %}{{ m.role }}{% endfor %}`, nil, "user")

	named, err := json.Marshal(map[string]any{"chat_template": []map[string]string{{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}}})
	if err != nil {
		t.Fatal(err)
	}
	tp, err := Parse(named)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := tp.RenderUser("x"); got != "D" {
		t.Errorf("named list: got %q, want D", got)
	}
}

func TestErrors(t *testing.T) {
	if _, err := Parse([]byte(`{"bos_token": "<s>"}`)); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("no template: %v", err)
	}
	if _, err := Parse([]byte(`{`)); err == nil {
		t.Error("bad JSON: no error")
	}
	if _, err := Parse([]byte(`{"chat_template": "{% for %}"}`)); err == nil {
		t.Error("bad template: no error")
	}
	tp, err := Parse([]byte(`{"chat_template": "{{ raise_exception('only system and user roles') }}"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tp.RenderUser("x"); err == nil || !strings.Contains(err.Error(), "only system and user roles") {
		t.Errorf("raise_exception: %v", err)
	}
}

// FuzzParse: any tokenizer_config.json either fails to parse or renders
// any text without panicking (RenderUser turns engine panics into errors).
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"chat_template": "{{ bos_token }}{{ messages[0].content }}", "bos_token": "<s>"}`), "hi")
	f.Fuzz(func(t *testing.T, config []byte, text string) {
		if len(config) > 4096 {
			return
		}
		tp, err := Parse(config)
		if err != nil {
			return
		}
		_, _ = tp.RenderUser(text)
	})
}
