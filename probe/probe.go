// Package probe is the server's functional self-test behind POST /probe
// (contract §4.3, policy-propagation.md "/probe wire contract"): it
// synthesizes one KV block under the reserved tenant and a reserved replica,
// and checks that the index accepts it (stage ingest), routes to it (stage
// routing) and, for LMCache backends with a wired T2Prober, that the tier-2
// store round-trips (stage t2).
//
// Isolation: the state lives under tenant policy.ReservedTenantID and replica
// "__probe-<backend>", which real traffic cannot reach (the gRPC handlers
// drop or short-circuit the reserved tenant) and which the index keeps out
// of the entry cap and /snapshot. Every run ends with a deferred ALL_CLEARED
// of the reserved replica, on every path: a failed stage, a panic in a
// stage, or a context that ends.
//
// Runs for the same (backend, model) are serialized, so two concurrent probes
// never clear each other's block mid-run; runs for different keys proceed in
// parallel.
package probe

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/controlserver"
	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/policy"
)

// Constants of the synthesized state (contract §6).
const (
	// ReplicaPrefix starts the reserved replica id: "__probe-<backend>".
	ReplicaPrefix = "__probe-"
	// BlockTokens is the token count of the one synthesized block.
	BlockTokens = 16
	// hashDomain opens the probe hash's SHA-256 input.
	hashDomain = "inferencecache.io/probe/v1\n"
	// backendTypeLMCache is the spec.type that runs stage t2 (as does "").
	backendTypeLMCache = "LMCache"
)

// Index is what the probe needs from the cache index; *engine.Engine
// implements it. Tests wrap it to inject failures.
type Index interface {
	Ingest(u *engine.Update, now int64) engine.IngestResult
	ApplyEvent(ev *engine.Event, now int64)
	LookupRoute(req *engine.LookupRequest, now int64, res *engine.LookupResult)
}

var _ Index = (*engine.Engine)(nil)

// T2Prober runs a tier-2 put/get round trip for a backend. The production
// server wires RemoteT2 (t2.go), which probes the backend's remote tier
// when the request names one. ErrNoRemoteTier from it means skipped.
type T2Prober interface {
	ProbeT2(ctx context.Context, req controlapi.ProbeRequest) error
}

// Config wires a Prober.
type Config struct {
	// Index is the cache index. Required.
	Index Index
	// T2 runs stage t2; nil skips it.
	T2 T2Prober
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Prober implements controlserver.Prober. It is safe for concurrent use.
type Prober struct {
	index Index
	t2    T2Prober
	now   func() time.Time
	log   *slog.Logger

	// mu guards slots, the per-(backend, model) run slots: a slot is a
	// one-token channel held by the running probe for that key; refs counts
	// the runs holding or waiting for it, and the entry is deleted when the
	// last one leaves, so the map only holds keys with runs in flight.
	mu    sync.Mutex
	slots map[slotKey]*slot
}

var _ controlserver.Prober = (*Prober)(nil)

type slotKey struct{ backend, model string }

type slot struct {
	ch   chan struct{} // capacity 1: a token in it means "held"
	refs int           // guarded by Prober.mu
}

// New returns a Prober. It panics if cfg.Index is nil (a wiring bug).
func New(cfg Config) *Prober {
	if cfg.Index == nil {
		panic("BUG: probe: nil Index")
	}
	p := &Prober{index: cfg.Index, t2: cfg.T2, now: cfg.Now, log: cfg.Logger, slots: map[slotKey]*slot{}}
	if p.now == nil {
		p.now = time.Now
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	return p
}

// ReplicaID returns the reserved replica id of a backend.
func ReplicaID(backend string) string { return ReplicaPrefix + backend }

// Hash returns the probe block's hash: SHA-256 over the domain line
// "inferencecache.io/probe/v1\n" followed by hashScheme, model and backend,
// each as a 4-byte big-endian length and its bytes.
func Hash(hashScheme, model, backend string) []byte {
	h := sha256.New()
	h.Write([]byte(hashDomain))
	for _, f := range []string{hashScheme, model, backend} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return h.Sum(nil)
}

// Probe runs the self-test for a validated request (controlserver checked
// that backend, model and hashScheme are set). A stage that fails (or
// panics) is reported failed with a message, and every later stage skipped.
func (p *Prober) Probe(ctx context.Context, req controlapi.ProbeRequest) (resp controlapi.ProbeResponse) {
	resp = controlapi.ProbeResponse{
		Backend: req.Backend,
		Ingest:  controlapi.StageSkipped,
		Routing: controlapi.StageSkipped,
		T2:      controlapi.StageSkipped,
	}
	release, err := p.acquire(ctx, slotKey{req.Backend, req.Model})
	if err != nil {
		resp.Ingest = controlapi.StageFailed
		resp.Errors = append(resp.Errors, controlapi.ProbeError{Stage: controlapi.StageIngest, Message: err.Error()})
		return resp
	}
	defer release()

	r := run{p: p, req: req, replica: ReplicaID(req.Backend), hash: Hash(req.HashScheme, req.Model, req.Backend)}
	// The cleanup is deferred before any write, so it runs on every path
	// out, including a panic recovered below.
	defer r.cleanup()

	stage := controlapi.StageIngest
	defer func() {
		if v := recover(); v != nil {
			p.log.Error("probe stage panicked", "stage", stage, "backend", req.Backend, "model", req.Model, "panic", v)
			setStage(&resp, stage, controlapi.StageFailed)
			resp.Errors = append(resp.Errors, controlapi.ProbeError{Stage: stage, Message: fmt.Sprintf("panic: %v", v)})
		}
	}()

	for _, st := range []struct {
		name string
		run  func(context.Context) (bool, error)
	}{
		{controlapi.StageIngest, r.ingest},
		{controlapi.StageRouting, r.routing},
		{controlapi.StageT2, r.tier2},
	} {
		stage = st.name
		ran, err := st.run(ctx)
		switch {
		case err != nil:
			setStage(&resp, st.name, controlapi.StageFailed)
			resp.Errors = append(resp.Errors, controlapi.ProbeError{Stage: st.name, Message: err.Error()})
			return resp // later stages stay skipped
		case ran:
			setStage(&resp, st.name, controlapi.StageOK)
		}
	}
	return resp
}

func setStage(resp *controlapi.ProbeResponse, stage, result string) {
	switch stage {
	case controlapi.StageIngest:
		resp.Ingest = result
	case controlapi.StageRouting:
		resp.Routing = result
	case controlapi.StageT2:
		resp.T2 = result
	}
}

// acquire takes the (backend, model) slot, waiting at most until ctx ends.
func (p *Prober) acquire(ctx context.Context, k slotKey) (release func(), err error) {
	p.mu.Lock()
	s := p.slots[k]
	if s == nil {
		s = &slot{ch: make(chan struct{}, 1)}
		p.slots[k] = s
	}
	s.refs++
	p.mu.Unlock()
	leave := func() {
		p.mu.Lock()
		if s.refs--; s.refs == 0 {
			delete(p.slots, k)
		}
		p.mu.Unlock()
	}
	select {
	case s.ch <- struct{}{}:
		return func() { <-s.ch; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, fmt.Errorf("probe: gave up waiting for a concurrent probe of backend %q, model %q: %w", k.backend, k.model, ctx.Err())
	}
}

// run is one probe run's state.
type run struct {
	p       *Prober
	req     controlapi.ProbeRequest
	replica string
	hash    []byte
}

func (r *run) lookup() *engine.LookupResult {
	var res engine.LookupResult
	r.p.index.LookupRoute(&engine.LookupRequest{
		TenantID:         policy.ReservedTenantID,
		ModelID:          r.req.Model,
		HashScheme:       r.req.HashScheme,
		BlockHashes:      [][]byte{r.hash},
		BlockTokenCounts: []int32{BlockTokens},
	}, r.p.now().UnixMicro(), &res)
	return &res
}

func (r *run) holds(res *engine.LookupResult) bool {
	return slices.ContainsFunc(res.Scores, func(s engine.Score) bool { return s.ReplicaID == r.replica })
}

// ingest is stage A: write the block (and stats hit_rate 1, pressure 0)
// through the index's ingest path, then check the index holds it.
func (r *run) ingest(context.Context) (bool, error) {
	now := r.p.now().UnixMicro()
	got := r.p.index.Ingest(&engine.Update{
		ReplicaID:   r.replica,
		ModelID:     r.req.Model,
		TenantID:    policy.ReservedTenantID,
		HashScheme:  r.req.HashScheme,
		TimestampUs: now,
		Prefixes:    []engine.PrefixEntry{{BlockHashes: [][]byte{r.hash}, BlockTokenCounts: []int32{BlockTokens}}},
		Stats:       &engine.ReplicaStats{HitRate: 1, Pressure: 0},
	}, now)
	if got.Entries < 1 || got.Dropped > 0 {
		return false, fmt.Errorf("probe: the index did not accept the probe block (entries %d, dropped %d)", got.Entries, got.Dropped)
	}
	if res := r.lookup(); !r.holds(res) {
		return false, fmt.Errorf("probe: replica %q is not indexed after ingest (lookup strategy %s, %d scores)", r.replica, res.Strategy, len(res.Scores))
	}
	return true, nil
}

// routing is stage B: the index's LookupRoute must answer PREFIX_MATCH and
// include the probe replica.
func (r *run) routing(context.Context) (bool, error) {
	res := r.lookup()
	if res.Strategy != engine.StrategyPrefixMatch {
		return false, fmt.Errorf("probe: LookupRoute answered %s, want PREFIX_MATCH", res.Strategy)
	}
	if !r.holds(res) {
		return false, fmt.Errorf("probe: PREFIX_MATCH without replica %q (%d scores)", r.replica, len(res.Scores))
	}
	return true, nil
}

// tier2 is stage C, with a T2Prober: for a backend whose remote tier the
// request names (T2Endpoint), or an LMCache (or unset) backend. A prober
// that finds nothing to probe (ErrNoRemoteTier) skips it.
func (r *run) tier2(ctx context.Context) (bool, error) {
	if r.p.t2 == nil || (r.req.T2Endpoint == "" && r.req.BackendType != "" && r.req.BackendType != backendTypeLMCache) {
		return false, nil
	}
	if err := r.p.t2.ProbeT2(ctx, r.req); err != nil {
		if errors.Is(err, ErrNoRemoteTier) {
			return false, nil
		}
		return false, fmt.Errorf("probe: tier-2 round trip failed: %w", err)
	}
	return true, nil
}

// cleanup clears the reserved replica from (reserved tenant, model). It
// recovers its own panic: a failing cleanup is logged (the TTL sweep is the
// backstop) and never masks the probe's answer.
func (r *run) cleanup() {
	defer func() {
		if v := recover(); v != nil {
			r.p.log.Error("probe cleanup panicked; the TTL sweep will reclaim the probe state",
				"backend", r.req.Backend, "model", r.req.Model, "panic", v)
		}
	}()
	r.p.index.ApplyEvent(&engine.Event{
		Type:      engine.EventAllCleared,
		ReplicaID: r.replica,
		ModelID:   r.req.Model,
		TenantID:  policy.ReservedTenantID,
	}, r.p.now().UnixMicro())
}
