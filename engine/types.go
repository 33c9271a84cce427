package engine

import (
	"math"
	"time"

	"github.com/inferencecache/inferencecache/policy"
)

// Defaults of the index (contract §6).
const (
	// DefaultMaxEntries bounds replica×key storage entries; 0 means unbounded.
	DefaultMaxEntries = 1_000_000
	// DefaultSweepInterval is how often the server runs the TTL sweep.
	DefaultSweepInterval = time.Minute
	// MaxHashBytes is the longest block or prefix hash the index stores. A
	// longer hash is dropped at ingest and never matches at lookup.
	MaxHashBytes = 256
	// MaxReplicasPerModel bounds distinct replica ids live at once within one
	// (tenant, model); further replicas are dropped at ingest.
	MaxReplicasPerModel = 1<<16 - 1
)

// Ranker defaults (contract §3, §6).
const (
	DefaultPressureWeight      = 1.0
	DefaultSLOTightTTFTMs      = 200
	DefaultSLOTightBias        = 1.0
	DefaultTenantHotMinHitRate = 0.1
	DefaultTenantHotMaxAge     = 5 * time.Minute
)

// RankerConfig holds the score knobs of contract §3. The zero value is not
// the default; use DefaultRanker.
type RankerConfig struct {
	PressureWeight      float64
	SLOTightTTFTMs      int32
	SLOTightBias        float64
	TenantHotMinHitRate float64
	// TenantHotMaxAge <= 0 disables the TENANT_HOT fallback.
	TenantHotMaxAge time.Duration
}

// DefaultRanker returns the contract's ranker defaults.
func DefaultRanker() RankerConfig {
	return RankerConfig{
		PressureWeight:      DefaultPressureWeight,
		SLOTightTTFTMs:      DefaultSLOTightTTFTMs,
		SLOTightBias:        DefaultSLOTightBias,
		TenantHotMinHitRate: DefaultTenantHotMinHitRate,
		TenantHotMaxAge:     DefaultTenantHotMaxAge,
	}
}

// Tier is where a replica holds a block. Stored tiers order from most local
// (T1) to coldest; values a producer sent that the contract does not name
// sort coldest of all and are reported back as unspecified.
type Tier uint8

const (
	TierUnspecified Tier = 0
	TierT1          Tier = 1 // engine KV cache (HBM)
	TierT2          Tier = 2 // external offload such as LMCache
	TierT3          Tier = 3 // remote store
	// tierUnknown stands for any positive wire value above T3.
	tierUnknown Tier = 0xFE
	// tierInvalid stands for a negative wire value.
	tierInvalid Tier = 0xFF
)

// TierFromWire normalizes a producer's tier at ingest: UNSPECIFIED becomes
// T1, T1..T3 are kept, an unknown positive value is kept as "unknown" and a
// negative one as "invalid" (both sort coldest).
func TierFromWire(v int32) Tier {
	switch {
	case v == 0:
		return TierT1
	case v >= 1 && v <= 3:
		return Tier(v)
	case v > 3:
		return tierUnknown
	default:
		return tierInvalid
	}
}

// Wire is the tier as reported in a ReplicaScore: T1..T3 as themselves,
// everything else (unknown, invalid, unspecified) as UNSPECIFIED (0).
func (t Tier) Wire() int32 {
	if t >= TierT1 && t <= TierT3 {
		return int32(t)
	}
	return 0
}

// coldest returns the colder of two stored tiers.
func coldest(a, b Tier) Tier { return max(a, b) }

// PrefixEntry is one prefix a replica reports holding (contract §1.1).
// Either the chain form (BlockHashes with a parallel BlockTokenCounts) or
// the legacy form (PrefixHash with TokenCount), or both.
type PrefixEntry struct {
	PrefixHash       []byte
	TokenCount       int32
	BlockHashes      [][]byte
	BlockTokenCounts []int32
	// Tier is the wire value (0 = unspecified, normalized to T1).
	Tier int32
	// AdapterID is the entry's adapter partition; empty falls back to the
	// update's.
	AdapterID string
}

// ReplicaStats is a replica's cache health (contract §1.1).
type ReplicaStats struct {
	CacheMemoryBytes int64
	HitRate          float32
	Pressure         float32
	T2HitTokens      int64
	T2QueryTokens    int64
	// Load is the live load (inferencecache extension); Load.Reported is
	// false for a pressure-only report.
	Load LoadStats
}

// Update is one CacheStateUpdate: an additive delta from one replica.
type Update struct {
	ReplicaID  string
	ModelID    string
	TenantID   string
	HashScheme string
	// TimestampUs is the producer's clock in µs; 0 means "now".
	TimestampUs int64
	Prefixes    []PrefixEntry
	// Stats is optional.
	Stats     *ReplicaStats
	AdapterID string
	// Placement, when set, replaces what the index knew of the replica's
	// role, pool, node and zone (a RoleUnknown keeps the known role).
	Placement *Placement
}

// EventType mirrors CacheEvent.Type.
type EventType int32

const (
	EventUnspecified    EventType = 0
	EventPrefixAdded    EventType = 1
	EventPrefixEvicted  EventType = 2
	EventReplicaUpdated EventType = 3
	EventAllCleared     EventType = 4
	// EventReplicaRemoved is reported by the change stream only
	// (events.go); ApplyEvent ignores it.
	EventReplicaRemoved EventType = 5
)

// Event is one CacheEvent. It carries no hash scheme.
type Event struct {
	Type        EventType
	ReplicaID   string
	ModelID     string
	TenantID    string
	PrefixHash  []byte
	TimestampUs int64
	AdapterID   string
}

// LookupRequest is the index's view of a LookupRoute request after the
// handler resolved its input: either a chain (BlockHashes with a parallel
// BlockTokenCounts) or an exact PrefixHash.
type LookupRequest struct {
	TenantID, ModelID, HashScheme, AdapterID string
	PrefixHash                               []byte
	BlockHashes                              [][]byte
	BlockTokenCounts                         []int32
	// SLOTTFTMs is the caller's TTFT budget; 0 means none.
	SLOTTFTMs int32
	// Policy, when set, is the tenant's resolved policy the caller already
	// read, so the lookup and the caller's gates use one snapshot; nil
	// means the engine reads the current one.
	Policy *policy.Tenant
}

// Strategy is which path produced a lookup result.
type Strategy uint8

const (
	StrategyNone Strategy = iota
	StrategyPrefixMatch
	StrategyTenantHot
	StrategyUnknownTenant
	StrategyUnknownModel
	StrategyUnknownHashScheme
)

// String returns the contract reason code of a strategy (None is NO_HINT).
func (s Strategy) String() string {
	switch s {
	case StrategyPrefixMatch:
		return "PREFIX_MATCH"
	case StrategyTenantHot:
		return "TENANT_HOT"
	case StrategyUnknownTenant:
		return "UNKNOWN_TENANT"
	case StrategyUnknownModel:
		return "UNKNOWN_MODEL"
	case StrategyUnknownHashScheme:
		return "UNKNOWN_HASH_SCHEME"
	default:
		return "NO_HINT"
	}
}

// Score is one ranked replica.
type Score struct {
	ReplicaID     string
	Score         float32
	MatchedTokens int32
	// Prob is the estimated cache-hit probability: freshness on the prefix
	// path, hit rate on TENANT_HOT.
	Prob float32
	Tier Tier

	// rid and run let Credit find the entries behind this score: rid is the
	// replica's id within its (tenant, model); run is the number of chain
	// blocks matched, or -1 for an exact match, 0 for no entries.
	rid uint16
	run int32
}

// Policies supplies the current policy snapshot. *policy.Store implements it.
type Policies interface {
	Load() *policy.Snapshot
}

type staticPolicies struct{ s *policy.Snapshot }

func (p staticPolicies) Load() *policy.Snapshot { return p.s }

// StaticPolicies returns a Policies that always yields s.
func StaticPolicies(s *policy.Snapshot) Policies { return staticPolicies{s} }

// Metrics receives the index's counters. Implementations must be safe for
// concurrent use and must not call back into the Engine: the index calls
// them outside its writer lock, one write's reports at a time and in write
// order (so the last SetIndexEntries of a model carries its latest count).
type Metrics interface {
	// AddIndexEvictions counts n storage entries removed by the index itself:
	// reason "cap" (entry cap or byte budget) or "ttl" (freshness sweep),
	// labeled with the evicted tenant's algorithm ("lru" or "lfu").
	AddIndexEvictions(algorithm, reason string, n int)
	// AddTenantEvictions counts n distinct keys evicted to bring a tenant
	// back within its quota (reason over_entries).
	AddTenantEvictions(tenantID string, n int)
	// SetIndexEntries reports the distinct keys the index holds for a model,
	// excluding the reserved tenant. A model that drains reports 0.
	SetIndexEntries(model string, n int64)
}

type nopMetrics struct{}

func (nopMetrics) AddIndexEvictions(string, string, int) {}
func (nopMetrics) AddTenantEvictions(string, int)        {}
func (nopMetrics) SetIndexEntries(string, int64)         {}

// clampRate maps NaN and ±Inf to 0 so a bad engine stat cannot poison scores
// or the JSON snapshot.
func clampRate(v float32) float32 {
	if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
		return 0
	}
	return v
}
