package rpc

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// ReportCacheState ingests a client stream of additive CacheStateUpdate
// deltas (contract §1.2) and answers one Ack{accepted: true} when the client
// half-closes. Updates for the reserved probe tenant are dropped silently.
// Malformed content (unbalanced chains, empty or oversized hashes, NaN
// stats, unknown tiers) is the index's to drop or normalize; it never fails
// the stream. What the index does not apply is counted by reason (see
// DropReasons) and logged at most once a minute. A message that does not
// decode ends the call with InvalidArgument (the updates before it are
// applied); another receive error than the half-close ends it with that
// error.
//
// An update with an id over MaxIDBytes is refused whole; the stream goes
// on, and its end is answered InvalidArgument naming the first such field
// instead of the Ack.
//
// The stream reuses one message and one engine.Update (with its prefix
// slice) for all its updates: the index copies what it keeps. When the
// index can batch (engine.IngestBatch), each update waits in the ingest
// batcher (batch.go) and is applied together with what other streams and
// PublishEvent calls queued meanwhile, still in this stream's order.
//
// A timestamp_us beyond now + MaxClockSkew is clamped to it (counted), so a
// bad producer clock cannot make entries outlive the TTL. The response
// header carries the server's instance id (InstanceIDHeader).
func (s *Service) ReportCacheState(stream pb.InferenceCache_ReportCacheStateServer) error {
	var msg pb.CacheStateUpdate
	return s.reportCacheState(stream, &msg, &msg, stream.SendAndClose)
}

// reportCacheState is ReportCacheState receiving every update into recv,
// whose message is msg (recv is msg itself, or the codec's reused updateMsg
// around it), and answering with ack.
func (s *Service) reportCacheState(stream grpc.ServerStream, recv any, msg *pb.CacheStateUpdate, ack func(*pb.Ack) error) error {
	var (
		cv updateConverter
		// firstBad is the first refused update's oversized id; refused
		// counts the refused updates.
		firstBad oversizedID
		refused  int
		// req is this stream's slot in the ingest batcher.
		req *ingestReq
	)
	if s.instanceMD != nil {
		// Sent with the Ack (or the error status); a failure means the
		// stream is already gone, which RecvMsg reports below.
		_ = stream.SetHeader(s.instanceMD)
	}
	for {
		if err := stream.RecvMsg(recv); err != nil {
			if errors.Is(err, io.EOF) {
				if refused > 0 {
					return firstBad.err("updates with an oversized id", refused)
				}
				return ack(&pb.Ack{Accepted: true})
			}
			return err
		}
		if err := decodeError(recv); err != nil {
			return err
		}
		if msg.GetTenantId() == policy.ReservedTenantID {
			continue
		}
		if o := updateOversizedID(msg); o.found() {
			if refused++; refused == 1 {
				firstBad = o
			}
			s.droppedUpdate(msg)
			continue
		}
		now := s.now().UnixMicro()
		u := cv.convert(msg)
		u.TimestampUs = s.clampTimestamp(u.TimestampUs, now, "ReportCacheState")
		var res engine.IngestResult
		if s.batcher != nil {
			if req == nil {
				req = newIngestReq()
			}
			req.u, req.now = u, now
			s.batcher.ingest(req)
			res, req.u = req.res, nil
		} else {
			res = s.index.Ingest(u, now)
		}
		if res.Dropped > 0 || u.ReplicaID == "" || (u.HashScheme == "" && len(u.Prefixes) > 0) {
			t := updateDrops(u, res)
			s.dropped(&t, u.TenantID, u.ModelID, u.ReplicaID)
		}
	}
}

// clampTimestamp returns ts, or now + the allowed skew when ts lies beyond
// it (counted for rpc). 0 ("now") and past timestamps pass unchanged.
func (s *Service) clampTimestamp(ts, now int64, rpc string) int64 {
	if limit := now + s.skewUS; ts > limit {
		s.producer.TimestampClamped(rpc)
		return limit
	}
	return ts
}

// updateConverter turns CacheStateUpdates into engine.Updates, reusing its
// memory between calls. The result aliases the message's slices and is valid
// until the next convert.
type updateConverter struct {
	u         engine.Update
	prefixes  []engine.PrefixEntry
	stats     engine.ReplicaStats
	placement engine.Placement
}

// roleFromWire maps a ReplicaRole; UNSPECIFIED and values this server does
// not know keep what the index knows (engine.RoleUnknown).
func roleFromWire(r pb.ReplicaRole) engine.Role {
	switch r {
	case pb.ReplicaRole_REPLICA_ROLE_BOTH:
		return engine.RoleBoth
	case pb.ReplicaRole_REPLICA_ROLE_PREFILL:
		return engine.RolePrefill
	case pb.ReplicaRole_REPLICA_ROLE_DECODE:
		return engine.RoleDecode
	}
	return engine.RoleUnknown
}

func (c *updateConverter) convert(m *pb.CacheStateUpdate) *engine.Update {
	clear(c.prefixes) // drop the previous message's references
	ps := c.prefixes[:0]
	for _, p := range m.GetPrefixes() {
		ps = append(ps, engine.PrefixEntry{
			PrefixHash:       p.GetPrefixHash(),
			TokenCount:       p.GetTokenCount(),
			BlockHashes:      p.GetBlockHashes(),
			BlockTokenCounts: p.GetBlockTokenCounts(),
			Tier:             int32(p.GetTier()),
			AdapterID:        p.GetAdapterId(),
		})
	}
	c.prefixes = ps
	c.u = engine.Update{
		// The top-level replica id is the index key; stats.replica_id is
		// not trusted for identity.
		ReplicaID:   m.GetReplicaId(),
		ModelID:     m.GetModelId(),
		TenantID:    m.GetTenantId(),
		HashScheme:  m.GetHashScheme(),
		TimestampUs: m.GetTimestampUs(),
		Prefixes:    ps,
		AdapterID:   m.GetAdapterId(),
	}
	if m.GetRole() != pb.ReplicaRole_REPLICA_ROLE_UNSPECIFIED || m.GetPdPool() != "" || m.GetNodeName() != "" || m.GetZone() != "" {
		// A report that places the replica (docs/pd.md).
		c.placement = engine.Placement{Role: roleFromWire(m.GetRole()), Pool: m.GetPdPool(), Node: m.GetNodeName(), Zone: m.GetZone()}
		c.u.Placement = &c.placement
	}
	if st := m.GetStats(); st != nil {
		// client_version is accepted and not stored; the index clamps
		// non-finite rates to 0.
		c.stats = engine.ReplicaStats{
			CacheMemoryBytes: st.GetCacheMemoryBytes(),
			HitRate:          st.GetHitRate(),
			Pressure:         st.GetPressure(),
			T2HitTokens:      st.GetT2HitTokens(),
			T2QueryTokens:    st.GetT2QueryTokens(),
		}
		if st.WaitingRequests != nil || st.RunningRequests != nil {
			c.stats.Load = engine.LoadStats{Reported: true, Waiting: st.GetWaitingRequests(), Running: st.GetRunningRequests(), QueuedTokens: -1}
			if st.QueuedPrefillTokens != nil && st.GetQueuedPrefillTokens() >= 0 {
				// A negative figure is no figure: unknown, not an idle queue.
				c.stats.Load.QueuedTokens = st.GetQueuedPrefillTokens()
			}
		}
		c.u.Stats = &c.stats
	}
	return &c.u
}

// PublishEvent applies one CacheEvent (contract §1.2) and answers
// Ack{accepted: true}. Events for the reserved probe tenant are acknowledged
// and not applied; PREFIX_ADDED is a no-op. Events the index cannot apply
// (an unknown type, a missing replica id, a bad hash) are acknowledged and
// counted as dropped. An event with an id over MaxIDBytes is refused with
// InvalidArgument. Timestamps are clamped as in ReportCacheState; the
// response header carries the instance id.
func (s *Service) PublishEvent(ctx context.Context, ev *pb.CacheEvent) (*pb.Ack, error) {
	if s.instanceMD != nil {
		// Fails only outside a gRPC call (a direct call in a test).
		_ = grpc.SetHeader(ctx, s.instanceMD)
	}
	if ev.GetTenantId() == policy.ReservedTenantID {
		return &pb.Ack{Accepted: true}, nil // as ReportCacheState: before any check
	}
	if o := eventOversizedID(ev); o.found() {
		s.droppedEvent(ev, dropOversizedID)
		return nil, o.err("event with an oversized id", 1)
	}
	if r := eventDrop(ev); r != dropNone {
		// The index would ignore it; count it instead.
		s.droppedEvent(ev, r)
		return &pb.Ack{Accepted: true}, nil
	}
	now := s.now().UnixMicro()
	e := &engine.Event{
		Type:        engine.EventType(ev.GetType()),
		ReplicaID:   ev.GetReplicaId(),
		ModelID:     ev.GetModelId(),
		TenantID:    ev.GetTenantId(),
		PrefixHash:  ev.GetPrefixHash(),
		TimestampUs: s.clampTimestamp(ev.GetTimestampUs(), now, "PublishEvent"),
		AdapterID:   ev.GetAdapterId(),
	}
	if s.batcher != nil && s.batcher.idx.KnowsDomain(e.TenantID, e.ModelID) {
		// Batched with the report streams' updates (an event for a pair
		// the index does not know is a no-op: no need to queue it).
		req := eventReqs.Get().(*ingestReq)
		req.ev, req.now = e, now
		s.batcher.ingest(req)
		req.ev = nil
		eventReqs.Put(req)
	} else {
		s.index.ApplyEvent(e, now)
	}
	return &pb.Ack{Accepted: true}, nil
}

// GetCacheState reports the stats of the (tenant, model)'s replicas that
// reported stats, sorted by replica id, and the summary: total_prefixes is
// the (tenant, model)'s distinct key count (as the seed system counts it:
// every key, across schemes and adapters, swept or not yet), hot_prefixes
// always 0. The reserved tenant reads as empty. A tenant or model id over
// MaxIDBytes is refused with InvalidArgument (the id rule, limits.go).
func (s *Service) GetCacheState(_ context.Context, req *pb.GetCacheStateRequest) (*pb.GetCacheStateResponse, error) {
	if o := stateRequestOversizedID(req); o.found() {
		return nil, o.refuse("GetCacheStateRequest")
	}
	if req.GetTenantId() == policy.ReservedTenantID {
		return &pb.GetCacheStateResponse{Summary: &pb.CacheSummary{}}, nil
	}
	views, keys := s.index.ModelState(req.GetTenantId(), req.GetModelId())
	resp := &pb.GetCacheStateResponse{Summary: &pb.CacheSummary{TotalPrefixes: keys}}
	if len(views) > 0 {
		resp.Replicas = make([]*pb.ReplicaStats, len(views))
		vals := make([]pb.ReplicaStats, len(views))
		for i := range views {
			v := &vals[i]
			v.ReplicaId = views[i].ReplicaID
			v.CacheMemoryBytes = views[i].CacheMemoryBytes
			v.HitRate = views[i].HitRate
			v.Pressure = views[i].Pressure
			v.T2HitTokens = views[i].T2HitTokens
			v.T2QueryTokens = views[i].T2QueryTokens
			resp.Replicas[i] = v
		}
	}
	return resp, nil
}
