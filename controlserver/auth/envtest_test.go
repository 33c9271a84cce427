package auth

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/inferencecache/controlserver/internal/kubetest"
)

// countingReviewer counts the reviews that reach the real Reviewer.
type countingReviewer struct {
	inner Reviewer
	n     atomic.Int64 // reviews forwarded to inner; added by request goroutines
}

func (c *countingReviewer) Create(ctx context.Context, rv *authnv1.TokenReview, o metav1.CreateOptions) (*authnv1.TokenReview, error) {
	c.n.Add(1)
	return c.inner.Create(ctx, rv, o)
}

// TestAgainstAPIServer runs the middleware against a real kube-apiserver +
// etcd with real TokenRequest tokens. The subtests run in order; the last
// ones stop the apiserver.
func TestAgainstAPIServer(t *testing.T) {
	env := kubetest.Start(t)
	const (
		ns         = "inferencecache-system"
		controller = "inferencecache-controller"
		intruder   = "intruder"
		policyAud  = "inferencecache.io/policy"
	)
	env.CreateServiceAccount(t, ns, controller)
	env.CreateServiceAccount(t, ns, intruder)
	identity := ServiceAccountPrefix + ns + ":" + controller

	// The real Reviewer, built the way the server builds it: from a
	// kubeconfig file.
	kube, err := NewKubeReviewer(env.WriteKubeconfig(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	counter := &countingReviewer{inner: kube}
	rec := &countingRecorder{}
	logs := &syncBuffer{}
	a, err := New(Config{
		Reviewer: counter, Audience: testAudience, AllowedIdentity: identity, Recorder: rec,
		ReviewTimeout: 5 * time.Second,
		Logger:        slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64 // wrapped-handler runs; added by the server goroutines
	srv := httptest.NewServer(a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ran.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()
	client := &http.Client{Timeout: 15 * time.Second}

	do := func(t *testing.T, token string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/snapshot", nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// expect runs one request and checks status, result and review count.
	expect := func(t *testing.T, token string, code int, result string, reviews int64) {
		t.Helper()
		beforeRev, beforeRes, beforeRan := counter.n.Load(), rec.get(result), ran.Load()
		if got := do(t, token); got != code {
			t.Errorf("status = %d, want %d", got, code)
		}
		if got := rec.get(result) - beforeRes; got != 1 {
			t.Errorf("result %q recorded %d times, want 1 (all: %v)", result, got, rec.n)
		}
		if got := counter.n.Load() - beforeRev; got != reviews {
			t.Errorf("reviews = %d, want %d", got, reviews)
		}
		if got := ran.Load() - beforeRan; (got == 1) != (code == http.StatusNoContent) {
			t.Errorf("handler ran %d times", got)
		}
	}

	good := env.Token(t, ns, controller, testAudience)
	t.Run("right SA, right audience", func(t *testing.T) {
		expect(t, good, http.StatusNoContent, ResultOK, 1)
	})
	t.Run("cached: no second review", func(t *testing.T) {
		for range 3 {
			expect(t, good, http.StatusNoContent, ResultOK, 0)
		}
	})
	t.Run("right SA, wrong audience", func(t *testing.T) {
		expect(t, env.Token(t, ns, controller, policyAud), http.StatusUnauthorized, ResultUnauth, 1)
		if !strings.Contains(logs.String(), "is invalid for the target audiences") {
			t.Errorf("the apiserver's audience diagnostic is not logged at WARN:\n%s", logs)
		}
	})
	t.Run("right SA, default audience", func(t *testing.T) {
		expect(t, env.Token(t, ns, controller), http.StatusUnauthorized, ResultUnauth, 1)
	})
	t.Run("token with both audiences", func(t *testing.T) {
		// The review intersects the token's audiences with ours: accepted.
		expect(t, env.Token(t, ns, controller, policyAud, testAudience), http.StatusNoContent, ResultOK, 1)
	})
	t.Run("other SA", func(t *testing.T) {
		expect(t, env.Token(t, ns, intruder, testAudience), http.StatusForbidden, ResultForbidden, 1)
		if !strings.Contains(logs.String(), ServiceAccountPrefix+ns+":"+intruder) {
			t.Error("the rejected identity is not logged")
		}
	})
	t.Run("other SA again: forbidden is not cached", func(t *testing.T) {
		expect(t, env.Token(t, ns, intruder, testAudience), http.StatusForbidden, ResultForbidden, 1)
	})
	t.Run("tampered token", func(t *testing.T) {
		expect(t, kubetest.Tamper(good), http.StatusUnauthorized, ResultUnauth, 1)
	})
	t.Run("missing bearer", func(t *testing.T) {
		expect(t, "", http.StatusUnauthorized, ResultUnauth, 0)
	})
	if t.Failed() {
		t.FailNow()
	}

	// Mint before the apiserver goes away: a valid token that is not cached.
	uncached := env.Token(t, ns, controller, testAudience)
	stopped := time.Now()
	env.StopAPIServer(t)
	t.Logf("kube-apiserver stopped in %v", time.Since(stopped).Round(time.Millisecond))

	t.Run("apiserver down: uncached token fails closed", func(t *testing.T) {
		start := time.Now()
		expect(t, uncached, http.StatusServiceUnavailable, ResultError, 1)
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("fail-closed took %v", d)
		}
	})
	t.Run("apiserver down: cached token still served without a review", func(t *testing.T) {
		expect(t, good, http.StatusNoContent, ResultOK, 0)
	})
	t.Run("apiserver down: cached token expires and then fails closed", func(t *testing.T) {
		a.now = func() time.Time { return time.Now().Add(DefaultCacheTTL + time.Second) }
		expect(t, good, http.StatusServiceUnavailable, ResultError, 1)
	})
}
