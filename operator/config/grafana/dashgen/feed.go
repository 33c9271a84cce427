package main

// sub selects the kvevent-subscriber sidecars: they run in the engine
// pods, so in the tenants' namespaces and under whatever job scrapes them.
const sub scope = `job=~"$sub_job", namespace=~"$sub_namespace"`

const (
	subMetric      = "inferencecache_subscriber_"
	forwardBuckets = subMetric + "forward_latency_seconds_bucket"
)

// staleThreshold is InferencecacheBusStale's bound.
var staleThreshold = []step{{0, "green"}, {60, "yellow"}, {300, "red"}}

func feed() board {
	vars := append(serverVars(),
		queryVar("sub_job", "Subscriber job", `label_values(inferencecache_subscriber_batches_decoded_total, job)`, true),
		queryVar("sub_namespace", "Engine namespace", `label_values(inferencecache_subscriber_batches_decoded_total{job=~"$sub_job"}, namespace)`, true))
	return board{
		UID:   "inferencecache-feed",
		Title: "inferencecache / Event feed",
		Desc:  "Engine KV events into the index: the kvevent-subscriber sidecars, their publishing (gRPC or NATS JetStream), the servers' NATS consumers, and recovery from restarts (kvevents/README.md, docs/scaleout.md).",
		Vars:  vars,
		Rows: []row{
			{"Overview", []panel{
				{Title: "Subscribers", Unit: "none", Stat: true,
					Desc:    "kvevent-subscriber sidecars scraped (one per engine pod and data-parallel rank).",
					Queries: []query{{"count(" + sub.of(subMetric+"positional_index_blocks") + ")", ""}}},
				{Title: "Engine events/s", Unit: "short", Stat: true,
					Desc:    "KV events the subscribers decoded per second, every type.",
					Queries: []query{{sumBy("", rate(sub.of(subMetric+"events_decoded_total"))), ""}}},
				{Title: "Events dropped/s", Unit: "short", Stat: true, Steps: []step{{0, "green"}, {1e-9, "yellow"}},
					Desc:    "Decoded events the subscribers did not forward.",
					Queries: []query{{sumBy("", rate(sub.of(subMetric+"events_dropped_total"))), ""}}},
				{Title: "Publish errors/s", Unit: "short", Stat: true, Steps: []step{{0, "green"}, {1e-9, "yellow"}},
					Desc:    "Failed calls to the server or NATS; the subscriber buffers and retries.",
					Queries: []query{{sumBy("", rate(sub.of(subMetric+"forward_errors_total"))), ""}}},
				{Title: "Servers on NATS", Unit: "none", Stat: true,
					Desc:    "Server pods connected to NATS (inferencecache_bus_connected); empty without --nats-url.",
					Queries: []query{{sumBy("", srv.of("inferencecache_bus_connected")), ""}}},
				{Title: "Max consumer lag", Unit: "short", Stat: true, Steps: []step{{0, "green"}, {1000, "yellow"}, {100000, "red"}},
					Desc:    "Stream messages the furthest-behind server has not applied yet.",
					Queries: []query{{maxBy("", srv.of("inferencecache_bus_consumer_lag_messages")), ""}}},
			}},
			{"Engine events (subscribers)", []panel{
				{Title: "Events decoded/s by type", Unit: "short", Stack: true,
					Desc:    "BlockStored, BlockRemoved, AllBlocksCleared, ... per second. Replayed batches count again.",
					Queries: []query{{sumBy("type", rate(sub.of(subMetric+"events_decoded_total"))), "{{type}}"}}},
				{Title: "Drops by reason", Unit: "short",
					Desc: "Events not forwarded and batches skipped as malformed, by reason, and BlockRemoved hashes the positional index did not hold (skipped).",
					Queries: []query{
						{sumBy("reason", rate(sub.of(subMetric+"events_dropped_total"))), "event: {{reason}}"},
						{sumBy("reason", rate(sub.of(subMetric+"batches_dropped_total"))), "batch: {{reason}}"},
						{sumBy("", rate(sub.of(subMetric+"removed_unknown_blocks_total"))), "removed unknown block"},
					}},
				{Title: "Sequence gaps and replay syncs", Unit: "short",
					Desc: "Gaps on the engine's PUB stream and the replay requests that fill them, by outcome (ok, unavailable, timeout, incomplete, error), per rate window. Every SUB connection starts with a replay sync too.",
					Queries: []query{
						{sumBy("", increase(sub.of(subMetric+"sequence_gaps_total"))), "gaps"},
						{sumBy("outcome", increase(sub.of(subMetric+"replays_total"))), "replay {{outcome}}"},
					}},
				{Title: "Resyncs and re-reports", Unit: "short",
					Desc: "Clear-and-resync cycles (ALL_CLEARED, then the whole positional index again: after an incomplete replay or a lost delivery) and re-reports without a clear, by reason (sync, server_restart, server_reconnect), per rate window.",
					Queries: []query{
						{sumBy("", increase(sub.of(subMetric+"resyncs_total"))), "clear-and-resync"},
						{sumBy("reason", increase(sub.of(subMetric+"rereports_total"))), "re-report: {{reason}}"},
					}},
				{Title: "Positional index blocks per subscriber", Unit: "short",
					Desc:    "Engine blocks each subscriber's positional index holds: the engine's cache as the index will see it.",
					Queries: []query{{maxBy("namespace, pod", sub.of(subMetric+"positional_index_blocks")), "{{namespace}}/{{pod}}"}}},
				{Title: "Engine links", Unit: "short",
					Desc: "Engine /metrics scrapes (load and stats) by result per second, SUB socket re-dials and periodic refreshes of the held blocks per rate window.",
					Queries: []query{
						{sumBy("result", rate(sub.of(subMetric+"stats_scrapes_total"))), "stats scrape {{result}}"},
						{sumBy("", increase(sub.of(subMetric+"zmq_reconnects_total"))), "ZMQ reconnects"},
						{sumBy("", increase(sub.of(subMetric+"refreshes_total"))), "refreshes"},
					}},
			}},
			{"Publish (subscribers to the server or NATS)", []panel{
				{Title: "Publishes/s by RPC", Unit: "reqps",
					Desc: "Successful and failed calls, by RPC (PublishEvent, ReportCacheState), to the server over gRPC or to NATS JetStream, whichever sink the subscriber runs.",
					Queries: []query{
						{sumBy("rpc", rate(sub.of(subMetric+"forward_latency_seconds_count"))), "{{rpc}} ok"},
						{sumBy("rpc", rate(sub.of(subMetric+"forward_errors_total"))), "{{rpc}} failed"},
					}},
				{Title: "Publish latency by RPC", Unit: "s",
					Desc: "Latency of successful calls (NATS: until JetStream acknowledged the message), buckets 0.5 ms to 5 s.",
					Queries: []query{
						{quantile("0.5", "rpc", sub.of(forwardBuckets)), "{{rpc}} p50"},
						{quantile("0.99", "rpc", sub.of(forwardBuckets)), "{{rpc}} p99"},
					}},
				{Title: "Forward buffer", Unit: "short",
					Desc:    "Entries waiting to be forwarded, per subscriber: grows while the server or NATS is unreachable.",
					Queries: []query{{maxBy("namespace, pod", sub.of(subMetric+"forward_buffered_entries")), "{{namespace}}/{{pod}}"}}},
				{Title: "Lost deliveries and overflows", Unit: "short", Steps: zeroIsGood,
					Desc: "Deliveries NATS did not store after accepting them (each triggers a clear-and-resync; always 0 over gRPC) and forward buffer overflows (the buffer was dropped), per rate window.",
					Queries: []query{
						{sumBy("", increase(sub.of(subMetric+"forward_lost_total"))), "lost deliveries"},
						{sumBy("", increase(sub.of(subMetric+"buffer_overflows_total"))), "buffer overflows"},
					}},
			}},
			{"NATS consumers (servers)", []panel{
				{Title: "Consumer lag per server", Unit: "short",
					Desc:    "Stream messages (this server's filter) not applied yet, as last known.",
					Queries: []query{{maxBy("pod", srv.of("inferencecache_bus_consumer_lag_messages")), "{{pod}}"}}},
				{Title: "Staleness per server", Unit: "s", Steps: staleThreshold,
					Desc:    "Seconds since the server last knew itself current (lag 0 and connected). The index is still answered meanwhile but may miss what was published since. InferencecacheBusStale fires above 300 s.",
					Queries: []query{{maxBy("pod", srv.of("inferencecache_bus_consumer_stale_seconds")), "{{pod}}"}}},
				{Title: "Messages applied/s by kind", Unit: "short", Stack: true,
					Desc:    "Stream messages read per second: update, event, unknown (no known Inferencecache-Kind header; skipped).",
					Queries: []query{{sumBy("kind", rate(srv.of("inferencecache_bus_messages_total"))), "{{kind}}"}}},
				{Title: "Messages dropped/s by reason", Unit: "short", Steps: zeroIsGood,
					Desc:    "Stream messages not applied: malformed, refused (an id over the limit), panic (a bug), subject (the payload names another tenant or model than its subject).",
					Queries: []query{{sumBy("reason", rate(srv.of("inferencecache_bus_messages_dropped_total"))), "{{reason}}"}}},
				{Title: "Connected and caught up", Unit: "none", Max: ratioMax(),
					Desc: "1 while the server is connected to NATS; caught up once it applied what the stream held at its start (it is ready from then on).",
					Queries: []query{
						{minBy("pod", srv.of("inferencecache_bus_connected")), "{{pod}} connected"},
						{minBy("pod", srv.of("inferencecache_bus_caught_up")), "{{pod}} caught up"},
					}},
				{Title: "Last applied sequence", Unit: "none",
					Desc:    "Stream sequence of the last message each server applied: servers on the same stream should move together.",
					Queries: []query{{maxBy("pod", srv.of("inferencecache_bus_last_sequence")), "{{pod}}"}}},
			}},
			{"Restarts recovered", []panel{
				{Title: "Server restart replay", Unit: "s",
					Desc:    "Seconds from a server's start until it caught up with the stream (restart to ready); 0 until then.",
					Queries: []query{{maxBy("pod", srv.of("inferencecache_bus_replay_duration_seconds")), "{{pod}}"}}},
				{Title: "Server replay progress", Unit: "percentunit", Max: ratioMax(),
					Desc:    "Applied share of the start replay (the messages the stream held when the server started), per server.",
					Queries: []query{{minBy("pod", srv.of("inferencecache_bus_replay_progress_ratio")), "{{pod}}"}}},
				{Title: "Engine restarts and history recoveries", Unit: "short",
					Desc: "Engine publishers that restarted (sequence went backwards) and replays from the engine's oldest buffered batch after a BlockStored with an unknown parent, by outcome (adopted, no_further, failed), per rate window.",
					Queries: []query{
						{sumBy("", increase(sub.of(subMetric+"engine_restarts_total"))), "engine restarts"},
						{sumBy("outcome", increase(sub.of(subMetric+"history_recoveries_total"))), "history recovery {{outcome}}"},
					}},
				{Title: "Subscriber state file", Unit: "short",
					Desc: "State file reads at a subscriber's start (ok, missing, invalid, foreign, error) and writes (ok, error), per rate window: a restarted sidecar resumes from its saved positional index.",
					Queries: []query{
						{sumBy("result", increase(sub.of(subMetric+"state_loads_total"))), "load {{result}}"},
						{sumBy("result", increase(sub.of(subMetric+"state_saves_total"))), "save {{result}}"},
					}},
			}},
		},
	}
}
