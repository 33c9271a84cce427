package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// EnginePolicyName is the report name of this project's router.
const EnginePolicyName = "inferencecache"

// statsInterval is how often the adapter reports replica stats, as the
// kvevent subscriber scrapes engine metrics every 10 s.
const statsInterval = 10 * time.Second

// EnginePolicy routes with this project's LookupRoute: the production gRPC
// handler (rpc.Service, called in process) over a real engine with the
// contract's default policy (no CachePolicy: 64-token matched floor, 0.1
// routing floor, affinity on). KV events reach the engine the way the
// kvevent subscriber delivers them (one legacy prefix entry per block with
// its cumulative token count; removals as PREFIX_EVICTED; clears as
// ALL_CLEARED), and replica stats with pressure = in-flight/256 every 10 s
// of simulated time. The gateway side takes the first ranked replica
// (PREFIX_MATCH, TENANT_HOT or AFFINITY_HINT) and falls back to least loaded
// on NO_HINT.
func EnginePolicy() Policy {
	return EnginePolicyWith(EnginePolicyName, EngineOptions{Refresh: DefaultRefresh})
}

// DefaultRefresh is how often the kvevent subscriber re-reports the blocks
// its engine still holds (kvevents --refresh-interval): engines publish
// BlockStored only for newly computed blocks, so without a refresh a block
// that stays hot in the engine would age out of the index after the TTL.
const DefaultRefresh = 5 * time.Minute

// EngineOptions vary the engine router for comparisons.
type EngineOptions struct {
	// Refresh is the subscriber's refresh interval; 0 disables refreshes,
	// as the seed system's subscriber behaves.
	Refresh time.Duration
	// Policy, when set, is pushed as the CachePolicy of the simulated
	// tenant (namespace "bench"); nil keeps the contract's defaults.
	Policy *policy.ResolvedPolicy
}

// EnginePolicyWith is EnginePolicy under another name with options.
func EnginePolicyWith(name string, opt EngineOptions) Policy {
	return Policy{Name: name, New: func(n int, _ uint64) Router {
		r := newEngineRouter(n)
		r.name, r.refresh = name, opt.Refresh
		if opt.Policy != nil {
			p := *opt.Policy
			p.Namespace = engineTenant
			r.store.Apply(&policy.Body{Version: policy.PropagationVersion, Policies: []policy.ResolvedPolicy{p}})
		}
		return r
	}}
}

// affinityOff is the contract's defaults with affinityRouting Disabled.
func affinityOff() *policy.ResolvedPolicy {
	off, floor := false, policy.DefaultRoutingFloorScore
	return &policy.ResolvedPolicy{MinimumMatchedTokens: policy.DefaultMinimumMatchedTokens, RoutingFloorScore: &floor, AffinityRouting: &off}
}

type engineRouter struct {
	name    string
	refresh time.Duration
	// held mirrors, per replica, the blocks its engine holds (block id ->
	// cumulative tokens), as the subscriber's positional index does; it
	// feeds the periodic refresh.
	held        []map[uint64]int32
	lastRefresh time.Duration
	eng         *engine.Engine
	store       *policy.Store
	svc         *rpc.Service
	names       []string
	byID        map[string]int
	// now is the simulated clock the engine and service read.
	now       time.Duration
	lastStats time.Duration
	statsSent bool
	// Scratch reused across calls.
	req     pb.LookupRouteRequest
	hashes  [][]byte
	counts  []int32
	hashBuf []byte
	update  engine.Update
}

const (
	engineTenant = "bench"
	engineModel  = "model"
	engineScheme = "vllm"
)

// simEpoch anchors simulated time on the engine's µs clock.
var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newEngineRouter(n int) *engineRouter {
	store := policy.NewStore()
	e := engine.New(engine.Config{MaxEntries: engine.DefaultMaxEntries, Policies: store})
	r := &engineRouter{eng: e, store: store, byID: map[string]int{}}
	svc, err := rpc.NewService(rpc.Config{Index: e, Policies: store, Now: func() time.Time { return simEpoch.Add(r.now) }})
	if err != nil {
		panic("BUG: " + err.Error())
	}
	r.svc = svc
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("replica-%02d", i)
		r.names = append(r.names, name)
		r.byID[name] = i
		r.held = append(r.held, map[uint64]int32{})
	}
	return r
}

func (r *engineRouter) Name() string { return r.name }

func (r *engineRouter) micros() int64 { return simEpoch.Add(r.now).UnixMicro() }

// blockHash is the wire hash of a workload block id.
func blockHash(dst []byte, id uint64) []byte { return binary.BigEndian.AppendUint64(dst, id) }

func (r *engineRouter) Observe(ev *Event) {
	r.now = ev.DeliveredAt
	now := r.micros()
	name := r.names[ev.Replica]
	switch ev.Kind {
	case BlockStored:
		u := &r.update
		*u = engine.Update{ReplicaID: name, TenantID: engineTenant, ModelID: engineModel, HashScheme: engineScheme, TimestampUs: now, Prefixes: u.Prefixes[:0]}
		buf := r.hashBuf[:0]
		for k := range ev.Blocks {
			tokens := ev.BlockSize
			if k == len(ev.Blocks)-1 {
				tokens = ev.LastBlockTokens
			}
			if tokens < ev.BlockSize {
				break // engines hash full blocks only
			}
			buf = blockHash(buf, ev.Blocks[k])
		}
		r.hashBuf = buf
		for k := 0; k < len(buf)/8; k++ {
			tokens := int32(ev.TokensBefore + (k+1)*ev.BlockSize)
			u.Prefixes = append(u.Prefixes, engine.PrefixEntry{PrefixHash: buf[8*k : 8*k+8], TokenCount: tokens})
			r.held[ev.Replica][ev.Blocks[k]] = tokens
		}
		if len(u.Prefixes) > 0 {
			r.eng.Ingest(u, now)
		}
	case BlockRemoved:
		var h [8]byte
		for _, id := range ev.Blocks {
			delete(r.held[ev.Replica], id)
			r.eng.ApplyEvent(&engine.Event{Type: engine.EventPrefixEvicted, TenantID: engineTenant, ModelID: engineModel, ReplicaID: name, PrefixHash: blockHash(h[:0], id), TimestampUs: now}, now)
		}
	case AllCleared:
		clear(r.held[ev.Replica])
		r.eng.ApplyEvent(&engine.Event{Type: engine.EventAllCleared, TenantID: engineTenant, ModelID: engineModel, ReplicaID: name, TimestampUs: now}, now)
	}
}

func (r *engineRouter) reportStats(v *View) {
	if r.statsSent && v.Now-r.lastStats < statsInterval {
		return
	}
	r.statsSent, r.lastStats = true, v.Now
	now := r.micros()
	for i, l := range v.Replicas {
		p := float32(l.InFlight()) / 256
		r.eng.Ingest(&engine.Update{ReplicaID: r.names[i], TenantID: engineTenant, ModelID: engineModel, TimestampUs: now,
			Stats: &engine.ReplicaStats{Pressure: min(p, 1)}}, now)
	}
}

// refreshHeld re-reports every block each replica still holds, stamped now.
func (r *engineRouter) refreshHeld(v *View) {
	if r.refresh <= 0 || v.Now-r.lastRefresh < r.refresh {
		return
	}
	r.lastRefresh = v.Now
	now := r.micros()
	for i, held := range r.held {
		ids := make([]uint64, 0, len(held))
		for id := range held {
			ids = append(ids, id)
		}
		slices.Sort(ids) // deterministic order
		u := &engine.Update{ReplicaID: r.names[i], TenantID: engineTenant, ModelID: engineModel, HashScheme: engineScheme, TimestampUs: now}
		for _, id := range ids {
			u.Prefixes = append(u.Prefixes, engine.PrefixEntry{PrefixHash: blockHash(nil, id), TokenCount: held[id]})
		}
		if len(u.Prefixes) > 0 {
			r.eng.Ingest(u, now)
		}
	}
}

func (r *engineRouter) Route(req *workload.Request, v *View) int {
	r.now = v.Now
	r.reportStats(v)
	r.refreshHeld(v)
	full := len(req.Blocks)
	if last := req.InputTokens - req.BlockSize*(len(req.Blocks)-1); len(req.Blocks) > 0 && last < req.BlockSize {
		full-- // the partial last block has no engine hash
	}
	buf := r.hashBuf[:0]
	r.hashes, r.counts = r.hashes[:0], r.counts[:0]
	for _, id := range req.Blocks[:max(full, 0)] {
		buf = blockHash(buf, id)
		r.counts = append(r.counts, int32(req.BlockSize))
	}
	for k := range r.counts {
		r.hashes = append(r.hashes, buf[8*k:8*k+8])
	}
	r.hashBuf = buf
	r.req = pb.LookupRouteRequest{ModelId: engineModel, TenantId: engineTenant, HashScheme: engineScheme, BlockHashes: r.hashes, BlockTokenCounts: r.counts}
	resp, err := r.svc.LookupRoute(context.Background(), &r.req)
	if err == nil && len(resp.ReplicaScores) > 0 {
		if i, ok := r.byID[resp.ReplicaScores[0].ReplicaId]; ok {
			return i
		}
	}
	return leastLoaded(v)
}
