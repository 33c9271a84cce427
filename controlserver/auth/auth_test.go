package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	testAudience = "inferencecache.io/controller"
	testIdentity = "system:serviceaccount:inferencecache-system:controller"
)

// fakeReviewer answers TokenReviews from a function and counts calls.
type fakeReviewer struct {
	calls  atomic.Int64 // Create calls; added by request goroutines, read by the test
	mu     sync.Mutex   // guards last
	last   *authnv1.TokenReview
	answer func(ctx context.Context, token string) (*authnv1.TokenReview, error)
}

func (f *fakeReviewer) Create(ctx context.Context, rv *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	f.calls.Add(1)
	f.mu.Lock()
	f.last = rv.DeepCopy()
	f.mu.Unlock()
	return f.answer(ctx, rv.Spec.Token)
}

// reviewAs returns an answer function: authenticated tokens map to usernames;
// others are rejected with an apiserver-like diagnostic.
func reviewAs(users map[string]string) func(context.Context, string) (*authnv1.TokenReview, error) {
	return func(_ context.Context, token string) (*authnv1.TokenReview, error) {
		u, ok := users[token]
		if !ok {
			return &authnv1.TokenReview{Status: authnv1.TokenReviewStatus{Error: "[invalid bearer token, token audiences [\"other\"] is invalid for the target audiences [\"" + testAudience + "\"]]"}}, nil
		}
		return &authnv1.TokenReview{Status: authnv1.TokenReviewStatus{
			Authenticated: true, Audiences: []string{testAudience},
			User: authnv1.UserInfo{Username: u},
		}}, nil
	}
}

// countingRecorder counts results.
type countingRecorder struct {
	mu sync.Mutex // guards n
	n  map[string]int
}

func (c *countingRecorder) Record(r string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[r]++
}

func (c *countingRecorder) get(r string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[r]
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type fixture struct {
	a    *Authenticator
	rev  *fakeReviewer
	rec  *countingRecorder
	logs *syncBuffer
	h    http.Handler
	ran  atomic.Int64 // handler invocations
	now  time.Time    // the fake clock; only the test goroutine moves it
}

func newFixture(t *testing.T, mod func(*Config)) *fixture {
	t.Helper()
	f := &fixture{
		rev:  &fakeReviewer{answer: reviewAs(map[string]string{"good": testIdentity, "other": "system:serviceaccount:ns:intruder"})},
		rec:  &countingRecorder{},
		logs: &syncBuffer{},
		now:  time.Unix(1_800_000_000, 0),
	}
	cfg := Config{
		Reviewer: f.rev, Audience: testAudience, AllowedIdentity: testIdentity, Recorder: f.rec,
		Logger: slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.now = func() time.Time { return f.now }
	f.a = a
	f.h = a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		f.ran.Add(1)
		w.WriteHeader(http.StatusTeapot)
	}))
	return f
}

func (f *fixture) do(authz ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/snapshot", nil)
	for _, v := range authz {
		r.Header.Add("Authorization", v)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

func TestNewValidation(t *testing.T) {
	rev := &fakeReviewer{}
	ok := Config{Reviewer: rev, Audience: testAudience, AllowedIdentity: testIdentity}
	cases := map[string]func(*Config){
		"nil reviewer":        func(c *Config) { c.Reviewer = nil },
		"empty audience":      func(c *Config) { c.Audience = "" },
		"space audience":      func(c *Config) { c.Audience = " " },
		"leading space":       func(c *Config) { c.Audience = " " + testAudience },
		"trailing newline":    func(c *Config) { c.Audience = testAudience + "\n" },
		"empty identity":      func(c *Config) { c.AllowedIdentity = "" },
		"identity not SA":     func(c *Config) { c.AllowedIdentity = "admin" },
		"identity ns/name":    func(c *Config) { c.AllowedIdentity = "inferencecache-system/controller" },
		"identity no name":    func(c *Config) { c.AllowedIdentity = "system:serviceaccount:ns:" },
		"identity no ns":      func(c *Config) { c.AllowedIdentity = "system:serviceaccount::name" },
		"identity extra part": func(c *Config) { c.AllowedIdentity = "system:serviceaccount:ns:name:x" },
		"identity padded":     func(c *Config) { c.AllowedIdentity = testIdentity + " " },
		"negative TTL":        func(c *Config) { c.CacheTTL = -time.Second },
		"negative size":       func(c *Config) { c.CacheSize = -1 },
		"negative timeout":    func(c *Config) { c.ReviewTimeout = -1 },
	}
	for name, mod := range cases {
		t.Run(name, func(t *testing.T) {
			c := ok
			mod(&c)
			a, err := New(c)
			if !errors.Is(err, ErrInvalidConfig) || a != nil {
				t.Fatalf("New = %v, %v; want ErrInvalidConfig", a, err)
			}
		})
	}
	a, err := New(ok)
	if err != nil {
		t.Fatal(err)
	}
	if a.cache.ttl != 30*time.Second || a.cache.size != 32 || a.reviewTimeout != DefaultReviewTimeout {
		t.Errorf("defaults: ttl %v size %d timeout %v", a.cache.ttl, a.cache.size, a.reviewTimeout)
	}
}

func TestBearerParsing(t *testing.T) {
	long := strings.Repeat("a", MaxTokenBytes+1)
	cases := []struct {
		name   string
		header []string
		token  string // "" = rejected
	}{
		{"missing", nil, ""},
		{"empty header", []string{""}, ""},
		{"scheme only", []string{"Bearer"}, ""},
		{"scheme and space", []string{"Bearer "}, ""},
		{"basic", []string{"Basic dXNlcjpwYXNz"}, ""},
		{"no scheme", []string{"good"}, ""},
		{"two headers", []string{"Bearer good", "Bearer good"}, ""},
		{"inner space", []string{"Bearer go od"}, ""},
		{"bad char", []string{"Bearer go\"od"}, ""},
		{"only padding", []string{"Bearer =="}, ""},
		{"padding inside", []string{"Bearer a=b"}, ""},
		{"too long", []string{"Bearer " + long}, ""},
		{"ok", []string{"Bearer good"}, "good"},
		{"lower-case scheme", []string{"bearer good"}, "good"},
		{"extra spaces", []string{"Bearer   good"}, "good"},
		{"jwt charset", []string{"Bearer eyJ0.eyJz-_~+/.sig=="}, "eyJ0.eyJz-_~+/.sig=="},
		{"max length", []string{"Bearer " + long[1:]}, long[1:]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range c.header {
				h.Add("Authorization", v)
			}
			tok, problem := bearerToken(h)
			if tok != c.token || (c.token == "") != (problem != "") {
				t.Errorf("bearerToken = %q, %q; want token %q", tok, problem, c.token)
			}
		})
	}
}

func TestOutcomes(t *testing.T) {
	transportErr := errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	cases := []struct {
		name    string
		authz   []string
		answer  func(context.Context, string) (*authnv1.TokenReview, error)
		code    int
		result  string
		reviews int64
		logs    []string
	}{
		{"ok", []string{"Bearer good"}, nil, http.StatusTeapot, ResultOK, 1, nil},
		{"missing bearer", nil, nil, http.StatusUnauthorized, ResultUnauth, 0, []string{"level=WARN", "missing Authorization header"}},
		{"empty bearer", []string{"Bearer "}, nil, http.StatusUnauthorized, ResultUnauth, 0, []string{"empty bearer token"}},
		{"malformed bearer", []string{"Token good"}, nil, http.StatusUnauthorized, ResultUnauth, 0, []string{"not Bearer"}},
		{"not authenticated", []string{"Bearer bad"}, nil, http.StatusUnauthorized, ResultUnauth, 1,
			[]string{"level=WARN", "is invalid for the target audiences"}},
		{"authenticated without the audience", []string{"Bearer good"},
			func(context.Context, string) (*authnv1.TokenReview, error) {
				return &authnv1.TokenReview{Status: authnv1.TokenReviewStatus{Authenticated: true,
					Audiences: []string{"https://kubernetes.default.svc"}, User: authnv1.UserInfo{Username: testIdentity}}}, nil
			}, http.StatusUnauthorized, ResultUnauth, 1, []string{"level=WARN", "audience missing"}},
		{"authenticated with no audiences", []string{"Bearer good"},
			func(context.Context, string) (*authnv1.TokenReview, error) {
				return &authnv1.TokenReview{Status: authnv1.TokenReviewStatus{Authenticated: true,
					User: authnv1.UserInfo{Username: testIdentity}}}, nil
			}, http.StatusUnauthorized, ResultUnauth, 1, nil},
		{"other identity", []string{"Bearer other"}, nil, http.StatusForbidden, ResultForbidden, 1,
			[]string{"level=WARN", "system:serviceaccount:ns:intruder"}},
		{"transport error", []string{"Bearer good"},
			func(context.Context, string) (*authnv1.TokenReview, error) { return nil, transportErr },
			http.StatusServiceUnavailable, ResultError, 1, []string{"level=ERROR", "connection refused"}},
		{"nil response", []string{"Bearer good"},
			func(context.Context, string) (*authnv1.TokenReview, error) { return nil, nil },
			http.StatusServiceUnavailable, ResultError, 1, []string{"nil TokenReview response"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, nil)
			if c.answer != nil {
				f.rev.answer = c.answer
			}
			w := f.do(c.authz...)
			if w.Code != c.code {
				t.Errorf("status = %d, want %d (body %q)", w.Code, c.code, w.Body)
			}
			if ran := f.ran.Load(); (ran == 1) != (c.result == ResultOK) {
				t.Errorf("handler ran %d times", ran)
			}
			if f.rec.get(c.result) != 1 {
				t.Errorf("recorder = %v, want one %q", f.rec.n, c.result)
			}
			if got := f.rev.calls.Load(); got != c.reviews {
				t.Errorf("reviews = %d, want %d", got, c.reviews)
			}
			if c.code == http.StatusUnauthorized && !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Bearer") {
				t.Error("401 without WWW-Authenticate: Bearer")
			}
			logs := f.logs.String()
			for _, s := range c.logs {
				if !strings.Contains(logs, s) {
					t.Errorf("logs lack %q:\n%s", s, logs)
				}
			}
			if strings.Contains(logs, "good") || strings.Contains(w.Body.String(), "good") {
				t.Errorf("the token leaked into logs or body:\n%s", logs)
			}
			if c.reviews > 0 {
				f.rev.mu.Lock()
				spec := f.rev.last.Spec
				f.rev.mu.Unlock()
				if len(spec.Audiences) != 1 || spec.Audiences[0] != testAudience {
					t.Errorf("review audiences = %q, want [%q]", spec.Audiences, testAudience)
				}
			}
		})
	}
}

func TestCache(t *testing.T) {
	t.Run("hit within TTL, review after", func(t *testing.T) {
		f := newFixture(t, nil)
		for range 5 {
			if w := f.do("Bearer good"); w.Code != http.StatusTeapot {
				t.Fatalf("status %d", w.Code)
			}
			f.now = f.now.Add(5 * time.Second) // 0, 5, ..., 20 s: all within 30 s of the review
		}
		if n := f.rev.calls.Load(); n != 1 {
			t.Fatalf("reviews = %d, want 1 (cache hits)", n)
		}
		if f.rec.get(ResultOK) != 5 {
			t.Errorf("ok recorded %d times, want 5 (hits count)", f.rec.get(ResultOK))
		}
		f.now = f.now.Add(10 * time.Second) // 35 s after the review
		f.do("Bearer good")
		if n := f.rev.calls.Load(); n != 2 {
			t.Fatalf("reviews = %d after TTL, want 2", n)
		}
	})
	t.Run("only successes are cached", func(t *testing.T) {
		f := newFixture(t, nil)
		for range 3 {
			f.do("Bearer bad")
			f.do("Bearer other")
		}
		if n := f.rev.calls.Load(); n != 6 {
			t.Errorf("reviews = %d, want 6", n)
		}
		fail := true
		f.rev.answer = func(_ context.Context, tok string) (*authnv1.TokenReview, error) {
			if fail {
				return nil, errors.New("boom")
			}
			return reviewAs(map[string]string{"good": testIdentity})(context.Background(), tok)
		}
		if w := f.do("Bearer good"); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("status %d", w.Code)
		}
		fail = false
		if w := f.do("Bearer good"); w.Code != http.StatusTeapot {
			t.Fatalf("after an error the next review must run: status %d", w.Code)
		}
		if f.a.cache.len() != 1 {
			t.Errorf("cache holds %d entries, want 1", f.a.cache.len())
		}
	})
	t.Run("keyed by SHA-256", func(t *testing.T) {
		f := newFixture(t, nil)
		f.do("Bearer good")
		f.a.cache.mu.Lock()
		_, ok := f.a.cache.entries[sha256.Sum256([]byte("good"))]
		f.a.cache.mu.Unlock()
		if !ok {
			t.Fatal("no entry under sha256(token)")
		}
	})
	t.Run("size bound evicts the oldest", func(t *testing.T) {
		f := newFixture(t, func(c *Config) { c.CacheSize = 4 })
		users := map[string]string{}
		for i := range 6 {
			users[fmt.Sprintf("tok%d", i)] = testIdentity
		}
		f.rev.answer = reviewAs(users)
		for i := range 4 {
			f.do(fmt.Sprintf("Bearer tok%d", i))
			f.now = f.now.Add(time.Second)
		}
		f.do("Bearer tok0") // hit: does not refresh the insertion order
		f.do("Bearer tok4") // full: evicts tok0, the oldest inserted
		if f.a.cache.len() != 4 {
			t.Fatalf("cache len %d, want 4", f.a.cache.len())
		}
		before := f.rev.calls.Load()
		f.do("Bearer tok1")
		f.do("Bearer tok4")
		if n := f.rev.calls.Load() - before; n != 0 {
			t.Errorf("tok1/tok4 reviewed again (%d): should be cached", n)
		}
		f.do("Bearer tok0")
		if n := f.rev.calls.Load() - before; n != 1 {
			t.Errorf("tok0 was not evicted (reviews %d)", n)
		}
	})
	t.Run("full cache drops expired entries first", func(t *testing.T) {
		f := newFixture(t, func(c *Config) { c.CacheSize = 2; c.CacheTTL = 10 * time.Second })
		f.rev.answer = reviewAs(map[string]string{"a": testIdentity, "b": testIdentity, "c": testIdentity})
		f.do("Bearer a")
		f.now = f.now.Add(8 * time.Second)
		f.do("Bearer b")
		f.now = f.now.Add(3 * time.Second) // a expired, b live
		f.do("Bearer c")
		if f.a.cache.len() != 2 {
			t.Fatalf("cache len %d", f.a.cache.len())
		}
		before := f.rev.calls.Load()
		f.do("Bearer b")
		if f.rev.calls.Load() != before {
			t.Error("b was evicted although an expired entry was available")
		}
	})
}

// TestReviewTimeout: a hung apiserver is bounded by ReviewTimeout and fails
// closed.
func TestReviewTimeout(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.ReviewTimeout = 50 * time.Millisecond })
	f.rev.answer = func(ctx context.Context, _ string) (*authnv1.TokenReview, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Second):
			return nil, errors.New("ReviewTimeout not applied")
		}
	}
	start := time.Now()
	w := f.do("Bearer good")
	if w.Code != http.StatusServiceUnavailable || f.rec.get(ResultError) != 1 {
		t.Fatalf("status %d, recorder %v", w.Code, f.rec.n)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	if !strings.Contains(f.logs.String(), "deadline exceeded") {
		t.Errorf("logs: %s", f.logs.String())
	}
}

// TestConcurrentRequests exercises the cache and recorder from many
// goroutines (run with -race).
func TestConcurrentRequests(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.CacheSize = 8 })
	users := map[string]string{}
	for i := range 16 {
		users[fmt.Sprintf("tok%d", i)] = testIdentity
	}
	f.rev.answer = reviewAs(users)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				r := httptest.NewRequest(http.MethodGet, "/snapshot", nil)
				r.Header.Set("Authorization", fmt.Sprintf("Bearer tok%d", (g+i)%16))
				w := httptest.NewRecorder()
				f.h.ServeHTTP(w, r)
				if w.Code != http.StatusTeapot {
					t.Errorf("status %d", w.Code)
					return
				}
			}
		})
	}
	wg.Wait()
	if f.rec.get(ResultOK) != 8*200 {
		t.Errorf("ok = %d", f.rec.get(ResultOK))
	}
	if n := f.a.cache.len(); n > 8 {
		t.Errorf("cache len %d exceeds its size", n)
	}
}
