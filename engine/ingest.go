package engine

import (
	"math"
	"unsafe"

	"github.com/inferencecache/inferencecache/engine/internal/prefetch"
	"github.com/inferencecache/inferencecache/policy"
)

// IngestResult tells the producer-facing layer what an update did.
type IngestResult struct {
	// Entries is the number of (replica, key) writes applied.
	Entries int
	// Dropped counts prefix entries (or blocks) the index refused: an
	// unbalanced or malformed chain, a missing or oversized hash, a full
	// arena or replica table, an empty replica id.
	Dropped int
	// Reserved is true when the update targeted the reserved tenant through
	// Ingest (the probe); producer RPCs drop those before calling Ingest.
	Reserved bool
}

const (
	reasonCap = "cap"
	reasonTTL = "ttl"
)

// pendingMetrics tallies one write's evictions and the model counts it
// changed, so they are reported after the writer lock is released.
type pendingMetrics struct {
	index  [2][2]int // [algorithm][cap, ttl]
	tenant []tenantEvictions
	models []modelReport
	// changes and changeHashes are the write's index changes for the
	// change stream (events.go), recorded only while Engine.subs is set;
	// changeSubs is the subscription list they go to (set at unlock).
	changes      []pendingChange
	changeHashes []byte
	changeSubs   []*Subscription
}

type tenantEvictions struct {
	tenant string
	n      int
}

type modelReport struct {
	model string
	n     int64
}

func (p *pendingMetrics) addIndex(a policy.Algorithm, reason string, n int) {
	r := 0
	if reason == reasonTTL {
		r = 1
	}
	p.index[a][r] += n
}

func (p *pendingMetrics) addTenant(tenant string, n int) {
	p.tenant = append(p.tenant, tenantEvictions{tenant, n})
}

func (p *pendingMetrics) empty() bool {
	return p.index == [2][2]int{} && len(p.tenant) == 0 && len(p.models) == 0 && len(p.changes) == 0
}

// reset empties p, keeping its buffers.
func (p *pendingMetrics) reset() {
	p.index = [2][2]int{}
	clear(p.tenant)
	p.tenant = p.tenant[:0]
	clear(p.models)
	p.models = p.models[:0]
	p.resetChanges()
}

// unlockAndReport releases the writer lock and reports the write's metrics.
//
// Reports leave in write order: the writer takes reportMu before it releases
// mu, so the next writer (which needs mu first) reports after it, and a
// model's index_entries series always ends at the model's latest count. The
// tally moves to the report buffer, which only the reportMu holder touches,
// so the next writer fills a buffer no reporter is reading. A write that
// changed nothing reportable skips reportMu altogether.
//
// Both locks are released even if something panics on the way (a Metrics
// implementation, or a bug in the write it closes, when a caller recovers
// the panic: the gRPC server does): a recovered panic must not leave every
// later write blocked.
func (e *Engine) unlockAndReport() {
	locked := true
	defer func() {
		if locked {
			e.mu.Unlock()
		}
	}()
	if len(e.wrapped) >= maxWrapped {
		e.compactCapLocked()
	}
	for _, mc := range e.dirtyModels {
		e.pending.models = append(e.pending.models, modelReport{mc.model, mc.n})
		mc.dirty = false
	}
	clear(e.dirtyModels)
	e.dirtyModels = e.dirtyModels[:0]
	if e.pending.empty() {
		return
	}
	e.pending.changeSubs = e.subs
	e.reportMu.Lock()
	defer e.reportMu.Unlock()
	e.pending, e.report = e.report, e.pending
	locked = false
	e.mu.Unlock()
	p := &e.report
	defer p.reset()
	for a := range p.index {
		for r, n := range p.index[a] {
			if n > 0 {
				reason := reasonCap
				if r == 1 {
					reason = reasonTTL
				}
				e.metrics.AddIndexEvictions(policy.Algorithm(a).String(), reason, n)
			}
		}
	}
	for _, t := range p.tenant {
		e.metrics.AddTenantEvictions(t.tenant, t.n)
	}
	for _, m := range p.models {
		e.metrics.SetIndexEntries(m.model, m.n)
	}
	p.publishChanges()
}

// lockWriter takes the writer lock and adopts the current policy snapshot.
func (e *Engine) lockWriter() *policy.Snapshot {
	e.mu.Lock()
	snap := e.policies.Load()
	e.syncPolicyLocked(snap)
	return snap
}

// Ingest applies one CacheStateUpdate (contract §1.2): an additive delta.
// Chain entries expand to one key per block with cumulative token counts;
// an entry's legacy prefix_hash is written too. An entry's partition is its
// adapter, else the update's, else "". An update without a hash scheme keeps
// its stats but indexes no prefixes. After the write, the tenant's quota and
// then the global cap and byte budget are enforced. now is the server clock
// in µs, used when the update carries no timestamp.
//
// Deviation from the seed system, on purpose: an entry with no hash (or a
// chain containing an empty or over-long hash) is dropped and counted rather
// than indexed under the empty key, which a hash-less lookup would then match.
func (e *Engine) Ingest(u *Update, now int64) IngestResult {
	snap := e.lockWriter()
	defer e.unlockAndReport()
	res := e.ingestLocked(u, now)
	e.enforceLocked(snap, u.TenantID, now)
	return res
}

// enforceLocked enforces the tenant's quota, then the entry cap and the
// byte budget, after a write; the change stream names each as the reason
// of what it evicts.
func (e *Engine) enforceLocked(snap *policy.Snapshot, tenant string, now int64) {
	e.changeReason = ReasonQuota
	e.enforceQuotaLocked(snap, tenant, now)
	e.changeReason = ReasonCap
	e.enforceCapLocked(snap, now)
	e.changeReason = ""
}

// BatchItem is one write of IngestBatch: an update or an event (exactly one
// of them set), the server clock (µs) it arrived at, and, after the call, an
// update's result.
type BatchItem struct {
	Update *Update
	Event  *Event
	Now    int64
	Result IngestResult
}

// IngestBatch applies items in order, each exactly as Ingest(it.Update,
// it.Now) (write, then quota, then cap and byte budget) or
// ApplyEvent(it.Event, it.Now) would, under one hold of the writer lock,
// and sets each update's Result. A producer layer with many report streams
// and event calls queues their writes and applies them together, so
// writers hand the lock over once per batch instead of once per write.
func (e *Engine) IngestBatch(items []BatchItem) {
	snap := e.lockWriter()
	defer e.unlockAndReport()
	for i := range items {
		it := &items[i]
		if it.Update == nil {
			e.applyEventLocked(it.Event, it.Now)
			continue
		}
		it.Result = e.ingestLocked(it.Update, it.Now)
		e.enforceLocked(snap, it.Update.TenantID, it.Now)
	}
}

func (e *Engine) ingestLocked(u *Update, now int64) IngestResult {
	var res IngestResult
	res.Reserved = u.TenantID == policy.ReservedTenantID
	ts := u.TimestampUs
	if ts == 0 {
		ts = now
	}
	if u.ReplicaID == "" {
		res.Dropped = len(u.Prefixes)
		return res
	}
	hasPrefixes := u.HashScheme != "" && len(u.Prefixes) > 0
	if !hasPrefixes && u.Stats == nil {
		return res
	}
	d := e.domainLocked(u.TenantID, u.ModelID)
	r := e.replicaLocked(d, u.ReplicaID, now)
	if r == nil {
		res.Dropped = len(u.Prefixes)
		return res
	}
	if u.Placement != nil {
		r.setPlacementLocked(u.Placement)
	}
	if hasPrefixes {
		sch := e.schemeLocked(d, u.HashScheme)
		var sc, prevScope *scope
		// prevOff is the node of the previous legacy entry. Producers that
		// report one legacy entry per block (the kvevent subscriber) send a
		// chain's blocks in order, so a legacy entry whose token count grows
		// past the previous one's is linked as its successor hint. A wrong
		// link costs a failed validation, never a wrong answer.
		var prevOff uint32
		var prevTokens int32
		for i := range u.Prefixes {
			p := &u.Prefixes[i]
			adapter := p.AdapterID
			if adapter == "" {
				adapter = u.AdapterID
			}
			if sc == nil || sc.adapter != adapter {
				if sc = e.scopeLocked(d, sch, adapter, now); sc == nil {
					res.Dropped++
					prevOff = 0
					continue
				}
			}
			tier := TierFromWire(p.Tier)
			before := r.load.newHolders
			if len(p.BlockHashes) > 0 || len(p.BlockTokenCounts) > 0 {
				n, ok := e.ingestChainLocked(sc, r, p, tier, ts)
				res.Entries += n
				if n > 0 {
					r.noteStoredLocked(before, chainTokens(p.BlockTokenCounts[:n])/int32(n))
					for _, h := range p.BlockHashes[:n] {
						e.confirmStoredLocked(sch, r, h)
					}
				}
				if !ok {
					res.Dropped++
					prevOff = 0
					continue
				}
				if len(p.PrefixHash) > 0 {
					if e.ingestOneLocked(sc, r, p.PrefixHash, p.TokenCount, tier, ts) != 0 {
						res.Entries++
					} else {
						res.Dropped++
					}
				}
				prevOff = 0
				continue
			}
			off := e.ingestOneLocked(sc, r, p.PrefixHash, p.TokenCount, tier, ts)
			if off == 0 {
				res.Dropped++
				prevOff = 0
				continue
			}
			res.Entries++
			e.confirmStoredLocked(sch, r, p.PrefixHash)
			// A legacy entry's own tokens: the step from its predecessor in
			// the update, else the replica's last seen block size.
			block := r.load.blockTokens
			if prevOff != 0 && prevScope == sc && p.TokenCount > prevTokens {
				e.arena.Word(prevOff + nNext).Store(off)
				block = p.TokenCount - prevTokens
			}
			r.noteStoredLocked(before, block)
			prevOff, prevTokens, prevScope = off, p.TokenCount, sc
		}
	}
	if u.Stats != nil {
		st := &statsRecord{ReplicaStats: *u.Stats, reported: ts}
		st.HitRate = clampRate(st.HitRate)
		st.Pressure = clampRate(st.Pressure)
		r.stats.Store(st)
		r.liveness.Store(ts)
		r.announced = true
		if u.Stats.Load.Reported {
			e.applyLoadLocked(d, r, u.Stats.Load, u.HashScheme, now)
			e.updateActivationLocked(d, now)
		} else if r.load.report.Load() != nil {
			// The latest stats carry no load: the replica's load is
			// unknown from now on, not what it was.
			r.load.report.Store(nil)
			e.updateActivationLocked(d, now)
		}
	}
	if r.keys.Load() == 0 {
		e.maybeFreeReplicaLocked(d, r, now)
	}
	return res
}

// ingestChainLocked writes one chain entry. It returns how many blocks were
// written and false when the entry was refused (unbalanced, a bad hash, or
// the arena filled part-way).
func (e *Engine) ingestChainLocked(sc *scope, r *replica, p *PrefixEntry, tier Tier, ts int64) (int, bool) {
	if len(p.BlockHashes) != len(p.BlockTokenCounts) {
		return 0, false
	}
	for _, h := range p.BlockHashes {
		if _, ok := e.makeKey(h); !ok {
			return 0, false
		}
	}
	var cum int64
	var prev uint32
	var k, next key
	for j := range p.BlockHashes {
		cum += int64(p.BlockTokenCounts[j])
		if j == 0 {
			k, _ = e.makeKey(p.BlockHashes[0])
		} else {
			k = next // its table hash already computed by touchSlot
		}
		if j+1 < len(p.BlockHashes) {
			next, _ = e.makeKey(p.BlockHashes[j+1])
			e.touchSlot(sc, &next)
		}
		off := e.upsertLocked(sc, r, &k, holderWrite{rid: r.id, tokens: clampInt32(cum), tier: tier, ts: ts})
		if off == 0 {
			return j, false
		}
		if prev != 0 {
			// A plain store: the hint only nominates a node, readers validate it.
			e.arena.Word(prev + nNext).Store(off)
		}
		prev = off
	}
	return len(p.BlockHashes), true
}

// touchSlot loads the table slot where k's search starts, so that its cache
// miss (table slots are random by design) overlaps the current block's write
// instead of stalling the next one. The value is discarded; the search proper
// happens in upsertLocked, which reuses the table hash cached in k.
func (e *Engine) touchSlot(sc *scope, k *key) {
	t := sc.table.Load()
	prefetch.Line(unsafe.Pointer(&t.slots[t.home(slotTag(e.tableHash(k)))]))
}

// ingestOneLocked writes one legacy entry and returns its node, or 0.
func (e *Engine) ingestOneLocked(sc *scope, r *replica, h []byte, tokens int32, tier Tier, ts int64) uint32 {
	k, ok := e.makeKey(h)
	if !ok {
		return 0
	}
	return e.upsertLocked(sc, r, &k, holderWrite{rid: r.id, tokens: tokens, tier: tier, ts: ts})
}

// chainTokens sums a chain's block token counts, clamped to int32.
func chainTokens(counts []int32) int32 {
	var sum int64
	for _, c := range counts {
		sum += int64(max(c, 0))
	}
	return clampInt32(sum)
}

func clampInt32(v int64) int32 {
	return int32(max(min(v, math.MaxInt32), math.MinInt32))
}

// KnowsDomain reports whether (tenant, model) is indexed, without a lock.
// ApplyEvent for an unknown pair does nothing, so a caller batching events
// (IngestBatch) can skip them.
func (e *Engine) KnowsDomain(tenant, model string) bool {
	return e.lookupDomain(tenant, model) != nil
}

// ApplyEvent applies one CacheEvent (contract §1.2):
//   - PREFIX_EVICTED removes the replica from every key with the event's
//     tenant, model and hash, in every scheme; in the event's adapter
//     partition only, or in all partitions when the adapter is empty.
//   - ALL_CLEARED removes the replica from every key of (tenant, model) and
//     drops its stats.
//   - REPLICA_UPDATED refreshes the stats liveness only.
//   - PREFIX_ADDED and unknown types do nothing.
func (e *Engine) ApplyEvent(ev *Event, now int64) {
	switch ev.Type {
	case EventPrefixEvicted, EventAllCleared, EventReplicaUpdated:
	default:
		return
	}
	if e.lookupDomain(ev.TenantID, ev.ModelID) == nil {
		return // unknown pair: no lock needed
	}
	e.lockWriter()
	defer e.unlockAndReport()
	e.applyEventLocked(ev, now)
}

// applyEventLocked is ApplyEvent under the writer lock.
func (e *Engine) applyEventLocked(ev *Event, now int64) {
	switch ev.Type {
	case EventPrefixEvicted, EventAllCleared, EventReplicaUpdated:
	default:
		return
	}
	// Looked up again under the lock: the sweep may have reclaimed the
	// domain meanwhile, and a writer never writes into a reclaimed domain.
	d := e.lookupDomain(ev.TenantID, ev.ModelID)
	if d == nil {
		return
	}
	id, ok := d.byName[ev.ReplicaID]
	if !ok {
		return
	}
	r := d.replicaSlots()[id]
	ts := ev.TimestampUs
	if ts == 0 {
		ts = now
	}
	e.changeReason = ReasonEngine
	defer func() { e.changeReason = "" }()
	switch ev.Type {
	case EventReplicaUpdated:
		if r.stats.Load() != nil {
			r.liveness.Store(ts)
		}
	case EventPrefixEvicted:
		k, ok := e.makeKey(ev.PrefixHash)
		if !ok {
			return
		}
		for _, sc := range e.scopesOf(d) {
			if ev.AdapterID != "" && sc.adapter != ev.AdapterID {
				continue
			}
			off, _ := e.findLocked(sc.table.Load(), sc.id, &k)
			if off == 0 {
				continue
			}
			meta := e.w(off + nMeta)
			if idx, found := e.findHolder(e.w(off+nHolders), metaCount(meta), id); found {
				e.removeHolderLocked(sc, off, idx, now)
			}
		}
	case EventAllCleared:
		e.clearReplicaLocked(d, r, now)
	}
}

// clearReplicaLocked removes replica r from every key of its domain and
// drops its stats. It scans the domain's keys: ALL_CLEARED is rare (an
// engine restart or cache reset), so the index keeps no per-replica key list.
func (e *Engine) clearReplicaLocked(d *domain, r *replica, now int64) {
	if e.subs != nil && (r.keys.Load() > 0 || r.stats.Load() != nil) {
		// One ALL_CLEARED for the replica instead of one eviction per key.
		e.recordReplicaLocked(EventAllCleared, ReasonEngine, d, r, now)
		e.clearing = true
		defer func() { e.clearing = false }()
	}
	r.stats.Store(nil)
	r.load.report.Store(nil)
	for _, sc := range e.scopesOf(d) {
		if r.keys.Load() == 0 {
			break
		}
		if len(r.schemeKeys) <= sc.sch.index || r.schemeKeys[sc.sch.index] == 0 {
			continue
		}
		var victims []uint32
		e.forEachNodeLocked(sc, func(off uint32) {
			meta := e.w(off + nMeta)
			if _, found := e.findHolder(e.w(off+nHolders), metaCount(meta), r.id); found {
				victims = append(victims, off)
			}
		})
		for _, off := range victims {
			meta := e.w(off + nMeta)
			if idx, found := e.findHolder(e.w(off+nHolders), metaCount(meta), r.id); found {
				e.removeHolderLocked(sc, off, idx, now)
			}
		}
	}
	e.maybeFreeReplicaLocked(d, r, now)
}
