package endpoints

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

const sampleJSON = `{"tenant": "ns", "hashScheme": "sglang",
 "endpoints": [{"replicaId": "pod-b", "address": "10.0.0.8:8000"}, {"replicaId": "pod-a", "address": "10.0.0.7:8000"}],
 "models": [{"name": "my-lora", "modelId": "meta-llama/Llama-3.1-8B-Instruct", "adapterId": "my-lora"},
            {"name": "llama", "modelId": "meta-llama/Llama-3.1-8B-Instruct"}]}`

const sampleYAML = `# the same pool as sampleJSON
tenant: ns
hashScheme: sglang
endpoints:
- replicaId: pod-b
  address: 10.0.0.8:8000
- replicaId: pod-a
  address: "10.0.0.7:8000"
models:
- name: my-lora
  modelId: meta-llama/Llama-3.1-8B-Instruct
  adapterId: my-lora
- name: llama
  modelId: meta-llama/Llama-3.1-8B-Instruct
`

func TestDecodeFileJSONAndYAML(t *testing.T) {
	pj, err := DecodeFile([]byte(sampleJSON))
	if err != nil {
		t.Fatal(err)
	}
	py, err := DecodeFile([]byte(sampleYAML))
	if err != nil {
		t.Fatal(err)
	}
	if !pj.Equal(py) {
		t.Fatalf("JSON and YAML differ:\n%+v\n%+v", pj, py)
	}
	if pj.Tenant != "ns" || pj.HashScheme != "sglang" || pj.Len() != 2 || pj.Endpoints[0].ReplicaID != "pod-a" {
		t.Fatalf("pool %+v", pj)
	}
	if m := pj.Resolve("my-lora"); m != (Model{ModelID: "meta-llama/Llama-3.1-8B-Instruct", AdapterID: "my-lora"}) {
		t.Fatalf("Resolve my-lora: %+v", m)
	}
	if m := pj.Resolve("llama"); m != (Model{ModelID: "meta-llama/Llama-3.1-8B-Instruct"}) {
		t.Fatalf("Resolve alias: %+v", m)
	}
	if m := pj.Resolve("other"); m != (Model{ModelID: "other"}) {
		t.Fatalf("Resolve unlisted: %+v", m)
	}

	minimal, err := DecodeFile([]byte(`{"tenant": "t"}`))
	if err != nil {
		t.Fatal(err)
	}
	if minimal.HashScheme != DefaultHashScheme || minimal.Len() != 0 {
		t.Fatalf("minimal pool %+v", minimal)
	}
}

func TestDecodeFileRejects(t *testing.T) {
	f := func(name, in, reason string, want error, mention ...string) {
		t.Helper()
		p, gotReason, err := decodeFile([]byte(in))
		if err == nil {
			t.Errorf("%s: decoded %+v, want an error", name, p)
			return
		}
		if !errors.Is(err, want) {
			t.Errorf("%s: error %v, want %v", name, err, want)
		}
		if gotReason != reason {
			t.Errorf("%s: reason %q, want %q (%v)", name, gotReason, reason, err)
		}
		for _, m := range mention {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: error %q does not mention %q", name, err, m)
			}
		}
	}
	f("empty", " \n", ReasonDecode, ErrInvalidFile, "empty")
	f("not an object", `[1, 2]`, ReasonDecode, ErrInvalidFile)
	f("syntax", `{"tenant": "t",`, ReasonDecode, ErrInvalidFile)
	f("yaml syntax", "tenant: t\nendpoints: [\n", ReasonDecode, ErrInvalidFile)
	f("unknown top field", `{"tenant": "t", "tennant": "u"}`, ReasonDecode, ErrInvalidFile, `unknown field "tennant"`)
	f("unknown nested field", `{"tenant": "t", "endpoints": [{"replicaId": "a", "adress": "10.0.0.1:80"}]}`,
		ReasonDecode, ErrInvalidFile, `unknown field "endpoints[0].adress"`)
	f("unknown model field", "tenant: t\nmodels:\n- name: a\n  modelId: b\n  adapter: c\n", ReasonDecode, ErrInvalidFile, `"models[0].adapter"`)
	f("wrong case", `{"tenant": "t", "endpoints": [{"replicaID": "a", "address": "10.0.0.1:80"}]}`,
		ReasonDecode, ErrInvalidFile, `"endpoints[0].replicaID"`)
	f("duplicate json key", `{"tenant": "t", "tenant": "u"}`, ReasonDecode, ErrInvalidFile, "tenant")
	f("duplicate yaml key", "tenant: t\ntenant: u\n", ReasonDecode, ErrInvalidFile, "tenant")
	f("wrong type", `{"tenant": "t", "endpoints": {"replicaId": "a"}}`, ReasonDecode, ErrInvalidFile, "endpoints")
	f("number id", "tenant: t\nendpoints:\n- replicaId: 7\n  address: 10.0.0.1:80\n", ReasonDecode, ErrInvalidFile, "replicaId")
	f("no tenant", `{"endpoints": []}`, ReasonInvalid, ErrInvalidPool, "tenant")
	f("hostname", `{"tenant": "t", "endpoints": [{"replicaId": "a", "address": "pod-a:8000"}]}`, ReasonInvalid, ErrInvalidEndpoint, "pod-a:8000")
	f("no replica", `{"tenant": "t", "endpoints": [{"address": "10.0.0.1:80"}]}`, ReasonInvalid, ErrInvalidEndpoint)
	f("dup replica", `{"tenant": "t", "endpoints": [{"replicaId": "a", "address": "10.0.0.1:80"}, {"replicaId": "a", "address": "10.0.0.2:80"}]}`,
		ReasonInvalid, ErrInvalidPool, `"a"`)
	f("dup model", `{"tenant": "t", "models": [{"name": "m", "modelId": "x"}, {"name": "m", "modelId": "y"}]}`,
		ReasonInvalid, ErrInvalidFile, "models[1]", `"m"`)
	f("model without id", `{"tenant": "t", "models": [{"name": "m"}]}`, ReasonInvalid, ErrInvalidFile, "models[0]")
}

func TestDecodeModels(t *testing.T) {
	m, err := decodeModels([]byte(`[{"name":"my-lora","modelId":"base","adapterId":"my-lora"}]`))
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m["my-lora"] != (Model{ModelID: "base", AdapterID: "my-lora"}) {
		t.Fatalf("models %+v", m)
	}
	for _, bad := range []string{`{"name":"a"}`, `[{"name":"a","modelId":"b","extra":1}]`, `[{"name":"a"}]`, `[`} {
		if _, err := decodeModels([]byte(bad)); !errors.Is(err, ErrInvalidFile) {
			t.Errorf("%s: error %v, want ErrInvalidFile", bad, err)
		}
	}
}

// FuzzDecodeFile: no input panics, and a decoded pool written back in the
// file format decodes to the same pool.
func FuzzDecodeFile(f *testing.F) {
	for _, s := range []string{sampleJSON, sampleYAML, `{"tenant": "t"}`, "tenant: t\nendpoints: []\n",
		`{"tenant": "t", "endpoints": [{"replicaId": "v6", "address": "[fe80::1]:8000"}]}`,
		"tenant: &a t\nhashScheme: *a\n", `{"tenant": "t", "tenant": "u"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, reason, err := decodeFile(data)
		if err != nil {
			if p != nil || (reason != ReasonDecode && reason != ReasonInvalid) {
				t.Fatalf("error %v with pool %v, reason %q", err, p, reason)
			}
			return
		}
		spec := fileSpec{Tenant: p.Tenant, HashScheme: p.HashScheme}
		for _, ep := range p.Endpoints {
			spec.Endpoints = append(spec.Endpoints, endpointSpec(ep))
		}
		for name, m := range p.models {
			spec.Models = append(spec.Models, modelSpec{Name: name, ModelID: m.ModelID, AdapterID: m.AdapterID})
		}
		out, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		q, err := DecodeFile(out)
		if err != nil {
			t.Fatalf("re-encoded pool does not decode: %v\n%s", err, out)
		}
		if !p.Equal(q) {
			t.Fatalf("round trip changed the pool:\n%+v\n%+v", p, q)
		}
	})
}

// FuzzDecodeModels: no models annotation panics, and a decoded map has
// only named entries with a model id.
func FuzzDecodeModels(f *testing.F) {
	for _, s := range []string{`[{"name":"my-lora","modelId":"base","adapterId":"my-lora"}]`, "- name: a\n  modelId: b\n", `[]`, `{}`, `[{"name":"a"}]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeModels(data)
		if err != nil {
			if m != nil {
				t.Fatalf("error %v with models %v", err, m)
			}
			return
		}
		for name, s := range m {
			if name == "" || s.ModelID == "" {
				t.Fatalf("entry %q: %+v", name, s)
			}
		}
	})
}
