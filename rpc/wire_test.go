package rpc_test

import (
	"bytes"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// The wire contract (shared/spec/contract.md §1.1, with the upstream
// inferencecache.proto for the details the notes leave out). Any change to a
// name, number, kind or cardinality below breaks deployed clients: do not
// "fix" this table to match an edited .proto.

const (
	protoPath = "inferencecache/v1alpha1/inferencecache.proto"
	pkg       = "inferencecache.v1alpha1"
)

type fieldSpec struct {
	msg      string // message name relative to the package
	name     string
	num      protowire.Number
	kind     protoreflect.Kind
	repeated bool
	// ref is the full name of the enum or message type, relative to the
	// package, or "map<K,V>" for map fields; empty for scalars.
	ref string
	// ext marks a field this project added after the upstream contract
	// (with a fresh number). Extensions may use explicit presence
	// (proto3 optional) so a reader can tell "not reported" from zero.
	ext bool
}

const (
	upstream  = false
	extension = true
)

const (
	str  = protoreflect.StringKind
	byt  = protoreflect.BytesKind
	i32  = protoreflect.Int32Kind
	u32  = protoreflect.Uint32Kind
	i64  = protoreflect.Int64Kind
	f32  = protoreflect.FloatKind
	f64  = protoreflect.DoubleKind
	bl   = protoreflect.BoolKind
	enm  = protoreflect.EnumKind
	msgk = protoreflect.MessageKind
)

var wireFields = []fieldSpec{
	{"RenderTemplateRequest", "template_ref", 1, str, false, "", upstream},
	{"RenderTemplateRequest", "variables", 2, msgk, true, "map<string,string>", upstream},
	{"RenderTemplateRequest", "tenant_id", 3, str, false, "", upstream},
	{"RenderTemplateRequest", "model_id", 4, str, false, "", extension},

	{"RenderTemplateResponse", "rendered_prompt", 1, byt, false, "", upstream},
	{"RenderTemplateResponse", "stable_prefix_hash", 2, byt, false, "", upstream},
	{"RenderTemplateResponse", "tenant_namespace", 3, byt, false, "", upstream},
	{"RenderTemplateResponse", "reason_code", 4, str, false, "", upstream},
	{"RenderTemplateResponse", "template_revision", 5, str, false, "", upstream},
	{"RenderTemplateResponse", "stable_prefix_tokens", 6, i32, false, "", extension},
	{"RenderTemplateResponse", "token_ids", 7, u32, true, "", extension},
	{"RenderTemplateResponse", "message", 8, str, false, "", extension},

	{"SLO", "ttft_ms", 1, i32, false, "", upstream},
	{"SLO", "tbt_ms", 2, i32, false, "", upstream},

	{"LookupRouteRequest", "model_id", 1, str, false, "", upstream},
	{"LookupRouteRequest", "tenant_id", 2, str, false, "", upstream},
	{"LookupRouteRequest", "prefix_hash", 3, byt, false, "", upstream},
	{"LookupRouteRequest", "prefix_token_count", 4, i32, false, "", upstream},
	{"LookupRouteRequest", "hash_scheme", 5, str, false, "", upstream},
	{"LookupRouteRequest", "slo", 6, msgk, false, "SLO", upstream},
	{"LookupRouteRequest", "block_hashes", 7, byt, true, "", upstream},
	{"LookupRouteRequest", "block_token_counts", 8, i32, true, "", upstream},
	{"LookupRouteRequest", "token_ids", 9, u32, true, "", upstream},
	{"LookupRouteRequest", "prompt_text", 10, str, false, "", upstream},
	{"LookupRouteRequest", "adapter_id", 11, str, false, "", upstream},
	{"LookupRouteRequest", "follows_answer", 12, bl, false, "", extension},

	{"ReplicaScore", "replica_id", 1, str, false, "", upstream},
	{"ReplicaScore", "score", 2, f32, false, "", upstream},
	{"ReplicaScore", "matched_tokens", 3, i32, false, "", upstream},
	{"ReplicaScore", "estimated_cache_hit_prob", 4, f32, false, "", upstream},
	{"ReplicaScore", "tier", 5, enm, false, "CacheTier", upstream},

	{"LookupRouteResponse", "replica_scores", 1, msgk, true, "ReplicaScore", upstream},
	{"LookupRouteResponse", "reason_code", 2, str, false, "", upstream},
	{"LookupRouteResponse", "lookup_latency_us", 3, i64, false, "", upstream},
	{"LookupRouteResponse", "token_ids", 4, u32, true, "", upstream},
	{"LookupRouteResponse", "adapter_id", 5, str, false, "", upstream},

	{"LookupPDRouteRequest", "model_id", 1, str, false, "", upstream},
	{"LookupPDRouteRequest", "tenant_id", 2, str, false, "", upstream},
	{"LookupPDRouteRequest", "prefix_hash", 3, byt, false, "", upstream},
	{"LookupPDRouteRequest", "prefix_token_count", 4, i32, false, "", upstream},
	{"LookupPDRouteRequest", "pd_topology_ref", 5, str, false, "", upstream},
	{"LookupPDRouteRequest", "hash_scheme", 6, str, false, "", extension},
	{"LookupPDRouteRequest", "block_hashes", 7, byt, true, "", extension},
	{"LookupPDRouteRequest", "block_token_counts", 8, i32, true, "", extension},
	{"LookupPDRouteRequest", "token_ids", 9, u32, true, "", extension},
	{"LookupPDRouteRequest", "adapter_id", 10, str, false, "", extension},

	{"LookupPDRouteResponse", "prefill_replica_id", 1, str, false, "", upstream},
	{"LookupPDRouteResponse", "decode_replica_id", 2, str, false, "", upstream},
	{"LookupPDRouteResponse", "transport_hint", 3, str, false, "", upstream},
	{"LookupPDRouteResponse", "reason_code", 4, str, false, "", upstream},
	{"LookupPDRouteResponse", "prefill_matched_tokens", 5, i32, false, "", extension},
	{"LookupPDRouteResponse", "decode_matched_tokens", 6, i32, false, "", extension},
	{"LookupPDRouteResponse", "uncached_tokens", 7, i32, false, "", extension},
	{"LookupPDRouteResponse", "lookup_latency_us", 8, i64, false, "", extension},

	{"GetCacheStateRequest", "model_id", 1, str, false, "", upstream},
	{"GetCacheStateRequest", "tenant_id", 2, str, false, "", upstream},

	{"GetCacheStateResponse", "replicas", 1, msgk, true, "ReplicaStats", upstream},
	{"GetCacheStateResponse", "summary", 2, msgk, false, "CacheSummary", upstream},

	{"CacheSummary", "total_prefixes", 1, i64, false, "", upstream},
	{"CacheSummary", "hot_prefixes", 2, i64, false, "", upstream},

	{"CacheStateUpdate", "replica_id", 1, str, false, "", upstream},
	{"CacheStateUpdate", "model_id", 2, str, false, "", upstream},
	{"CacheStateUpdate", "tenant_id", 3, str, false, "", upstream},
	{"CacheStateUpdate", "hash_scheme", 4, str, false, "", upstream},
	{"CacheStateUpdate", "timestamp_us", 5, i64, false, "", upstream},
	{"CacheStateUpdate", "prefixes", 6, msgk, true, "PrefixEntry", upstream},
	{"CacheStateUpdate", "stats", 7, msgk, false, "ReplicaStats", upstream},
	{"CacheStateUpdate", "adapter_id", 8, str, false, "", upstream},
	{"CacheStateUpdate", "role", 9, enm, false, "ReplicaRole", extension},
	{"CacheStateUpdate", "pd_pool", 10, str, false, "", extension},
	{"CacheStateUpdate", "node_name", 11, str, false, "", extension},
	{"CacheStateUpdate", "zone", 12, str, false, "", extension},

	{"PrefixEntry", "prefix_hash", 1, byt, false, "", upstream},
	{"PrefixEntry", "token_count", 2, i32, false, "", upstream},
	{"PrefixEntry", "block_hashes", 3, byt, true, "", upstream},
	{"PrefixEntry", "block_token_counts", 4, i32, true, "", upstream},
	{"PrefixEntry", "tier", 5, enm, false, "CacheTier", upstream},
	{"PrefixEntry", "adapter_id", 6, str, false, "", upstream},

	{"ReplicaStats", "replica_id", 1, str, false, "", upstream},
	{"ReplicaStats", "cache_memory_bytes", 2, i64, false, "", upstream},
	{"ReplicaStats", "hit_rate", 3, f32, false, "", upstream},
	{"ReplicaStats", "pressure", 4, f32, false, "", upstream},
	{"ReplicaStats", "client_version", 5, str, false, "", upstream},
	{"ReplicaStats", "t2_hit_tokens", 6, i64, false, "", upstream},
	{"ReplicaStats", "t2_query_tokens", 7, i64, false, "", upstream},
	{"ReplicaStats", "waiting_requests", 8, i32, false, "", extension},
	{"ReplicaStats", "running_requests", 9, i32, false, "", extension},
	{"ReplicaStats", "queued_prefill_tokens", 10, i64, false, "", extension},

	{"CacheEvent", "type", 1, enm, false, "CacheEvent.Type", upstream},
	{"CacheEvent", "replica_id", 2, str, false, "", upstream},
	{"CacheEvent", "model_id", 3, str, false, "", upstream},
	{"CacheEvent", "tenant_id", 4, str, false, "", upstream},
	{"CacheEvent", "prefix_hash", 5, byt, false, "", upstream},
	{"CacheEvent", "timestamp_us", 6, i64, false, "", upstream},
	{"CacheEvent", "adapter_id", 7, str, false, "", upstream},
	{"CacheEvent", "reason", 8, str, false, "", extension},
	{"CacheEvent", "hash_scheme", 9, str, false, "", extension},
	{"CacheEvent", "token_count", 10, i32, false, "", extension},
	{"CacheEvent", "tier", 11, enm, false, "CacheTier", extension},

	{"StreamEventsRequest", "model_id", 1, str, false, "", upstream},
	{"StreamEventsRequest", "tenant_id", 2, str, false, "", upstream},
	{"StreamEventsRequest", "types", 3, enm, true, "CacheEvent.Type", upstream},

	{"StreamMetricsRequest", "names", 1, str, true, "", upstream},
	{"StreamMetricsRequest", "interval_ms", 2, i32, false, "", extension},

	{"Metric", "name", 1, str, false, "", upstream},
	{"Metric", "type", 2, str, false, "", upstream},
	{"Metric", "labels", 3, msgk, true, "map<string,string>", upstream},
	{"Metric", "value", 4, f64, false, "", upstream},
	{"Metric", "timestamp_us", 5, i64, false, "", upstream},

	{"Ack", "accepted", 1, bl, false, "", upstream},
	{"Ack", "reason_code", 2, str, false, "", upstream},
}

type enumSpec struct {
	enum string // relative to the package
	name string
	num  protoreflect.EnumNumber
}

var wireEnums = []enumSpec{
	{"CacheTier", "CACHE_TIER_UNSPECIFIED", 0},
	{"CacheTier", "CACHE_TIER_T1", 1},
	{"CacheTier", "CACHE_TIER_T2", 2},
	{"CacheTier", "CACHE_TIER_T3", 3},

	{"CacheEvent.Type", "TYPE_UNSPECIFIED", 0},
	{"CacheEvent.Type", "PREFIX_ADDED", 1},
	{"CacheEvent.Type", "PREFIX_EVICTED", 2},
	{"CacheEvent.Type", "REPLICA_UPDATED", 3},
	{"CacheEvent.Type", "ALL_CLEARED", 4},
	// Ours, streamed only (docs/wire.md).
	{"CacheEvent.Type", "REPLICA_REMOVED", 5},

	// Ours (docs/pd.md).
	{"ReplicaRole", "REPLICA_ROLE_UNSPECIFIED", 0},
	{"ReplicaRole", "REPLICA_ROLE_BOTH", 1},
	{"ReplicaRole", "REPLICA_ROLE_PREFILL", 2},
	{"ReplicaRole", "REPLICA_ROLE_DECODE", 3},
}

type methodSpec struct {
	name         string
	fullMethod   string // the gRPC path on the wire
	generated    string // the generated FullMethodName constant
	in, out      string // relative to the package
	clientStream bool
	serverStream bool
}

var wireMethods = []methodSpec{
	{"RenderTemplate", "/inferencecache.v1alpha1.InferenceCache/RenderTemplate", pb.InferenceCache_RenderTemplate_FullMethodName, "RenderTemplateRequest", "RenderTemplateResponse", false, false},
	{"LookupRoute", "/inferencecache.v1alpha1.InferenceCache/LookupRoute", pb.InferenceCache_LookupRoute_FullMethodName, "LookupRouteRequest", "LookupRouteResponse", false, false},
	// Ours, additive (docs/wire.md): LookupRoute on a long-lived stream.
	{"LookupRouteStream", "/inferencecache.v1alpha1.InferenceCache/LookupRouteStream", pb.InferenceCache_LookupRouteStream_FullMethodName, "LookupRouteRequest", "LookupRouteResponse", true, true},
	{"LookupPDRoute", "/inferencecache.v1alpha1.InferenceCache/LookupPDRoute", pb.InferenceCache_LookupPDRoute_FullMethodName, "LookupPDRouteRequest", "LookupPDRouteResponse", false, false},
	{"GetCacheState", "/inferencecache.v1alpha1.InferenceCache/GetCacheState", pb.InferenceCache_GetCacheState_FullMethodName, "GetCacheStateRequest", "GetCacheStateResponse", false, false},
	{"ReportCacheState", "/inferencecache.v1alpha1.InferenceCache/ReportCacheState", pb.InferenceCache_ReportCacheState_FullMethodName, "CacheStateUpdate", "Ack", true, false},
	{"PublishEvent", "/inferencecache.v1alpha1.InferenceCache/PublishEvent", pb.InferenceCache_PublishEvent_FullMethodName, "CacheEvent", "Ack", false, false},
	{"StreamCacheEvents", "/inferencecache.v1alpha1.InferenceCache/StreamCacheEvents", pb.InferenceCache_StreamCacheEvents_FullMethodName, "StreamEventsRequest", "CacheEvent", false, true},
	{"StreamMetrics", "/inferencecache.v1alpha1.InferenceCache/StreamMetrics", pb.InferenceCache_StreamMetrics_FullMethodName, "StreamMetricsRequest", "Metric", false, true},
}

func full(rel string) protoreflect.FullName { return protoreflect.FullName(pkg + "." + rel) }

func TestWireFile(t *testing.T) {
	fd := pb.File_inferencecache_v1alpha1_inferencecache_proto
	if fd.Path() != protoPath {
		t.Errorf("proto file path = %q, want %q (it is part of the registered descriptor)", fd.Path(), protoPath)
	}
	if fd.Package() != pkg {
		t.Errorf("proto package = %q, want %q", fd.Package(), pkg)
	}
	if fd.Syntax() != protoreflect.Proto3 {
		t.Errorf("syntax = %v, want proto3", fd.Syntax())
	}
	if got, err := protoregistry.GlobalFiles.FindFileByPath(protoPath); err != nil || got != fd {
		t.Errorf("GlobalFiles.FindFileByPath(%q) = %v, %v; want the generated descriptor", protoPath, got, err)
	}
	if n := fd.Imports().Len(); n != 0 {
		t.Errorf("the contract imports %d files, want none", n)
	}
}

func TestWireFields(t *testing.T) {
	files := protoregistry.GlobalFiles
	perMsg := map[protoreflect.FullName]int{}
	for _, w := range wireFields {
		perMsg[full(w.msg)]++
		d, err := files.FindDescriptorByName(full(w.msg))
		if err != nil {
			t.Errorf("message %s is missing: %v", w.msg, err)
			continue
		}
		md, ok := d.(protoreflect.MessageDescriptor)
		if !ok {
			t.Errorf("%s is a %T, want a message", w.msg, d)
			continue
		}
		f := md.Fields().ByNumber(w.num)
		if f == nil {
			t.Errorf("%s: no field number %d (want %s)", w.msg, w.num, w.name)
			continue
		}
		if string(f.Name()) != w.name {
			t.Errorf("%s #%d: name %q, want %q", w.msg, w.num, f.Name(), w.name)
		}
		if f.Kind() != w.kind {
			t.Errorf("%s.%s #%d: kind %v, want %v", w.msg, w.name, w.num, f.Kind(), w.kind)
		}
		if rep := f.Cardinality() == protoreflect.Repeated; rep != w.repeated {
			t.Errorf("%s.%s #%d: repeated=%v, want %v", w.msg, w.name, w.num, rep, w.repeated)
		}
		if f.HasPresence() && f.Message() == nil && !w.ext {
			t.Errorf("%s.%s #%d: has explicit presence (optional/oneof); the contract uses plain proto3 fields", w.msg, w.name, w.num)
		}
		if f.ContainingOneof() != nil && !(w.ext && f.ContainingOneof().IsSynthetic()) {
			t.Errorf("%s.%s #%d: is in oneof %s; the contract has no oneofs", w.msg, w.name, w.num, f.ContainingOneof().Name())
		}
		if w.repeated && f.Kind() != byt && f.Kind() != str && f.Kind() != msgk && !f.IsPacked() {
			t.Errorf("%s.%s #%d: repeated scalar is not packed (proto3 default)", w.msg, w.name, w.num)
		}
		if got := refOf(f); got != w.ref {
			t.Errorf("%s.%s #%d: type %q, want %q", w.msg, w.name, w.num, got, w.ref)
		}
	}

	// No message may have fields the table does not know, and every message
	// of the file must be in the table.
	fd := pb.File_inferencecache_v1alpha1_inferencecache_proto
	seen := map[protoreflect.FullName]bool{}
	var walk func(protoreflect.MessageDescriptors)
	walk = func(ms protoreflect.MessageDescriptors) {
		for i := range ms.Len() {
			md := ms.Get(i)
			if md.IsMapEntry() {
				continue
			}
			seen[md.FullName()] = true
			if got, want := md.Fields().Len(), perMsg[md.FullName()]; got != want {
				t.Errorf("message %s has %d fields, the wire table lists %d", md.FullName(), got, want)
			}
			walk(md.Messages())
		}
	}
	walk(fd.Messages())
	for name := range perMsg {
		if !seen[name] {
			t.Errorf("message %s from the wire table is not in %s", name, protoPath)
		}
	}
}

// refOf names a field's enum or message type relative to the package, or
// describes a map field as map<K,V>.
func refOf(f protoreflect.FieldDescriptor) string {
	switch {
	case f.IsMap():
		return "map<" + f.MapKey().Kind().String() + "," + f.MapValue().Kind().String() + ">"
	case f.Enum() != nil:
		return string(f.Enum().FullName())[len(pkg)+1:]
	case f.Message() != nil:
		return string(f.Message().FullName())[len(pkg)+1:]
	}
	return ""
}

func TestWireEnums(t *testing.T) {
	perEnum := map[protoreflect.FullName]int{}
	for _, w := range wireEnums {
		perEnum[full(w.enum)]++
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(full(w.enum))
		if err != nil {
			t.Errorf("enum %s is missing: %v", w.enum, err)
			continue
		}
		ed, ok := d.(protoreflect.EnumDescriptor)
		if !ok {
			t.Errorf("%s is a %T, want an enum", w.enum, d)
			continue
		}
		v := ed.Values().ByNumber(w.num)
		if v == nil || string(v.Name()) != w.name {
			t.Errorf("enum %s value %d = %v, want %s", w.enum, w.num, v, w.name)
		}
	}
	for name, want := range perEnum {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
		if err != nil {
			continue
		}
		if got := d.(protoreflect.EnumDescriptor).Values().Len(); got != want {
			t.Errorf("enum %s has %d values, the wire table lists %d", name, got, want)
		}
	}
	fd := pb.File_inferencecache_v1alpha1_inferencecache_proto
	n := fd.Enums().Len()
	for i := range fd.Messages().Len() {
		n += fd.Messages().Get(i).Enums().Len()
	}
	if n != len(perEnum) {
		t.Errorf("the file declares %d enums, the wire table lists %d", n, len(perEnum))
	}
	// The generated Go constants agree with the descriptors.
	if pb.CacheTier_CACHE_TIER_T2 != 2 || pb.CacheEvent_ALL_CLEARED != 4 {
		t.Errorf("generated enum constants drifted: CACHE_TIER_T2=%d ALL_CLEARED=%d", pb.CacheTier_CACHE_TIER_T2, pb.CacheEvent_ALL_CLEARED)
	}
}

func TestWireService(t *testing.T) {
	const svc = "inferencecache.v1alpha1.InferenceCache"
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(svc)
	if err != nil {
		t.Fatalf("service %s is missing: %v", svc, err)
	}
	sd := d.(protoreflect.ServiceDescriptor)
	if got := sd.Methods().Len(); got != len(wireMethods) {
		t.Errorf("service has %d methods, want %d", got, len(wireMethods))
	}
	if pb.InferenceCache_ServiceDesc.ServiceName != svc {
		t.Errorf("grpc ServiceDesc.ServiceName = %q, want %q", pb.InferenceCache_ServiceDesc.ServiceName, svc)
	}
	unary := map[string]bool{}
	for _, m := range pb.InferenceCache_ServiceDesc.Methods {
		unary[m.MethodName] = true
	}
	streams := map[string]grpc.StreamDesc{}
	for _, s := range pb.InferenceCache_ServiceDesc.Streams {
		streams[s.StreamName] = s
	}

	for _, w := range wireMethods {
		if w.generated != w.fullMethod {
			t.Errorf("generated FullMethodName for %s = %q, want %q", w.name, w.generated, w.fullMethod)
		}
		md := sd.Methods().ByName(protoreflect.Name(w.name))
		if md == nil {
			t.Errorf("method %s is missing", w.name)
			continue
		}
		if got := "/" + string(sd.FullName()) + "/" + string(md.Name()); got != w.fullMethod {
			t.Errorf("method path %q, want %q", got, w.fullMethod)
		}
		if md.Input().FullName() != full(w.in) || md.Output().FullName() != full(w.out) {
			t.Errorf("%s: %s -> %s, want %s -> %s", w.name, md.Input().FullName(), md.Output().FullName(), full(w.in), full(w.out))
		}
		if md.IsStreamingClient() != w.clientStream || md.IsStreamingServer() != w.serverStream {
			t.Errorf("%s: client stream %v, server stream %v; want %v, %v",
				w.name, md.IsStreamingClient(), md.IsStreamingServer(), w.clientStream, w.serverStream)
		}
		// The grpc-go ServiceDesc must route the same way.
		if !w.clientStream && !w.serverStream {
			if !unary[w.name] {
				t.Errorf("%s is not a unary method in InferenceCache_ServiceDesc", w.name)
			}
			continue
		}
		s, ok := streams[w.name]
		if !ok {
			t.Errorf("%s is not a stream in InferenceCache_ServiceDesc", w.name)
			continue
		}
		if s.ClientStreams != w.clientStream || s.ServerStreams != w.serverStream {
			t.Errorf("InferenceCache_ServiceDesc %s: ClientStreams=%v ServerStreams=%v; want %v, %v",
				w.name, s.ClientStreams, s.ServerStreams, w.clientStream, w.serverStream)
		}
	}
}

// TestWireBytes pins a few encodings byte for byte, built by hand with
// protowire so they do not depend on the generated code.
func TestWireBytes(t *testing.T) {
	var (
		b       []byte
		tagged  = func(n protowire.Number, typ protowire.Type) { b = protowire.AppendTag(b, n, typ) }
		varint  = func(n protowire.Number, v uint64) { tagged(n, protowire.VarintType); b = protowire.AppendVarint(b, v) }
		lenDel  = func(n protowire.Number, v []byte) { tagged(n, protowire.BytesType); b = protowire.AppendBytes(b, v) }
		fixed32 = func(n protowire.Number, v uint32) {
			tagged(n, protowire.Fixed32Type)
			b = protowire.AppendFixed32(b, v)
		}
	)
	tests := []struct {
		name string
		msg  proto.Message
		want func()
	}{
		{
			name: "PrefixEntry",
			msg: &pb.PrefixEntry{
				PrefixHash: []byte{0xAA}, TokenCount: 16,
				BlockHashes: [][]byte{{1}, {2}}, BlockTokenCounts: []int32{16, 32},
				Tier: pb.CacheTier_CACHE_TIER_T2, AdapterId: "lora-a",
			},
			want: func() {
				lenDel(1, []byte{0xAA})
				varint(2, 16)
				lenDel(3, []byte{1})
				lenDel(3, []byte{2})
				lenDel(4, []byte{16, 32}) // packed
				varint(5, 2)
				lenDel(6, []byte("lora-a"))
			},
		},
		{
			name: "LookupRouteRequest",
			msg: &pb.LookupRouteRequest{
				ModelId: "m", TenantId: "t", HashScheme: "vllm",
				Slo:      &pb.SLO{TtftMs: 200},
				TokenIds: []uint32{300}, PromptText: "p", AdapterId: "a",
			},
			want: func() {
				lenDel(1, []byte("m"))
				lenDel(2, []byte("t"))
				lenDel(5, []byte("vllm"))
				lenDel(6, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 200))
				lenDel(9, protowire.AppendVarint(nil, 300)) // packed
				lenDel(10, []byte("p"))
				lenDel(11, []byte("a"))
			},
		},
		{
			name: "ReplicaScore",
			msg:  &pb.ReplicaScore{ReplicaId: "r", Score: 1.5, MatchedTokens: 64, Tier: pb.CacheTier_CACHE_TIER_T1},
			want: func() {
				lenDel(1, []byte("r"))
				fixed32(2, 0x3FC00000) // float32(1.5)
				varint(3, 64)
				varint(5, 1)
			},
		},
		{
			name: "CacheEvent",
			msg:  &pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, ReplicaId: "r", TimestampUs: 7, AdapterId: "a"},
			want: func() {
				varint(1, 2)
				lenDel(2, []byte("r"))
				varint(6, 7)
				lenDel(7, []byte("a"))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b = nil
			tt.want()
			got, err := proto.MarshalOptions{Deterministic: true}.Marshal(tt.msg)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, b) {
				t.Errorf("encoding drifted:\n got  %x\n want %x", got, b)
			}
			back := tt.msg.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(b, back); err != nil || !proto.Equal(back, tt.msg) {
				t.Errorf("hand-built bytes decode to %v (err %v), want %v", back, err, tt.msg)
			}
		})
	}
}
