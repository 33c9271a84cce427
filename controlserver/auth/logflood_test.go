package auth

import (
	"net/http"
	"strings"
	"testing"
)

// TestDenialFloodLogsBounded: a flood of requests without a token, with a
// token the review does not authenticate, and with another identity's
// token, is denied each time (and recorded each time) but costs a bounded
// number of WARN lines per kind of denial.
func TestDenialFloodLogsBounded(t *testing.T) {
	const flood = 200
	f := newFixture(t, nil)
	for range flood {
		if w := f.do(); w.Code != http.StatusUnauthorized {
			t.Fatalf("no token: %d", w.Code)
		}
		if w := f.do("Bearer nobody"); w.Code != http.StatusUnauthorized {
			t.Fatalf("unknown token: %d", w.Code)
		}
		if w := f.do("Bearer other"); w.Code != http.StatusForbidden {
			t.Fatalf("other identity: %d", w.Code)
		}
	}
	if n := f.rec.get(ResultUnauth); n != 2*flood {
		t.Fatalf("recorded %d unauth results, want %d", n, 2*flood)
	}
	logs := f.logs.String()
	for _, msg := range []string{"auth denied\"", "token not authenticated", "identity not allowed"} {
		if n := strings.Count(logs, msg); n == 0 || n > 10 {
			t.Errorf("%d lines %q for %d denials, want 1 to 10", n, msg, flood)
		}
	}
}
