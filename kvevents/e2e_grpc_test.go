package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// fakeServer is a minimal InferenceCache server: it applies
// ReportCacheState and PublishEvent to a per-replica key set the way the
// contract (§1.2) describes, and records what it saw on the wire.
type fakeServer struct {
	icv1.UnimplementedInferenceCacheServer

	mu      sync.Mutex                           // guards the fields below
	held    map[string]map[string]icv1.CacheTier // replica → key/adapter → tier
	stats   map[string]*icv1.ReplicaStats
	streams int
	events  []icv1.CacheEvent_Type
	bad     []string // contract violations seen on the wire
}

func newFakeServer() *fakeServer {
	return &fakeServer{held: map[string]map[string]icv1.CacheTier{}, stats: map[string]*icv1.ReplicaStats{}}
}

func (s *fakeServer) ReportCacheState(stream grpc.ClientStreamingServer[icv1.CacheStateUpdate, icv1.Ack]) error {
	s.mu.Lock()
	s.streams++
	s.mu.Unlock()
	for {
		u, err := stream.Recv()
		if err == io.EOF {
			return stream.SendAndClose(&icv1.Ack{Accepted: true})
		}
		if err != nil {
			return err
		}
		s.mu.Lock()
		if u.HashScheme == "" || u.ModelId == "" || u.TimestampUs < 0 {
			s.bad = append(s.bad, fmt.Sprintf("update header %v", u))
		}
		h := s.held[u.ReplicaId]
		if h == nil {
			h = map[string]icv1.CacheTier{}
			s.held[u.ReplicaId] = h
		}
		for _, p := range u.Prefixes {
			if len(p.PrefixHash) != 8 || p.TokenCount <= 0 || len(p.BlockHashes) != 0 {
				s.bad = append(s.bad, fmt.Sprintf("entry %v", p))
				continue
			}
			h[fmt.Sprintf("%x/%s", binary.BigEndian.Uint64(p.PrefixHash), p.AdapterId)] = p.Tier
		}
		if u.Stats != nil {
			s.stats[u.ReplicaId] = u.Stats
		}
		s.mu.Unlock()
	}
}

func (s *fakeServer) PublishEvent(_ context.Context, e *icv1.CacheEvent) (*icv1.Ack, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e.Type)
	h := s.held[e.ReplicaId]
	switch e.Type {
	case icv1.CacheEvent_ALL_CLEARED:
		delete(s.held, e.ReplicaId)
		delete(s.stats, e.ReplicaId)
	case icv1.CacheEvent_PREFIX_EVICTED:
		if len(e.PrefixHash) != 8 {
			s.bad = append(s.bad, fmt.Sprintf("event %v", e))
		}
		delete(h, fmt.Sprintf("%x/%s", binary.BigEndian.Uint64(e.PrefixHash), e.AdapterId))
	}
	return &icv1.Ack{Accepted: true}, nil
}

func (s *fakeServer) replica(id string) map[string]icv1.CacheTier {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.held[id])
}

// serveFake serves s on lis until the test ends.
func serveFake(t *testing.T, s *fakeServer, lis net.Listener) {
	srv := grpc.NewServer()
	icv1.RegisterInferenceCacheServer(srv, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
}

// e2eRun is what driveE2E leaves running: the fake engine and subscriber,
// the synthetic workload (what the engine holds) and the chain model of
// everything it published.
type e2eRun struct {
	*zmqFixture
	w     *fakeengine.Synthetic
	model *chainModel
}

// driveE2E runs a fake engine (synthetic workload stamped from a minute
// ago, replay on) and a subscriber forwarding to the InferenceCache server
// at addr over gRPC, publishes turns batches with a forced gap in the
// middle, waits until everything is applied and flushed, and returns the
// run.
//
// It is the hook for the end-to-end tests against the real server
// (e2e_server_test.go): start the server on 127.0.0.1, call driveE2E with
// its address, then compare the server's view (GetCacheState, LookupRoute
// on the chains) with what the engine holds.
func driveE2E(t *testing.T, addr string, turns int, beforePublish func()) *e2eRun {
	t.Helper()
	conn, err := DialServer(addr, TLSFiles{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	f := startZMQSink(t, fakeengine.Config{Encoding: fakeengine.Encoding{Layout: fakeengine.LayoutMap}}, true,
		func(c *Config) {
			c.RPCTimeout = time.Second
			c.MaxBackoff = 50 * time.Millisecond
		}, NewGRPCSink(conn, nil))
	if beforePublish != nil {
		beforePublish()
	}
	w := fakeengine.NewSynthetic(fakeengine.SyntheticConfig{Sessions: 6, CapacityBlocks: 80, LoRAIDs: []int64{1, 2}, Seed: 11,
		Start: time.Now().Add(-time.Minute)})
	run := &e2eRun{zmqFixture: f, w: w, model: newChainModel(f.sub.cfg.LoRAAdapters)}
	rec := &recordingWorkload{w: w, m: run.model}
	publishN(t, f.pub, rec, turns/2)
	f.pub.Drop(4)
	last := publishN(t, f.pub, rec, turns-turns/2)
	f.waitApplied(t, last+1)
	return run
}

func TestE2EOverGRPCToFakeServer(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newFakeServer()
	serveFake(t, srv, lis)

	run := driveE2E(t, lis.Addr().String(), 120, nil)
	sub, w := run.sub, run.w

	got, want := srv.replica("r1"), indexModel(sub.Index())
	if len(want) != w.CachedBlocks() {
		t.Fatalf("index %d blocks, engine %d", len(want), w.CachedBlocks())
	}
	if !maps.Equal(got, want) {
		t.Fatalf("server holds %d keys, index %d", len(got), len(want))
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.bad) > 0 {
		t.Fatalf("contract violations: %q", srv.bad)
	}
	if slices.Contains(srv.events, icv1.CacheEvent_ALL_CLEARED) {
		t.Fatal("ALL_CLEARED sent, but the engine never restarted")
	}
	// The sync when the SUB socket connected, and the forced gap.
	if c := counter(t, sub.metrics.replays.WithLabelValues(ReplayOK)); c != 2 {
		t.Fatalf("replays ok %v", c)
	}
}

func TestE2EServerStartsLate(t *testing.T) {
	// Reserve a port, release it, and only serve on it after the engine has
	// published: the subscriber buffers and retries with backoff.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	srv := newFakeServer()

	var sub *Subscriber
	started := make(chan struct{})
	go func() {
		defer close(started)
		time.Sleep(300 * time.Millisecond) // the subscriber fails and backs off meanwhile
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("cannot re-listen on %s: %v", addr, err)
			return
		}
		serveFake(t, srv, l)
	}()
	sub = driveE2E(t, addr, 60, nil).sub
	<-started
	if got, want := srv.replica("r1"), indexModel(sub.Index()); !maps.Equal(got, want) {
		t.Fatalf("server holds %d keys, index %d", len(got), len(want))
	}
	if counter(t, sub.metrics.forwardErrors.WithLabelValues("ReportCacheState")) == 0 {
		t.Fatal("expected failed attempts before the server came up")
	}
}
