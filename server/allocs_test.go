package server_test

import (
	"cmp"
	"context"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server/servertest"
)

// maxServerAllocsPerLookup pins the server side of one LookupRoute over a
// real loopback connection: grpc-go's transport and stream setup (HPACK
// header fields, the stream and its contexts, the deadline timer, the
// trailer); the handler and codec allocate one slice header (the response
// BufferSlice) and nothing else. Measured 56.1 on
// go1.26 / grpc v1.85 (57.4 before the server set fixed flow-control
// windows, which stopped the BDP pings).
const maxServerAllocsPerLookup = 57

// TestLookupRouteServerAllocs counts the allocations of LookupRoute calls
// that happen on the server's goroutines, client and server in one process.
// testing.AllocsPerRun would count both sides; instead every allocation is
// sampled (runtime.MemProfileRate = 1) and attributed by its stack: server
// frames are grpc.(*Server), the server transport's reader and writer, and
// this module's handlers.
func TestLookupRouteServerAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own and makes sync.Pool drop items")
	}
	if testing.Short() {
		t.Skip("samples every allocation")
	}
	srv := servertest.Start(t, nil)
	cli := pb.NewInferenceCacheClient(servertest.Conn(t, srv))
	req := allocsRequest()
	call := func() {
		// A deadline, as every real client sends one (grpc-timeout): the
		// server arms a timer for it.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := cli.LookupRoute(ctx, req); err != nil {
			t.Fatalf("LookupRoute: %v", err)
		}
	}
	for range 500 { // connection setup, pools, the workers' stacks
		call()
	}
	per := measureServerAllocs(t, "LookupRoute", call)
	if per > maxServerAllocsPerLookup {
		t.Fatalf("server allocations per LookupRoute = %.2f, want at most %d", per, maxServerAllocsPerLookup)
	}
	if per < 5 {
		t.Fatalf("server allocations per LookupRoute = %.2f: the attribution found no server stacks", per)
	}
}

// TestLookupRouteStreamServerAllocs is TestLookupRouteServerAllocs for
// lookups sent on one long-lived LookupRouteStream: no per-call HTTP/2
// stream, headers, contexts or timer, only the transport's per-message
// frames and the response BufferSlice. Measured on go1.26 / grpc v1.85:
// 9.2 with a default grpc-go client, whose BDP estimator pings after every
// response it reads (the server parses the ping and queues its ack, and the
// ping brings a WINDOW_UPDATE), and 6.5 with a client that sets fixed
// flow-control windows, which turns the estimator off (docs/wire.md
// recommends it to gateways).
func TestLookupRouteStreamServerAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own and makes sync.Pool drop items")
	}
	if testing.Short() {
		t.Skip("samples every allocation")
	}
	srv := servertest.Start(t, nil)
	for _, tc := range []struct {
		name string
		opts []grpc.DialOption
		max  float64
	}{
		{"default-client", nil, 10},
		{"fixed-window-client", []grpc.DialOption{grpc.WithInitialWindowSize(1 << 20), grpc.WithInitialConnWindowSize(1 << 20)}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, tc.opts...)
			cc, err := grpc.NewClient(srv.GRPCAddr().String(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			stream, err := pb.NewInferenceCacheClient(cc).LookupRouteStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			req := allocsRequest()
			call := func() {
				if err := stream.Send(req); err != nil {
					t.Fatalf("Send: %v", err)
				}
				if _, err := stream.Recv(); err != nil {
					t.Fatalf("Recv: %v", err)
				}
			}
			for range 500 {
				call()
			}
			per := measureServerAllocs(t, "streamed lookup", call)
			if per > tc.max {
				t.Fatalf("server allocations per streamed lookup = %.2f, want at most %v", per, tc.max)
			}
			if per < 2 {
				t.Fatalf("server allocations per streamed lookup = %.2f: the attribution found no server stacks", per)
			}
			if err := stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			if _, err := stream.Recv(); err != io.EOF {
				t.Fatalf("Recv after CloseSend = %v, want EOF (the server ends the stream OK)", err)
			}
		})
	}
}

// allocsRequest is a 16-block chain lookup of an empty index.
func allocsRequest() *pb.LookupRouteRequest {
	hashes := make([][]byte, 16)
	for i := range hashes {
		hashes[i] = []byte{byte(i), 1, 2, 3, 4, 5, 6, 7}
	}
	return &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", BlockHashes: hashes}
}

// measureServerAllocs runs call 2,000 times with every allocation sampled
// and returns the server's allocations per call, logging the top sites.
func measureServerAllocs(t *testing.T, what string, call func()) float64 {
	t.Helper()
	defer runtime.GC()
	old := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	defer func() { runtime.MemProfileRate = old }()
	before := serverAllocs(t)
	const calls = 2000
	for range calls {
		call()
	}
	after := serverAllocs(t)
	runtime.MemProfileRate = old

	var total int64
	type site struct {
		fn string
		n  int64
	}
	var sites []site
	for fn, n := range after {
		if d := n - before[fn]; d > 0 {
			total += d
			sites = append(sites, site{fn, d})
		}
	}
	slices.SortFunc(sites, func(a, b site) int { return cmp.Compare(b.n, a.n) })
	per := float64(total) / calls
	t.Logf("server allocations per %s: %.2f", what, per)
	for _, s := range sites[:min(len(sites), 12)] {
		t.Logf("  %6.2f  %s", float64(s.n)/calls, s.fn)
	}
	return per
}

// serverAllocs returns the allocated objects of the server's stacks so far,
// by the allocating function (the innermost frame outside the runtime).
func serverAllocs(t *testing.T) map[string]int64 {
	t.Helper()
	// The profile is published by garbage collections.
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	out := make(map[string]int64)
	for i := range recs {
		fn, server := classify(recs[i].Stack())
		if server {
			out[fn] += recs[i].AllocObjects
		}
	}
	return out
}

// classify names a stack's allocating function and tells whether the stack
// runs on the server.
func classify(stk []uintptr) (fn string, server bool) {
	frames := runtime.CallersFrames(stk)
	for {
		f, more := frames.Next()
		name := f.Function
		if fn == "" && !strings.HasPrefix(name, "runtime.") && !strings.HasPrefix(name, "internal/") {
			fn = name
		}
		switch {
		case strings.Contains(name, "grpc.(*Server)"),
			strings.Contains(name, "transport.(*http2Server)"),
			strings.Contains(name, "transport.NewServerTransport"),
			strings.Contains(name, "inferencecache/rpc.lookupRouteHandler"),
			strings.Contains(name, "inferencecache/rpc.lookupRouteStreamHandler"):
			server = true
		}
		if !more {
			return fn, server
		}
	}
}
