package bench

import (
	"testing"

	"github.com/inferencecache/inferencecache/bench/workload"
)

// BenchmarkSimulate measures the simulator itself (not a hot path of the
// server): one chat workload through greedy longest-prefix routing.
func BenchmarkSimulate(b *testing.B) {
	reqs, err := workload.DefaultChat().Generate()
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig("chat", reqs)
	sc := SimConfig{Replicas: cfg.Replicas, CacheBlocks: 2000, Lag: cfg.Lag, Slots: cfg.Slots, Cost: cfg.Cost, Window: cfg.Window}
	p := LongestPrefixPolicy()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Simulate(reqs, sc, p.New(cfg.Replicas, 1)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(reqs))*float64(b.N)/b.Elapsed().Seconds(), "req/s")
}
