package bus

import (
	"testing"
	"time"
)

// A consumer whose first sessions failed (NATS not up yet, ~5 failures
// reach retryMax) must not wait retryMax after the end of every later
// session, however long that one ran: a session that ran retryMax or
// longer starts the waits again at retryMin (reconnect.Backoff.ResetAfter,
// whose Loop semantics internal/reconnect tests).
func TestSessionBackoffResetsAfterAWorkingSession(t *testing.T) {
	b := sessionBackoff
	if b.Min != retryMin || b.Max != retryMax {
		t.Errorf("backoff %v to %v, want %v to %v", b.Min, b.Max, retryMin, retryMax)
	}
	if b.ResetAfter <= 0 || b.ResetAfter > time.Minute {
		t.Errorf("ResetAfter %v: a session that ran for hours is followed by the %v its early failures reached", b.ResetAfter, retryMax)
	}
}
