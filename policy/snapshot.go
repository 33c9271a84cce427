package policy

import (
	"math"
	"strings"
	"sync/atomic"
	"time"
)

// Algorithm is a cap-eviction algorithm.
type Algorithm uint8

const (
	// LRU evicts the oldest lastSeen first. It is the default.
	LRU Algorithm = iota
	// LFU evicts the lowest access count first, then the oldest lastSeen.
	LFU
)

// String returns the lower-case wire and metric label form.
func (a Algorithm) String() string {
	if a == LFU {
		return "lfu"
	}
	return "lru"
}

// ParseAlgorithm maps a wire value to an Algorithm; anything but "lfu"
// (case-insensitive) is LRU.
func ParseAlgorithm(s string) Algorithm {
	if strings.EqualFold(strings.TrimSpace(s), "lfu") {
		return LFU
	}
	return LRU
}

// Tenant is the fully resolved policy of one tenant id: every knob has its
// final value, defaults applied. Tenants are immutable once published.
type Tenant struct {
	// HasPolicy is true when a CachePolicy governs this tenant's namespace.
	HasPolicy bool

	TTL                  time.Duration // > 0
	Eviction             Algorithm
	MinimumPrefixTokens  int32         // 0 = no gate
	MinimumMatchedTokens int32         // 0 = no floor
	RoutingFloorScore    float32       // 0 = no floor
	LookupTimeout        time.Duration // 0 = no deadline
	AffinityRouting      bool
	EnableChainMatching  bool
	RequireChain         bool
	EnableTenantHot      bool

	// HasQuota is true when a CacheTenant bounds this tenant's distinct keys;
	// MaxIndexEntries is then the budget (0 admits nothing).
	HasQuota        bool
	MaxIndexEntries int64
}

// Defaults is the resolved policy of a tenant with neither a CachePolicy nor
// a CacheTenant quota.
var Defaults = Tenant{
	TTL:                  DefaultTTL,
	Eviction:             LRU,
	MinimumMatchedTokens: DefaultMinimumMatchedTokens,
	RoutingFloorScore:    DefaultRoutingFloorScore,
	AffinityRouting:      DefaultAffinityRoutingEnabled,
	EnableChainMatching:  DefaultEnableChainMatching,
	RequireChain:         DefaultRequireChain,
	EnableTenantHot:      DefaultEnableTenantHot,
}

// Snapshot is an immutable, resolved view of one policy push. The zero
// Snapshot is not valid; use Empty or Build. A Snapshot is safe for
// concurrent use because nothing mutates it after Build returns.
type Snapshot struct {
	// generation is stamped by Store.Replace before the snapshot is published
	// and never written again (published guards that).
	generation uint64
	// published is set (once, by CompareAndSwap in Store.Replace or NewStore)
	// before the atomic store that makes the snapshot visible. A second
	// publication would rewrite generation under concurrent readers, so it is
	// a BUG panic instead of a silent data race.
	published atomic.Bool
	tenants   map[string]*Tenant
	// quotas lists the tenant ids with a quota, for the index's enforcement.
	quotas []string
	// anyLFU is true when some tenant evicts by LFU.
	anyLFU bool
	body   *Body
	// topologies and templates are keyed by "namespace/name";
	// nsTopologies lists each namespace's topology keys in push order.
	topologies   map[string]*Topology
	nsTopologies map[string][]string
	templates    map[string]*Template
}

var defaultTenant = Defaults

// Empty returns the snapshot every server starts with: every tenant at the
// defaults.
func Empty() *Snapshot {
	return &Snapshot{tenants: map[string]*Tenant{}, body: &Body{Version: PropagationVersion}}
}

// Generation increases with every snapshot a Store publishes.
func (s *Snapshot) Generation() uint64 { return s.generation }

// Tenant returns the resolved policy of a tenant id. It never returns nil and
// the result must not be modified.
func (s *Snapshot) Tenant(id string) *Tenant {
	if t, ok := s.tenants[id]; ok {
		return t
	}
	return &defaultTenant
}

// QuotaTenants returns the tenant ids that carry a quota, sorted as pushed.
// The slice must not be modified.
func (s *Snapshot) QuotaTenants() []string { return s.quotas }

// AnyLFU reports whether any tenant's policy selects LFU eviction.
func (s *Snapshot) AnyLFU() bool { return s.anyLFU }

// Body returns the normalized body this snapshot was built from (for
// debugging and tests). It must not be modified.
func (s *Snapshot) Body() *Body { return s.body }

// Build resolves a normalized body into a Snapshot.
//
// Rules: entries with an empty namespace or tenant id are skipped; when a
// namespace or tenant id repeats, the first entry wins (the controller
// already sends them deduplicated and sorted); a negative maxIndexEntries is
// 0; the reserved tenant never gets a quota.
func Build(b *Body) *Snapshot {
	s := &Snapshot{tenants: make(map[string]*Tenant, len(b.Policies)+len(b.Tenants)), body: b}
	get := func(id string) *Tenant {
		t, ok := s.tenants[id]
		if !ok {
			t = new(Tenant)
			*t = Defaults
			s.tenants[id] = t
		}
		return t
	}
	for i := range b.Policies {
		p := &b.Policies[i]
		if p.Namespace == "" {
			continue
		}
		if t, ok := s.tenants[p.Namespace]; ok && t.HasPolicy {
			continue
		}
		resolvePolicy(get(p.Namespace), p)
	}
	for _, q := range b.Tenants {
		if q.TenantID == "" || q.TenantID == ReservedTenantID {
			continue
		}
		t := get(q.TenantID)
		if t.HasQuota {
			continue
		}
		t.HasQuota = true
		t.MaxIndexEntries = max(q.MaxIndexEntries, 0)
		s.quotas = append(s.quotas, q.TenantID)
	}
	for _, t := range s.tenants {
		if t.Eviction == LFU {
			s.anyLFU = true
		}
	}
	buildV8(s, b)
	return s
}

// buildV8 resolves the version-8 lists: the first entry of a repeated
// "namespace/name" wins, as for policies.
func buildV8(s *Snapshot, b *Body) {
	if len(b.PDTopologies) > 0 {
		s.topologies = make(map[string]*Topology, len(b.PDTopologies))
		s.nsTopologies = map[string][]string{}
	}
	for i := range b.PDTopologies {
		p := &b.PDTopologies[i]
		k := Ref(p.Namespace, p.Name)
		if _, dup := s.topologies[k]; dup || p.Namespace == "" || p.Name == "" {
			continue
		}
		s.topologies[k] = resolveTopology(p)
		s.nsTopologies[p.Namespace] = append(s.nsTopologies[p.Namespace], k)
	}
	if len(b.PromptTemplates) > 0 {
		s.templates = make(map[string]*Template, len(b.PromptTemplates))
	}
	for i := range b.PromptTemplates {
		p := &b.PromptTemplates[i]
		k := Ref(p.Namespace, p.Name)
		if _, dup := s.templates[k]; dup || p.Namespace == "" || p.Name == "" {
			continue
		}
		t := &Template{PromptTemplate: p, Revision: p.TemplateRevision}
		if t.Revision == "" {
			t.Revision = TemplateRevision(p.Body, p.Slots)
		}
		s.templates[k] = t
	}
}

// Topology returns the PDTopology a request names: ref "namespace/name",
// or "name" in namespace ns, or empty for the only PDTopology of namespace
// ns. It returns nil when there is no such topology (or ref is empty and ns
// has none or several). The result must not be modified.
func (s *Snapshot) Topology(ref, ns string) *Topology {
	if ref == "" {
		if ks := s.nsTopologies[ns]; len(ks) == 1 {
			return s.topologies[ks[0]]
		}
		return nil
	}
	return lookupRef(s.topologies, ref, ns)
}

// Template returns the PromptTemplate named by ref ("namespace/name", or
// "name" in namespace ns), nil when there is none. The result must not be
// modified.
func (s *Snapshot) Template(ref, ns string) *Template {
	return lookupRef(s.templates, ref, ns)
}

// lookupRef is m[ResolveRef(ref, ns)] without allocating: a short name's
// "namespace/name" key is built on the stack (the map index of a []byte
// conversion does not copy), so a gateway's lookups cost nothing per call.
func lookupRef[V any](m map[string]*V, ref, ns string) *V {
	if strings.IndexByte(ref, '/') >= 0 {
		k, ok := ResolveRef(ref, ns)
		if !ok {
			return nil
		}
		return m[k]
	}
	if ref == "" || ns == "" {
		return nil
	}
	var buf [128]byte
	key := append(append(append(buf[:0], ns...), '/'), ref...)
	return m[string(key)]
}

// Topologies and Templates count the resolved version-8 entries.
func (s *Snapshot) Topologies() int { return len(s.topologies) }

// Templates: see Topologies.
func (s *Snapshot) Templates() int { return len(s.templates) }

func resolvePolicy(t *Tenant, p *ResolvedPolicy) {
	t.HasPolicy = true
	t.TTL = DefaultTTL
	if p.EvictionTTL > 0 {
		t.TTL = p.EvictionTTL
	}
	t.Eviction = ParseAlgorithm(p.Eviction)
	t.MinimumPrefixTokens = max(p.MinimumPrefixTokens, 0)
	// A policy's minimumMatchedTokens is taken as written: 0 is the explicit
	// opt-out. Only tenants without a policy get the default floor.
	t.MinimumMatchedTokens = max(p.MinimumMatchedTokens, 0)
	t.RoutingFloorScore = DefaultRoutingFloorScore
	if p.RoutingFloorScore != nil {
		v := *p.RoutingFloorScore
		switch {
		case math.IsNaN(float64(v)) || math.IsInf(float64(v), 0):
			// Unrepresentable in JSON, but a Go caller could build one.
		case v < 0:
			t.RoutingFloorScore = 0
		default:
			t.RoutingFloorScore = v
		}
	}
	t.LookupTimeout = 0
	if p.LookupTimeoutMs > 0 {
		t.LookupTimeout = time.Duration(p.LookupTimeoutMs) * time.Millisecond
	}
	t.AffinityRouting = DefaultAffinityRoutingEnabled
	if p.AffinityRouting != nil {
		t.AffinityRouting = *p.AffinityRouting
	}
	t.EnableChainMatching, t.RequireChain, t.EnableTenantHot = DefaultEnableChainMatching, DefaultRequireChain, DefaultEnableTenantHot
	if s := p.Strategy; s != nil {
		if s.EnableChainMatching != nil {
			t.EnableChainMatching = *s.EnableChainMatching
		}
		if s.RequireChain != nil {
			t.RequireChain = *s.RequireChain
		}
		if s.EnableTenantHot != nil {
			t.EnableTenantHot = *s.EnableTenantHot
		}
	}
}
