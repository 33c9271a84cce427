package ratelog_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/internal/ratelog"
	"github.com/inferencecache/inferencecache/internal/ratelog/ratelogtest"
)

type clock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestBurstThenOnePerInterval: a burst goes through at once, then one line
// per interval; the line after a held-back run carries its count.
func TestBurstThenOnePerInterval(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	l := ratelog.NewWithClock(3, time.Second, clk.now)
	var allowed []int64
	step := func(n int) {
		for range n {
			if s, ok := l.Allow(); ok {
				allowed = append(allowed, s)
			}
		}
	}
	step(10) // 3 through, 7 held back
	if len(allowed) != 3 || allowed[0] != 0 || allowed[2] != 0 {
		t.Fatalf("burst: %v, want three lines with nothing suppressed", allowed)
	}
	clk.add(999 * time.Millisecond)
	step(1) // still inside the interval
	if len(allowed) != 3 {
		t.Fatalf("a line inside the interval went through: %v", allowed)
	}
	clk.add(time.Millisecond)
	step(5) // one goes through, carrying the 8 held back
	if len(allowed) != 4 || allowed[3] != 8 {
		t.Fatalf("after an interval: %v, want a fourth line reporting 8 suppressed", allowed)
	}
	clk.add(time.Hour) // the bucket refills to its burst, not beyond
	step(10)
	if len(allowed) != 7 || allowed[4] != 4 {
		t.Fatalf("after an hour: %v, want 3 more lines, the first reporting 4", allowed)
	}
}

// TestConcurrentFloodBounded: goroutines flooding one limiter at a frozen
// clock get exactly the burst through, and every held-back call is
// reported by the next line.
func TestConcurrentFloodBounded(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	l := ratelog.NewWithClock(5, time.Minute, clk.now)
	log, rec := ratelogtest.NewLogger(slog.LevelInfo)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				l.Warn(context.Background(), log, "bad request", "k", 1)
			}
		})
	}
	wg.Wait()
	if n := rec.Count("bad request"); n != 5 {
		t.Fatalf("%d lines from 8000 calls, want the burst of 5", n)
	}
	clk.add(time.Minute)
	l.Warn(context.Background(), log, "bad request")
	if n, s := rec.Count(""), rec.Suppressed(""); n != 6 || s != 7995 {
		t.Fatalf("%d lines reporting %d suppressed, want 6 and 7995", n, s)
	}
}

// TestLogLine: the line keeps its level, message and attributes, adds the
// suppressed count, names its caller as source, and a disabled level costs
// no token.
func TestLogLine(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	l := ratelog.NewWithClock(1, time.Minute, clk.now)
	log, rec := ratelogtest.NewLogger(slog.LevelInfo)
	l.Debug(context.Background(), log, "not enabled") // no token spent
	l.Error(context.Background(), log.With("listener", "grpc"), "boom", "n", 3)
	rs := rec.Records()
	if len(rs) != 1 {
		t.Fatalf("%d records, want 1 (the debug line disabled, without spending the token)", len(rs))
	}
	r := rs[0]
	got := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { got[a.Key] = a.Value.String(); return true })
	if r.Level != slog.LevelError || r.Message != "boom" || got["n"] != "3" || got["listener"] != "grpc" || got[ratelog.SuppressedKey] != "0" {
		t.Fatalf("record %v %q %v", r.Level, r.Message, got)
	}
	fs := r.Source()
	if fs == nil || !strings.HasSuffix(fs.File, "ratelog_test.go") || fs.Function != "github.com/inferencecache/inferencecache/internal/ratelog_test.TestLogLine" {
		t.Fatalf("source %+v, want this test", fs)
	}
}

// TestZeroValue: a zero Limiter lets one line through per DefaultEvery.
func TestZeroValue(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	var l ratelog.Limiter
	l.Now = clk.now
	n := 0
	for range 5 {
		if _, ok := l.Allow(); ok {
			n++
		}
	}
	clk.add(ratelog.DefaultEvery - time.Nanosecond)
	if _, ok := l.Allow(); ok {
		n++
	}
	if n != 1 {
		t.Fatalf("%d lines within the default interval, want 1", n)
	}
	clk.add(time.Nanosecond)
	if s, ok := l.Allow(); !ok || s != 5 {
		t.Fatalf("after the default interval: %v %d, want a line reporting 5", ok, s)
	}
}
