// Package auth is the TokenReview-backed bearer middleware in front of the
// server's internal :8081 endpoints (/snapshot, /policy, /probe). It enforces
// the two L7 gates of the control bridge:
//
//   - identity: the bearer token must resolve, through a TokenReview against
//     the kube-apiserver, to exactly the configured controller ServiceAccount
//     (Config.AllowedIdentity, "system:serviceaccount:<ns>:<name>");
//   - audience: the review is issued with Spec.Audiences = [Config.Audience],
//     so a token minted for another audience (the apiserver default, or the
//     other endpoint's audience) is not authenticated; the returned
//     status.audiences must contain the audience too.
//
// Outcomes, reported once per request to Config.Recorder and mapped to HTTP:
//
//	ok        200 path: the wrapped handler runs
//	unauth    401: missing, empty or malformed bearer; Authenticated=false
//	          (bad token, wrong audience: the apiserver's status.error is
//	          logged at WARN); audience absent from status.audiences
//	forbidden 403: authenticated as another identity
//	error     503: the review failed (transport error, timeout, nil
//	          response); fail closed
//
// Successful reviews are cached per Authenticator (one per endpoint) for
// Config.CacheTTL (30 s) in at most Config.CacheSize (32) entries, keyed by
// the SHA-256 of the token; the token itself is never stored or logged. A
// cached token is accepted until its entry expires even if it was revoked or
// expired at the apiserver in the meantime: that window is at most CacheTTL.
package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/inferencecache/internal/ratelog"
)

// Results reported to a Recorder; they are the values of the result label of
// inferencecache_{snapshot,policy,probe}_auth_total.
const (
	ResultOK        = "ok"
	ResultUnauth    = "unauth"
	ResultForbidden = "forbidden"
	ResultError     = "error"
)

// Defaults for the zero Config fields.
const (
	DefaultCacheTTL      = 30 * time.Second
	DefaultCacheSize     = 32
	DefaultReviewTimeout = 10 * time.Second
)

// MaxTokenBytes bounds the bearer token; a longer one is malformed (service
// account tokens are about 1 KiB) and is never sent to the apiserver.
const MaxTokenBytes = 16 << 10

// ServiceAccountPrefix starts every ServiceAccount username.
const ServiceAccountPrefix = "system:serviceaccount:"

// ErrInvalidConfig is wrapped by every New error.
var ErrInvalidConfig = errors.New("auth: invalid config")

// Reviewer creates TokenReviews. Its method is exactly client-go's
// TokenReviewInterface.Create, so clientset.AuthenticationV1().TokenReviews()
// is a Reviewer (see NewKubeReviewer and ReviewerFromClientset).
type Reviewer interface {
	Create(ctx context.Context, review *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error)
}

// Recorder receives one result (ResultOK, ResultUnauth, ResultForbidden or
// ResultError) per request that reaches the middleware. It is called from
// request goroutines concurrently.
type Recorder interface {
	Record(result string)
}

// Config configures one endpoint's Authenticator.
type Config struct {
	// Reviewer issues the TokenReviews. Required.
	Reviewer Reviewer
	// Audience is passed as TokenReviewSpec.Audiences=[Audience] and must be
	// echoed in status.audiences. Required; surrounding whitespace is an
	// error (a padded flag value would never match a token's audience).
	Audience string
	// AllowedIdentity is the one username accepted, of the form
	// "system:serviceaccount:<namespace>:<name>". Required.
	AllowedIdentity string
	// CacheTTL is how long a successful review is reused; 0 means
	// DefaultCacheTTL.
	CacheTTL time.Duration
	// CacheSize bounds the cached reviews; 0 means DefaultCacheSize.
	CacheSize int
	// ReviewTimeout bounds one TokenReview call; 0 means
	// DefaultReviewTimeout. A timeout is a ResultError (503).
	ReviewTimeout time.Duration
	// Recorder counts outcomes; nil records nothing.
	Recorder Recorder
	// Logger receives the WARN diagnostics of denials; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Authenticator is the middleware of one endpoint. It is safe for concurrent
// use; create one per endpoint so caches and counters stay independent.
type Authenticator struct {
	reviewer        Reviewer
	audience        string
	allowedIdentity string
	reviewTimeout   time.Duration
	recorder        Recorder
	log             *slog.Logger
	cache           tokenCache
	// now is the clock (time.Now; tests replace it before first use).
	now func() time.Time
	// One limiter per denial log line: any client that reaches the
	// listener can trigger them, once per request (the zero value: one
	// line per 10 s, the next counting those held back; the Recorder
	// counts every request).
	noTokenLog, reviewErrLog, nilReviewLog, unauthenticatedLog, audienceLog, identityLog ratelog.Limiter
}

// New validates cfg and returns the endpoint's Authenticator.
func New(cfg Config) (*Authenticator, error) {
	if cfg.Reviewer == nil {
		return nil, fmt.Errorf("%w: nil Reviewer", ErrInvalidConfig)
	}
	if cfg.Audience == "" {
		return nil, fmt.Errorf("%w: empty audience", ErrInvalidConfig)
	}
	if strings.TrimSpace(cfg.Audience) != cfg.Audience {
		return nil, fmt.Errorf("%w: audience %q has surrounding whitespace", ErrInvalidConfig, cfg.Audience)
	}
	if err := validateIdentity(cfg.AllowedIdentity); err != nil {
		return nil, err
	}
	ttl, size, timeout := cfg.CacheTTL, cfg.CacheSize, cfg.ReviewTimeout
	switch {
	case ttl < 0:
		return nil, fmt.Errorf("%w: negative cache TTL %v", ErrInvalidConfig, ttl)
	case size < 0:
		return nil, fmt.Errorf("%w: negative cache size %d", ErrInvalidConfig, size)
	case timeout < 0:
		return nil, fmt.Errorf("%w: negative review timeout %v", ErrInvalidConfig, timeout)
	}
	if ttl == 0 {
		ttl = DefaultCacheTTL
	}
	if size == 0 {
		size = DefaultCacheSize
	}
	if timeout == 0 {
		timeout = DefaultReviewTimeout
	}
	a := &Authenticator{
		reviewer:        cfg.Reviewer,
		audience:        cfg.Audience,
		allowedIdentity: cfg.AllowedIdentity,
		reviewTimeout:   timeout,
		recorder:        cfg.Recorder,
		log:             cfg.Logger,
		cache:           tokenCache{ttl: ttl, size: size, entries: make(map[[sha256.Size]byte]cacheEntry, size)},
		now:             time.Now,
	}
	if a.recorder == nil {
		a.recorder = nopRecorder{}
	}
	if a.log == nil {
		a.log = slog.Default()
	}
	a.log = a.log.With("audience", a.audience)
	return a, nil
}

// validateIdentity accepts "system:serviceaccount:<namespace>:<name>" with a
// non-empty namespace and name and no whitespace.
func validateIdentity(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty allowed identity", ErrInvalidConfig)
	}
	rest, ok := strings.CutPrefix(id, ServiceAccountPrefix)
	ns, name, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || ns == "" || name == "" || strings.Contains(name, ":") || strings.ContainsAny(id, " \t\r\n") {
		return fmt.Errorf("%w: allowed identity %q is not %s<namespace>:<name>", ErrInvalidConfig, id, ServiceAccountPrefix)
	}
	return nil
}

// Wrap returns next behind the bearer gate. Its signature is
// func(http.Handler) http.Handler, the controlserver.Config auth hooks.
func (a *Authenticator) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		result := a.authenticate(r)
		a.recorder.Record(result)
		switch result {
		case ResultOK:
			next.ServeHTTP(w, r)
		case ResultUnauth:
			w.Header().Set("WWW-Authenticate", `Bearer realm="inferencecache"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
		case ResultForbidden:
			http.Error(w, "forbidden", http.StatusForbidden)
		default:
			http.Error(w, "token review unavailable", http.StatusServiceUnavailable)
		}
	})
}

// authenticate returns the request's result; it logs denials, rate-limited
// per kind.
func (a *Authenticator) authenticate(r *http.Request) string {
	log := a.log.With("path", r.URL.Path, "remote", r.RemoteAddr)
	ctx := r.Context()
	token, problem := bearerToken(r.Header)
	if problem != "" {
		a.noTokenLog.Warn(ctx, log, "control endpoint auth denied", "result", ResultUnauth, "reason", problem)
		return ResultUnauth
	}
	key := sha256.Sum256([]byte(token))
	if a.cache.get(key, a.now()) {
		return ResultOK
	}

	// The review is not tied to the client connection (a client that goes
	// away does not turn a review into an error), only to ReviewTimeout.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.reviewTimeout)
	defer cancel()
	resp, err := a.reviewer.Create(rctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{a.audience}},
	}, metav1.CreateOptions{})
	switch {
	case err != nil:
		a.reviewErrLog.Error(ctx, log, "control endpoint auth failed closed: TokenReview error", "result", ResultError, "err", err)
		return ResultError
	case resp == nil:
		a.nilReviewLog.Error(ctx, log, "control endpoint auth failed closed: nil TokenReview response", "result", ResultError)
		return ResultError
	}
	st := &resp.Status
	if !st.Authenticated {
		a.unauthenticatedLog.Warn(ctx, log, "control endpoint auth denied: token not authenticated", "result", ResultUnauth,
			"apiserver_error", st.Error)
		return ResultUnauth
	}
	if !slices.Contains(st.Audiences, a.audience) {
		a.audienceLog.Warn(ctx, log, "control endpoint auth denied: audience missing from the review status", "result", ResultUnauth,
			"status_audiences", st.Audiences)
		return ResultUnauth
	}
	if st.User.Username != a.allowedIdentity {
		a.identityLog.Warn(ctx, log, "control endpoint auth denied: identity not allowed", "result", ResultForbidden,
			"username", st.User.Username, "allowed", a.allowedIdentity)
		return ResultForbidden
	}
	a.cache.put(key, a.now())
	return ResultOK
}

// bearerToken extracts the token of a single "Authorization: Bearer <token>"
// header. problem is non-empty (and names why) when there is none or it is
// malformed.
func bearerToken(h http.Header) (token, problem string) {
	vals := h.Values("Authorization")
	switch len(vals) {
	case 0:
		return "", "missing Authorization header"
	case 1:
	default:
		return "", "more than one Authorization header"
	}
	scheme, rest, _ := strings.Cut(vals[0], " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", "Authorization scheme is not Bearer"
	}
	token = strings.Trim(rest, " ")
	switch {
	case token == "":
		return "", "empty bearer token"
	case len(token) > MaxTokenBytes:
		return "", "bearer token too long"
	case !isB64Token(token):
		return "", "malformed bearer token"
	}
	return token, ""
}

// isB64Token reports whether s matches RFC 6750's b64token:
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func isB64Token(s string) bool {
	body := strings.TrimRight(s, "=")
	if body == "" {
		return false
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/':
		default:
			return false
		}
	}
	return true
}

// tokenCache remembers successful reviews by token hash.
type tokenCache struct {
	ttl  time.Duration // fixed at construction
	size int           // fixed at construction; > 0

	// mu guards entries and seq; get and put take it for their whole body.
	mu      sync.Mutex
	entries map[[sha256.Size]byte]cacheEntry
	seq     uint64 // insertion counter: orders entries for oldest-first eviction
}

type cacheEntry struct {
	expires time.Time
	seq     uint64
}

// get reports whether key holds an unexpired entry, dropping an expired one.
func (c *tokenCache) get(key [sha256.Size]byte, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return false
	}
	if !now.Before(e.expires) {
		delete(c.entries, key)
		return false
	}
	return true
}

// put records a successful review at now. When the cache is full it first
// drops expired entries, then the oldest inserted one.
func (c *tokenCache) put(key [sha256.Size]byte, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.size {
		c.evictLocked(now)
	}
	c.entries[key] = cacheEntry{expires: now.Add(c.ttl), seq: c.seq}
}

// evictLocked makes room for one entry. c.mu must be held.
func (c *tokenCache) evictLocked(now time.Time) {
	var oldest [sha256.Size]byte
	oldestSeq := uint64(0)
	found := false
	for k, e := range c.entries {
		if !now.Before(e.expires) {
			delete(c.entries, k)
			continue
		}
		if !found || e.seq < oldestSeq {
			oldest, oldestSeq, found = k, e.seq, true
		}
	}
	if len(c.entries) >= c.size && found {
		delete(c.entries, oldest)
	}
}

// len returns the number of entries, expired or not (for tests).
func (c *tokenCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

type nopRecorder struct{}

func (nopRecorder) Record(string) {}
