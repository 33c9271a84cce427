package endpoints

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// Observer is told what a source does, for metrics. It must be safe for
// concurrent use (the InferencePool source reports watch failures from its
// informers' goroutines) and return quickly. Prometheus counters and gauges
// qualify as they are.
type Observer interface {
	// PoolChanged is called each time the source publishes a pool that
	// differs from the previous one (the first one included), with its
	// number of endpoints.
	PoolChanged(endpoints int)
	// ReloadFailed is called once per failed attempt to make a new pool
	// (the last good pool stays published), with one of the Reason
	// constants: a small fixed set, fit for a metric label.
	ReloadFailed(reason string)
}

// Reasons passed to Observer.ReloadFailed.
const (
	// ReasonRead: the endpoints file cannot be read (missing, unreadable,
	// too large).
	ReasonRead = "read"
	// ReasonDecode: the file is not YAML or JSON of the schema (a syntax
	// error, an unknown or duplicate field, a wrong type).
	ReasonDecode = "decode"
	// ReasonInvalid: the input decodes but does not make a valid pool (a
	// bad address, a duplicate replica id, a bad InferencePool annotation).
	ReasonInvalid = "invalid"
	// ReasonWatch: a list or watch of the Kubernetes API failed (RBAC, the
	// apiserver unreachable); the cache retries by itself.
	ReasonWatch = "watch"
)

// Reasons lists every ReloadFailed reason, for exporting them at 0.
var Reasons = []string{ReasonRead, ReasonDecode, ReasonInvalid, ReasonWatch}

// Option configures a source made by NewFile or NewInferencePool.
type Option func(*options)

type options struct {
	observer Observer
	log      *slog.Logger
	resync   time.Duration
	// noWatch turns the fsnotify watch off, so tests can prove the
	// periodic re-read alone.
	noWatch bool
}

// DefaultResyncInterval is how often the file source re-reads its file
// whatever fsnotify says (a fallback for missed events and for symlinks
// that point outside the watched directory).
const DefaultResyncInterval = 10 * time.Second

// WithObserver reports pool changes and failed reloads to o.
func WithObserver(o Observer) Option { return func(c *options) { c.observer = o } }

// WithLogger logs to l instead of slog.Default().
func WithLogger(l *slog.Logger) Option { return func(c *options) { c.log = l } }

// WithResyncInterval sets how often the file source re-reads its file
// without an fsnotify event (DefaultResyncInterval; 0 or less: never). The
// InferencePool source ignores it: its informers keep it current.
func WithResyncInterval(d time.Duration) Option { return func(c *options) { c.resync = d } }

func makeOptions(opts []Option) options {
	o := options{resync: DefaultResyncInterval}
	for _, f := range opts {
		f(&o)
	}
	if o.observer == nil {
		o.observer = nopObserver{}
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	return o
}

type nopObserver struct{}

func (nopObserver) PoolChanged(int)     {}
func (nopObserver) ReloadFailed(string) {}

// warnEvery is the rate limit of a source's warnings: at most one per
// interval reaches WARN, the others go to DEBUG.
const warnEvery = 10 * time.Second

// limitedLog logs warnings at most once per warnEvery.
type limitedLog struct {
	log *slog.Logger
	// last is the UnixNano of the last WARN (0: none yet); CAS-updated by
	// any goroutine that warns (informer goroutines and Run).
	last atomic.Int64
}

func (l *limitedLog) warn(msg string, args ...any) {
	now := time.Now().UnixNano()
	if last := l.last.Load(); now-last >= int64(warnEvery) && l.last.CompareAndSwap(last, now) {
		l.log.Warn(msg, args...)
		return
	}
	l.log.Debug(msg, args...)
}
