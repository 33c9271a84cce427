package bench

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
	"github.com/inferencecache/inferencecache/engine"
)

func zzReqs(t *testing.T, path string) []workload.Request {
	var reqs []workload.Request
	var err error
	switch path {
	case "chat":
		reqs, err = workload.DefaultChat().Generate()
	case "rag":
		reqs, err = workload.DefaultRAG().Generate()
	case "shared":
		reqs, err = workload.DefaultSharedPrompt().Generate()
	default:
		reqs, err = workload.LoadTrace(path, workload.MooncakeBlockSize, 0)
	}
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// ZZVARIANTS: semicolon list of name=bound,minq,alpha[,counts]
func TestZZEngine(t *testing.T) {
	path := os.Getenv("ZZTRACE")
	if path == "" {
		t.Skip()
	}
	cfg := DefaultConfig("x", zzReqs(t, path))
	pol := []Policy{LongestPrefixPolicy(), LeastLoadedPolicy(), DynamoCostPolicy(1), SGLangCacheAwarePolicy(DefaultSGLangConfig())}
	if os.Getenv("ZZBASE") == "0" {
		pol = nil
	}
	pol = append(pol, EnginePolicyWith("contract", EngineOptions{Refresh: DefaultRefresh, ContractOnly: true}))
	for _, v := range strings.Split(os.Getenv("ZZVARIANTS"), ";") {
		if v == "" {
			continue
		}
		name, args, _ := strings.Cut(v, "=")
		f := strings.Split(args, ",")
		b, _ := strconv.ParseFloat(f[0], 64)
		mq, _ := strconv.Atoi(f[1])
		a, _ := strconv.ParseFloat(f[2], 64)
		lc := engine.DefaultLoadConfig()
		lc.Bound, lc.MinQueue, lc.PrefillWeight = b, mq, a
		opt := EngineOptions{Refresh: DefaultRefresh, Load: &lc}
		for _, x := range f[3:] {
			switch {
			case x == "queued":
				opt.QueuedTokens = true
			case strings.HasPrefix(x, "iv"):
				d, _ := time.ParseDuration(x[2:])
				opt.StatsInterval = d
			case strings.HasPrefix(x, "lag"):
				d, _ := time.ParseDuration(x[3:])
				opt.StatsLag = d
				if d == 0 {
					opt.StatsLag = -1
				}
			}
		}
		pol = append(pol, EnginePolicyWith(name, opt))
	}
	cfg.Policies = pol
	rep, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Sizes {
		for _, r := range s.Results {
			fmt.Printf("%5d %-22s bound %.1f%% imb %.2f p50 %v p99 %v\n", s.CacheBlocks, r.Policy, 100*s.FractionOfPooled(&r), r.ImbalanceMean, r.TTFTP50, r.TTFTP99)
		}
	}
}

// oracle with routing-time memory: overlap = max(event view, routed-chains tree with TTL)
type memRouter struct {
	name  string
	alpha float64
	idx   *PrefixIndex
	trees []*LRU
	ttl   int // tree capacity in blocks
	ov    []int
	sc    []int
	ev    []uint64
}

func (r *memRouter) Name() string     { return r.name }
func (r *memRouter) Observe(e *Event) { r.idx.Apply(e) }
func (r *memRouter) Route(req *workload.Request, v *View) int {
	if r.trees == nil {
		for range v.Replicas {
			r.trees = append(r.trees, NewLRU(r.ttl))
		}
	}
	r.ov = r.idx.Overlaps(req.Blocks, r.ov)
	var sum float64
	for _, l := range v.Replicas {
		sum += float64(l.InFlight())
	}
	mean := sum / float64(len(v.Replicas))
	bound := max(1.25*mean+2*math.Sqrt(mean), 4)
	best, bc := -1, 0.0
	for i, l := range v.Replicas {
		ov := max(r.ov[i], r.trees[i].LeadingRun(req.Blocks))
		if float64(l.InFlight()) > bound {
			continue
		}
		unc := float64(req.InputTokens - req.PrefixTokens(ov))
		c := float64(l.PendingPrefillTokens) + r.alpha*unc
		if best < 0 || c < bc || (c == bc && lessLoaded(v, i, best)) {
			best, bc = i, c
		}
	}
	if best < 0 {
		best = leastLoaded(v)
	}
	r.sc, r.ev = r.trees[best].Access(req.Blocks, r.sc[:0], r.ev[:0])
	return best
}

func TestZZMem(t *testing.T) {
	path := os.Getenv("ZZTRACE")
	if path == "" {
		t.Skip()
	}
	cfg := DefaultConfig("x", zzReqs(t, path))
	var pol []Policy
	for _, ttl := range []int{0, 50, 200, 1000, 100000} {
		for _, a := range []float64{4, 16} {
			name := fmt.Sprintf("mem%d-a%g", ttl, a)
			ttl, a := ttl, a
			pol = append(pol, Policy{Name: name, New: func(n int, _ uint64) Router {
				return &memRouter{name: name, alpha: a, idx: NewPrefixIndex(n), ttl: max(ttl, 1)}
			}})
		}
	}
	cfg.Policies = pol
	rep, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Sizes {
		for _, r := range s.Results {
			fmt.Printf("%5d %-22s bound %.1f%% imb %.2f p50 %v p99 %v\n", s.CacheBlocks, r.Policy, 100*s.FractionOfPooled(&r), r.ImbalanceMean, r.TTFTP50, r.TTFTP99)
		}
	}
}
