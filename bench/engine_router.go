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

// EnginePolicyName is the report name of this project's router, and
// PickerPolicyName the name of its row driven as the endpoint picker
// drives it (EngineOptions.Picker).
const (
	EnginePolicyName = "inferencecache"
	PickerPolicyName = EnginePolicyName + "-picker"
)

// DefaultStatsInterval and DefaultStatsLag describe how the kvevent
// subscriber feeds load to the server: it scrapes its engine's metrics
// every second (kvevents.DefaultStatsInterval) and the report reaches the
// server about one event lag later.
const (
	DefaultStatsInterval = time.Second
	DefaultStatsLag      = 50 * time.Millisecond
)

// EnginePolicy routes with this project's LookupRoute: the production gRPC
// handler (rpc.Service, called in process) over a real engine with the
// contract's default policy (no CachePolicy: 64-token matched floor, 0.1
// routing floor, affinity on) and the server's default load-aware routing.
// KV events reach the engine the way the kvevent subscriber delivers them
// (one legacy prefix entry per block with its cumulative token count;
// removals as PREFIX_EVICTED; clears as ALL_CLEARED). Load reaches it the
// way the subscriber and the server see it: a stats report per replica
// every StatsInterval (waiting and running requests, as stock vLLM and
// SGLang export them, and pressure = in flight/256), sampled exactly and
// delivered StatsLag later; between reports the server counts what it
// routed itself and what KV events show stored.
// The gateway side takes the first ranked replica (PREFIX_MATCH,
// TENANT_HOT or AFFINITY_HINT) and falls back to least loaded on NO_HINT.
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
	// ContractOnly turns load-aware routing off (--load-aware-routing=false):
	// every answer is the contract's ranking.
	ContractOnly bool
	// Load overrides the server's load-aware routing knobs; nil keeps
	// engine.DefaultLoadConfig.
	Load *engine.LoadConfig
	// StatsInterval and StatsLag override DefaultStatsInterval and
	// DefaultStatsLag when positive (StatsLag < 0 means no lag).
	StatsInterval, StatsLag time.Duration
	// QueuedTokens also reports the replica's queued prefill tokens (an
	// engine that exports them, --engine-queued-tokens-metric). Without it
	// the reports carry waiting and running requests only, as a scrape of
	// stock vLLM or SGLang metrics does, and the server estimates the
	// queue from them and from what it routed.
	QueuedTokens bool
	// Picker routes as the endpoint picker does: it also tells the server
	// each request's start (RequestStarted, as it sends the request to
	// the replica it chose) and end (RequestFinished, when the response
	// completes), so the server knows its requests in flight exactly.
	Picker bool
	// NoFollow leaves follows_answer unset: the gateway asks but does not
	// promise to send the request to the first replica, so the server keeps
	// no routing-time entries (docs/routing.md). The default row, like the
	// endpoint picker, follows its answers and says so.
	NoFollow bool
}

// EnginePolicyWith is EnginePolicy under another name with options.
func EnginePolicyWith(name string, opt EngineOptions) Policy {
	return Policy{Name: name, New: func(n int, _ uint64) Router {
		load := engine.DefaultLoadConfig()
		if opt.Load != nil {
			load = *opt.Load
		}
		load.Enabled = !opt.ContractOnly
		r := newEngineRouter(n, load)
		r.name, r.refresh, r.queuedTokens, r.follow = name, opt.Refresh, opt.QueuedTokens, !opt.NoFollow
		r.statsEvery, r.statsLag = DefaultStatsInterval, DefaultStatsLag
		if opt.StatsInterval > 0 {
			r.statsEvery = opt.StatsInterval
		}
		if opt.StatsLag > 0 {
			r.statsLag = opt.StatsLag
		} else if opt.StatsLag < 0 {
			r.statsLag = 0
		}
		if opt.Policy != nil {
			p := *opt.Policy
			p.Namespace = engineTenant
			r.store.Apply(&policy.Body{Version: policy.PropagationVersion, Policies: []policy.ResolvedPolicy{p}})
		}
		if opt.Picker {
			return &pickerRouter{r}
		}
		return r
	}}
}

// pickerRouter is the engine router as the endpoint picker drives the
// server: the same lookup, then RequestStarted for the replica the request
// goes to, and RequestFinished when it ends (a Finisher).
type pickerRouter struct{ *engineRouter }

func (p *pickerRouter) Route(req *workload.Request, v *View) int {
	i := p.engineRouter.Route(req, v)
	p.eng.RequestStarted(engineTenant, engineModel, p.names[i], p.micros())
	return i
}

func (p *pickerRouter) Finished(_ *workload.Request, replica int, now time.Duration) {
	p.deliverStats(now)
	p.now = now
	p.eng.RequestFinished(engineTenant, engineModel, p.names[replica], p.micros())
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
	now time.Duration
	// Load reports: sampled every statsEvery, delivered statsLag later
	// (pending, in delivery order).
	statsEvery, statsLag time.Duration
	queuedTokens         bool
	follow               bool
	pending              []statsSample
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

// statsSample is one replica's load report on its way to the server.
type statsSample struct {
	at, deliver time.Duration
	replica     int
	load        ReplicaLoad
}

func newEngineRouter(n int, load engine.LoadConfig) *engineRouter {
	store := policy.NewStore()
	e := engine.New(engine.Config{MaxEntries: engine.DefaultMaxEntries, Policies: store, Load: load})
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
	r.deliverStats(ev.DeliveredAt)
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

// TickInterval and Tick implement Ticker: the subscriber's metrics scrape.
func (r *engineRouter) TickInterval() time.Duration { return r.statsEvery }

func (r *engineRouter) Tick(v *View) {
	for i, l := range v.Replicas {
		r.pending = append(r.pending, statsSample{at: v.Now, deliver: v.Now + r.statsLag, replica: i, load: l})
	}
}

// deliverStats ingests every load report due by now, each at its delivery
// time, as a stats-only update stamped with its scrape time.
func (r *engineRouter) deliverStats(now time.Duration) {
	k := 0
	for ; k < len(r.pending) && r.pending[k].deliver <= now; k++ {
		p := &r.pending[k]
		r.now = p.deliver
		at := simEpoch.Add(p.at).UnixMicro()
		st := &engine.ReplicaStats{
			Pressure: min(float32(p.load.InFlight())/256, 1),
			Load:     engine.LoadStats{Reported: true, Waiting: int32(p.load.Waiting), Running: int32(p.load.Running), QueuedTokens: int64(p.load.PendingPrefillTokens)},
		}
		if !r.queuedTokens {
			st.Load.QueuedTokens = -1
		}
		r.eng.Ingest(&engine.Update{ReplicaID: r.names[p.replica], TenantID: engineTenant, ModelID: engineModel, HashScheme: engineScheme, TimestampUs: at, Stats: st}, r.micros())
	}
	r.pending = append(r.pending[:0], r.pending[k:]...)
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
	r.deliverStats(v.Now)
	r.now = v.Now
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
	r.req = pb.LookupRouteRequest{ModelId: engineModel, TenantId: engineTenant, HashScheme: engineScheme, BlockHashes: r.hashes, BlockTokenCounts: r.counts, FollowsAnswer: r.follow}
	resp, err := r.svc.LookupRoute(context.Background(), &r.req)
	if err == nil && len(resp.ReplicaScores) > 0 {
		if i, ok := r.byID[resp.ReplicaScores[0].ReplicaId]; ok {
			return i
		}
	}
	return leastLoaded(v)
}
