package endpoints

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
)

// DefaultHashScheme is the hash scheme of a pool that names none: the one
// the pod injection configures for vLLM engines.
const DefaultHashScheme = "vllm"

// Endpoint is one address the gateway can send a request to.
type Endpoint struct {
	// ReplicaID is the id the endpoint's kvevent subscriber reports its
	// blocks and load under (the pod name for a one-port pod).
	ReplicaID string
	// Address is "ip:port" ("[v6]:port" for IPv6), as Envoy's
	// ORIGINAL_DST cluster reads it from the destination header.
	Address string
}

// Model is the index scope a request's model name resolves to.
type Model struct {
	// ModelID is the index model id (the engine's served base model).
	ModelID string
	// AdapterID is the LoRA adapter, empty for the base model.
	AdapterID string
}

// Pool is an immutable set of endpoints. The zero Pool is empty. A Pool
// must not be modified after NewPool returns it; it is safe for concurrent
// use.
type Pool struct {
	// Tenant is the index tenant of every request through this pool (the
	// pool's namespace in Kubernetes mode).
	Tenant string
	// HashScheme is the index hash scheme of the pool's engines.
	HashScheme string
	// Endpoints are sorted by Address, with unique addresses and replica
	// ids.
	Endpoints []Endpoint

	models    map[string]Model
	byAddr    map[string]int
	byReplica map[string]int
}

// Errors of NewPool.
var (
	ErrInvalidEndpoint = errors.New("endpoints: invalid endpoint")
	ErrInvalidPool     = errors.New("endpoints: invalid pool")
)

// NewPool validates and indexes a pool. Addresses must be ip:port with a
// port in 1..65535 (no IPv6 zone: it means nothing to the gateway); addresses and replica ids must be unique and non-empty.
// models maps a request's model name to its scope; a name it lacks
// resolves to itself with no adapter. hashScheme "" is DefaultHashScheme.
// NewPool copies its inputs.
func NewPool(tenant, hashScheme string, models map[string]Model, eps []Endpoint) (*Pool, error) {
	if tenant == "" {
		return nil, fmt.Errorf("%w: empty tenant", ErrInvalidPool)
	}
	if hashScheme == "" {
		hashScheme = DefaultHashScheme
	}
	p := &Pool{
		Tenant:     tenant,
		HashScheme: hashScheme,
		Endpoints:  make([]Endpoint, 0, len(eps)),
		models:     make(map[string]Model, len(models)),
		byAddr:     make(map[string]int, len(eps)),
		byReplica:  make(map[string]int, len(eps)),
	}
	for name, m := range models {
		if name == "" || m.ModelID == "" {
			return nil, fmt.Errorf("%w: model %q maps to model id %q: both must be set", ErrInvalidPool, name, m.ModelID)
		}
		p.models[name] = m
	}
	for _, ep := range eps {
		if ep.ReplicaID == "" {
			return nil, fmt.Errorf("%w: address %q has no replica id", ErrInvalidEndpoint, ep.Address)
		}
		ap, err := netip.ParseAddrPort(ep.Address)
		if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" {
			return nil, fmt.Errorf("%w: address %q of replica %q is not ip:port", ErrInvalidEndpoint, ep.Address, ep.ReplicaID)
		}
		ep.Address = ap.String() // canonical, as Envoy writes it back
		p.Endpoints = append(p.Endpoints, ep)
	}
	slices.SortFunc(p.Endpoints, func(a, b Endpoint) int { return strings.Compare(a.Address, b.Address) })
	for i, ep := range p.Endpoints {
		if _, dup := p.byAddr[ep.Address]; dup {
			return nil, fmt.Errorf("%w: address %q listed twice", ErrInvalidPool, ep.Address)
		}
		if _, dup := p.byReplica[ep.ReplicaID]; dup {
			return nil, fmt.Errorf("%w: replica id %q listed twice", ErrInvalidPool, ep.ReplicaID)
		}
		p.byAddr[ep.Address] = i
		p.byReplica[ep.ReplicaID] = i
	}
	return p, nil
}

// Resolve maps a request's model name to its index scope.
func (p *Pool) Resolve(name string) Model {
	if m, ok := p.models[name]; ok {
		return m
	}
	return Model{ModelID: name}
}

// ByAddress returns the endpoint at a canonical address.
func (p *Pool) ByAddress(addr string) (Endpoint, bool) {
	i, ok := p.byAddr[addr]
	if !ok {
		return Endpoint{}, false
	}
	return p.Endpoints[i], true
}

// ByReplica returns the endpoint of a replica id.
func (p *Pool) ByReplica(id string) (Endpoint, bool) {
	i, ok := p.byReplica[id]
	if !ok {
		return Endpoint{}, false
	}
	return p.Endpoints[i], true
}

// Equal reports whether p and q have the same tenant, hash scheme, model
// map and endpoints. Two nil pools are equal; nil equals no non-nil pool.
func (p *Pool) Equal(q *Pool) bool {
	if p == nil || q == nil {
		return p == q
	}
	return p.Tenant == q.Tenant && p.HashScheme == q.HashScheme &&
		slices.Equal(p.Endpoints, q.Endpoints) && maps.Equal(p.models, q.models)
}

// Len is the number of endpoints; 0 for a nil Pool.
func (p *Pool) Len() int {
	if p == nil {
		return 0
	}
	return len(p.Endpoints)
}

// Source publishes the current pool.
type Source interface {
	// Pool returns the current pool, nil until the first one is known.
	// It is lock-free and safe for concurrent use; the result is
	// immutable.
	Pool() *Pool
	// Run keeps the pool current until ctx ends; it returns nil then, or
	// an error that stops the source for good. Call it once.
	Run(ctx context.Context) error
	// Synced is closed once the source has published its first pool, so
	// readiness can wait for "endpoints known" (the file and InferencePool
	// sources never return a nil Pool after that). It is never reopened.
	Synced() <-chan struct{}
}

// closed is the Synced channel of sources that know their pool when they
// are made.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

var (
	_ Source = (*Fixed)(nil)
	_ Source = (*File)(nil)
	_ Source = (*InferencePool)(nil)
)

// Fixed is a Source of one pool that never changes (tests, embedding).
type Fixed struct {
	// p is the pool served; NewFixed and Set store it, Pool loads it.
	p atomic.Pointer[Pool]
}

// NewFixed returns a Source that always serves p.
func NewFixed(p *Pool) *Fixed {
	f := &Fixed{}
	f.p.Store(p)
	return f
}

// Pool implements Source.
func (f *Fixed) Pool() *Pool { return f.p.Load() }

// Set replaces the pool (tests that change endpoints at run time).
func (f *Fixed) Set(p *Pool) { f.p.Store(p) }

// Synced implements Source: a Fixed source is synced when it is made,
// whatever pool (nil included) it was given.
func (f *Fixed) Synced() <-chan struct{} { return closed }

// Run implements Source: it waits for ctx.
func (f *Fixed) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}
