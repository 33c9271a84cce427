package loadgen

import (
	"context"
	"fmt"
	"time"
)

// progressLoop prints one line a second to cfg.Progress: the phase, the
// completion rate and p99 latency over the last second, and errors.
func (r *runner) progressLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var (
		h         Histogram
		totalErrs int64
		last      = r.started
	)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			h.Reset()
			var errs int64
			for _, rec := range r.recs {
				rec.mu.Lock()
				h.Merge(&rec.interval)
				rec.interval.Reset()
				errs += rec.intervalErrs
				rec.intervalErrs = 0
				rec.mu.Unlock()
			}
			totalErrs += errs
			el := now.Sub(r.started)
			phase := "measure"
			if el < r.cfg.Warmup {
				phase = "warm-up"
			}
			rate := float64(h.Count()) / now.Sub(last).Seconds()
			last = now
			fmt.Fprintf(r.cfg.Progress, "loadgen %5.1fs %-7s %8.0f req/s  p99 %-9s errors %d (total %d)\n",
				el.Seconds(), phase, rate, fmtUs(float64(h.Quantile(0.99))/1e3), errs, totalErrs)
		}
	}
}
