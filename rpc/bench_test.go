package rpc_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

// The engine issue's workload (shape of engine/workload_test.go): one
// tenant, model and scheme; 32 replicas; prompts of 64 blocks x 16 tokens
// sharing an 8-block system prefix; each prompt held by 1 to 3 replicas. A
// lookup of a stored prompt scores all 32 replicas (every one holds the
// system prefix, 128 tokens, above the default 64-token floor).
const (
	benchPrompts   = 20_000
	benchBlocks    = 64
	benchSysBlocks = 8
	benchTenant    = "bench"
	benchModel     = "llama-3-8b"
	benchScheme    = "vllm"
)

type benchFixture struct {
	srv    *server.Server
	client pb.InferenceCacheClient
	reqs   []*pb.LookupRouteRequest
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// benchChain returns prompt p's 64 block hashes (the first 8 shared).
func benchChain(p int) [][]byte {
	out := make([][]byte, benchBlocks)
	for j := range out {
		v := splitmix(uint64(j) + 0xabcdef)
		if j >= benchSysBlocks {
			v = splitmix(uint64(p)<<8 | uint64(j))
		}
		out[j] = binary.BigEndian.AppendUint64(nil, v)
	}
	return out
}

// newBenchFixture starts the production server wiring (package server:
// keepalive, message limits, health, reflection, the metrics observer) on
// 127.0.0.1 with no entry cap through servertest, seeds its index directly
// through the engine (setup speed: about 1 s for 2.25M entries), and
// connects a client. The server stops when b ends.
func newBenchFixture(b testing.TB) *benchFixture {
	b.Helper()
	srv := servertest.Start(b, func(c *server.Config) {
		c.MaxIndexEntries = 0 // the workload holds 2.25M entries
	})
	e := srv.Engine()
	counts := make([]int32, benchBlocks)
	for i := range counts {
		counts[i] = 16
	}
	replicas := make([]string, 32)
	for i := range replicas {
		replicas[i] = fmt.Sprintf("vllm-%02d", i)
	}
	r := rand.New(rand.NewPCG(42, 7))
	now := time.Now().UnixMicro()
	u := &engine.Update{TenantID: benchTenant, ModelID: benchModel, HashScheme: benchScheme, TimestampUs: now, Prefixes: make([]engine.PrefixEntry, 1)}
	for p := 0; p < benchPrompts; p++ {
		chain := benchChain(p)
		for _, h := range r.Perm(32)[:1+r.IntN(3)] {
			u.ReplicaID = replicas[h]
			u.Prefixes[0] = engine.PrefixEntry{BlockHashes: chain, BlockTokenCounts: counts}
			e.Ingest(u, now)
		}
	}
	f := &benchFixture{srv: srv, client: pb.NewInferenceCacheClient(servertest.Conn(b, srv))}
	for i := 0; i < 4096; i++ {
		f.reqs = append(f.reqs, &pb.LookupRouteRequest{TenantId: benchTenant, ModelId: benchModel, HashScheme: benchScheme,
			BlockHashes: benchChain((i * 7919) % benchPrompts), BlockTokenCounts: counts})
	}
	if entries, keys := e.Counts(); entries < 2_000_000 {
		b.Fatalf("workload built only %d entries over %d keys", entries, keys)
	}
	return f
}

// BenchmarkGRPCLookupRoute measures a matching 64-block chain lookup on the
// full workload through a real gRPC server and client over 127.0.0.1,
// serially and from parallel clients; allocs/op there counts client,
// transport and server together. The handler sub-benchmark calls the
// service method directly: its allocs/op are the server side's own (the
// response message; see TestLookupRouteAllocs).
func BenchmarkGRPCLookupRoute(b *testing.B) {
	f := newBenchFixture(b)
	svc := f.srv.Service()
	ctx := context.Background()
	check := func(resp *pb.LookupRouteResponse, err error) {
		if err != nil || resp.GetReasonCode() != rpc.ReasonPrefixMatch || len(resp.GetReplicaScores()) != 32 {
			b.Fatalf("lookup: %v %d scores, %v", resp.GetReasonCode(), len(resp.GetReplicaScores()), err)
		}
	}
	check(f.client.LookupRoute(ctx, f.reqs[0]))
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := f.client.LookupRoute(ctx, f.reqs[i&4095]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				if _, err := f.client.LookupRoute(ctx, f.reqs[i&4095]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("handler", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			check(svc.LookupRoute(ctx, f.reqs[i&4095]))
		}
	})
	b.Run("handler-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for i := 0; pb.Next(); i++ {
				if _, err := svc.LookupRoute(ctx, f.reqs[i&4095]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
