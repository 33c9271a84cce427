package bench

import (
	"fmt"
	"io"
	"math"
)

// The routing targets (issue routing3, bench/results/README.md): at one
// cache size, a row meets the hit target when its share of the pooled
// bound is at least the best baseline's minus TargetHitSlack, and each
// TTFT target when its percentile is at most TargetTTFTRatio × the best
// baseline's. Each column's best may be another baseline.
const (
	TargetHitSlack  = 0.01
	TargetTTFTRatio = 1.03
)

// Cells is one row's standing against the targets at one cache size.
type Cells struct {
	CacheBlocks int
	// Bound is the row's share of the pooled bound, BestBound the best
	// baseline's (fractions).
	Bound, BestBound float64
	// P50, P99 are the row's TTFT percentiles over the best baseline's.
	P50, P99 float64
	// Met reports each target: hits, p50, p99.
	Met [3]bool
}

// N is the number of targets met.
func (c *Cells) N() int {
	n := 0
	for _, m := range c.Met {
		if m {
			n++
		}
	}
	return n
}

// Targets returns policy's cells at this size. ok is false when the report
// has no such row or no baseline to compare with.
func (s *SizeReport) Targets(policy string) (c Cells, ok bool) {
	var ours *Result
	for i := range s.Results {
		if s.Results[i].Policy == policy {
			ours = &s.Results[i]
		}
	}
	hit, p50, p99 := s.bestBaselines()
	if ours == nil || hit == nil || p50.TTFTP50 <= 0 || p99.TTFTP99 <= 0 {
		return Cells{}, false
	}
	c = Cells{CacheBlocks: s.CacheBlocks, Bound: s.FractionOfPooled(ours), BestBound: s.FractionOfPooled(hit),
		P50: ratioOf(ours.TTFTP50, p50.TTFTP50), P99: ratioOf(ours.TTFTP99, p99.TTFTP99)}
	// The comparison is in the printed precision (hundredths of a point,
	// thousandths of a ratio), so a cell reads the same as its table.
	c.Met = [3]bool{
		math.Round(c.Bound*1e4) >= math.Round((c.BestBound-TargetHitSlack)*1e4),
		math.Round(c.P50*1e3) <= TargetTTFTRatio*1e3,
		math.Round(c.P99*1e3) <= TargetTTFTRatio*1e3,
	}
	return c, true
}

// TargetRun is one workload of a targets sweep: a name and its cells per
// cache size, for one seed.
type TargetRun struct {
	Name  string
	Seed  uint64
	Cells []Cells
}

// TargetSummary aggregates a sweep over seeds: how many cells each seed
// met, how often each cell was met, and the geometric means and worst of
// the TTFT ratios.
type TargetSummary struct {
	Seeds []uint64
	// PerSeed is the cells met per seed, in Seeds order; Total the cells
	// per seed.
	PerSeed []int
	Total   int
	// MetCount[workload][size][target] is how many seeds met the cell.
	Names    []string
	Sizes    []int
	MetCount [][][3]int
	// GeoP50, GeoP99: geometric mean of the ratios over every cell and
	// seed; MaxP50, MaxP99 the worst; MeanGap the mean of (bound − best
	// baseline's bound), in points.
	GeoP50, GeoP99, MaxP50, MaxP99, MeanGap float64
}

// Summarize aggregates runs (every workload of every seed).
func Summarize(runs []TargetRun) TargetSummary {
	var s TargetSummary
	wi := map[string]int{}
	si := map[int]int{}
	seedIdx := map[uint64]int{}
	for _, r := range runs {
		if _, ok := wi[r.Name]; !ok {
			wi[r.Name] = len(s.Names)
			s.Names = append(s.Names, r.Name)
		}
		if _, ok := seedIdx[r.Seed]; !ok {
			seedIdx[r.Seed] = len(s.Seeds)
			s.Seeds = append(s.Seeds, r.Seed)
			s.PerSeed = append(s.PerSeed, 0)
		}
		for _, c := range r.Cells {
			if _, ok := si[c.CacheBlocks]; !ok {
				si[c.CacheBlocks] = len(s.Sizes)
				s.Sizes = append(s.Sizes, c.CacheBlocks)
			}
		}
	}
	s.MetCount = make([][][3]int, len(s.Names))
	for i := range s.MetCount {
		s.MetCount[i] = make([][3]int, len(s.Sizes))
	}
	var l50, l99, gap float64
	n := 0
	for _, r := range runs {
		for _, c := range r.Cells {
			m := &s.MetCount[wi[r.Name]][si[c.CacheBlocks]]
			for k, met := range c.Met {
				if met {
					m[k]++
				}
			}
			s.PerSeed[seedIdx[r.Seed]] += c.N()
			l50 += math.Log(c.P50)
			l99 += math.Log(c.P99)
			gap += 100 * (c.Bound - c.BestBound)
			s.MaxP50, s.MaxP99 = max(s.MaxP50, c.P50), max(s.MaxP99, c.P99)
			n++
		}
	}
	if len(s.Seeds) > 0 {
		s.Total = 3 * n / len(s.Seeds)
	}
	if n > 0 {
		s.GeoP50, s.GeoP99, s.MeanGap = math.Exp(l50/float64(n)), math.Exp(l99/float64(n)), gap/float64(n)
	}
	return s
}

// MeanCells is the mean number of cells met per seed.
func (s *TargetSummary) MeanCells() float64 {
	if len(s.PerSeed) == 0 {
		return 0
	}
	t := 0
	for _, n := range s.PerSeed {
		t += n
	}
	return float64(t) / float64(len(s.PerSeed))
}

// WriteText prints the summary: cells per seed, then how many seeds met
// each cell.
func (s *TargetSummary) WriteText(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "cells met per seed %v of %d; mean %.1f\n", s.PerSeed, s.Total, s.MeanCells()); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "TTFT vs the best baseline: p50 geomean %.3fx (worst %.2fx), p99 geomean %.3fx (worst %.2fx); hits %+.2f points of the bound on average\n",
		s.GeoP50, s.MaxP50, s.GeoP99, s.MaxP99, s.MeanGap); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "seeds meeting each cell (of %d): hits / p50 / p99\n", len(s.Seeds)); err != nil {
		return err
	}
	for i, name := range s.Names {
		for j, size := range s.Sizes {
			m := s.MetCount[i][j]
			if _, err := fmt.Fprintf(w, "  %-24s %5d blocks  %d / %d / %d\n", name, size, m[0], m[1], m[2]); err != nil {
				return err
			}
		}
	}
	return nil
}
