package kvevents

import "github.com/inferencecache/inferencecache/internal/ratelog"

// Log lines the server's answers or the engine's messages can trigger once
// per message, rate-limited (the zero Limiter: one line per 10 s, each
// counting those held back; the metrics count every one). Shared by the
// process's subscribers (one per process outside tests).
var (
	refusedForwardLog ratelog.Limiter // the server refused a forwarded op (forwarder)
	refusedAckLog     ratelog.Limiter // an Ack with accepted=false (grpcsink)
	badBatchLog       ratelog.Limiter // an undecodable engine batch (subscriber)
)
