// Package modeldir serves prompt_text tokenization from a --tokenizer-dir:
// the tokenizer of model M is DIR/M/tokenizer.json with the chat template
// of DIR/M/tokenizer_config.json (a model id with '/' maps to nested
// folders, as Hugging Face ids are laid out). Dir implements rpc.Tokenizer:
// Encode renders the text as one user message with the generation prompt,
// then tokenizes the rendering, special tokens included.
//
// A model is loaded on its first request, once however many requests wait
// for it (single flight), and kept. A failed load (missing folder, broken
// file, unsupported component or template) is logged once with the reason,
// counted, and remembered for RetryAfter: requests in that window fail fast
// (the caller fails open); the next one after it loads again. Nothing here
// panics on bad files.
package modeldir

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sync/singleflight"

	"github.com/inferencecache/inferencecache/chattemplate"
	"github.com/inferencecache/inferencecache/internal/ratelog"
	"github.com/inferencecache/inferencecache/tokenizer"
)

// Failure reasons of Observer.TokenizeFailed (the reason label of
// inferencecache_tokenize_failures_total).
const (
	ReasonInvalidModel = "invalid_model" // empty, path traversal, bad characters
	ReasonNotFound     = "not_found"     // no DIR/M/tokenizer.json
	ReasonLoadFailed   = "load_failed"   // unreadable, broken or unsupported tokenizer.json
	ReasonNoTemplate   = "no_template"   // tokenizer_config.json missing, broken or without chat_template
	ReasonRenderFailed = "render_failed" // the template raised or needs more than one user message
	ReasonEncodeFailed = "encode_failed" // the tokenizer refused the text (no unk token for a rune)
	ReasonCanceled     = "canceled"      // the caller's deadline passed first
)

// Reasons lists every failure reason, for exporting them at 0.
var Reasons = []string{ReasonInvalidModel, ReasonNotFound, ReasonLoadFailed, ReasonNoTemplate, ReasonRenderFailed, ReasonEncodeFailed, ReasonCanceled}

// Observer records tokenizations (servermetrics.Metrics implements it). It
// is called concurrently and must not block.
type Observer interface {
	// Tokenized records one successful Encode and its latency (loading,
	// rendering and tokenizing).
	Tokenized(elapsed time.Duration)
	// TokenizeFailed records one failed Encode.
	TokenizeFailed(reason string)
	// TokenizerLoaded records one load attempt of a model's files.
	TokenizerLoaded(ok bool)
}

// LoadFailureObserver is an Observer that also records which model failed
// to load and why (servermetrics' tokenizer_load_failures_total); Dir
// calls it when its Observer implements it. model is a valid model id.
type LoadFailureObserver interface {
	TokenizerLoadFailed(model, reason string)
}

// DefaultRetryAfter is how long a failed load is remembered.
const DefaultRetryAfter = 30 * time.Second

// maxRemembered bounds the failed loads kept (model ids come from requests).
const maxRemembered = 4096

// maxModelIDBytes bounds the model id turned into a path.
const maxModelIDBytes = 512

// Config configures a Dir.
type Config struct {
	// Root is the --tokenizer-dir. Required; it must be a directory.
	Root string
	// Observer records outcomes; nil records nothing.
	Observer Observer
	// RetryAfter is how long a failed load is remembered; 0 means
	// DefaultRetryAfter.
	RetryAfter time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// PrefixCacheBytes bounds each loaded model's cache of recent chat
	// renderings; 0 means DefaultPrefixCacheBytes.
	PrefixCacheBytes int64
}

// Dir is the tokenizer registry of a --tokenizer-dir. Safe for concurrent
// use.
type Dir struct {
	root  string
	obs   Observer
	retry time.Duration
	log   *slog.Logger
	now   func() time.Time
	// prefixBytes is Config.PrefixCacheBytes.
	prefixBytes int64

	// group makes concurrent first requests for a model share one load.
	group singleflight.Group

	// mu protects models and failed. Readers take it shared for one map
	// lookup per Encode.
	mu sync.RWMutex
	// models holds the loaded models; entries are never removed.
	models map[string]*model
	// failed remembers failed loads until their retry time.
	failed map[string]failure

	// failLog rate-limits the failed-load log line to one a second (set
	// up by New; lock-free, safe for concurrent use).
	failLog ratelog.Limiter
}

type model struct {
	tok  *tokenizer.Tokenizer
	tmpl *chattemplate.Template
	// tmplErr is why tmpl is nil (the config has no chat_template).
	tmplErr error
	// special is tok with the post-processor a completion prompt gets
	// (tokenizer.json's, or the tokenizer class's own; see
	// specialTokenizer).
	special *tokenizer.Tokenizer
	// prefix remembers recent chat renderings (RequestTokens).
	prefix *prefixCache
	// msgs keeps converted messages (RequestTokens); nil when the template
	// could modify them.
	msgs *msgCache
}

type failure struct {
	reason string
	err    error
	until  time.Time
}

// Error is returned by Encode: the failure reason and its cause.
type Error struct {
	Model  string
	Reason string
	Err    error
}

func (e *Error) Error() string {
	return fmt.Sprintf("cannot tokenize for model %.128q (%s): %v", e.Model, e.Reason, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrInvalidModel is the cause of ReasonInvalidModel failures.
var ErrInvalidModel = errors.New("modeldir: model id is not a relative folder path")

// New checks that cfg.Root is a directory.
func New(cfg Config) (*Dir, error) {
	st, err := os.Stat(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("cannot use tokenizer dir: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("cannot use tokenizer dir %q: not a directory", cfg.Root)
	}
	d := &Dir{
		root: cfg.Root, obs: cfg.Observer, retry: cfg.RetryAfter, log: cfg.Logger, now: cfg.Now,
		models: map[string]*model{}, failed: map[string]failure{},
	}
	if d.obs == nil {
		d.obs = nopObserver{}
	}
	if d.retry <= 0 {
		d.retry = DefaultRetryAfter
	}
	if d.log == nil {
		d.log = slog.Default()
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.prefixBytes = cfg.PrefixCacheBytes; d.prefixBytes <= 0 {
		d.prefixBytes = DefaultPrefixCacheBytes
	}
	d.failLog = ratelog.Limiter{Every: time.Second, Now: d.now}
	return d, nil
}

type nopObserver struct{}

func (nopObserver) Tokenized(time.Duration) {}
func (nopObserver) TokenizeFailed(string)   {}
func (nopObserver) TokenizerLoaded(bool)    {}

// ModelPath maps a model id to its folder under root, refusing ids that are
// not a clean relative path: empty, absolute, with "." or ".." or empty
// segments, backslashes, NUL or control characters, or over 512 bytes.
func ModelPath(root, id string) (string, error) {
	if id == "" || len(id) > maxModelIDBytes || !utf8.ValidString(id) {
		return "", ErrInvalidModel
	}
	for _, seg := range strings.Split(id, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", ErrInvalidModel
		}
	}
	for _, r := range id {
		if r < 0x20 || r == 0x7f || r == '\\' || r == ':' {
			return "", ErrInvalidModel
		}
	}
	rel := filepath.FromSlash(id)
	if !filepath.IsLocal(rel) {
		return "", ErrInvalidModel
	}
	return filepath.Join(root, rel), nil
}

// Encode implements rpc.Tokenizer.
func (d *Dir) Encode(ctx context.Context, modelID, text string) ([]uint32, error) {
	start := d.now()
	m, err := d.model(ctx, modelID)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			d.obs.TokenizeFailed(e.Reason)
		} else {
			d.obs.TokenizeFailed(ReasonCanceled)
		}
		return nil, err
	}
	if m.tmpl == nil {
		d.obs.TokenizeFailed(ReasonNoTemplate)
		return nil, &Error{modelID, ReasonNoTemplate, m.tmplErr}
	}
	rendered, err := m.tmpl.RenderUser(text)
	if err != nil {
		d.obs.TokenizeFailed(ReasonRenderFailed)
		return nil, &Error{modelID, ReasonRenderFailed, err}
	}
	ids, err := m.tok.Encode(ctx, make([]uint32, 0, len(rendered)/3+16), rendered)
	if err != nil {
		if ctx.Err() != nil {
			d.obs.TokenizeFailed(ReasonCanceled)
			return nil, err
		}
		d.obs.TokenizeFailed(ReasonEncodeFailed)
		return nil, &Error{modelID, ReasonEncodeFailed, err}
	}
	d.obs.Tokenized(d.now().Sub(start))
	return ids, nil
}

// model returns the loaded model, loading it (once) if needed.
func (d *Dir) model(ctx context.Context, id string) (*model, error) {
	if _, err := ModelPath(d.root, id); err != nil {
		// Not remembered nor logged: ids come from requests.
		return nil, &Error{id, ReasonInvalidModel, err}
	}
	d.mu.RLock()
	m, ok := d.models[id]
	f, failed := d.failed[id]
	d.mu.RUnlock()
	if ok {
		return m, nil
	}
	if failed && d.now().Before(f.until) {
		return nil, &Error{id, f.reason, f.err}
	}
	ch := d.group.DoChan(id, func() (any, error) { return d.load(id) })
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*model), nil
	case <-ctx.Done():
		// The load goes on; the next request finds it done.
		return nil, ctx.Err()
	}
}

// load reads the model's files; its outcome is stored for later requests.
func (d *Dir) load(id string) (*model, error) {
	d.mu.RLock()
	m, ok := d.models[id]
	d.mu.RUnlock()
	if ok {
		return m, nil
	}
	begin := d.now()
	m, reason, err := d.read(id)
	if err != nil {
		d.obs.TokenizerLoaded(false)
		if lf, ok := d.obs.(LoadFailureObserver); ok {
			lf.TokenizerLoadFailed(id, reason)
		}
		d.logFailure("cannot load the tokenizer of a model: prompt_text lookups for it fail open to NO_HINT",
			"model", clip(id), "reason", reason, "error", err, "retry_after", d.retry)
		d.mu.Lock()
		if len(d.failed) >= maxRemembered {
			for k := range d.failed { // drop an arbitrary one
				delete(d.failed, k)
				break
			}
		}
		d.failed[id] = failure{reason: reason, err: err, until: d.now().Add(d.retry)}
		d.mu.Unlock()
		return nil, &Error{id, reason, err}
	}
	d.obs.TokenizerLoaded(true)
	d.log.Info("loaded the tokenizer of a model", "model", clip(id), "took", d.now().Sub(begin))
	d.mu.Lock()
	d.models[id] = m
	delete(d.failed, id)
	d.mu.Unlock()
	return m, nil
}

func (d *Dir) read(id string) (*model, string, error) {
	dir, err := ModelPath(d.root, id)
	if err != nil {
		return nil, ReasonInvalidModel, err
	}
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ReasonNotFound, fmt.Errorf("cannot read tokenizer.json: %w", err)
		}
		return nil, ReasonLoadFailed, fmt.Errorf("cannot read tokenizer.json: %w", err)
	}
	tok, err := tokenizer.Load(data)
	if err != nil {
		return nil, ReasonLoadFailed, err
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, ReasonNoTemplate, fmt.Errorf("cannot read tokenizer_config.json: %w", err)
	}
	// A chat_template.jinja file, where the model has one, is the
	// template transformers uses.
	var src []byte
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil && len(b) > 0 {
		src = b
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, ReasonNoTemplate, fmt.Errorf("cannot read chat_template.jinja: %w", err)
	}
	tmpl, err := chattemplate.ParseWithSource(cfg, string(src))
	var tmplErr error
	if errors.Is(err, chattemplate.ErrNoTemplate) {
		// Completions need no template: the model loads, chats fail.
		tmpl, tmplErr = nil, err
	} else if err != nil {
		return nil, ReasonNoTemplate, err
	}
	special, err := specialTokenizer(tok, cfg)
	if err != nil {
		return nil, ReasonLoadFailed, err
	}
	m := &model{tok: tok, tmpl: tmpl, tmplErr: tmplErr, special: special, prefix: newPrefixCache(d.prefixBytes)}
	if tmpl != nil && !tmpl.MayModifyValues() {
		m.msgs = newMsgCache(d.prefixBytes)
	}
	return m, "", nil
}

// logFailure logs a failed load at ERROR, at most once a second (model ids
// come from requests; the count is in tokenizer_loads_total), the next line
// counting those held back.
func (d *Dir) logFailure(msg string, args ...any) {
	d.failLog.Error(context.Background(), d.log, msg, args...)
}

// clip bounds a request-supplied id in log lines.
func clip(s string) string {
	if len(s) <= 128 {
		return s
	}
	return s[:128] + "..."
}
