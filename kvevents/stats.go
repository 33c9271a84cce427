package kvevents

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"

	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// PressureCeiling is the running+waiting request count that maps to
// pressure 1 (contract §6).
const PressureCeiling = 256

// maxMetricsBody bounds an engine /metrics response.
const maxMetricsBody = 16 << 20

// Engine metric names, in order of preference; counters are looked up with
// and without the _total suffix.
var (
	vllmHits      = []string{"vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"}
	vllmQueries   = []string{"vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"}
	vllmRunning   = []string{"vllm:num_requests_running"}
	vllmWaiting   = []string{"vllm:num_requests_waiting"}
	vllmUsage     = []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"}
	vllmT2Hits    = []string{"vllm:external_prefix_cache_hits"}
	vllmT2Queries = []string{"vllm:external_prefix_cache_queries"}

	sglangHitRate = []string{"sglang:cache_hit_rate"}
	sglangUsage   = []string{"sglang:token_usage"}
	sglangRunning = []string{"sglang:num_running_reqs"}
	sglangQueue   = []string{"sglang:num_queue_reqs"}
)

// StatsScraper reads an engine's Prometheus /metrics (vLLM or SGLang, told
// apart by their metric prefixes) and turns it into ReplicaStats. It keeps
// the previous counters to compute the hit rate over the last interval, so
// one StatsScraper serves one engine from one goroutine.
type StatsScraper struct {
	URL            string
	CacheSizeBytes int64
	ClientVersion  string
	Client         *http.Client // nil means http.DefaultClient
	// QueuedTokensMetric names a gauge of the prefill tokens the engine
	// still has queued, for engines (or exporters) that publish one; ""
	// means none, and the server estimates the queue from waiting requests.
	QueuedTokensMetric string
	// RankLabel, when set, keeps only the series whose label RankLabel is
	// Rank: a data-parallel engine exports every rank's series on one
	// /metrics, and each rank is a replica of its own (see DataParallel).
	RankLabel, Rank string

	havePrev            bool
	prevHits, prevQuery float64
	lastHitRate         float32
	parser              expfmt.TextParser
	parserReady         bool
}

// Scrape fetches the metrics once and returns the stats to report. The
// caller bounds it with ctx.
func (s *StatsScraper) Scrape(ctx context.Context) (*icv1.ReplicaStats, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("cannot build metrics request: %w", err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot scrape engine metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("cannot scrape engine metrics: %s", resp.Status)
	}
	return s.Parse(io.LimitReader(resp.Body, maxMetricsBody))
}

// Parse computes stats from a Prometheus text exposition.
func (s *StatsScraper) Parse(r io.Reader) (*icv1.ReplicaStats, error) {
	if !s.parserReady {
		s.parser = expfmt.NewTextParser(model.LegacyValidation)
		s.parserReady = true
	}
	fams, err := s.parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("cannot parse engine metrics: %w", err)
	}
	st := &icv1.ReplicaStats{ClientVersion: s.ClientVersion}
	sglang := false
	for name := range fams {
		if strings.HasPrefix(name, "sglang:") {
			sglang = true
			break
		}
	}
	var usage, running, waiting float64
	var okR, okW bool
	if sglang {
		hr, _ := s.lookup(fams, sglangHitRate)
		st.HitRate = clamp01(hr)
		usage, _ = s.lookup(fams, sglangUsage)
		running, okR = s.lookup(fams, sglangRunning)
		waiting, okW = s.lookup(fams, sglangQueue)
	} else {
		st.HitRate = s.vllmHitRate(fams)
		usage, _ = s.lookup(fams, vllmUsage)
		running, okR = s.lookup(fams, vllmRunning)
		waiting, okW = s.lookup(fams, vllmWaiting)
		if v, ok := s.lookup(fams, vllmT2Hits); ok {
			st.T2HitTokens = int64(v)
		}
		if v, ok := s.lookup(fams, vllmT2Queries); ok {
			st.T2QueryTokens = int64(v)
		}
	}
	st.Pressure = clamp01((running + waiting) / PressureCeiling)
	// The live load (ReplicaStats 8-10) goes with every report that has
	// the engine's request gauges, so the server can rank by queue.
	if okR || okW {
		st.WaitingRequests = proto.Int32(count(waiting))
		st.RunningRequests = proto.Int32(count(running))
		if s.QueuedTokensMetric != "" {
			if q, ok := s.lookup(fams, []string{s.QueuedTokensMetric}); ok && !math.IsNaN(q) {
				st.QueuedPrefillTokens = proto.Int64(int64(min(max(q, 0), math.MaxInt64/2)))
			}
		}
	}
	if !math.IsNaN(usage) {
		st.CacheMemoryBytes = int64(float64(s.CacheSizeBytes) * min(max(usage, 0), 1))
	}
	return st, nil
}

// vllmHitRate is Δhits/Δqueries since the previous scrape. The first
// scrape, and one after a counter reset, use the lifetime ratio; an
// interval without queries keeps the previous rate.
func (s *StatsScraper) vllmHitRate(fams map[string]*dto.MetricFamily) float32 {
	hits, okH := s.lookup(fams, vllmHits)
	queries, okQ := s.lookup(fams, vllmQueries)
	if !okH || !okQ {
		return s.lastHitRate
	}
	var rate float32
	dh, dq := hits-s.prevHits, queries-s.prevQuery
	switch {
	case !s.havePrev || dh < 0 || dq < 0:
		if queries > 0 {
			rate = clamp01(hits / queries)
		}
	case dq == 0:
		rate = s.lastHitRate
	default:
		rate = clamp01(dh / dq)
	}
	s.havePrev, s.prevHits, s.prevQuery, s.lastHitRate = true, hits, queries, rate
	return rate
}

// lookup sums every series of the first family found among names, each
// tried as is and with a _total suffix; with RankLabel set, only the series
// of Rank, and a family without any is not found.
func (s *StatsScraper) lookup(fams map[string]*dto.MetricFamily, names []string) (float64, bool) {
	for _, n := range names {
		for _, name := range [2]string{n, n + "_total"} {
			f, ok := fams[name]
			if !ok {
				continue
			}
			var sum float64
			found := false
			for _, m := range f.GetMetric() {
				if s.RankLabel != "" && !hasLabel(m, s.RankLabel, s.Rank) {
					continue
				}
				found = true
				switch {
				case m.Counter != nil:
					sum += m.GetCounter().GetValue()
				case m.Gauge != nil:
					sum += m.GetGauge().GetValue()
				case m.Untyped != nil:
					sum += m.GetUntyped().GetValue()
				}
			}
			if found {
				return sum, true
			}
		}
	}
	return 0, false
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

// count converts a request gauge to an int32: NaN and negatives are 0.
func count(v float64) int32 {
	if !(v > 0) {
		return 0
	}
	return int32(min(v, math.MaxInt32))
}

func clamp01(v float64) float32 {
	if math.IsNaN(v) || v < 0 {
		return 0
	}
	if v > 1 {
		return 1
	}
	return float32(v)
}
