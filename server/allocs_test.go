package server_test

import (
	"cmp"
	"context"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

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
	hashes := make([][]byte, 16)
	for i := range hashes {
		hashes[i] = []byte{byte(i), 1, 2, 3, 4, 5, 6, 7}
	}
	req := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", BlockHashes: hashes}
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
	t.Logf("server allocations per LookupRoute: %.2f", per)
	for _, s := range sites[:min(len(sites), 12)] {
		t.Logf("  %6.2f  %s", float64(s.n)/calls, s.fn)
	}
	if per > maxServerAllocsPerLookup {
		t.Fatalf("server allocations per LookupRoute = %.2f, want at most %d", per, maxServerAllocsPerLookup)
	}
	if per < 5 {
		t.Fatalf("server allocations per LookupRoute = %.2f: the attribution found no server stacks", per)
	}
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
			strings.Contains(name, "inferencecache/rpc.lookupRouteHandler"):
			server = true
		}
		if !more {
			return fn, server
		}
	}
}
