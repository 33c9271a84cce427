// Package kvevents turns an inference engine's KV-cache events (vLLM and
// SGLang publish them over ZMQ as msgpack) into the inferencecache wire
// contract: ReportCacheState deltas and PublishEvent lifecycle events.
//
// The pipeline has four stages, each usable on its own:
//
//   - wire.Decoder (package kvevents/wire, the engines' wire format) turns
//     one ZMQ payload into a wire.Batch (both the tag-first array layout and
//     the map layout of events, array or map envelopes).
//   - Index is the per-replica positional index: engine block hash to our
//     fingerprint key, cumulative tokens, adapter and media.
//   - Forwarder batches adds, orders removals and clears behind them, and
//     ships them to a Sink with retries, a bounded buffer and clear-and-resync
//     on overflow.
//   - Subscriber wires a ZMQ SUB socket, sequence tracking and replay-based gap
//     recovery around the three, plus the engine stats scraper.
//
// See README.md in this directory for the delivery guarantees.
package kvevents
