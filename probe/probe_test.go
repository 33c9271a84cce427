package probe_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/probe"
)

var quiet = slog.New(slog.DiscardHandler)

// faults selects what a faultIndex injects.
type faults struct {
	dropIngest   bool // Ingest writes nothing and reports a drop
	hideLookups  int  // the first n lookups return nothing
	noMatchAfter int  // lookups after the first n return StrategyNone
	panicIngest  bool
	panicClear   bool
}

// faultIndex wraps a real engine and injects faults per method.
type faultIndex struct {
	*engine.Engine
	faults

	// mu guards lookups, the number of LookupRoute calls so far.
	mu      sync.Mutex
	lookups int
	// clears counts ALL_CLEARED events.
	clears atomic.Int32
}

func (f *faultIndex) Ingest(u *engine.Update, now int64) engine.IngestResult {
	if f.panicIngest {
		panic("ingest exploded")
	}
	if f.dropIngest {
		return engine.IngestResult{Dropped: 1}
	}
	return f.Engine.Ingest(u, now)
}

func (f *faultIndex) LookupRoute(req *engine.LookupRequest, now int64, res *engine.LookupResult) {
	f.mu.Lock()
	f.lookups++
	n := f.lookups
	f.mu.Unlock()
	f.Engine.LookupRoute(req, now, res)
	if n <= f.hideLookups || (f.noMatchAfter > 0 && n > f.noMatchAfter) {
		res.Strategy, res.Scores = engine.StrategyNone, nil
	}
}

func (f *faultIndex) ApplyEvent(ev *engine.Event, now int64) {
	if ev.Type == engine.EventAllCleared {
		f.clears.Add(1)
	}
	if f.panicClear {
		panic("clear exploded")
	}
	f.Engine.ApplyEvent(ev, now)
}

type t2Func func(ctx context.Context, req controlapi.ProbeRequest) error

func (f t2Func) ProbeT2(ctx context.Context, req controlapi.ProbeRequest) error { return f(ctx, req) }

var req = controlapi.ProbeRequest{Backend: "ns/cb", Model: "functional-self-test", HashScheme: "vllm"}

// probeStateLeft reports whether the probe block is still indexed.
func probeStateLeft(e *engine.Engine, r controlapi.ProbeRequest) bool {
	var res engine.LookupResult
	e.LookupRoute(&engine.LookupRequest{
		TenantID: policy.ReservedTenantID, ModelID: r.Model, HashScheme: r.HashScheme,
		BlockHashes: [][]byte{probe.Hash(r.HashScheme, r.Model, r.Backend)}, BlockTokenCounts: []int32{probe.BlockTokens},
	}, time.Now().UnixMicro(), &res)
	return len(res.Scores) > 0
}

func TestProbeStages(t *testing.T) {
	okT2 := t2Func(func(context.Context, controlapi.ProbeRequest) error { return nil })
	badT2 := t2Func(func(context.Context, controlapi.ProbeRequest) error { return errors.New("lmcache unreachable") })
	panicT2 := t2Func(func(context.Context, controlapi.ProbeRequest) error { panic("t2 exploded") })
	for _, tc := range []struct {
		name                string
		fault               faults
		prober              probe.T2Prober
		backendType         string
		ingest, routing, t2 string
		errStage, errSubstr string
	}{
		{name: "all ok, no T2 prober", ingest: "ok", routing: "ok", t2: "skipped"},
		{name: "all ok with a T2 prober", prober: okT2, ingest: "ok", routing: "ok", t2: "ok"},
		{name: "explicit LMCache runs T2", prober: okT2, backendType: "LMCache", ingest: "ok", routing: "ok", t2: "ok"},
		{name: "non-LMCache backends skip T2", prober: okT2, backendType: "SGLangHiCache", ingest: "ok", routing: "ok", t2: "skipped"},
		{name: "T2 failure", prober: badT2, ingest: "ok", routing: "ok", t2: "failed", errStage: "t2", errSubstr: "lmcache unreachable"},
		{name: "T2 panic", prober: panicT2, ingest: "ok", routing: "ok", t2: "failed", errStage: "t2", errSubstr: "panic: t2 exploded"},
		{name: "ingest dropped cascades", prober: okT2, fault: faults{dropIngest: true}, ingest: "failed", routing: "skipped", t2: "skipped", errStage: "ingest", errSubstr: "did not accept"},
		{name: "ingest not visible cascades", prober: okT2, fault: faults{hideLookups: 1}, ingest: "failed", routing: "skipped", t2: "skipped", errStage: "ingest", errSubstr: "not indexed"},
		{name: "ingest panic cascades", prober: okT2, fault: faults{panicIngest: true}, ingest: "failed", routing: "skipped", t2: "skipped", errStage: "ingest", errSubstr: "panic: ingest exploded"},
		{name: "routing failure cascades", prober: okT2, fault: faults{noMatchAfter: 1}, ingest: "ok", routing: "failed", t2: "skipped", errStage: "routing", errSubstr: "want PREFIX_MATCH"},
		{name: "cleanup panic does not change the answer", fault: faults{panicClear: true}, ingest: "ok", routing: "ok", t2: "skipped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := engine.New(engine.Config{})
			f := &faultIndex{Engine: e, faults: tc.fault}
			p := probe.New(probe.Config{Index: f, T2: tc.prober, Logger: quiet})
			r := req
			r.BackendType = tc.backendType
			resp := p.Probe(context.Background(), r)
			if resp.Backend != r.Backend || resp.Ingest != tc.ingest || resp.Routing != tc.routing || resp.T2 != tc.t2 {
				t.Fatalf("resp = %+v, want %s/%s/%s", resp, tc.ingest, tc.routing, tc.t2)
			}
			switch {
			case tc.errStage == "" && len(resp.Errors) != 0:
				t.Fatalf("unexpected errors %+v", resp.Errors)
			case tc.errStage != "" && (len(resp.Errors) != 1 || resp.Errors[0].Stage != tc.errStage || !strings.Contains(resp.Errors[0].Message, tc.errSubstr)):
				t.Fatalf("errors = %+v, want one %s error containing %q", resp.Errors, tc.errStage, tc.errSubstr)
			}
			if f.clears.Load() != 1 {
				t.Fatalf("ALL_CLEARED ran %d times, want once on every path", f.clears.Load())
			}
			if !tc.fault.panicClear && probeStateLeft(e, r) {
				t.Fatal("probe state left in the index")
			}
			if n, _ := e.Counts(); n != 0 {
				t.Fatalf("probe entries counted outside the reserved tenant: %d", n)
			}
		})
	}
}

// TestProbeHash pins the hash construction of contract §4.3.
func TestProbeHash(t *testing.T) {
	in := []byte("inferencecache.io/probe/v1\n")
	for _, f := range []string{"vllm", "m", "ns/cb"} {
		in = append(in, 0, 0, 0, byte(len(f)))
		in = append(in, f...)
	}
	want := sha256.Sum256(in)
	if got := probe.Hash("vllm", "m", "ns/cb"); string(got) != string(want[:]) {
		t.Fatalf("hash = %x, want %x", got, want)
	}
	// Field boundaries matter.
	if string(probe.Hash("vl", "lmm", "x")) == string(probe.Hash("vll", "mm", "x")) {
		t.Fatal("length prefixes do not separate fields")
	}
	if probe.ReplicaID("ns/cb") != "__probe-ns/cb" {
		t.Fatal(probe.ReplicaID("ns/cb"))
	}
}

// TestProbeSerialized: runs for one (backend, model) never overlap; runs for
// different keys do; a waiter whose context ends gives up with a failed
// ingest stage.
func TestProbeSerialized(t *testing.T) {
	e := engine.New(engine.Config{})
	var inFlight, maxInFlight atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, 8)
	t2 := t2Func(func(ctx context.Context, r controlapi.ProbeRequest) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		started <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	p := probe.New(probe.Config{Index: e, T2: t2, Logger: quiet})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	results := make(chan controlapi.ProbeResponse, 3)
	for _, r := range []controlapi.ProbeRequest{req, req, {Backend: "other/cb", Model: req.Model, HashScheme: "vllm"}} {
		wg.Go(func() { results <- p.Probe(ctx, r) })
	}
	// Two runs (different keys) get in; the second run of req waits.
	for range 2 {
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("probes did not start")
		}
	}
	select {
	case <-started:
		t.Fatal("two runs of the same (backend, model) overlapped")
	case <-time.After(50 * time.Millisecond):
	}
	// A third run of req with a short deadline gives up waiting.
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	resp := p.Probe(short, req)
	cancelShort()
	if resp.Ingest != "failed" || resp.Routing != "skipped" || len(resp.Errors) != 1 || !strings.Contains(resp.Errors[0].Message, "concurrent probe") {
		t.Fatalf("waiter that timed out: %+v", resp)
	}
	close(release)
	wg.Wait()
	close(results)
	for r := range results {
		if r.Ingest != "ok" || r.Routing != "ok" || r.T2 != "ok" {
			t.Fatalf("serialized run: %+v", r)
		}
	}
	if m := maxInFlight.Load(); m != 2 {
		t.Fatalf("max concurrent runs = %d, want 2 (one per key)", m)
	}
	if probeStateLeft(e, req) {
		t.Fatal("probe state left")
	}
}
