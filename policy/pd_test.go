package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// v8Body is a full version-8 body: one CachePolicy, one quota, two
// topologies in team-a, one in team-b, two templates.
const v8Body = `{
  "version": 8,
  "policies": [{"namespace": "team-a", "minimumPrefixTokens": 32, "affinityRouting": false}],
  "tenants": [{"tenantID": "team-a", "maxIndexEntries": 100}],
  "pdTopologies": [
    {"namespace": "team-a", "name": "llama-pd",
     "prefillPools": [{"name": "prefill", "matchLabels": {"role": "prefill"}, "replicas": 4, "acceleratorType": "h100"}],
     "decodePools": [{"name": "decode", "matchLabels": {"role": "decode"}, "replicas": 2, "acceleratorType": "h100"}],
     "acceleratorTypes": [{"name": "h100", "vendor": "nvidia", "model": "H100", "matchLabels": {"gpu": "h100"}}],
     "transport": "NIXL", "skipPrefillBelowTokens": 256, "kvLocality": "Zone"},
    {"namespace": "team-a", "name": "other", "prefillPools": [{"name": "p"}], "decodePools": [{"name": "d"}], "transport": "Mooncake"},
    {"namespace": "team-b", "name": "only", "decodePools": [{"name": "d"}], "skipPrefillBelowTokens": 0}
  ],
  "promptTemplates": [
    {"namespace": "team-a", "name": "support", "body": "{{ system }}\n\nUser: {{ question }}",
     "slots": [{"name": "system", "type": "Stable", "required": true, "description": "the system prompt"}, {"name": "question", "type": "Mutable"}],
     "templateRevision": "28e0a68ff7fe3c8d"},
    {"namespace": "team-a", "name": "hello", "body": "Hello {{ name }}"}
  ]
}`

func TestDecodeV8(t *testing.T) {
	b := mustDecode(t, v8Body)
	snap := Build(b)
	if snap.Topologies() != 3 || snap.Templates() != 2 {
		t.Fatalf("resolved %d topologies and %d templates, want 3 and 2", snap.Topologies(), snap.Templates())
	}
	// The v7 content is unaffected by the new lists.
	if pt := snap.Tenant("team-a"); pt.MinimumPrefixTokens != 32 || pt.AffinityRouting || !pt.HasQuota || pt.MaxIndexEntries != 100 {
		t.Errorf("team-a resolved to %+v", *pt)
	}

	top := snap.Topology("team-a/llama-pd", "whatever")
	if top == nil {
		t.Fatal("team-a/llama-pd not found")
	}
	if top.Transport != TransportNIXL || top.SkipBelow != 256 || top.Locality != LocalityZone {
		t.Errorf("llama-pd resolved to transport %q, skip %d, locality %q", top.Transport, top.SkipBelow, top.Locality)
	}
	if !top.HasPrefillPool("prefill") || top.HasPrefillPool("decode") || !top.HasDecodePool("decode") || top.HasDecodePool("prefill") {
		t.Error("pool membership of llama-pd is wrong")
	}
	if got := *top.PrefillPools[0].Replicas; got != 4 || top.AcceleratorTypes[0].Model != "H100" {
		t.Errorf("pool details lost: replicas %d, accelerator %+v", got, top.AcceleratorTypes[0])
	}
	if o := snap.Topology("other", "team-a"); o == nil || o.SkipBelow != DefaultSkipPrefillBelowTokens || o.Locality != LocalityNone {
		t.Errorf("team-a/other (bare name, defaults): %+v", o)
	}
	// An empty ref names the namespace's only topology, and nothing when
	// there are several.
	if o := snap.Topology("", "team-b"); o == nil || o.Name != "only" || o.SkipBelow != 0 {
		t.Errorf("empty ref in team-b: %+v (an explicit 0 must survive)", o)
	}
	if o := snap.Topology("", "team-a"); o != nil {
		t.Errorf("empty ref in team-a (two topologies) resolved to %s", o.Name)
	}
	for _, ref := range []string{"team-c/x", "/x", "x/", "a/b/c", "nope"} {
		if o := snap.Topology(ref, "team-a"); o != nil {
			t.Errorf("Topology(%q) = %s, want none", ref, o.Name)
		}
	}

	tp := snap.Template("team-a/support", "")
	if tp == nil || tp.Revision != "28e0a68ff7fe3c8d" || len(tp.Slots) != 2 || !tp.Slots[0].Required {
		t.Fatalf("team-a/support resolved to %+v", tp)
	}
	// A template the controller has not reconciled gets the revision the
	// controller would write.
	if h := snap.Template("hello", "team-a"); h == nil || h.Revision != "ce5f832c177d2bc4" {
		t.Errorf("hello resolved to %+v, want revision ce5f832c177d2bc4", h)
	}
	if snap.Template("hello", "") != nil || snap.Template("", "team-a") != nil {
		t.Error("a bare template name without a namespace, or an empty ref, resolved")
	}
}

// TestTemplateRevisionGolden pins TemplateRevision to the values the
// controller's TemplateRevision (operator/internal/controller) computes for
// the same specs.
func TestTemplateRevisionGolden(t *testing.T) {
	if got := TemplateRevision("Hello {{ name }}", nil); got != "ce5f832c177d2bc4" {
		t.Errorf("revision = %s, want ce5f832c177d2bc4", got)
	}
	slots := []TemplateSlot{{Name: "system", Type: "Stable", Required: true, Description: "the system prompt"}, {Name: "question", Type: "Mutable"}}
	if got := TemplateRevision("{{ system }}\n\nUser: {{ question }}", slots); got != "28e0a68ff7fe3c8d" {
		t.Errorf("revision = %s, want 28e0a68ff7fe3c8d", got)
	}
	// Length prefixes: moving a byte between fields changes the revision.
	if TemplateRevision("ab", []TemplateSlot{{Name: "c"}}) == TemplateRevision("a", []TemplateSlot{{Name: "bc"}}) {
		t.Error("two specs share a revision")
	}
}

func TestDecodeV8Duplicates(t *testing.T) {
	snap := Build(mustDecode(t, `{"version": 8,
	  "pdTopologies": [{"namespace": "a", "name": "t", "transport": "NIXL"}, {"namespace": "a", "name": "t", "transport": "Direct"}],
	  "promptTemplates": [{"namespace": "a", "name": "p", "body": "one"}, {"namespace": "a", "name": "p", "body": "two"}]}`))
	if top := snap.Topology("a/t", ""); top == nil || top.Transport != TransportNIXL {
		t.Errorf("duplicate topology: %+v, want the first", top)
	}
	if tp := snap.Template("a/p", ""); tp == nil || tp.Body != "one" {
		t.Errorf("duplicate template: %+v, want the first", tp)
	}
	// Two entries with the same namespace still make the empty ref
	// ambiguous only when they are distinct objects.
	if top := snap.Topology("", "a"); top == nil {
		t.Error("the namespace's only topology (pushed twice) did not resolve from an empty ref")
	}
}

func TestDecodeV8Invalid(t *testing.T) {
	for name, c := range map[string]struct{ body, want string }{
		"v7 with topologies":     {`{"version": 7, "pdTopologies": [{"namespace": "a", "name": "t"}]}`, "need version 8"},
		"v7 with templates":      {`{"version": 7, "promptTemplates": [{"namespace": "a", "name": "t", "body": "x"}]}`, "need version 8"},
		"transport":              {`{"version": 8, "pdTopologies": [{"namespace": "a", "name": "t", "transport": "nixl"}]}`, `transport "nixl"`},
		"locality":               {`{"version": 8, "pdTopologies": [{"namespace": "a", "name": "t", "kvLocality": "Rack"}]}`, `kvLocality "Rack"`},
		"negative threshold":     {`{"version": 8, "pdTopologies": [{"namespace": "a", "name": "t", "skipPrefillBelowTokens": -1}]}`, "negative skipPrefillBelowTokens"},
		"empty topology name":    {`{"version": 8, "pdTopologies": [{"namespace": "a", "name": ""}]}`, "empty name"},
		"slash in namespace":     {`{"version": 8, "pdTopologies": [{"namespace": "a/b", "name": "t"}]}`, "contains '/'"},
		"duplicate pool":         {`{"version": 8, "pdTopologies": [{"namespace": "a", "name": "t", "decodePools": [{"name": "d"}, {"name": "d"}]}]}`, `"d" given twice`},
		"negative replicas":      {`{"version": 8, "pdTopologies": [{"namespace": "a", "name": "t", "prefillPools": [{"name": "p", "replicas": -2}]}]}`, "negative replicas"},
		"unnamed accelerator":    {`{"version": 8, "pdTopologies": [{"namespace": "a", "name": "t", "acceleratorTypes": [{"vendor": "x"}]}]}`, "acceleratorTypes name"},
		"empty body":             {`{"version": 8, "promptTemplates": [{"namespace": "a", "name": "t", "body": ""}]}`, "empty body"},
		"slot type":              {`{"version": 8, "promptTemplates": [{"namespace": "a", "name": "t", "body": "x", "slots": [{"name": "s", "type": "stable"}]}]}`, `type "stable"`},
		"duplicate slot":         {`{"version": 8, "promptTemplates": [{"namespace": "a", "name": "t", "body": "x", "slots": [{"name": "s", "type": "Stable"}, {"name": "s", "type": "Mutable"}]}]}`, `"s" declared twice`},
		"empty slot name":        {`{"version": 8, "promptTemplates": [{"namespace": "a", "name": "t", "body": "x", "slots": [{"name": "", "type": "Stable"}]}]}`, "empty slot name"},
		"unknown topology field": {`{"version": 8, "pdTopologies": [{"namespace": "a", "name": "t", "threshold": 5}]}`, `unknown field "threshold"`},
		"unknown template field": {`{"version": 8, "promptTemplates": [{"namespace": "a", "name": "t", "body": "x", "model": "m"}]}`, `unknown field "model"`},
		"oversized body":         {`{"version": 8, "promptTemplates": [{"namespace": "a", "name": "t", "body": "` + strings.Repeat("x", MaxTemplateBodyBytes+1) + `"}]}`, "over 65536"},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := Decode(strings.NewReader(c.body))
			if err == nil || b != nil {
				t.Fatalf("Decode accepted it: %+v", b)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
			if !decodeErrorKnown(err) {
				t.Errorf("error %q is not a documented Decode error", err)
			}
		})
	}
}

// TestOlderReader is the version rule against the decoder a version-7
// server runs (v7reader_test.go, frozen): what a v8 controller sends
// either reaches it whole or is refused loudly, never half-applied.
func TestOlderReader(t *testing.T) {
	full := mustDecode(t, v8Body)

	t.Run("without v8 content the controller sends 7 and an old server applies it", func(t *testing.T) {
		b := WithoutVersion8(full)
		b.Version = 8 // whatever the controller had built
		b.Version = VersionFor(b)
		if b.Version != 7 {
			t.Fatalf("VersionFor a body without topologies or templates = %d, want 7", b.Version)
		}
		enc, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(enc, []byte("pdTopologies")) || bytes.Contains(enc, []byte("promptTemplates")) {
			t.Fatalf("a body without v8 content names the v8 lists: %s", enc)
		}
		old, err := v7Decode(bytes.NewReader(enc))
		if err != nil {
			t.Fatalf("the v7 reader rejected %s: %v", enc, err)
		}
		// Both readers store the same policies and tenants.
		cur := mustDecode(t, string(enc))
		oldJSON, _ := json.Marshal(old)
		curJSON, _ := json.Marshal(&Body{Version: cur.Version, Policies: cur.Policies, Tenants: cur.Tenants})
		if !bytes.Equal(oldJSON, curJSON) {
			t.Errorf("the readers disagree:\nv7 %s\nv8 %s", oldJSON, curJSON)
		}
	})

	t.Run("with v8 content the controller sends 8 and an old server refuses it whole", func(t *testing.T) {
		if v := VersionFor(full); v != 8 {
			t.Fatalf("VersionFor a body with topologies = %d, want 8", v)
		}
		enc, _ := json.Marshal(full)
		old, err := v7Decode(bytes.NewReader(enc))
		if err == nil || old != nil {
			t.Fatalf("the v7 reader accepted a v8 body: %+v", old)
		}
		// The v7 reader decodes with unknown fields disallowed, so it fails
		// on the first v8 list before its version check: an HTTP 400 whose
		// message names the field. A bare v8 body fails the version check.
		if !strings.Contains(err.Error(), `unknown field "pdTopologies"`) {
			t.Errorf("the v7 reader's error %q does not name the unknown list", err)
		}
		_, err = v7Decode(strings.NewReader(`{"version": 8, "policies": []}`))
		if !errors.Is(err, errV7UnsupportedVersion) || !strings.Contains(err.Error(), "unsupported policy snapshot version 8") {
			t.Errorf("the v7 reader on a bare v8 body: %v, want unsupported version", err)
		}
		// A v8 body stamped 7 fails the same loud way, never drops the
		// lists in silence.
		stamped := *full
		stamped.Version = 7
		enc, _ = json.Marshal(&stamped)
		if _, err := v7Decode(bytes.NewReader(enc)); err == nil || !strings.Contains(err.Error(), `unknown field "pdTopologies"`) {
			t.Errorf("the v7 reader on a v8 body stamped 7: %v, want unknown field", err)
		}
	})

	t.Run("the fallback after a refusal reaches the old server", func(t *testing.T) {
		down := WithoutVersion8(full)
		enc, _ := json.Marshal(down)
		old, err := v7Decode(bytes.NewReader(enc))
		if err != nil {
			t.Fatalf("the v7 reader rejected the fallback %s: %v", enc, err)
		}
		if len(old.Policies) != 1 || old.Policies[0].Namespace != "team-a" || len(old.Tenants) != 1 {
			t.Errorf("the fallback lost v7 content: %+v", old)
		}
		if len(full.PDTopologies) != 3 {
			t.Error("WithoutVersion8 modified its argument")
		}
	})

	t.Run("the new reader accepts every body the old one does", func(t *testing.T) {
		for _, v := range []int{3, 4, 5, 6, 7} {
			body := `{"version": ` + string(rune('0'+v)) + `, "policies": [{"namespace": "a", "minimumPrefixTokens": 3}]}`
			old, errOld := v7Decode(strings.NewReader(body))
			cur, errCur := Decode(strings.NewReader(body))
			if errOld != nil || errCur != nil {
				t.Fatalf("v%d: old %v, new %v", v, errOld, errCur)
			}
			oj, _ := json.Marshal(old)
			cj, _ := json.Marshal(cur)
			if !bytes.Equal(oj, cj) {
				t.Errorf("v%d normalized differently:\nv7 %s\nv8 %s", v, oj, cj)
			}
		}
	})
}

func TestResolveRef(t *testing.T) {
	for _, c := range []struct {
		ref, ns, want string
		ok            bool
	}{
		{"a/b", "x", "a/b", true},
		{"b", "x", "x/b", true},
		{"b", "", "", false},
		{"", "x", "", false},
		{"/b", "x", "", false},
		{"a/", "x", "", false},
		{"a/b/c", "x", "", false},
	} {
		got, ok := ResolveRef(c.ref, c.ns)
		if got != c.want || ok != c.ok {
			t.Errorf("ResolveRef(%q, %q) = %q, %v; want %q, %v", c.ref, c.ns, got, ok, c.want, c.ok)
		}
	}
}

// TestEmptySnapshotV8 checks the lookups of a snapshot without v8 content.
func TestEmptySnapshotV8(t *testing.T) {
	for _, s := range []*Snapshot{Empty(), Build(mustDecode(t, `{"version": 7, "policies": []}`))} {
		if s.Topology("", "a") != nil || s.Topology("a/b", "") != nil || s.Template("a/b", "") != nil ||
			s.Topologies() != 0 || s.Templates() != 0 {
			t.Error("an empty snapshot resolves v8 objects")
		}
	}
	if !reflect.DeepEqual(Empty().Body().Version, PropagationVersion) {
		t.Error("Empty's body is not at the current version")
	}
}
