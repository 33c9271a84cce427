package kvevents

// Load-aware routing end to end (docs/routing.md): fake engines publish
// the same prefix, subscribers scrape each engine's /metrics every stats
// interval and forward the load to the real server, and a gateway's
// LookupRoute stops naming the replica with a long queue first.

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/policy"
)

// engineLoad serves a vLLM-style /metrics whose request gauges a test sets.
type engineLoad struct {
	waiting, running atomic.Int32
	srv              *httptest.Server
}

func newEngineLoad(t *testing.T) *engineLoad {
	l := &engineLoad{}
	l.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprint(w, vllmExposition(0, 0, 0, 0, int(l.running.Load()), int(l.waiting.Load()), 0.5, true))
	}))
	t.Cleanup(l.srv.Close)
	return l
}

// TestE2ELongQueueStopsBeingFirst: r1 and r2 hold a 4-block prefix, r3
// only its first block; the contract names r1 first (r1 and r2 tie, name
// order). Once r1's engine reports a long queue, LookupRoute names r2
// first within two stats intervals; when the queue drains, load-awareness
// turns off again and the contract's answer is back.
func TestE2ELongQueueStopsBeingFirst(t *testing.T) {
	const interval = 400 * time.Millisecond
	srv := startRealServer(t, nil)
	// Affinity off and a one-block matched floor (startRealServer), and the
	// routing floor at its default.
	srv.Policies().Apply(&policy.Body{Version: policy.PropagationVersion, Policies: []policy.ResolvedPolicy{{
		Namespace: "t", MinimumMatchedTokens: 16, AffinityRouting: ptr(false),
		Strategy: &policy.LookupStrategy{EnableTenantHot: ptr(false)},
	}}})
	loads := map[string]*engineLoad{}
	fixtures := map[string]*zmqFixture{}
	var model *chainModel
	for _, id := range []string{"r1", "r2", "r3"} {
		l := newEngineLoad(t)
		loads[id] = l
		f, _, m := startOnServer(t, srv, func(c *Config) {
			c.ReplicaID = id
			c.MetricsURL = l.srv.URL
			c.StatsInterval = interval
		})
		fixtures[id], model = f, m
	}
	now := time.Now()
	prefix := seq(1, 4) // synthetic block ids → token ids
	fixtures["r1"].publish(t, model, chainBatch(now, seq(101, 4), prefix, nil))
	fixtures["r2"].publish(t, model, chainBatch(now, seq(201, 4), prefix, nil))
	fixtures["r3"].publish(t, model, chainBatch(now, seq(301, 1), prefix[:1], nil))
	tokens := model.blocks[104].tokens

	first := func() string {
		l := srv.lookupChain(t, "", tokens)
		if l.reason != "PREFIX_MATCH" {
			t.Fatalf("lookup: %s %v", l.reason, l.scores)
		}
		best, top := "", float32(-1)
		for id, s := range l.scores {
			if s.Score > top || (s.Score == top && id < best) {
				best, top = id, s.Score
			}
		}
		return best
	}
	if got := first(); got != "r1" {
		t.Fatalf("idle fleet: first %s, want r1 (the contract's tie-break)", got)
	}

	// r1's engine: 30 waiting, 10 running.
	loads["r1"].waiting.Store(30)
	loads["r1"].running.Store(10)
	start := time.Now()
	ctx := testCtx(t, 10*time.Second)
	for first() == "r1" {
		if !sleepCtx(ctx, 10*time.Millisecond) {
			t.Fatal("r1 stayed first behind a long queue")
		}
	}
	took := time.Since(start)
	t.Logf("r1 stopped being first %v after its queue grew (stats interval %v)", took.Round(time.Millisecond), interval)
	if took > 2*interval {
		t.Fatalf("took %v, more than two stats intervals (%v)", took, 2*interval)
	}
	if row, ok := srv.replicaRow("r1"); !ok || row.Load == nil || row.Load.WaitingRequests != 30 || row.Load.RunningRequests != 10 {
		t.Fatalf("/snapshot row of r1: %+v", row)
	}

	// The queue drains: every engine below half the minimum queue turns
	// load-awareness off, and r1 is first again (with a running request
	// r1 would lose the tie to r2 on the contract's own pressure factor).
	loads["r1"].waiting.Store(0)
	loads["r1"].running.Store(0)
	for first() != "r1" {
		if !sleepCtx(ctx, 10*time.Millisecond) {
			t.Fatal("r1 never came back first after its queue drained")
		}
	}
}
