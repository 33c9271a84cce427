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

// TestDefaultSizeLeavesRoomForPopulate: the lookups of an open-loop run
// start after the populate requests and must not wrap the epoch (a wrap
// renames every block, so the modeled hit ratio would drop to 0 mid-run).
func TestDefaultSizeLeavesRoomForPopulate(t *testing.T) {
	for _, populate := range []int{-1, 0, 3000} {
		cfg := DefaultConfig()
		cfg.Rate, cfg.Warmup, cfg.Duration, cfg.PopulateRequests = 1000, 2*time.Second, 10*time.Second, populate
		size := defaultSize(&cfg)
		popN := populate
		if popN < 0 {
			popN = size / 4 // defaultPopulate's upper bound
		}
		if sent := int(cfg.Rate * 12); size-popN < sent {
			t.Errorf("populate %d: epoch of %d requests, %d populate, %d lookups: the run wraps", populate, size, popN, sent)
		}
	}
}
