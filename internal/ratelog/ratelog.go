// Package ratelog rate-limits log lines that a client or a bus message can
// trigger, so a flood of bad requests costs a bounded number of lines
// instead of one each (and the disk, and the log pipeline behind it).
//
// Each call site owns a Limiter: a token bucket that lets a burst of lines
// through, then one per interval. Lines held back are counted, and the next
// line let through carries the count as "suppressed" (0 when none were), so
// nothing is lost silently: the number of events is in the log, only their
// individual lines are not.
//
//	type handler struct {
//		badPush ratelog.Limiter // the zero value: one line per 10 s
//	}
//	h.badPush.Warn(ctx, log, "policy push rejected", "err", err)
//
// On a hot path, call Allow first so a held-back line costs nothing but
// the bucket, not its arguments:
//
//	if held, ok := s.dropLog.Allow(); ok {
//		s.log.Warn("reports dropped", "tenant", clip(t), ratelog.SuppressedKey, held)
//	}
//
// A Limiter is safe for concurrent use and lock-free: Allow is one atomic
// load and add when it holds a line back, so a hot path (a lookup, an
// update) can call it on every bad request. The zero value is ready to use;
// a Limiter must not be copied after first use.
package ratelog

import (
	"context"
	"log/slog"
	"runtime"
	"sync/atomic"
	"time"
)

// SuppressedKey is the attribute carrying the count of lines held back
// since the previous line of the same call site.
const SuppressedKey = "suppressed"

// DefaultEvery is the interval of a Limiter whose Every is 0.
const DefaultEvery = 10 * time.Second

// Limiter is one call site's token bucket (a GCRA: a line at time t is let
// through when the bucket's theoretical arrival time is at most
// (Burst-1)*Every after t). Set its fields before first use, or not at all.
type Limiter struct {
	// Burst is how many lines go through at once; 0 (or less) means 1.
	Burst int
	// Every is the interval at which the bucket refills by one line; 0
	// (or less) means DefaultEvery.
	Every time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	// tat is the theoretical arrival time in Unix ns; updated by Allow
	// with compare-and-swap, by any goroutine.
	tat atomic.Int64
	// suppressed counts the lines held back since the last one let
	// through; Allow adds to it and swaps it to 0 when it lets one through.
	suppressed atomic.Int64
}

// New returns a Limiter that lets burst lines through at once and then one
// per every.
func New(burst int, every time.Duration) *Limiter {
	return &Limiter{Burst: burst, Every: every}
}

// NewWithClock is New with the clock the bucket reads (tests).
func NewWithClock(burst int, every time.Duration, now func() time.Time) *Limiter {
	return &Limiter{Burst: burst, Every: every, Now: now}
}

func (l *Limiter) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Allow reports whether a line may be logged now and, when it may, how many
// lines were held back since the last one it let through.
func (l *Limiter) Allow() (suppressed int64, ok bool) {
	every := int64(l.Every)
	if every <= 0 {
		every = int64(DefaultEvery)
	}
	tolerance := int64(max(l.Burst, 1)-1) * every
	t := l.now().UnixNano()
	for {
		tat := l.tat.Load()
		next := max(tat, t)
		if next-t > tolerance {
			l.suppressed.Add(1)
			return 0, false
		}
		if l.tat.CompareAndSwap(tat, next+every) {
			return l.suppressed.Swap(0), true
		}
	}
}

// Log logs msg at level through logger when the logger is enabled for it
// and the limiter lets the line through, adding the suppressed count. The
// line's source is Log's caller. A disabled level costs no token.
func (l *Limiter) Log(ctx context.Context, logger *slog.Logger, level slog.Level, msg string, args ...any) {
	l.emit(ctx, logger, level, msg, args)
}

// Warn is Log at slog.LevelWarn.
func (l *Limiter) Warn(ctx context.Context, logger *slog.Logger, msg string, args ...any) {
	l.emit(ctx, logger, slog.LevelWarn, msg, args)
}

// Error is Log at slog.LevelError.
func (l *Limiter) Error(ctx context.Context, logger *slog.Logger, msg string, args ...any) {
	l.emit(ctx, logger, slog.LevelError, msg, args)
}

// Info is Log at slog.LevelInfo.
func (l *Limiter) Info(ctx context.Context, logger *slog.Logger, msg string, args ...any) {
	l.emit(ctx, logger, slog.LevelInfo, msg, args)
}

// Debug is Log at slog.LevelDebug.
func (l *Limiter) Debug(ctx context.Context, logger *slog.Logger, msg string, args ...any) {
	l.emit(ctx, logger, slog.LevelDebug, msg, args)
}

// emit is the body of Log and the level methods; it must be called
// directly by them (the source frame is two above it).
func (l *Limiter) emit(ctx context.Context, logger *slog.Logger, level slog.Level, msg string, args []any) {
	if !logger.Enabled(ctx, level) {
		return
	}
	n, ok := l.Allow()
	if !ok {
		return
	}
	var pcs [1]uintptr
	runtime.Callers(3, pcs[:]) // runtime.Callers, emit, Log or a level method: the caller is next
	r := slog.NewRecord(l.now(), level, msg, pcs[0])
	r.Add(args...)
	r.AddAttrs(slog.Int64(SuppressedKey, n))
	_ = logger.Handler().Handle(ctx, r)
}
