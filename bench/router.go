package bench

import (
	"fmt"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
)

// EventKind is the kind of a KV-cache event, mirroring the three events
// that vLLM and SGLang publish (BlockStored, BlockRemoved, AllBlocksCleared).
type EventKind uint8

const (
	// BlockStored: the replica now caches Blocks.
	BlockStored EventKind = iota + 1
	// BlockRemoved: the replica evicted Blocks.
	BlockRemoved
	// AllCleared: the replica dropped its whole cache (restart, reset).
	AllCleared
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "stored"
	case BlockRemoved:
		return "removed"
	case AllCleared:
		return "cleared"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one change to one replica's cache, as a KV-event subscriber
// would receive it.
//
// The simulator emits BlockRemoved when a request's prefill starts (the
// engine evicts while allocating) and BlockStored when it completes (the
// KV now exists), and delivers each event to the router at EmittedAt+Lag.
// A replica's events are delivered in the order it emitted them.
//
// Blocks shares memory with the workload's requests: a router must not
// modify it, and must copy it if it keeps it past Observe.
type Event struct {
	Kind      EventKind
	Replica   int
	EmittedAt time.Duration
	// DeliveredAt is when the router observes the event.
	DeliveredAt time.Duration
	// Blocks holds prefix block ids. For BlockStored it is a contiguous run
	// of the storing request's chain, in chain order; for BlockRemoved any
	// set of ids; for AllCleared nil.
	Blocks []uint64
	// Parent is the chain block just before Blocks[0] (BlockStored only);
	// HasParent is false when Blocks[0] is the first block of the chain.
	Parent    uint64
	HasParent bool
	// BlockSize, TokensBefore and LastBlockTokens (BlockStored only) let an
	// index recover cumulative token counts: block k of Blocks ends at
	// TokensBefore + (k+1)*BlockSize tokens, except the last, which holds
	// LastBlockTokens (< BlockSize when it is a partial block, which real
	// engines do not hash; an adapter may drop it).
	BlockSize       int
	TokensBefore    int
	LastBlockTokens int
}

// ReplicaLoad is what a router knows about one replica's load at routing
// time. Load signals are exact and not lagged: a router keeps them from its
// own routing decisions and completion notices, as Dynamo's and SGLang's
// routers do; only cache state reaches the router late, through events.
type ReplicaLoad struct {
	// Waiting counts requests routed to the replica whose prefill has not
	// started.
	Waiting int
	// Running counts requests in prefill or decode.
	Running int
	// PendingPrefillTokens is the prompt work not yet done: the full prompt
	// of every waiting request plus the uncached remainder of the request
	// in prefill.
	PendingPrefillTokens int
	// ActiveBlocks is the number of prompt blocks of all requests in
	// flight (waiting or running), the decode-side load of Dynamo's cost.
	ActiveBlocks int
	// PrefilledTokens is the total number of prompt tokens the replica has
	// prefilled so far.
	PrefilledTokens int64
}

// InFlight returns Waiting+Running.
func (l ReplicaLoad) InFlight() int { return l.Waiting + l.Running }

// View is the router's picture of the cluster when a request arrives.
// It is valid only during the Route call that receives it; a router must
// not keep it or modify it.
type View struct {
	// Now is the simulated time of the routing decision.
	Now time.Duration
	// Replicas holds one entry per replica, indexed by replica.
	Replicas []ReplicaLoad
}

// Router is a routing policy under test.
//
// The simulator calls a Router from one goroutine only: Observe with each
// KV event at its delivery time, and Route with each request at its
// arrival; every event delivered at or before an arrival's time is observed
// before that request is routed. A Router keeps its own picture of the
// replicas' caches from the events (PrefixIndex is a ready-made one); an
// adapter for a real engine feeds the events into the engine's index in
// Observe and, in Route, asks that index for ranked replicas and returns
// the first, falling back on View loads when the index has nothing.
//
// Route must return a replica index in [0, len(view.Replicas)). Routers
// that draw random numbers must take them from a source seeded by their
// constructor, so a run is deterministic for a seed.
type Router interface {
	// Name is the policy's name in reports; it must be unique in a run.
	Name() string
	// Observe applies one KV event.
	Observe(ev *Event)
	// Route picks the replica for req.
	Route(req *workload.Request, view *View) int
}

// Policy names a Router and builds a fresh instance for each simulation.
type Policy struct {
	Name string
	// New returns a router for a cluster of replicas replicas; seed is the
	// run's seed, for routers that draw random numbers.
	New func(replicas int, seed uint64) Router
}

// Ticker is implemented by routers that sample replica load periodically,
// as a metrics scrape does (this project's router: the kvevent
// subscriber's stats scrape). The simulator calls Tick every TickInterval
// of simulated time, from the first interval until the last arrival, with
// the exact loads at that instant; what the router does with them (delay,
// aggregate) is its business. Ticks at the same instant as other work run
// after completions and clears and before event deliveries and arrivals.
type Ticker interface {
	TickInterval() time.Duration
	Tick(view *View)
}

// Finisher is implemented by routers that learn when each request ends, as
// an endpoint picker does (the response streams through it). The simulator
// calls Finished when a request's decode completes, on the goroutine that
// calls Route, in simulated-time order with the other calls; completions
// at an instant come before ticks, event deliveries and arrivals at it.
// req is the request Route placed on replica.
type Finisher interface {
	Finished(req *workload.Request, replica int, now time.Duration)
}
