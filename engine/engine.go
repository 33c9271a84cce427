// Package engine is the in-memory cache index: which engine replica holds
// which KV-block key per (tenant, model, hash scheme, adapter), and the
// ranker that answers LookupRoute from it (contract §1.2, §1.3, §2.2 step 8,
// §3, §6).
//
// Shape. Keys live in an offset-addressed arena (package arena) as fixed
// nodes with a holder block each, found through one open-addressing hash
// table per scope and, along a chain, through successor hints, so a chain
// walk mostly follows adjacent memory. Nothing in the arena is a Go
// pointer, so the collector never scans the index however large it grows.
// Scopes, replica ids, stats and serving sets hang off small Go structures
// read through lock-free maps (xsync) and atomic pointers to immutable
// slices that writers replace (copy-on-write).
//
// Concurrency. Readers (LookupRoute, AffinityHint, Snapshot, the stats
// views) take no lock and allocate nothing on the lookup path; they read
// nodes under a per-node sequence lock (see node.go). All writers (Ingest,
// ApplyEvent, Sweep, Credit is a reader) serialize on Engine.mu: ingest is a
// single-writer pipeline, which keeps eviction exact and cheap. The decision
// core takes `now` from the caller, so it is deterministic in tests.
package engine

import (
	"crypto/rand"
	"encoding/binary"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/inferencecache/inferencecache/arena"
	"github.com/inferencecache/inferencecache/policy"
)

// Config configures an Engine. The zero Config is an unbounded index with
// default policy and ranking.
type Config struct {
	// MaxEntries caps replica×key storage entries (reserved tenant
	// excluded); 0 means unbounded. The server's default is DefaultMaxEntries.
	MaxEntries int64
	// MaxBytes caps the index memory that evicting entries gives back
	// (arena live bytes, tables, queues: MemoryStats.IndexBytes); 0 means
	// no byte budget. Over budget, entries are evicted exactly as at the
	// entry cap. Go-side bookkeeping (MemoryStats.OverheadBytes) is not
	// budgeted: eviction cannot free it; the sweep reclaims it once empty.
	MaxBytes int64
	// Policies supplies per-tenant TTL, eviction algorithm and quota; nil
	// means every tenant has the defaults.
	Policies Policies
	// Metrics receives eviction and entry counts; nil discards them.
	Metrics Metrics
	// Ranker overrides the score knobs; the zero value means DefaultRanker.
	Ranker *RankerConfig
	// Load configures load-aware routing; the zero value disables it
	// (every answer is the contract's).
	Load LoadConfig
}

// domainKey names a (tenant, model) pair.
type domainKey struct{ tenant, model string }

// Engine is the cache index. Create it with New; it is safe for concurrent
// use by any number of goroutines.
type Engine struct {
	cfg    Config
	ranker RankerConfig
	// load is the normalized Config.Load (immutable).
	load LoadConfig
	// expect is the routing-time entries (expect.go): fixed at New,
	// lock-free.
	expect   expectTable
	policies Policies
	metrics  Metrics
	// seed salts table hashes per process.
	seed uint64

	// arena holds nodes, holder blocks and long hash bytes. Allocation and
	// freeing happen under mu; reads are lock-free (see node.go).
	arena arena.Arena

	// domains maps (tenant, model) to its state; xsync makes the read
	// lock-free. Entries are added under mu and removed under mu by the
	// sweep once empty (maybeReclaimDomainLocked). A reader may still hold a
	// removed *domain: it stays valid Go memory, empty, and no writer
	// touches it again (a later write to the same pair gets a new domain).
	domains *xsync.MapOf[domainKey, *domain]
	// tenants maps a tenant id to its counters; added under mu, removed
	// under mu with the tenant's last domain.
	tenants *xsync.MapOf[string, *tenantState]

	// totalKeys counts distinct keys outside the reserved tenant; written
	// under mu, read by lookups for the cold-start check.
	totalKeys atomic.Int64
	// totalEntries and reservedEntries count storage entries (replica×key)
	// outside and inside the reserved tenant; written under mu.
	totalEntries, reservedEntries atomic.Int64

	// reportMu orders metric reports: a writer takes it before releasing mu
	// and holds it while it calls Metrics, so reports leave in write order.
	// It guards report, the tally being reported. Lock order: mu, then
	// reportMu; Metrics implementations must not call back into the Engine.
	reportMu sync.Mutex
	report   pendingMetrics

	// mu serializes every writer. It guards everything below and all arena
	// writes, table writes, scope/replica registration and the queues.
	mu sync.Mutex
	// scopes is indexed by scope slot (scopeSlot of a node's word 7); a nil
	// entry is a free slot. freeSlots lists released slots, oldest first,
	// each with the generation its next scope gets and when it may be
	// reused (see "Scope ids" below).
	scopes    []*scope
	freeSlots []freeSlot
	// The cap queue orders storage entries for cap and byte-budget
	// eviction: one capQueue per tenant (tenantState.capq), its totals in
	// capAcct. It is kept only once capOn is set (see enforceCapLocked): an
	// engine with no cap or budget, or far below them, spends no memory on
	// it. capHeap orders the tenants whose queue holds records and that may
	// be over their fair share, by their queue's minimum key; spared holds
	// the tenants found at or under it (a max-heap by entries); see
	// evictCapOneLocked.
	capAcct queueAcct
	capOn   bool
	capHeap []*tenantState
	spared  []*tenantState
	// activeTenants counts the tenants holding at least one storage entry,
	// the reserved tenant excluded (the fair share's divisor).
	activeTenants int
	// quotas holds the per-tenant quota queues of tenants with a quota.
	quotas map[string]*quotaQueue
	// snap is the policy snapshot the writer last adopted (syncPolicyLocked).
	snap *policy.Snapshot
	// modelKeys counts distinct keys per model (reserved tenant excluded);
	// an entry lives while some domain of the model does. dirtyModels lists
	// the counters changed during the current write.
	modelKeys   map[string]*modelCount
	dirtyModels []*modelCount
	// pending tallies the current write's evictions and changed model
	// counts, reported after unlock (unlockAndReport).
	pending pendingMetrics
	// tableBytes is the memory of all live scopes' tables.
	tableBytes int64
	// sortScratch is the writer's scratch for sorting eviction buckets;
	// sortHashes holds the hash bytes its records point into, so sorting a
	// bucket allocates nothing in steady state (writer only, under mu).
	sortScratch []sortRec
	sortHashes  []byte
	// wrapped lists freed nodes parked by a wrap of their gen's low 16
	// bits until the cap queue has no record of them (see capRec).
	wrapped []uint32
	// subs lists the open change subscriptions (events.go), nil when
	// there are none: the one test a write makes for the change stream.
	// Replaced copy-on-write, so a write's tally can keep the list.
	subs []*Subscription
	// changeReason is the reason the current write removes entries for
	// (ReasonEngine, ReasonCap, ...); clearing is set while a producer's
	// ALL_CLEARED removes a replica's keys, which the change stream
	// reports as one change.
	changeReason string
	clearing     bool
}

// modelCount is the distinct-key count of one model (writer only).
type modelCount struct {
	model string
	n     int64
	dirty bool
	// domains counts the live domains of the model.
	domains int
}

// Scope ids. A node's word 7 names its scope by an id that packs a slot of
// Engine.scopes (low scopeSlotBits bits, never 0) and the slot's generation.
// Readers compare the word with the id of the scope they hold, lock-free;
// a reader may hold a scope the sweep has since reclaimed, so an id must
// not come back while such a reader could still be running, or the reader
// would validate a node of another (tenant, model, scheme, adapter) that
// happens to hold the hash it looks for. A released slot therefore waits
// scopeQuarantineUs (as replica ids do) and is reused oldest first, and its
// generation advances, so an id recurs only after 2^10 reuses of one slot,
// each at least the quarantine apart. The writer's own lookups by id (cap
// and quota records) only ever start from a live node, whose scope is live.
const (
	scopeSlotBits     = 22
	scopeSlotMask     = 1<<scopeSlotBits - 1
	scopeGenMask      = 1<<(32-scopeSlotBits) - 1
	scopeQuarantineUs = replicaQuarantineUs
)

type freeSlot struct {
	slot, gen uint32
	after     int64 // reusable once the writer's clock passes this (µs)
}

func scopeSlot(id uint32) uint32 { return id & scopeSlotMask }

// domain is one (tenant, model).
type domain struct {
	tenant, model string
	reserved      bool
	ts            *tenantState
	mc            *modelCount
	// dead is set (under mu) when the sweep unlinks the domain; no writer
	// writes into a dead domain.
	dead bool
	// keys counts the domain's distinct keys; written under mu.
	keys atomic.Int64
	// replicas is the replica table; replaced copy-on-write under mu.
	replicas atomic.Pointer[replicaTable]
	// schemes lists the domain's hash schemes; copy-on-write under mu.
	schemes atomic.Pointer[[]*scheme]

	// loadActive is load-aware routing's hysteresis state for the domain:
	// written under mu when a load report arrives, read by lookups.
	loadActive atomic.Bool

	// Writer state (mu).
	byName  map[string]uint16
	freeIDs []freeID
}

type freeID struct {
	id    uint16
	after int64 // reusable once the writer's clock passes this (µs)
}

// replicaQuarantineUs is how long a freed replica id waits before reuse, so
// a reader that read the id from a node just before its last entry went away
// still maps it to the right name.
const replicaQuarantineUs = 60_000_000

// replica is one replica id within a domain.
type replica struct {
	id   uint16
	name string
	// stats is the last reported stats payload, nil when none (or dropped).
	stats atomic.Pointer[statsRecord]
	// liveness is the stats lastSeen (µs): refreshed by stats reports and by
	// REPLICA_UPDATED events.
	liveness atomic.Int64
	// keys counts the keys this replica holds in the domain; newest is the
	// newest lastSeen among them (reset when keys drops to 0). Written under mu.
	keys   atomic.Int64
	newest atomic.Int64
	// schemeKeys counts keys per scheme index of the domain (writer only).
	schemeKeys []int32
	// load is the replica's load-aware routing state (load.go).
	load replicaLoad
	// placement is where the replica runs for disaggregated serving
	// (pd.go), nil until a report sets it; replaced under mu, read
	// lock-free.
	placement atomic.Pointer[Placement]
	// announced is set (under mu) once the replica held a key or stats,
	// so the change stream reports its removal (writer only).
	announced bool
}

// statsRecord is an immutable stats payload.
type statsRecord struct {
	ReplicaStats
	// reported is when the values were reported (µs).
	reported int64
}

// scheme is one hash scheme within a domain: the serving set of
// servingByScope and the scopes (one per adapter).
type scheme struct {
	name  string
	index int
	d     *domain
	// expectSeed keys this scheme's routing-time entries (expect.go).
	expectSeed uint64
	// scopes lists one scope per adapter; copy-on-write under mu.
	scopes atomic.Pointer[[]*scope]
	// serving is the immutable set of replicas holding at least one key in
	// this (tenant, model, scheme); replaced under mu when membership changes.
	serving atomic.Pointer[servingSet]
}

// servingSet lists serving replica ids ascending, and their names sorted
// ascending (the affinity ring) with each name's id alongside.
type servingSet struct {
	ids    []uint16
	names  []string
	byName []uint16
}

// servingByName sorts a serving set's names and byName together.
type servingByName struct{ s *servingSet }

func (x servingByName) Len() int           { return len(x.s.names) }
func (x servingByName) Less(i, j int) bool { return x.s.names[i] < x.s.names[j] }
func (x servingByName) Swap(i, j int) {
	x.s.names[i], x.s.names[j] = x.s.names[j], x.s.names[i]
	x.s.byName[i], x.s.byName[j] = x.s.byName[j], x.s.byName[i]
}

func (s *servingSet) has(id uint16) bool {
	lo, hi := 0, len(s.ids)
	for lo < hi {
		m := (lo + hi) / 2
		switch {
		case s.ids[m] == id:
			return true
		case s.ids[m] < id:
			lo = m + 1
		default:
			hi = m
		}
	}
	return false
}

// scope is one (tenant, model, scheme, adapter): the unit a lookup matches in.
type scope struct {
	id      uint32
	d       *domain
	sch     *scheme
	adapter string
	// dead is set (under mu) when the sweep unlinks the empty scope.
	dead bool
	// table maps keys to nodes; replaced (grown, cleaned) under mu.
	table atomic.Pointer[table]
}

// tenantState holds per-tenant counters.
type tenantState struct {
	id       string
	reserved bool
	// keys counts the tenant's distinct keys; written under mu.
	keys atomic.Int64
	// models lists the tenant's live domains (writer only).
	models []*domain
	// lfu is true while the tenant's policy evicts by LFU, and quota is
	// the tenant's quota queue while it has a quota (writer only).
	lfu   bool
	quota *quotaQueue

	// Cap eviction (writer only; see evictCapOneLocked). entries counts the
	// tenant's storage entries (0 for the reserved tenant, which is outside
	// the cap); capq is its cap queue; hidx and pidx are its positions in
	// Engine.capHeap and Engine.spared, -1 when not in them. A tenant is in
	// exactly one of them while its queue holds buckets.
	entries    int64
	capq       capQueue
	hidx, sidx int
}

// New returns an empty index.
func New(cfg Config) *Engine {
	e := &Engine{
		cfg:       cfg,
		ranker:    DefaultRanker(),
		policies:  cfg.Policies,
		metrics:   cfg.Metrics,
		domains:   xsync.NewMapOf[domainKey, *domain](),
		tenants:   xsync.NewMapOf[string, *tenantState](),
		quotas:    map[string]*quotaQueue{},
		modelKeys: map[string]*modelCount{},
	}
	if cfg.Ranker != nil {
		e.ranker = *cfg.Ranker
	}
	e.load = cfg.Load
	if e.load.Enabled {
		e.load.normalize()
		n := e.load.ExpectedBytes
		if cfg.MaxBytes > 0 {
			n = min(n, cfg.MaxBytes/8)
		}
		e.expect = newExpectTable(n)
	}
	if e.policies == nil {
		e.policies = StaticPolicies(policy.Empty())
	}
	if e.metrics == nil {
		e.metrics = nopMetrics{}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	e.seed = binary.LittleEndian.Uint64(b[:])
	// Scope slot 0 is never used, so a zero word never names a scope.
	e.scopes = append(e.scopes, nil)
	return e
}

// Ranker returns the score knobs in use.
func (e *Engine) Ranker() RankerConfig { return e.ranker }

// Policies returns the policy source the engine reads.
func (e *Engine) Policies() Policies { return e.policies }

// Counts reports the storage entries (replica×key) and distinct keys outside
// the reserved tenant.
func (e *Engine) Counts() (entries, keys int64) {
	return e.totalEntries.Load(), e.totalKeys.Load()
}

// lookupDomain returns the (tenant, model) domain or nil.
func (e *Engine) lookupDomain(tenant, model string) *domain {
	d, _ := e.domains.Load(domainKey{tenant, model})
	return d
}

// findScheme returns the domain's scheme named name, or nil.
func (d *domain) findScheme(name string) *scheme {
	if p := d.schemes.Load(); p != nil {
		for _, s := range *p {
			if s.name == name {
				return s
			}
		}
	}
	return nil
}

// findScope returns the scheme's scope for adapter, or nil.
func (s *scheme) findScope(adapter string) *scope {
	if p := s.scopes.Load(); p != nil {
		for _, sc := range *p {
			if sc.adapter == adapter {
				return sc
			}
		}
	}
	return nil
}

// replicaTable maps replica ids to replicas (a nil slot is a free id) and
// to the rank of their names in sorted order, so the ranker can order ties
// by replica id string with integer compares; byName lists the ids in that
// order, so a reader finds a replica by name without a lock (find).
// Immutable once published.
type replicaTable struct {
	slots  []*replica
	rank   []uint16
	byName []uint16
}

var emptyReplicaTable = &replicaTable{}

// table returns the domain's replica table (never nil).
func (d *domain) table() *replicaTable {
	if p := d.replicas.Load(); p != nil {
		return p
	}
	return emptyReplicaTable
}

// replicaSlots returns the domain's replicas indexed by id.
func (d *domain) replicaSlots() []*replica { return d.table().slots }

// newReplicaTable builds a table over slots, computing name ranks.
func newReplicaTable(slots []*replica) *replicaTable {
	t := &replicaTable{slots: slots, rank: make([]uint16, len(slots))}
	order := make([]*replica, 0, len(slots))
	for _, r := range slots {
		if r != nil {
			order = append(order, r)
		}
	}
	slices.SortFunc(order, func(a, b *replica) int { return strings.Compare(a.name, b.name) })
	t.byName = make([]uint16, len(order))
	for i, r := range order {
		t.rank[r.id] = uint16(i)
		t.byName[i] = r.id
	}
	return t
}

// find returns the replica named name, or nil. Lock-free, allocation-free.
func (t *replicaTable) find(name string) *replica {
	lo, hi := 0, len(t.byName)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		r := t.slots[t.byName[m]]
		switch c := strings.Compare(r.name, name); {
		case c == 0:
			return r
		case c < 0:
			lo = m + 1
		default:
			hi = m
		}
	}
	return nil
}
