package loadgen

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("loadgen: invalid config")

// Mode is how lookups are paced.
type Mode string

const (
	// OpenLoop sends at a target rate regardless of responses (Arrival,
	// Rate); latency runs from each request's intended send time.
	OpenLoop Mode = "open"
	// ClosedLoop keeps Concurrency requests in flight, each worker sending
	// its next request when the previous one returns; latency runs from the
	// actual send.
	ClosedLoop Mode = "closed"
)

// Config describes one load run. Start from DefaultConfig.
type Config struct {
	// Target is the server's gRPC address (host:port). Ignored when Conn is
	// set.
	Target string
	// TLS dials Target with TLS when non-nil; nil dials plaintext.
	TLS *tls.Config
	// Conn, when set, is used instead of dialing Target; the caller owns it.
	Conn grpc.ClientConnInterface

	// TenantID, ModelID and HashScheme key every request and report.
	TenantID, ModelID, HashScheme string

	// Workload is the request stream; Seed makes it (and Poisson arrivals)
	// deterministic.
	Workload WorkloadConfig
	Seed     uint64

	// Mode, Arrival, Rate, Speedup and Concurrency pace the lookups.
	// Open loop: Rate per second with Arrival constant or poisson, or the
	// trace's own arrivals divided by Speedup; at most Concurrency requests
	// in flight (later ones wait, and the wait counts in their latency).
	// Closed loop: Concurrency workers back to back.
	Mode        Mode
	Arrival     Arrival
	Rate        float64
	Speedup     float64
	Concurrency int

	// Warmup runs first and is excluded from the latency and reason
	// figures; Duration is the measured window after it.
	Warmup, Duration time.Duration
	// LookupStream sends the lookups through a lookupclient.Client, on
	// long-lived LookupRouteStream streams (as many as Concurrency), instead
	// of a unary LookupRoute call each; RequestTimeout still bounds each
	// lookup. A connection the run dials itself sets fixed flow-control
	// windows, as docs/wire.md recommends for stream clients.
	LookupStream bool

	// RequestTimeout bounds every RPC; DrainTimeout bounds the wait for
	// requests still queued or in flight when the window closes.
	RequestTimeout, DrainTimeout time.Duration

	// Emulated engine replicas (the feedback loop).
	Replicas      int    // how many
	ReplicaPrefix string // replica ids are <prefix>-00, <prefix>-01, ...
	// ReplicaCacheBlocks is each replica's LRU capacity in blocks.
	ReplicaCacheBlocks int
	// ReplicaSlots is the number of prefills in flight that make a replica
	// fully loaded (pressure 1).
	ReplicaSlots int
	// BytesPerToken sizes cache_memory_bytes in the stats (KV bytes per
	// cached token).
	BytesPerToken int64
	// PopulateRequests are reported (round-robin over the replicas) before
	// the run; -1 means a quarter of the workload's epoch, at most as many
	// as fill the replicas' caches once.
	PopulateRequests int
	// Prefill model: a routed request's blocks are reported after
	// PrefillBase + PrefillPerToken x uncached tokens, capped at PrefillMax.
	PrefillBase, PrefillPerToken, PrefillMax time.Duration
	// FlushInterval is how often a replica completes due prefills and
	// reports them; StatsInterval is the longest gap between two stats
	// reports of an idle replica.
	FlushInterval, StatsInterval time.Duration
	// EvictionRate caps the PREFIX_EVICTED calls per second across all
	// replicas (0: no cap); EvictionQueue bounds each replica's queue of
	// them. An overflow marks the replica for a resync (ALL_CLEARED, then a
	// full re-report), at most once per ResyncInterval.
	EvictionRate   float64
	EvictionQueue  int
	ResyncInterval time.Duration
	// EvictOrphans publishes the eviction of blocks whose parent was
	// evicted already; by default they are only counted (they cannot change
	// a routing decision).
	EvictOrphans bool
	// ClearEvery, when > 0, makes one replica (round-robin) clear its cache
	// and publish ALL_CLEARED at that period, as an engine restart would.
	ClearEvery time.Duration

	// Progress receives a live line at most once a second; nil is silent.
	Progress io.Writer
	// OnWindow, when set, is called with true when the measured window
	// opens (after the warm-up) and with false when it closes, from a
	// goroutine of Run; Run returns only after both calls (or after ctx
	// ended). Harnesses use it to take profiles or resource readings
	// exactly over the window.
	OnWindow func(open bool)
}

// DefaultConfig returns a 10-second open-loop chat run at 1,000 lookups a
// second against 127.0.0.1:9090, with 32 emulated replicas
// (enough that the feedback loop stays in a steady, mostly-hitting regime
// up to the ~10,000 lookups a second a 2-core machine sustains).
func DefaultConfig() Config {
	return Config{
		Target:     "127.0.0.1:9090",
		TenantID:   "loadgen",
		ModelID:    "loadgen-model",
		HashScheme: "vllm",
		Workload:   WorkloadConfig{Kind: WorkloadChat},
		Seed:       1,

		Mode:        OpenLoop,
		Arrival:     ArrivalPoisson,
		Rate:        1000,
		Speedup:     1,
		Concurrency: 64,

		Warmup:         2 * time.Second,
		Duration:       10 * time.Second,
		RequestTimeout: time.Second,
		DrainTimeout:   2 * time.Second,

		Replicas:           32,
		ReplicaPrefix:      "loadgen-replica",
		ReplicaCacheBlocks: 16384,
		ReplicaSlots:       32,
		BytesPerToken:      128 << 10, // an 8B GQA model in fp16: 2 x 32 layers x 8 heads x 128 x 2 B
		PopulateRequests:   -1,
		PrefillBase:        2 * time.Millisecond,
		PrefillPerToken:    20 * time.Microsecond,
		PrefillMax:         250 * time.Millisecond,
		FlushInterval:      5 * time.Millisecond,
		StatsInterval:      500 * time.Millisecond,
		EvictionRate:       2000,
		EvictionQueue:      1024,
		ResyncInterval:     5 * time.Second,
	}
}

func (c *Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.Conn == nil && c.Target == "":
		return bad("no target address")
	case c.TenantID == "" || c.ModelID == "" || c.HashScheme == "":
		return bad("tenant, model and hash scheme must be set")
	case c.Duration <= 0 || c.Warmup < 0:
		return bad("duration must be positive and warm-up not negative")
	case c.RequestTimeout <= 0 || c.DrainTimeout <= 0:
		return bad("request and drain timeouts must be positive")
	case c.Concurrency <= 0 || c.Concurrency > 1<<16:
		return bad("concurrency %d out of [1, 65536]", c.Concurrency)
	case c.Replicas <= 0 || c.Replicas > 1024 || c.ReplicaPrefix == "":
		return bad("replicas %d out of [1, 1024] or empty replica prefix", c.Replicas)
	case c.ReplicaCacheBlocks <= 0 || c.ReplicaSlots <= 0 || c.BytesPerToken < 0:
		return bad("replica cache blocks and slots must be positive")
	case c.PrefillBase < 0 || c.PrefillPerToken < 0 || c.PrefillMax < 0:
		return bad("prefill model durations must not be negative")
	case c.FlushInterval <= 0 || c.StatsInterval <= 0 || c.EvictionQueue <= 0 || c.ResyncInterval <= 0:
		return bad("flush, stats and resync intervals and the eviction queue must be positive")
	case c.EvictionRate < 0:
		return bad("negative eviction rate")
	case c.ClearEvery < 0:
		return bad("negative clear period")
	}
	switch c.Mode {
	case OpenLoop:
		switch c.Arrival {
		case ArrivalConstant, ArrivalPoisson:
			if !(c.Rate > 0) || c.Rate > 1e7 {
				return bad("rate %v per second out of (0, 1e7]", c.Rate)
			}
		case ArrivalTrace:
			if !(c.Speedup > 0) {
				return bad("trace arrivals need a positive speedup, got %v", c.Speedup)
			}
		default:
			return bad("arrival %q is not constant, poisson or trace", c.Arrival)
		}
	case ClosedLoop:
	default:
		return bad("mode %q is not open or closed", c.Mode)
	}
	return nil
}
