package rpc

import (
	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/internal/ratelog"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Reasons a producer report is dropped (the reason label of
// inferencecache_dropped_reports_total). A report is one prefix entry of a
// CacheStateUpdate (a chain entry counts once, however many blocks), one
// update's stats, or one CacheEvent. Reports for the reserved tenant and
// documented no-ops (PREFIX_ADDED, an eviction of a key the replica does not
// hold) are not drops.
const (
	// DropOversizedID: the message has an id over MaxIDBytes and is refused
	// whole (every report in it, at least one).
	DropOversizedID = "oversized_id"
	// DropMissingReplicaID: an update without replica_id (its prefixes and
	// stats), or an eviction, clear or liveness event without one.
	DropMissingReplicaID = "missing_replica_id"
	// DropMissingHashScheme: an update without hash_scheme keeps its stats
	// and drops its prefixes (contract §1.1).
	DropMissingHashScheme = "missing_hash_scheme"
	// DropMalformedChain: a chain entry whose block_hashes and
	// block_token_counts differ in length.
	DropMalformedChain = "malformed_chain"
	// DropInvalidHash: an empty hash or one over engine.MaxHashBytes (a
	// chain block, a legacy prefix_hash, or a PREFIX_EVICTED event's).
	DropInvalidHash = "invalid_hash"
	// DropIndexFull: the index refused a well-formed entry for capacity: its
	// (tenant, model) already has engine.MaxReplicasPerModel replicas, or
	// the arena is full.
	DropIndexFull = "index_full"
	// DropUnknownEventType: a CacheEvent of TYPE_UNSPECIFIED or a type the
	// contract does not define.
	DropUnknownEventType = "unknown_event_type"
)

// DropReasons lists every reason, for exporting each series from the start.
var DropReasons = []string{
	DropOversizedID, DropMissingReplicaID, DropMissingHashScheme, DropMalformedChain,
	DropInvalidHash, DropIndexFull, DropUnknownEventType,
}

// DropObserver counts dropped producer reports by reason (one of
// DropReasons); servermetrics.Metrics implements it. It is called
// concurrently and must not block.
type DropObserver interface {
	AddDroppedReports(reason string, n int)
}

type nopDrops struct{}

func (nopDrops) AddDroppedReports(string, int) {}

// dropReason indexes a dropTally; dropNone means "not dropped".
type dropReason uint8

const (
	dropNone dropReason = iota
	dropOversizedID
	dropMissingReplicaID
	dropMissingHashScheme
	dropMalformedChain
	dropInvalidHash
	dropIndexFull
	dropUnknownEventType
	numDropReasons
)

var dropReasonNames = [numDropReasons]string{
	dropOversizedID:       DropOversizedID,
	dropMissingReplicaID:  DropMissingReplicaID,
	dropMissingHashScheme: DropMissingHashScheme,
	dropMalformedChain:    DropMalformedChain,
	dropInvalidHash:       DropInvalidHash,
	dropIndexFull:         DropIndexFull,
	dropUnknownEventType:  DropUnknownEventType,
}

// dropTally counts one message's dropped reports by reason.
type dropTally [numDropReasons]int

// updateReports is the number of reports in an update: its prefix entries
// and its stats.
func updateReports(m *pb.CacheStateUpdate) int {
	n := len(m.GetPrefixes())
	if m.GetStats() != nil {
		n++
	}
	return n
}

// updateDrops attributes what the index did not apply of u to reasons. The
// index reports only how many entries it refused (res.Dropped); the entries
// it would refuse as malformed are recognized here from the message, and the
// rest of res.Dropped was refused for capacity. The per-entry scan runs only
// when something was dropped.
func updateDrops(u *engine.Update, res engine.IngestResult) (t dropTally) {
	switch {
	case u.ReplicaID == "":
		t[dropMissingReplicaID] = len(u.Prefixes)
		if u.Stats != nil {
			t[dropMissingReplicaID]++
		}
		return t
	case u.HashScheme == "":
		t[dropMissingHashScheme] = len(u.Prefixes)
		return t
	case res.Dropped <= 0:
		return t
	}
	left := res.Dropped
	for i := 0; i < len(u.Prefixes) && left > 0; i++ {
		if r := entryDropReason(&u.Prefixes[i]); r != dropNone {
			t[r]++
			left--
		}
	}
	t[dropIndexFull] += left
	return t
}

// entryDropReason is the reason the index refuses (part of) a prefix entry
// as malformed, or dropNone: a chain with unbalanced arrays, then any bad
// hash of the chain or of its legacy prefix_hash. A chain entry with a bad
// legacy hash keeps the chain and loses the legacy key; that counts once.
func entryDropReason(p *engine.PrefixEntry) dropReason {
	if len(p.BlockHashes) > 0 || len(p.BlockTokenCounts) > 0 {
		if len(p.BlockHashes) != len(p.BlockTokenCounts) {
			return dropMalformedChain
		}
		for _, h := range p.BlockHashes {
			if !validHash(h) {
				return dropInvalidHash
			}
		}
		if len(p.PrefixHash) > 0 && !validHash(p.PrefixHash) {
			return dropInvalidHash
		}
		return dropNone
	}
	if !validHash(p.PrefixHash) {
		return dropInvalidHash
	}
	return dropNone
}

// validHash is the index's notion of a storable hash.
func validHash(h []byte) bool { return len(h) > 0 && len(h) <= engine.MaxHashBytes }

// eventDrop is the reason the index cannot apply ev, or dropNone.
func eventDrop(ev *pb.CacheEvent) dropReason {
	switch ev.GetType() {
	case pb.CacheEvent_PREFIX_ADDED:
		return dropNone
	case pb.CacheEvent_PREFIX_EVICTED:
		if ev.GetReplicaId() == "" {
			return dropMissingReplicaID
		}
		if !validHash(ev.GetPrefixHash()) {
			return dropInvalidHash
		}
		return dropNone
	case pb.CacheEvent_REPLICA_UPDATED, pb.CacheEvent_ALL_CLEARED:
		if ev.GetReplicaId() == "" {
			return dropMissingReplicaID
		}
		return dropNone
	default:
		return dropUnknownEventType
	}
}

// maxLoggedIDBytes bounds each id quoted in the drop log line.
const maxLoggedIDBytes = 128

// dropped counts t's drops and logs at most one WARN a minute (the first
// drop after a quiet minute, with the reason, the message's ids and the
// running total).
func (s *Service) dropped(t *dropTally, tenant, model, replica string) {
	var n int
	first := dropNone
	for r := dropReason(1); r < numDropReasons; r++ {
		if t[r] > 0 {
			s.drops.AddDroppedReports(dropReasonNames[r], t[r])
			n += t[r]
			if first == dropNone {
				first = r
			}
		}
	}
	if n == 0 {
		return
	}
	total := s.droppedReports.Add(int64(n))
	// Allow before building the line: a flood of bad reports costs an
	// atomic add each, not the line's arguments.
	if held, ok := s.dropLog.Allow(); ok {
		s.log.Warn("producer reports dropped (logged at most once a minute; see inferencecache_dropped_reports_total)",
			"reason", dropReasonNames[first], "reports", n, "tenant", clip(tenant), "model", clip(model), "replica", clip(replica),
			"total", total, ratelog.SuppressedKey, held)
	}
}

// clip bounds an id for logging.
func clip(s string) string {
	if len(s) > maxLoggedIDBytes {
		return s[:maxLoggedIDBytes] + "..."
	}
	return s
}

// droppedUpdate counts an update refused whole for an oversized id: every
// report in it, at least one.
func (s *Service) droppedUpdate(m *pb.CacheStateUpdate) {
	var t dropTally
	t[dropOversizedID] = max(1, updateReports(m))
	s.dropped(&t, m.GetTenantId(), m.GetModelId(), m.GetReplicaId())
}

// droppedEvent counts one event dropped for reason r.
func (s *Service) droppedEvent(ev *pb.CacheEvent, r dropReason) {
	var t dropTally
	t[r] = 1
	s.dropped(&t, ev.GetTenantId(), ev.GetModelId(), ev.GetReplicaId())
}
