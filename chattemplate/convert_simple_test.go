package chattemplate

import (
	"strings"
	"testing"
)

// sameConversion fails unless ConvertMessage (fast path included) and the
// general path agree on raw: both fail, or both give the same value (key
// order included).
func sameConversion(t *testing.T, raw []byte, format ContentFormat) {
	t.Helper()
	got, gerr := ConvertMessage(raw, format)
	want, werr := convertGeneral(raw, format)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("%q: error %v, general path %v", raw, gerr, werr)
	}
	if gerr != nil {
		return
	}
	enc := func(v any) string {
		var b strings.Builder
		o := pyJSON{item: ", ", key: ": "}
		if err := o.encode(&b, got, 0); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	g, w := enc(got), ""
	{
		var b strings.Builder
		o := pyJSON{item: ", ", key: ": "}
		if err := o.encode(&b, want, 0); err != nil {
			t.Fatal(err)
		}
		w = b.String()
	}
	if g != w {
		t.Fatalf("%q:\n got %s\nwant %s", raw, g, w)
	}
}

var simpleCorner = []string{
	`{"role": "user", "content": "hi"}`,
	`{"role":"assistant","content":null}`,
	`{"role": "assistant"}`,
	`{"content": "x", "role": "system", "name": "bot"}`,
	`{"role": "tool", "tool_call_id": "c1", "content": "42"}`,
	`{"role": "user", "tool_call_id": "c1", "content": "42"}`,
	`{"role": "tool", "content": ""}`,
	`{"role": "developer", "content": "x"}`,
	`{"role": "", "content": "x"}`,
	`{"role": "user", "content": "a\nb\t\"c\" \u00e9 \ud83d\ude00 \ud800 x"}`,
	"{\"role\": \"user\", \"content\": \"\xff\xfe bad utf-8\"}",
	`{"r\u006fle": "user", "content": "escaped key"}`,
	`{"role": "user", "role": "assistant", "content": "dup"}`,
	`{"role": "user", "content": "a", "content": null}`,
	`{"role": "user", "content": 5}`,
	`{"role": "user", "content": ["a", {"type": "text", "text": "b"}]}`,
	`{"role": "user", "content": "x", "extra": 1}`,
	`{"role": "user", "content": "x", "name": 3}`,
	`{"role": 1, "content": "x"}`,
	` { "role" : "user" , "content" : "spaced" } `,
	`{"role": "user", "content": "x"} trailing`,
	`{"role": "user", "content": "x",}`,
	`{"role": "user" "content": "x"}`,
	`{"role": "user", "content": nul}`,
	`{"role": "user", "content": "x"`,
	`{"role": "user", "content": "ctl` + "\x01" + `"}`,
	`[]`, `{}`, ``, `"x"`,
}

func TestConvertSimpleMatchesGeneral(t *testing.T) {
	for _, s := range simpleCorner {
		for _, f := range []ContentFormat{FormatString, FormatOpenAI} {
			sameConversion(t, []byte(s), f)
		}
	}
	// The fast path takes what it should.
	for _, s := range []string{`{"role": "user", "content": "hi"}`, `{"role": "tool", "tool_call_id": "c", "content": null, "name": "n"}`} {
		if _, ok := convertSimple([]byte(s)); !ok {
			t.Errorf("%s took the general path", s)
		}
	}
}

// FuzzConvertSimple: the fast path and the general path agree on any
// input.
func FuzzConvertSimple(f *testing.F) {
	for _, s := range simpleCorner {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		sameConversion(t, raw, FormatString)
	})
}

func BenchmarkConvertMessage(b *testing.B) {
	raw := []byte(`{"role": "tool", "tool_call_id": "call_1", "content": "package handler\n\nfunc Handle(x int) (int, error) {\n\tif x < 0 {\n\t\treturn 0, fmt.Errorf(\"negative %d\", x)\n\t}\n\treturn x * 7, nil\n}\n` + strings.Repeat("The handler parses the request body and returns a typed error. ", 20) + `"}`)
	for _, c := range []struct {
		name string
		fn   func(json []byte, f ContentFormat) error
	}{
		{"fast", func(r []byte, f ContentFormat) error { _, err := ConvertMessage(r, f); return err }},
		{"general", func(r []byte, f ContentFormat) error { _, err := convertGeneral(r, f); return err }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if err := c.fn(raw, FormatString); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
