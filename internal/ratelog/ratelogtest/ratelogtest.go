// Package ratelogtest records log lines for tests that bound how many a
// flood of bad input produces.
package ratelogtest

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// Recorder is a slog.Handler that keeps every record at or above its level.
// It is safe for concurrent use.
type Recorder struct {
	// Level is the lowest level recorded; records below it are not enabled.
	Level slog.Level

	mu      sync.Mutex // guards records
	records []slog.Record
	attrs   []slog.Attr // from WithAttrs; immutable per handler value
	shared  *Recorder   // the recorder the records go to (itself, or its parent)
}

// NewLogger returns a logger writing into a new Recorder at level.
func NewLogger(level slog.Level) (*slog.Logger, *Recorder) {
	r := &Recorder{Level: level}
	return slog.New(r), r
}

func (r *Recorder) root() *Recorder {
	if r.shared != nil {
		return r.shared
	}
	return r
}

// Enabled implements slog.Handler.
func (r *Recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.root().Level }

// Handle implements slog.Handler.
func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	rec = rec.Clone()
	rec.AddAttrs(r.attrs...)
	root := r.root()
	root.mu.Lock()
	root.records = append(root.records, rec)
	root.mu.Unlock()
	return nil
}

// WithAttrs implements slog.Handler.
func (r *Recorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &Recorder{attrs: append(append([]slog.Attr(nil), r.attrs...), as...), shared: r.root()}
}

// WithGroup implements slog.Handler (groups are flattened).
func (r *Recorder) WithGroup(string) slog.Handler { return r }

// Records returns the records so far.
func (r *Recorder) Records() []slog.Record {
	root := r.root()
	root.mu.Lock()
	defer root.mu.Unlock()
	return append([]slog.Record(nil), root.records...)
}

// Count returns how many records' messages contain substr ("" counts all).
func (r *Recorder) Count(substr string) int {
	n := 0
	for _, rec := range r.Records() {
		if strings.Contains(rec.Message, substr) {
			n++
		}
	}
	return n
}

// Suppressed sums the "suppressed" attribute over the records whose
// messages contain substr.
func (r *Recorder) Suppressed(substr string) int64 {
	var n int64
	for _, rec := range r.Records() {
		if !strings.Contains(rec.Message, substr) {
			continue
		}
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "suppressed" {
				n += a.Value.Int64()
			}
			return true
		})
	}
	return n
}
