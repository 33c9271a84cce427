// Package chaos is the scale-out soundness run (docs/scaleout.md, "Chaos
// run"): a real NATS server, N servers consuming its stream and M fake
// engines, each followed by a subscriber publishing to NATS, all built with
// go build and run as separate processes. While the engines store and
// remove blocks, a seeded schedule SIGKILLs a random component (a server, a
// subscriber, an engine or NATS itself) every 5 to 10 s and restarts it, and
// a gateway-like client issues LookupRoute continuously against all
// servers. Then the engines stop, and after a quiet period every server's
// index must equal every engine's ground truth (no lost block, no stale
// block, per replica), no lookup may have gone unanswered, and no process
// may have grown without bound.
//
// Run is the whole run; the test (TestChaos, 60 s of faults by default,
// CHAOS_DURATION and CHAOS_SEED override) and `make chaos` (3 minutes) call
// it. The same seed gives the same fault schedule.
package chaos
