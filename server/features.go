package server

import (
	"context"
	"math"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/inferencecache/inferencecache/picker/request"
	"github.com/inferencecache/inferencecache/rpc"
	"github.com/inferencecache/inferencecache/tokenizer/modeldir"
)

// promptTokenizer serves rpc.TemplateTokenizer from --tokenizer-dir: a
// rendered template is tokenized as the engine tokenizes a /v1/completions
// text prompt (special tokens added, as vLLM's default).
type promptTokenizer struct{ dir *modeldir.Dir }

func (p promptTokenizer) EncodePrompt(ctx context.Context, model, text string) ([]uint32, error) {
	return p.dir.RequestTokens(ctx, model, &request.Request{Kind: request.KindCompletion, Model: model, Prompt: text, AddSpecialTokens: true})
}

// gatherSamples serves rpc.MetricsSource from the server's registry.
type gatherSamples struct{ g prometheus.Gatherer }

func (s gatherSamples) AppendSamples(dst []rpc.MetricSample, names map[string]bool) ([]rpc.MetricSample, error) {
	fams, err := s.g.Gather() // what it gathered even on error
	for _, f := range fams {
		name := f.GetName()
		if names != nil && !names[name] {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := make(map[string]string, len(m.GetLabel())+1)
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			add := func(n, typ string, v float64, extra ...string) {
				ls := labels
				if len(extra) == 2 {
					ls = make(map[string]string, len(labels)+1)
					for k, v := range labels {
						ls[k] = v
					}
					ls[extra[0]] = extra[1]
				}
				dst = append(dst, rpc.MetricSample{Name: n, Type: typ, Labels: ls, Value: v})
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(name, "counter", m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, "gauge", m.GetGauge().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add(name+"_bucket", "histogram", float64(b.GetCumulativeCount()), "le", formatFloat(b.GetUpperBound()))
				}
				add(name+"_bucket", "histogram", float64(h.GetSampleCount()), "le", "+Inf")
				add(name+"_sum", "histogram", h.GetSampleSum())
				add(name+"_count", "histogram", float64(h.GetSampleCount()))
			case dto.MetricType_SUMMARY:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					add(name, "summary", q.GetValue(), "quantile", formatFloat(q.GetQuantile()))
				}
				add(name+"_sum", "summary", sm.GetSampleSum())
				add(name+"_count", "summary", float64(sm.GetSampleCount()))
			default:
				add(name, "untyped", m.GetUntyped().GetValue())
			}
		}
	}
	return dst, err
}

// formatFloat writes a bucket bound or quantile as the text exposition
// does.
func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// streamNames are the observer streams, for the metrics.
var streamNames = []string{rpc.StreamCacheEventsName, rpc.StreamMetricsName}
