// Package loadgen drives a running inferencecache server over gRPC the way
// a gateway and a fleet of engine replicas would, and measures it.
//
// A Run has three phases:
//
//  1. Populate: Replicas emulated engine replicas report the first
//     PopulateRequests requests of the workload on ReportCacheState streams
//     (chain-form PrefixEntry per request, tier T1, with stats); closing
//     the streams waits for the server's Ack, a barrier after which every
//     report is visible.
//  2. Lookups, for Warmup + Duration: LookupRoute calls for the workload's
//     requests (with LookupStream, requests on one long-lived
//     LookupRouteStream per worker instead), open loop (a constant or Poisson schedule at Rate, or the
//     trace's own arrivals) or closed loop (Concurrency workers back to
//     back). Each answer routes its request to a replica (the first score,
//     or the least-loaded emulated replica when there is none), which after
//     a modeled prefill reports the blocks it stored and publishes the
//     evictions of its bounded LRU (see replica.go), so the index tracks
//     what the replicas would hold. ClearEvery adds engine restarts
//     (ALL_CLEARED).
//  3. Drain: requests still queued or in flight get DrainTimeout to finish;
//     the rest count as unfinished.
//
// Open-loop latency runs from each request's intended send time, so a
// server that stalls the sender is charged for the wait (no coordinated
// omission). Go timers wake up to a millisecond late for short sleeps, so
// the scheduler releases requests up to timerSlack early and times those
// from their actual send. Only the measured window counts in the latency,
// reason and hint figures; Report.Totals also counts the warm-up, to match
// the server's inferencecache_lookup_route_calls_total.
//
// Latencies go into a Histogram: log-linear buckets (64 per power of two)
// with at most 1/128 relative error, merged from one per worker.
//
// Report.Timeline cuts the whole run, warm-up included, into at most 60
// equal slices (100 ms or more) and counts each slice's responses by reason
// code, errors, modeled block hits and latency (coarser buckets, within
// about 3 %), by the lookup's intended send time; the counters are shared
// atomics preallocated at the start, so recording allocates nothing.
// (*Report).WriteSVG draws it (latency p50/p99, reason-code shares, modeled
// hit ratio per slice); cmd/loadgen writes it with -svg.
//
// Workloads come from bench/workload: multi-turn chat, RAG, diffuse
// single-turn behind shared system prompts, and Mooncake trace replay. Block
// ids become 8-byte wire hashes through a per-seed bijection; when the
// stream wraps, the next epoch renames every block, so no epoch replays an
// earlier one's cache state. Engines hash only full blocks, so a partial
// last block is never sent.
//
// Run is safe to call concurrently (each call has its own connection and
// state); a Config is read-only during a Run.
package loadgen
