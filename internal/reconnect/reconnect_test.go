package reconnect

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// waits returns the first n waits of b, as Loop takes them.
func waits(b Backoff, n int) []time.Duration {
	out := make([]time.Duration, 0, n)
	for d := b.Min; len(out) < n; d = b.next(d) {
		out = append(out, d)
	}
	return out
}

func TestBackoffSequence(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name string
		b    Backoff
		want []time.Duration
	}{
		// bus.Consumer: 250 ms doubling to 5 s, capped (reset after a working session: TestLoopResetsAfterAWorkingSession).
		{"consumer", Backoff{Min: 250 * ms, Max: 5 * time.Second},
			[]time.Duration{250 * ms, 500 * ms, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second, 5 * time.Second}},
		// kvevents: a constant ReconnectBackoff.
		{"constant", Backoff{Min: time.Second, Max: time.Second}, []time.Duration{time.Second, time.Second, time.Second, time.Second}},
		{"constant 1ns", Backoff{Min: 1, Max: 1}, []time.Duration{1, 1, 1}},
		{"max below min", Backoff{Min: 10 * ms, Max: 5 * ms}, []time.Duration{10 * ms, 10 * ms, 10 * ms}},
		{"max not a power of two of min", Backoff{Min: 3 * ms, Max: 10 * ms}, []time.Duration{3 * ms, 6 * ms, 10 * ms, 10 * ms}},
		{"largest constant", Backoff{Min: math.MaxInt64, Max: math.MaxInt64}, []time.Duration{math.MaxInt64, math.MaxInt64, math.MaxInt64}},
		{"doubling past half the largest", Backoff{Min: math.MaxInt64/2 - 1, Max: math.MaxInt64},
			[]time.Duration{math.MaxInt64/2 - 1, math.MaxInt64 - 3, math.MaxInt64, math.MaxInt64}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := waits(tc.b, len(tc.want)); !slices.Equal(got, tc.want) {
				t.Errorf("waits = %v, want %v", got, tc.want)
			}
		})
	}
}

// From 1 ns to the largest duration, every wait doubles until the cap,
// and none overflows.
func TestBackoffNoOverflow(t *testing.T) {
	b := Backoff{Min: 1, Max: math.MaxInt64}
	got := waits(b, 70)
	for i, d := range got {
		want := time.Duration(math.MaxInt64)
		if i < 63 {
			want = 1 << i
		}
		if d != want {
			t.Fatalf("wait %d = %d, want %d (all: %v)", i, d, want, got)
		}
	}
}

// The loop's waits follow the sequence, each lasts at least its length, a
// session returning nil is followed by a new one like a failed one, and a
// session ending with ctx returns ctx.Err() with no retry callback.
func TestLoopWaits(t *testing.T) {
	const ms = time.Millisecond
	b := Backoff{Min: ms, Max: 8 * ms}
	const sessions = 8
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type retry struct {
		err  error
		wait time.Duration
	}
	var (
		started  int
		retries  []retry
		waitFrom time.Time
	)
	errOf := func(i int) error {
		if i == 3 {
			return nil // a session that returned cleanly
		}
		return fmt.Errorf("session %d", i)
	}
	err := Loop(ctx, b, func(sctx context.Context) error {
		if sctx != ctx {
			t.Errorf("session %d got another context", started)
		}
		if started > 0 {
			if el, w := time.Since(waitFrom), retries[len(retries)-1].wait; el < w {
				t.Errorf("session %d started %v after the retry callback, before its wait %v", started, el, w)
			}
		}
		started++
		if started == sessions {
			cancel()
			return errors.New("ended by the cancel")
		}
		return errOf(started - 1)
	}, func(err error, wait time.Duration) {
		retries = append(retries, retry{err, wait})
		waitFrom = time.Now()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Loop = %v, want context.Canceled", err)
	}
	if started != sessions {
		t.Fatalf("%d sessions, want %d", started, sessions)
	}
	wantWaits := waits(b, sessions-1)
	if len(retries) != len(wantWaits) {
		t.Fatalf("%d retry callbacks, want %d (none after the session that ended with ctx)", len(retries), len(wantWaits))
	}
	for i, r := range retries {
		if r.wait != wantWaits[i] {
			t.Errorf("retry %d: wait %v, want %v", i, r.wait, wantWaits[i])
		}
		if want := errOf(i); fmt.Sprint(r.err) != fmt.Sprint(want) {
			t.Errorf("retry %d: err %v, want %v", i, r.err, want)
		}
	}
}

// A ctx ending during a long wait returns at once, with ctx.Err(): the
// cause (cancel or deadline) is kept.
func TestLoopCtxEndsDuringWait(t *testing.T) {
	for _, deadline := range []bool{false, true} {
		t.Run(fmt.Sprintf("deadline=%v", deadline), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			want := context.Canceled
			var ends time.Time // when ctx ends, for the deadline case
			if deadline {
				// Long enough for the first session and the retry callback
				// on a loaded machine; the wait is an hour.
				ends = time.Now().Add(2 * time.Second)
				ctx, cancel = context.WithDeadline(context.Background(), ends)
				want = context.DeadlineExceeded
			}
			defer cancel()
			var sessions, retries int
			done := make(chan error, 1)
			waiting := make(chan struct{})
			go func() {
				done <- Loop(ctx, Backoff{Min: time.Hour, Max: time.Hour}, func(context.Context) error {
					sessions++
					return errors.New("failed")
				}, func(error, time.Duration) {
					retries++
					close(waiting)
				})
			}()
			select {
			case <-waiting:
			case err := <-done:
				t.Fatalf("Loop = %v before its first wait", err)
			case <-time.After(30 * time.Second):
				t.Fatal("no retry callback after the first session")
			}
			if !deadline {
				ends = time.Now()
				cancel()
			}
			select {
			case err := <-done:
				if !errors.Is(err, want) {
					t.Fatalf("Loop = %v, want %v", err, want)
				}
				// Generous for a loaded machine, far below the hour's wait.
				if el := time.Since(ends); el > 10*time.Second {
					t.Errorf("Loop returned %v after ctx ended", el)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Loop still waiting 30 s after ctx ended")
			}
			if sessions != 1 || retries != 1 {
				t.Errorf("%d sessions and %d retry callbacks, want 1 and 1", sessions, retries)
			}
		})
	}
}

// The first session runs even on an ended ctx (callers that must not
// check themselves); then Loop returns without a retry.
func TestLoopEndedCtxRunsFirstSession(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sessions := 0
	err := Loop(ctx, Backoff{Min: time.Hour, Max: time.Hour}, func(context.Context) error {
		sessions++
		return nil
	}, func(error, time.Duration) { t.Error("retry callback on an ended ctx") })
	if !errors.Is(err, context.Canceled) || sessions != 1 {
		t.Fatalf("Loop = %v after %d sessions, want context.Canceled after 1", err, sessions)
	}
}

// retrying may be nil.
func TestLoopNilRetrying(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sessions := 0
	err := Loop(ctx, Backoff{Min: time.Millisecond, Max: time.Millisecond}, func(context.Context) error {
		if sessions++; sessions == 3 {
			cancel()
		}
		return errors.New("failed")
	}, nil)
	if !errors.Is(err, context.Canceled) || sessions != 3 {
		t.Fatalf("Loop = %v after %d sessions, want context.Canceled after 3", err, sessions)
	}
}

func TestLoopRejectsNonPositiveMin(t *testing.T) {
	for _, min := range []time.Duration{0, -time.Second} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Min %v: no panic", min)
				}
			}()
			_ = Loop(context.Background(), Backoff{Min: min, Max: time.Second}, func(context.Context) error {
				t.Errorf("Min %v: session ran", min)
				return nil
			}, nil)
		}()
	}
}

// A session that ran at least ResetAfter was a working one, not one more
// failed attempt: the wait after it starts again at Min, and the doubling
// starts over from there. Shorter sessions keep doubling.
func TestLoopResetsAfterAWorkingSession(t *testing.T) {
	const ms = time.Millisecond
	b := Backoff{Min: ms, Max: 8 * ms, ResetAfter: 200 * ms}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Sessions 0-4 fail at once, 5 runs past ResetAfter, 6-7 fail at once.
	const long, sessions = 5, 8
	started := 0
	var gotWaits []time.Duration
	err := Loop(ctx, b, func(ctx context.Context) error {
		i := started
		started++
		switch {
		case i == sessions-1:
			cancel()
		case i == long:
			timer := time.NewTimer(b.ResetAfter + 20*ms)
			defer timer.Stop()
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
		}
		return fmt.Errorf("session %d", i)
	}, func(_ error, wait time.Duration) { gotWaits = append(gotWaits, wait) })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Loop = %v, want context.Canceled", err)
	}
	want := []time.Duration{ms, 2 * ms, 4 * ms, 8 * ms, 8 * ms, ms, 2 * ms}
	if !slices.Equal(gotWaits, want) {
		t.Errorf("waits %v, want %v (reset to Min after the session that ran %v)", gotWaits, want, b.ResetAfter+20*ms)
	}
}

// Without ResetAfter the waits never reset, however long a session ran
// (the kvevents subscriber's constant wait and the old behaviour).
func TestLoopNoResetByDefault(t *testing.T) {
	const ms = time.Millisecond
	b := Backoff{Min: ms, Max: 4 * ms}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	started := 0
	var gotWaits []time.Duration
	_ = Loop(ctx, b, func(ctx context.Context) error {
		i := started
		started++
		switch i {
		case 3:
			time.Sleep(50 * ms) // bounded: a "long" session
		case 5:
			cancel()
		}
		return errors.New("failed")
	}, func(_ error, wait time.Duration) { gotWaits = append(gotWaits, wait) })
	if want := []time.Duration{ms, 2 * ms, 4 * ms, 4 * ms, 4 * ms}; !slices.Equal(gotWaits, want) {
		t.Errorf("waits %v, want %v", gotWaits, want)
	}
}
