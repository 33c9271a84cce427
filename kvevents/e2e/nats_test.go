package e2e

import (
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/bus/bustest"
)

// TestNATSBinaries: the built cmd/server (two of them) and
// cmd/kvevent-subscriber with --nats-url, a real NATS server in the test
// process. Every block the engine holds answers on both servers; a server
// killed with SIGKILL and started again rebuilds its index from the stream
// alone (nobody re-reports to it) before it reports ready.
func TestNATSBinaries(t *testing.T) {
	ns := bustest.Start(t)
	nats := []string{"--nats-url", ns.URL()}
	a := startServer(t, &serverProc{grpcPort: freePort(t), httpPort: freePort(t), intPort: freePort(t), extra: nats})
	b := startServer(t, &serverProc{grpcPort: freePort(t), httpPort: freePort(t), intPort: freePort(t), extra: nats})
	spec := engineSpec{flavor: "vllm", seed: 5, turns: 60, sessions: 4, capacity: 4096, ring: 1000}
	e := startEngine(t, spec, 0, 0, 10*time.Second)
	sub := startSubscriber(t, "pod-a", e, a, nats...)
	e.waitIdle(t)
	keys := e.heldKeys(t)
	for name, s := range map[string]*serverProc{"a": a, "b": b} {
		d, err := waitAnswering(t, s.client(t), "vllm", "pod-a", keys, 20*time.Second)
		if err != nil {
			t.Fatalf("server %s: %v", name, err)
		}
		t.Logf("server %s answers all %d held blocks %v after the engine went idle", name, len(keys), d.Round(time.Millisecond))
	}

	start := time.Now()
	b.restart(t) // SIGKILL, start again; returns once /readyz is ok
	ready := time.Since(start)
	if n := answering(b.client(t), "vllm", "pod-a", keys); n != len(keys) {
		t.Fatalf("restarted server ready with %d of %d held blocks", n, len(keys))
	}
	if sub.exited() {
		t.Fatal("the subscriber exited")
	}
	if v := sub.metric("inferencecache_subscriber_forward_lost_total"); v != 0 {
		t.Fatalf("forward_lost_total %v", v)
	}
	t.Logf("restarted server ready with all %d blocks %v after the kill", len(keys), ready.Round(time.Millisecond))
}
