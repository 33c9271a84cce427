package loadgen

import (
	"context"
	"testing"
	"time"
)

// TestOpenLoopUnfinishedWhenCancelled: a run cancelled before it could
// send counts every request its window scheduled as unfinished, and no
// other: the schedule's first request past the window is not one of them.
func TestOpenLoopUnfinishedWhenCancelled(t *testing.T) {
	f := func(arrival Arrival, rate float64, want int64) {
		t.Helper()
		cfg := DefaultConfig()
		cfg.Arrival, cfg.Rate, cfg.Warmup, cfg.Duration = arrival, rate, 0, time.Second
		r := &runner{cfg: &cfg, recs: []*recorder{newRecorder()}, started: time.Now()}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		end := r.started.Add(cfg.Duration)
		r.openLoop(ctx, end, end.Add(cfg.DrainTimeout))
		if got := r.unfinished.Load(); got != want {
			t.Errorf("%s at %v/s: %d unfinished, want %d", arrival, rate, got, want)
		}
	}
	f(ArrivalConstant, 1000, 1000)
	f(ArrivalPoisson, 1e-6, 0) // the first arrival lies far past the 1 s window
}
