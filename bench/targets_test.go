package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func targetRow(policy string, hitBlocks int64, p50, p99 time.Duration) Result {
	return Result{Policy: policy, Hits: Hits{Blocks: 1000, HitBlocks: hitBlocks}, TTFTP50: p50, TTFTP99: p99}
}

func TestTargets(t *testing.T) {
	s := SizeReport{CacheBlocks: 1000, Pooled: Hits{Blocks: 1000, HitBlocks: 500}, Results: []Result{
		targetRow(EnginePolicyName, 446, 1030*time.Millisecond, 2100*time.Millisecond),
		targetRow(PickerPolicyName, 500, 500*time.Millisecond, 500*time.Millisecond), // ours, never a baseline
		targetRow("a", 450, 1000*time.Millisecond, 3000*time.Millisecond),            // best hits and p50
		targetRow("b", 100, 2000*time.Millisecond, 2000*time.Millisecond),            // best p99
	}}
	c, ok := s.Targets(EnginePolicyName)
	if !ok {
		t.Fatal("no cells")
	}
	// 89.2 % of the bound against 90.0 %: within a point. p50 1.030×: met
	// at the bound. p99 1.05×: missed.
	if c.Met != [3]bool{true, true, false} || c.N() != 2 {
		t.Fatalf("cells %+v", c)
	}
	if c.BestBound != 0.9 || c.P99 != 1.05 {
		t.Fatalf("best bound %v, p99 ratio %v", c.BestBound, c.P99)
	}
	s.Results[0].HitBlocks = 444 // 88.8 %: 1.2 points short
	if c, _ := s.Targets(EnginePolicyName); c.Met[0] {
		t.Fatalf("hits met at %.4f against %.4f", c.Bound, c.BestBound)
	}
	if _, ok := s.Targets("missing"); ok {
		t.Fatal("cells for a missing row")
	}
	if _, ok := (&SizeReport{Results: s.Results[:2]}).Targets(EnginePolicyName); ok {
		t.Fatal("cells without a baseline")
	}
}

func TestSummarize(t *testing.T) {
	met := func(size int, m [3]bool, p50, p99 float64) Cells {
		return Cells{CacheBlocks: size, Bound: 0.9, BestBound: 0.91, P50: p50, P99: p99, Met: m}
	}
	runs := []TargetRun{
		{Name: "chat", Seed: 1, Cells: []Cells{met(1000, [3]bool{true, true, true}, 1, 1), met(4000, [3]bool{true, false, true}, 2, 1)}},
		{Name: "rag", Seed: 1, Cells: []Cells{met(1000, [3]bool{false, false, false}, 1, 4), met(4000, [3]bool{}, 1, 1)}},
		{Name: "chat", Seed: 2, Cells: []Cells{met(1000, [3]bool{true, true, false}, 1, 1), met(4000, [3]bool{}, 1, 1)}},
		{Name: "rag", Seed: 2, Cells: []Cells{met(1000, [3]bool{true, false, false}, 1, 1), met(4000, [3]bool{}, 1, 1)}},
	}
	s := Summarize(runs)
	if s.Total != 12 || len(s.PerSeed) != 2 || s.PerSeed[0] != 5 || s.PerSeed[1] != 3 || s.MeanCells() != 4 {
		t.Fatalf("per seed %v of %d, mean %v", s.PerSeed, s.Total, s.MeanCells())
	}
	if got := s.MetCount[0][0]; got != [3]int{2, 2, 1} {
		t.Fatalf("chat at 1,000 blocks met %v", got)
	}
	if s.MaxP50 != 2 || s.MaxP99 != 4 || s.GeoP50 <= 1 || s.GeoP99 <= 1 {
		t.Fatalf("ratios %+v", s)
	}
	if d := s.MeanGap + 1; d < -1e-9 || d > 1e-9 {
		t.Fatalf("mean gap %v, want -1 point", s.MeanGap)
	}
	var out bytes.Buffer
	if err := s.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "cells met per seed [5 3] of 12; mean 4.0") || !strings.Contains(out.String(), "rag") {
		t.Fatalf("summary:\n%s", out.String())
	}
}
