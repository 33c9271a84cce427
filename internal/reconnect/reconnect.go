// Package reconnect runs a long-lived session (a NATS consumer, a ZMQ
// subscription) again and again until its context ends, waiting between
// sessions with a capped exponential backoff.
//
// It is the loop that bus.Consumer.Run and the kvevents subscriber's
// receive loop shared, written once. Its semantics are theirs, exactly:
//
//   - The first session starts at once, without a wait and without checking
//     ctx first: a caller that must not start a session on an ended ctx
//     checks it itself.
//   - A session ends when its function returns, with an error or nil: both
//     are followed by a new session (the callers' sessions return only on a
//     failure or when ctx ended).
//   - When a session returns and ctx has ended, Loop returns ctx.Err() at
//     once: no retry callback, no wait. The session's error does not decide
//     this, ctx does.
//   - Otherwise the retry callback runs (the callers log or count there),
//     with the session's error and the wait about to begin, and then Loop
//     waits. A ctx ending during the wait returns ctx.Err() promptly (the
//     timer is stopped). When the wait elapses the next session starts,
//     without another ctx check.
//   - The waits are Min, then each one twice the one before, at most Max:
//     Min, 2·Min, 4·Min, ..., Max, Max, ... Min == Max is a constant wait
//     (the kvevents subscriber's ReconnectBackoff). There is no jitter.
//   - With ResetAfter set, a session that ran at least that long was a
//     working one, not one more failed attempt: the wait after it is Min
//     again, and the doubling starts over (bus.Consumer: a session that ran
//     for hours is followed by 250 ms, not by the 5 s its first failures
//     reached). Without it the waits never reset.
//   - Loop returns only when ctx ends, always with ctx.Err().
package reconnect

import (
	"context"
	"time"
)

// Backoff bounds the waits between sessions: Min before the first new
// session, doubling after each one up to Max. A Max below Min means Min (a
// constant wait).
type Backoff struct {
	Min, Max time.Duration
	// ResetAfter, when positive, makes a session that ran at least this
	// long start the waits again at Min. 0 never resets.
	ResetAfter time.Duration
}

// next returns the wait after d: twice d, at most Max (compared before
// doubling, so durations near the largest do not overflow).
func (b Backoff) next(d time.Duration) time.Duration {
	limit := max(b.Max, b.Min)
	if d > limit/2 {
		return limit
	}
	return 2 * d
}

// Loop runs session until ctx ends, with the semantics of the package
// comment, and returns ctx.Err(). retrying, which may be nil, is called
// before each wait with the error of the session that ended (nil if it
// returned nil) and the wait. Session and retrying run on the caller's
// goroutine. Min must be positive (a zero wait would spin).
func Loop(ctx context.Context, b Backoff, session func(context.Context) error, retrying func(err error, wait time.Duration)) error {
	if b.Min <= 0 {
		panic("BUG: reconnect.Backoff.Min must be positive")
	}
	wait := b.Min
	for {
		start := time.Now()
		err := session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if b.ResetAfter > 0 && time.Since(start) >= b.ResetAfter {
			wait = b.Min
		}
		if retrying != nil {
			retrying(err, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = b.next(wait)
	}
}
