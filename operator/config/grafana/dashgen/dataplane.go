package main

import (
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// srv selects the server pods the dashboard's variables pick.
const srv scope = `job=~"$job", namespace=~"$namespace", pod=~"$pod"`

// byModel narrows a server selector to the $model variable.
const byModel = `model=~"$model"`

// serverVars are the server-side variables: scrape job, namespace, pod.
func serverVars() []cog.Builder[dashboard.VariableModel] {
	return []cog.Builder[dashboard.VariableModel]{
		queryVar("job", "Server job", `label_values(inferencecache_server_up, job)`, true),
		queryVar("namespace", "Namespace", `label_values(inferencecache_server_up{job=~"$job"}, namespace)`, true),
		queryVar("pod", "Server pod", `label_values(inferencecache_server_up{job=~"$job", namespace=~"$namespace"}, pod)`, true),
	}
}

const (
	lookupCalls   = "inferencecache_lookup_route_calls_total"
	lookupBuckets = "inferencecache_lookup_route_latency_seconds_bucket"
	picks         = "inferencecache_picker_picks_total"
	pickBuckets   = "inferencecache_picker_decision_latency_seconds_bucket"
	indexMemory   = "inferencecache_index_memory_bytes"
	predicted     = "inferencecache_picker_predicted_cached_tokens_total"
	delivered     = "inferencecache_picker_delivered_cached_tokens_total"
	promptTokens  = "inferencecache_picker_prompt_tokens_total"
)

// lookupLatencyThreshold is InferencecacheLookupLatencyHigh's p99 bound.
var lookupLatencyThreshold = []step{{0, "green"}, {0.005, "yellow"}, {0.01, "red"}}

func dataPlane() board {
	vars := append(serverVars(),
		queryVar("model", "Model", `label_values(inferencecache_lookup_route_calls_total{job=~"$job", namespace=~"$namespace"}, model)`, true))
	return board{
		UID:   "inferencecache-data-plane",
		Title: "inferencecache / Data plane",
		Desc:  "The routing servers: LookupRoute, the endpoint picker, the index, replica load and the tokenizer (docs/metrics.md).",
		Vars:  vars,
		Rows: []row{
			{"Overview", []panel{
				{Title: "Servers up", Unit: "none", W: 3, Stat: true, Steps: oneIsGood,
					Desc:    "Server pods reporting inferencecache_server_up = 1 (serving). InferencecacheServerDown fires when none does for 5 minutes.",
					Queries: []query{{sumBy("", srv.of("inferencecache_server_up")), ""}}},
				{Title: "Lookups/s", Unit: "reqps", W: 3, Stat: true,
					Desc:    "LookupRoute calls answered per second, unary and streamed, over every model.",
					Queries: []query{{sumBy("", rate(srv.of(lookupCalls))), ""}}},
				{Title: "Hinted lookups", Unit: "percentunit", W: 3, Stat: true, Max: ratioMax(),
					Desc:    "Share of lookups answered with replica scores (hint_used=\"true\"): how often the gateway got a routing hint at all.",
					Queries: []query{{sumBy("", rate(srv.of(lookupCalls, `hint_used="true"`))) + " / " + sumBy("", rate(srv.of(lookupCalls))), ""}}},
				{Title: "Lookup p99", Unit: "s", W: 3, Stat: true, Steps: lookupLatencyThreshold,
					Desc:    "Server-side LookupRoute p99 over every model. Red from 10 ms, where InferencecacheLookupLatencyHigh fires.",
					Queries: []query{{quantile("0.99", "", srv.of(lookupBuckets)), ""}}},
				{Title: "Picker decisions/s", Unit: "reqps", W: 3, Stat: true,
					Desc:    "Requests the endpoint picker decided per second (every outcome).",
					Queries: []query{{sumBy("", rate(srv.of(picks))), ""}}},
				{Title: "Index storage entries", Unit: "short", W: 3, Stat: true,
					Desc:    "Replica x key entries the fullest server holds (the unit --max-index-entries caps). Every server holds the whole index, so this is the max across pods, not a sum.",
					Queries: []query{{maxBy("", srv.of("inferencecache_index_storage_entries")), ""}}},
				{Title: "Index memory", Unit: "bytes", W: 3, Stat: true,
					Desc:    "Memory the largest server's index holds from the Go runtime (component=\"total\"): size the pod from it.",
					Queries: []query{{maxBy("", srv.of(indexMemory, `component="total"`)), ""}}},
				{Title: "Recovered panics", Unit: "none", W: 3, Stat: true, Steps: zeroIsGood,
					Desc:    "Handler panics the servers recovered from in the dashboard's time range. Anything above 0 is a bug to report (InferencecacheRecoveredPanics).",
					Queries: []query{{sumBy("", "increase("+srv.of("inferencecache_recovered_panics_total")+"[$__range])"), ""}}},
			}},
			{"Lookups", []panel{
				{Title: "Lookups/s by reason code", Unit: "reqps", Stack: true,
					Desc:    "LookupRoute answers by reason_code (PREFIX_MATCH, TENANT_HOT, AFFINITY_HINT, NO_HINT, UNKNOWN_MODEL, ...). A growing NO_HINT or UNKNOWN_MODEL share means the index is not fed for that traffic.",
					Queries: []query{{sumBy("reason_code", rate(srv.of(lookupCalls, byModel))), "{{reason_code}}"}}},
				{Title: "Lookup latency", Unit: "s", Steps: lookupLatencyThreshold,
					Desc: "Server-side LookupRoute latency, handler entry to response, ranking included (buckets 100 µs to 100 ms). The dashed lines are 5 ms and the 10 ms p99 alert bound.",
					Queries: []query{
						{quantile("0.5", "", srv.of(lookupBuckets, byModel)), "p50"},
						{quantile("0.99", "", srv.of(lookupBuckets, byModel)), "p99"},
					}},
				{Title: "Lookups/s by model", Unit: "reqps", Stack: true,
					Desc:    "Models the index does not hold share model=\"__other__\" (docs/metrics.md, the bounded model label).",
					Queries: []query{{sumBy("model", rate(srv.of(lookupCalls, byModel))), "{{model}}"}}},
				{Title: "Hinted share by model", Unit: "percentunit", Max: ratioMax(),
					Desc: "Per model, the share of lookups that returned replica scores.",
					Queries: []query{{sumBy("model", rate(srv.of(lookupCalls, byModel, `hint_used="true"`))) + " / " +
						sumBy("model", rate(srv.of(lookupCalls, byModel))), "{{model}}"}}},
				{Title: "Lookup streams open", Unit: "short",
					Desc:    "LookupRouteStream streams open per server: gateways on long-lived streams. Falls to 0 on a server that drains.",
					Queries: []query{{sumBy("pod", srv.of("inferencecache_lookup_streams_open")), "{{pod}}"}}},
				{Title: "Recovered panics by listener", Unit: "short", Steps: zeroIsGood,
					Desc:    "Panics recovered per rate window, by server pod and listener (grpc, http, control). Each one answered Internal or 500 and was logged with its stack.",
					Queries: []query{{sumBy("pod, listener", increase(srv.of("inferencecache_recovered_panics_total"))), "{{pod}} {{listener}}"}}},
			}},
			{"Endpoint picker", []panel{
				{Title: "Picker decisions/s by outcome", Unit: "reqps", Stack: true,
					Desc:    "prefix, tenant_hot, affinity: the index's answer; fallback: least loaded; 503, 413, 400: answered by the picker itself.",
					Queries: []query{{sumBy("outcome", rate(srv.of(picks))), "{{outcome}}"}}},
				{Title: "Picker decision latency", Unit: "s",
					Desc: "From the end of the request body (or headers) to the decision: parse, tokenize, lookup, endpoint mapping (buckets 10 µs to 100 ms).",
					Queries: []query{
						{quantile("0.5", "", srv.of(pickBuckets)), "p50"},
						{quantile("0.99", "", srv.of(pickBuckets)), "p99"},
					}},
				{Title: "Fallbacks and picker answers by reason", Unit: "reqps", Stack: true,
					Desc:    "Decisions the index did not make, by why: no_hint, timeout, tokenizer_busy, no_tokenizer, unknown_replicas, ... (fallback) and no_endpoints, body_too_large, not_json (answered by the picker).",
					Queries: []query{{sumBy("outcome, reason", rate(srv.of(picks, `outcome!~"prefix|tenant_hot|affinity"`))), "{{outcome}} {{reason}}"}}},
				{Title: "Predicted vs delivered cached tokens", Unit: "short",
					Desc: "Per second, over the responses that reported cached_tokens: the prefix the index predicted on the endpoint that served, what the engines reported cached, and the prompt tokens of every response whose usage was read.",
					Queries: []query{
						{sumBy("", rate(srv.of(predicted, byModel))), "predicted cached"},
						{sumBy("", rate(srv.of(delivered, byModel))), "delivered cached"},
						{sumBy("", rate(srv.of(promptTokens, byModel))), "prompt"},
					}},
				{Title: "Routing quality by model", Unit: "percentunit",
					Desc: "delivered / predicted: how much of the prefix the picker counted on the engine really had (below 1: the index is ahead of the engines). delivered / prompt: the prefix-cache hit rate the gateway's traffic got.",
					Queries: []query{
						{sumBy("model", rate(srv.of(delivered, byModel))) + " / " + sumBy("model", rate(srv.of(predicted, byModel))), "{{model}} delivered / predicted"},
						{sumBy("model", rate(srv.of(delivered, byModel))) + " / " + sumBy("model", rate(srv.of(promptTokens, byModel))), "{{model}} hit rate"},
					}},
				{Title: "Picker in-flight requests by endpoint", Unit: "short", Stack: true,
					Desc:    "Requests the pickers routed to each endpoint whose response has not ended, summed over the server pods.",
					Queries: []query{{sumBy("replica_id, endpoint", srv.of("inferencecache_picker_inflight_requests")), "{{replica_id}} {{endpoint}}"}}},
				{Title: "Response usage", Unit: "reqps", Stack: true,
					Desc:    "Finished responses by how their usage was read: read, no_cached_tokens (the engine does not report prompt_tokens_details), absent, unreadable.",
					Queries: []query{{sumBy("result", rate(srv.of("inferencecache_picker_usage_total"))), "{{result}}"}}},
				{Title: "Endpoint pool", Unit: "short",
					Desc: "Endpoints in each picker's pool (Ready pods x target ports, or --endpoints-file), and failed attempts to make a new pool per rate window (the last good pool stays).",
					Queries: []query{
						{maxBy("pod", srv.of("inferencecache_picker_endpoints")), "{{pod}} endpoints"},
						{sumBy("reason", increase(srv.of("inferencecache_picker_endpoint_source_failures_total"))), "source failure: {{reason}}"},
					}},
			}},
			{"Index", []panel{
				{Title: "Index keys by model", Unit: "short",
					Desc:    "Distinct keys per model (reserved tenant excluded), max across the servers: each holds the whole index. A drained model reads 0 for --metrics-model-grace, then leaves.",
					Queries: []query{{maxBy("model", srv.of("inferencecache_index_entries", byModel)), "{{model}}"}}},
				{Title: "Storage entries per server", Unit: "short",
					Desc:    "Replica x key entries, what --max-index-entries caps. Servers fed by the same stream should agree.",
					Queries: []query{{maxBy("pod", srv.of("inferencecache_index_storage_entries")), "{{pod}}"}}},
				{Title: "Index memory by component", Unit: "bytes", Stack: true,
					Desc:    "What the selected servers' indexes hold, summed: arena slabs, hash tables, eviction queues and Go-side overhead stack up to component=\"total\".",
					Queries: []query{{sumBy("component", srv.of(indexMemory, `component=~"arena_slabs|tables|queues|overhead"`)), "{{component}}"}}},
				{Title: "Index memory per server", Unit: "bytes",
					Desc: "total: held from the runtime (size the pod from it); budgeted: what --max-index-bytes is checked against.",
					Queries: []query{
						{maxBy("pod", srv.of(indexMemory, `component="total"`)), "{{pod}} total"},
						{maxBy("pod", srv.of(indexMemory, `component="budgeted"`)), "{{pod}} budgeted"},
					}},
				{Title: "Index evictions/s by reason", Unit: "short", Stack: true,
					Desc:    "Entries the index removed itself, by reason (cap: --max-index-entries or the byte budget; ttl) and the namespace's eviction algorithm. A steady cap rate is InferencecacheIndexAtCapacity.",
					Queries: []query{{sumBy("reason, algorithm", rate(srv.of("inferencecache_index_evictions_total"))), "{{reason}} ({{algorithm}})"}}},
				{Title: "Tenant quota evictions/s", Unit: "short", Stack: true,
					Desc:    "Distinct prefixes evicted to bring a tenant back within its CacheTenant quota.",
					Queries: []query{{sumBy("tenant_id", rate(srv.of("inferencecache_tenant_evictions_total"))), "{{tenant_id}}"}}},
				{Title: "Dropped producer reports/s", Unit: "short", Stack: true,
					Desc:    "Reports (prefix entries, stats, events) the index did not apply, by reason: oversized_id, missing_replica_id, missing_hash_scheme, malformed_chain, invalid_hash, index_full, unknown_event_type.",
					Queries: []query{{sumBy("reason", rate(srv.of("inferencecache_dropped_reports_total"))), "{{reason}}"}}},
				{Title: "Producer timestamps clamped/s", Unit: "short",
					Desc:    "Producer messages whose timestamp lay beyond now + --max-clock-skew and were stored clamped: a producer with a bad clock.",
					Queries: []query{{sumBy("rpc", rate(srv.of("inferencecache_producer_timestamps_clamped_total"))), "{{rpc}}"}}},
			}},
			{"Replica load", []panel{
				{Title: "Queued prefill tokens per replica", Unit: "short",
					Desc:    "Load-aware routing's estimate of the prefill work queued ahead of a new request: last load report, plus what was routed there since, minus the prefills completed since. Max across servers; only replicas with a fresh load report.",
					Queries: []query{{maxBy("tenant_id, model, replica_id", srv.of("inferencecache_replica_queue_tokens", byModel)), "{{tenant_id}}/{{replica_id}}"}}},
				{Title: "In-flight requests per replica", Unit: "short",
					Desc:    "Waiting + running requests from the replica's last load report, adjusted by what the servers and pickers routed and saw end since. Max across servers.",
					Queries: []query{{maxBy("tenant_id, model, replica_id", srv.of("inferencecache_replica_inflight_requests", byModel)), "{{tenant_id}}/{{replica_id}}"}}},
			}},
			{"Tokenizer", []panel{
				{Title: "Tokenizations and failures", Unit: "reqps",
					Desc: "prompt_text lookups rendered and tokenized per second, and those that failed open to NO_HINT, by reason (not_found, load_failed, no_template, render_failed, encode_failed, canceled, invalid_model).",
					Queries: []query{
						{sumBy("", rate(srv.of("inferencecache_tokenizations_total"))), "tokenized"},
						{sumBy("reason", rate(srv.of("inferencecache_tokenize_failures_total"))), "failed: {{reason}}"},
					}},
				{Title: "Tokenize latency", Unit: "s",
					Desc: "Successful tokenizations: the server's prompt_text path (render + tokenize, a model's first load included) and the picker's whole-request tokenization.",
					Queries: []query{
						{quantile("0.5", "", srv.of("inferencecache_tokenize_latency_seconds_bucket")), "prompt_text p50"},
						{quantile("0.99", "", srv.of("inferencecache_tokenize_latency_seconds_bucket")), "prompt_text p99"},
						{quantile("0.99", "", srv.of("inferencecache_picker_tokenize_latency_seconds_bucket")), "picker p99"},
					}},
				{Title: "Tokenizer loads", Unit: "short",
					Desc:    "Loads of a model's tokenizer files per rate window, by result; a failed load is retried after --tokenizer-retry-after.",
					Queries: []query{{sumBy("result", increase(srv.of("inferencecache_tokenizer_loads_total"))), "{{result}}"}}},
				{Title: "Tokenizer load failures by model", Unit: "short", Steps: zeroIsGood,
					Desc:    "Which model's tokenizer files are broken and why (not_found, load_failed, no_template). Models past the first 64 count as __other__.",
					Queries: []query{{sumBy("model, reason", increase(srv.of("inferencecache_tokenizer_load_failures_total"))), "{{model}} {{reason}}"}}},
			}},
		},
	}
}
