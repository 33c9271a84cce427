package rpc

// The id rule (docs/wire.md, "Ids over 1024 bytes"): the lookups fail open
// and never answer an error: LookupRoute, LookupRouteStream and
// LookupPDRoute answer NO_HINT before reading the index (contract §2: a
// lookup fails open). RenderTemplate answers TEMPLATE_NOT_FOUND naming the
// limit. Every other method refuses it with InvalidArgument naming the
// field and the limit: ReportCacheState and PublishEvent (which write the
// index), GetCacheState (which reads it by id) and StreamCacheEvents (a
// filter on an id the index cannot hold).

import (
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// oversizedID names the first id of a request over MaxIDBytes: the field
// (as in the .proto, with the entry index for a prefix entry's adapter) and
// its length. The zero value means every id fits.
type oversizedID struct {
	field string
	n     int
}

func (o oversizedID) found() bool { return o.field != "" }

// err is the InvalidArgument status of a refused message. It names the
// field and the limit, never the id itself.
func (o oversizedID) err(what string, refused int) error {
	return status.Errorf(codes.InvalidArgument, "%s: %d refused; the first has a %s of %d bytes, over the %d-byte limit on ids",
		what, refused, o.field, o.n, MaxIDBytes)
}

// refuse is the InvalidArgument status of a request refused for its id (a
// method that reads the index by id: GetCacheState).
func (o oversizedID) refuse(what string) error {
	return status.Errorf(codes.InvalidArgument, "%s refused: its %s of %d bytes is over the %d-byte limit on ids",
		what, o.field, o.n, MaxIDBytes)
}

// checkID returns the oversizedID of field when v is over MaxIDBytes.
func checkID(field, v string) oversizedID {
	if len(v) > MaxIDBytes {
		return oversizedID{field: field, n: len(v)}
	}
	return oversizedID{}
}

// updateOversizedID checks every id of a CacheStateUpdate. It does not
// allocate unless an id is over the limit.
func updateOversizedID(m *pb.CacheStateUpdate) oversizedID {
	for _, o := range [...]oversizedID{
		checkID("tenant_id", m.GetTenantId()),
		checkID("model_id", m.GetModelId()),
		checkID("replica_id", m.GetReplicaId()),
		checkID("hash_scheme", m.GetHashScheme()),
		checkID("adapter_id", m.GetAdapterId()),
		checkID("pd_pool", m.GetPdPool()),
		checkID("node_name", m.GetNodeName()),
		checkID("zone", m.GetZone()),
	} {
		if o.found() {
			return o
		}
	}
	for i, p := range m.GetPrefixes() {
		if n := len(p.GetAdapterId()); n > MaxIDBytes {
			return oversizedID{field: "prefixes[" + strconv.Itoa(i) + "].adapter_id", n: n}
		}
	}
	return oversizedID{}
}

// eventOversizedID checks every id of a CacheEvent.
func eventOversizedID(ev *pb.CacheEvent) oversizedID {
	for _, o := range [...]oversizedID{
		checkID("tenant_id", ev.GetTenantId()),
		checkID("model_id", ev.GetModelId()),
		checkID("replica_id", ev.GetReplicaId()),
		checkID("adapter_id", ev.GetAdapterId()),
	} {
		if o.found() {
			return o
		}
	}
	return oversizedID{}
}

// stateRequestOversizedID checks the ids of a GetCacheStateRequest.
func stateRequestOversizedID(req *pb.GetCacheStateRequest) oversizedID {
	if o := checkID("tenant_id", req.GetTenantId()); o.found() {
		return o
	}
	return checkID("model_id", req.GetModelId())
}

// lookupIDsFit reports whether every id of a LookupRouteRequest is within
// MaxIDBytes.
func lookupIDsFit(req *pb.LookupRouteRequest) bool {
	return len(req.GetTenantId()) <= MaxIDBytes && len(req.GetModelId()) <= MaxIDBytes &&
		len(req.GetHashScheme()) <= MaxIDBytes && len(req.GetAdapterId()) <= MaxIDBytes
}
