// Package bus carries producer reports over NATS JetStream so that many
// servers can be fed by the same subscribers and a restarted server can
// rebuild its index from the stream (docs/scaleout.md).
//
// One concern: the stream and its subject naming (Subject, EncodeToken,
// StreamConfig, Retention), publishing (Publisher, asynchronous with a
// bounded number of unacknowledged messages) and consuming (Consumer, an
// ordered per-process consumer that replays the retained window and then
// follows the stream). Payloads are the protobuf messages of the gRPC
// producer RPCs, unchanged; what they mean is the rpc package's business.
//
// Tests run a real NATS server in process (package bustest).
package bus
