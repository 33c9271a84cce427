package controlserver

import (
	"net/http"
	"strings"
	"testing"
)

// TestBadRequestFloodLogsBounded: a flood of rejected /policy and /probe
// requests is answered 400 each time but costs a bounded number of WARN
// lines per kind.
func TestBadRequestFloodLogsBounded(t *testing.T) {
	const flood = 200
	e := newEnv(t, nil)
	for range flood {
		if r := e.do(t, http.MethodPost, "/policy", strings.NewReader("{not json")); r.code != http.StatusBadRequest {
			t.Fatalf("bad push: %d", r.code)
		}
		if r := e.do(t, http.MethodPost, "/probe", strings.NewReader(`{"backend":""}`)); r.code != http.StatusBadRequest {
			t.Fatalf("bad probe: %d", r.code)
		}
	}
	for _, msg := range []string{"policy push rejected", "probe request rejected"} {
		if n := strings.Count(e.logs.String(), msg); n == 0 || n > 10 {
			t.Errorf("%d lines %q for %d rejected requests, want 1 to 10", n, msg, flood)
		}
	}
}
