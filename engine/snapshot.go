package engine

import (
	"cmp"
	"slices"
	"time"

	"github.com/inferencecache/inferencecache/controlapi"
)

// Snapshot builds the /snapshot aggregate (contract §4.2) without stopping
// writers: it reads counters and stats atomically, so under concurrent
// ingest it is a near-instant view rather than a transaction. Rows are keyed
// by (tenant, replica id) across models; the reserved tenant is excluded;
// TotalPrefixes is the sum of the tenant rows, so the sum identity holds by
// construction.
func (e *Engine) Snapshot() controlapi.CacheSnapshot {
	type rowKey struct{ tenant, replica string }
	rows := map[rowKey]*controlapi.ReplicaSnapshot{}
	reported := map[rowKey]int64{}
	loadAt := map[rowKey]int64{}
	now := time.Now().UnixMicro()
	tenants := map[string]*controlapi.TenantSnapshot{}
	e.domains.Range(func(_ domainKey, d *domain) bool {
		if d.reserved {
			return true
		}
		t := tenants[d.tenant]
		if t == nil {
			t = &controlapi.TenantSnapshot{TenantID: d.tenant}
			tenants[d.tenant] = t
		}
		t.IndexEntries += d.keys.Load()
		for _, r := range d.replicaSlots() {
			if r == nil {
				continue
			}
			keys, st := r.keys.Load(), r.stats.Load()
			if keys == 0 && st == nil {
				continue
			}
			k := rowKey{d.tenant, r.name}
			row := rows[k]
			if row == nil {
				row = &controlapi.ReplicaSnapshot{ReplicaID: r.name, Tenant: d.tenant}
				rows[k] = row
			}
			row.PrefixCount += keys
			if n := r.newest.Load(); keys > 0 && n != 0 {
				at := time.UnixMicro(n).UTC()
				if at.After(row.LastEventAt) {
					row.LastEventAt = at
				}
			}
			// Stats are per (tenant, model, replica); a replica serving
			// several models shows its most recently reported payload.
			if st != nil && (!row.StatsReported || st.reported > reported[k]) {
				reported[k] = st.reported
				row.StatsReported = true
				row.CacheMemoryBytes = st.CacheMemoryBytes
				row.HitRate = st.HitRate
				row.Pressure = st.Pressure
				row.T2HitTokens = st.T2HitTokens
				row.T2QueryTokens = st.T2QueryTokens
				row.LastUpdate = time.UnixMicro(r.liveness.Load()).UTC()
			}
			if rec := r.load.report.Load(); rec != nil && (row.Load == nil || rec.at > loadAt[k]) {
				loadAt[k] = rec.at
				row.Load = snapshotLoad(d.model, rec, r, meanRequestTokens(d.replicaSlots()), now, e.load.MaxAge.Microseconds())
			}
		}
		return true
	})
	var out controlapi.CacheSnapshot
	out.Replicas = make([]controlapi.ReplicaSnapshot, 0, len(rows))
	for _, r := range rows {
		out.Replicas = append(out.Replicas, *r)
	}
	slices.SortFunc(out.Replicas, func(a, b controlapi.ReplicaSnapshot) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.ReplicaID, b.ReplicaID))
	})
	sums := map[string]float64{}
	counts := map[string]int{}
	for _, r := range out.Replicas {
		if r.StatsReported {
			sums[r.Tenant] += float64(r.HitRate)
			counts[r.Tenant]++
		}
	}
	out.Tenants = make([]controlapi.TenantSnapshot, 0, len(tenants))
	for id, t := range tenants {
		if n := counts[id]; n > 0 {
			t.HitRate = float32(sums[id] / float64(n))
			t.HitRateReported = true
		}
		if t.IndexEntries == 0 && counts[id] == 0 {
			continue
		}
		out.Tenants = append(out.Tenants, *t)
		out.TotalPrefixes += t.IndexEntries
	}
	slices.SortFunc(out.Tenants, func(a, b controlapi.TenantSnapshot) int { return cmp.Compare(a.TenantID, b.TenantID) })
	return out
}

// ReplicaStatsView is one replica's stats as GetCacheState reports them.
type ReplicaStatsView struct {
	ReplicaID string
	ReplicaStats
}

// ModelState returns the stats of the replicas of (tenant, model) that
// reported stats, sorted by replica id, and the model's distinct key count.
func (e *Engine) ModelState(tenant, model string) (replicas []ReplicaStatsView, keys int64) {
	d := e.lookupDomain(tenant, model)
	if d == nil {
		return nil, 0
	}
	for _, r := range d.replicaSlots() {
		if r == nil {
			continue
		}
		if st := r.stats.Load(); st != nil {
			replicas = append(replicas, ReplicaStatsView{ReplicaID: r.name, ReplicaStats: st.ReplicaStats})
		}
	}
	slices.SortFunc(replicas, func(a, b ReplicaStatsView) int { return cmp.Compare(a.ReplicaID, b.ReplicaID) })
	return replicas, d.keys.Load()
}

// snapshotLoad is a replica's load row for /snapshot.
func snapshotLoad(model string, rec *loadRecord, r *replica, per float64, now, maxAge int64) *controlapi.ReplicaLoad {
	if maxAge <= 0 {
		maxAge = DefaultLoadMaxAge.Microseconds()
	}
	l := &controlapi.ReplicaLoad{
		Model:                model,
		WaitingRequests:      rec.Waiting,
		RunningRequests:      rec.Running,
		RoutedSinceReport:    r.load.routedReqs.Load(),
		InFlightRequests:     r.load.inFlight(rec),
		EstimatedQueueTokens: rec.estimate(r, per),
		ReportedAt:           time.UnixMicro(rec.at).UTC(),
		Fresh:                now-rec.at < maxAge,
	}
	if rec.QueuedTokens >= 0 {
		q := rec.QueuedTokens
		l.QueuedPrefillTokens = &q
	}
	return l
}
