package controlserver

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzDecodeProbe: decodeProbe never panics; an accepted body has the
// required fields, re-encodes and decodes to the same request. Kept seeds:
// testdata/fuzz/FuzzDecodeProbe.
func FuzzDecodeProbe(f *testing.F) {
	for _, s := range []string{
		`{"backend": "ns/b", "model": "m", "hashScheme": "vllm"}`,
		`{"backend": "ns/b", "model": "m", "hashScheme": "vllm", "backendType": "LMCache", "t2Endpoint": "redis://:pw@redis:6379/1", "t2Provider": "Redis"}`,
		`{"backend": "ns/b", "model": "m", "hashScheme": "vllm", "T2Endpoint": "x"}`,
		`{"backend": "", "model": "m", "hashScheme": "vllm"}`,
		`{"backend": "b", "model": "m", "hashScheme": "vllm"} {}`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := decodeProbe(bytes.NewReader(data))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "probe: ") {
				t.Fatalf("error %q without the package prefix", err)
			}
			return
		}
		if req.Backend == "" || req.Model == "" || req.HashScheme == "" {
			t.Fatalf("accepted %+v", req)
		}
		enc, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeProbe(bytes.NewReader(enc))
		if err != nil || again != req {
			t.Fatalf("re-decoded %s to %+v, %v", enc, again, err)
		}
	})
}
