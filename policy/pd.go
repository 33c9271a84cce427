package policy

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Version 8 adds two top-level lists to the /policy body, both optional:
// pdTopologies (one resolved PDTopology CR each) and promptTemplates (one
// PromptTemplate CR each). They are additive: a body without them means
// "none". An older server (v7) rejects a body carrying them with HTTP 400
// (unknown field, or unsupported version), so a newer controller never
// half-applies on it; see VersionFor for the version a controller sends.

// Transports of a PDTopology (LookupPDRouteResponse.transport_hint).
const (
	TransportMooncake = "Mooncake"
	TransportNIXL     = "NIXL"
	TransportDirect   = "Direct"
)

// KV locality preferences of a PDTopology: where the decode replica should
// run relative to the prefill replica it pulls the KV cache from.
const (
	LocalityNone = "None"
	LocalityNode = "Node"
	LocalityZone = "Zone"
)

// Slot types of a PromptTemplate.
const (
	SlotStable  = "Stable"
	SlotMutable = "Mutable"
)

// DefaultSkipPrefillBelowTokens is the skip-prefill threshold of a
// PDTopology that sets none: a request whose prompt the decode replica
// would compute fewer than this many tokens of is served by the decode
// replica alone. Chosen with the P/D simulator (bench/results/pd.md).
const DefaultSkipPrefillBelowTokens = int32(512)

// Limits of the version-8 lists (each entry is checked by Decode).
const (
	// MaxTemplateBodyBytes caps one PromptTemplate body.
	MaxTemplateBodyBytes = 64 << 10
	// MaxTemplateSlots caps the slots of one PromptTemplate.
	MaxTemplateSlots = 256
	// MaxNameBytes caps namespaces, names and other identifiers.
	MaxNameBytes = 253
)

// PDTopology is one PDTopology CR, flattened by the controller: the
// metadata that names it and its spec. Pool and accelerator lists keep the
// CR's order.
type PDTopology struct {
	Namespace        string            `json:"namespace"`
	Name             string            `json:"name"`
	PrefillPools     []PDPool          `json:"prefillPools,omitempty"`
	DecodePools      []PDPool          `json:"decodePools,omitempty"`
	AcceleratorTypes []AcceleratorType `json:"acceleratorTypes,omitempty"`
	// Transport is the KV transfer the pools use: Mooncake, NIXL or
	// Direct; empty sends no transport hint.
	Transport string `json:"transport,omitempty"`
	// SkipPrefillBelowTokens: a request whose uncached part on the decode
	// replica is below it skips the prefill hop. Nil means
	// DefaultSkipPrefillBelowTokens; 0 never skips by size.
	SkipPrefillBelowTokens *int32 `json:"skipPrefillBelowTokens,omitempty"`
	// KVLocality is None, Node or Zone (empty: None): prefer a decode
	// replica on the prefill replica's node, or in its zone.
	KVLocality string `json:"kvLocality,omitempty"`
}

// PDPool is one prefill or decode pool of a PDTopology.
type PDPool struct {
	Name            string            `json:"name"`
	MatchLabels     map[string]string `json:"matchLabels,omitempty"`
	Replicas        *int32            `json:"replicas,omitempty"`
	AcceleratorType string            `json:"acceleratorType,omitempty"`
}

// AcceleratorType is one accelerator class of a PDTopology.
type AcceleratorType struct {
	Name        string            `json:"name"`
	Vendor      string            `json:"vendor,omitempty"`
	Model       string            `json:"model,omitempty"`
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// PromptTemplate is one PromptTemplate CR: its name, spec and
// status.templateRevision.
type PromptTemplate struct {
	Namespace string         `json:"namespace"`
	Name      string         `json:"name"`
	Body      string         `json:"body"`
	Slots     []TemplateSlot `json:"slots,omitempty"`
	// TemplateRevision is status.templateRevision; empty (a template the
	// controller has not reconciled yet) is computed by the server the
	// same way.
	TemplateRevision string `json:"templateRevision,omitempty"`
}

// TemplateSlot is one declared slot of a PromptTemplate.
type TemplateSlot struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Required    bool   `json:"required,omitempty"`
	Description string `json:"description,omitempty"`
}

// ErrInvalidEntry is wrapped by Decode's errors for a version-8 entry that
// breaks the schema.
var ErrInvalidEntry = errors.New("policy: invalid entry")

// VersionFor is the schema version a controller should send b at: 8 when b
// carries version-8 content (a PDTopology or a PromptTemplate), else 7.
// A cluster that uses neither thus pushes exactly what a v7 controller
// pushed, which every server since v7 accepts, and a rolling upgrade works
// in either order. A v7 server refuses a body that needs version 8 with
// HTTP 400 (its decoder stops at the first unknown field, `unknown field
// "pdTopologies"`, or at the version, "unsupported policy snapshot
// version"); on a 400 for a version-8 body the controller sends
// WithoutVersion8(b) once, so CachePolicy and CacheTenant state still
// reaches that server (docs/pd.md, "What the controller pushes").
func VersionFor(b *Body) int {
	if len(b.PDTopologies) > 0 || len(b.PromptTemplates) > 0 {
		return PropagationVersion
	}
	return 7
}

// WithoutVersion8 returns a shallow copy of b at version 7 without the
// version-8 lists, for a server that predates them.
func WithoutVersion8(b *Body) *Body {
	c := *b
	c.Version = 7
	c.PDTopologies, c.PromptTemplates = nil, nil
	return &c
}

// validateV8 checks the version-8 lists of a decoded body.
func validateV8(b *Body) error {
	if b.Version < 8 && (len(b.PDTopologies) > 0 || len(b.PromptTemplates) > 0) {
		return fmt.Errorf("%w: pdTopologies and promptTemplates need version 8, the body says %d", ErrInvalidEntry, b.Version)
	}
	for i := range b.PDTopologies {
		if err := validateTopology(&b.PDTopologies[i]); err != nil {
			return fmt.Errorf("%w: pdTopologies[%d]: %w", ErrInvalidEntry, i, err)
		}
	}
	for i := range b.PromptTemplates {
		if err := validateTemplate(&b.PromptTemplates[i]); err != nil {
			return fmt.Errorf("%w: promptTemplates[%d]: %w", ErrInvalidEntry, i, err)
		}
	}
	return nil
}

func validName(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty %s", what)
	case len(s) > MaxNameBytes:
		return fmt.Errorf("%s is %d bytes, over %d", what, len(s), MaxNameBytes)
	case strings.ContainsRune(s, '/'):
		return fmt.Errorf("%s %q contains '/'", what, s)
	}
	return nil
}

func validateTopology(t *PDTopology) error {
	if err := validName("namespace", t.Namespace); err != nil {
		return err
	}
	if err := validName("name", t.Name); err != nil {
		return err
	}
	switch t.Transport {
	case "", TransportMooncake, TransportNIXL, TransportDirect:
	default:
		return fmt.Errorf("%s/%s: transport %q: want Mooncake, NIXL or Direct", t.Namespace, t.Name, t.Transport)
	}
	switch t.KVLocality {
	case "", LocalityNone, LocalityNode, LocalityZone:
	default:
		return fmt.Errorf("%s/%s: kvLocality %q: want None, Node or Zone", t.Namespace, t.Name, t.KVLocality)
	}
	if v := t.SkipPrefillBelowTokens; v != nil && *v < 0 {
		return fmt.Errorf("%s/%s: negative skipPrefillBelowTokens %d", t.Namespace, t.Name, *v)
	}
	for side, pools := range map[string][]PDPool{"prefillPools": t.PrefillPools, "decodePools": t.DecodePools} {
		seen := map[string]bool{}
		for _, p := range pools {
			if err := validName(side+" name", p.Name); err != nil {
				return fmt.Errorf("%s/%s: %w", t.Namespace, t.Name, err)
			}
			if seen[p.Name] {
				return fmt.Errorf("%s/%s: %s name %q given twice", t.Namespace, t.Name, side, p.Name)
			}
			seen[p.Name] = true
			if p.Replicas != nil && *p.Replicas < 0 {
				return fmt.Errorf("%s/%s: %s %q: negative replicas", t.Namespace, t.Name, side, p.Name)
			}
		}
	}
	for _, a := range t.AcceleratorTypes {
		if err := validName("acceleratorTypes name", a.Name); err != nil {
			return fmt.Errorf("%s/%s: %w", t.Namespace, t.Name, err)
		}
	}
	return nil
}

func validateTemplate(t *PromptTemplate) error {
	if err := validName("namespace", t.Namespace); err != nil {
		return err
	}
	if err := validName("name", t.Name); err != nil {
		return err
	}
	switch {
	case t.Body == "":
		return fmt.Errorf("%s/%s: empty body", t.Namespace, t.Name)
	case len(t.Body) > MaxTemplateBodyBytes:
		return fmt.Errorf("%s/%s: body is %d bytes, over %d", t.Namespace, t.Name, len(t.Body), MaxTemplateBodyBytes)
	case !utf8.ValidString(t.Body):
		return fmt.Errorf("%s/%s: body is not UTF-8", t.Namespace, t.Name)
	case len(t.TemplateRevision) > MaxNameBytes:
		return fmt.Errorf("%s/%s: templateRevision is %d bytes, over %d", t.Namespace, t.Name, len(t.TemplateRevision), MaxNameBytes)
	case len(t.Slots) > MaxTemplateSlots:
		return fmt.Errorf("%s/%s: %d slots, over %d", t.Namespace, t.Name, len(t.Slots), MaxTemplateSlots)
	}
	seen := map[string]bool{}
	for _, s := range t.Slots {
		if err := validName("slot name", s.Name); err != nil {
			return fmt.Errorf("%s/%s: %w", t.Namespace, t.Name, err)
		}
		if seen[s.Name] {
			return fmt.Errorf("%s/%s: slot %q declared twice", t.Namespace, t.Name, s.Name)
		}
		seen[s.Name] = true
		if s.Type != SlotStable && s.Type != SlotMutable {
			return fmt.Errorf("%s/%s: slot %q: type %q, want Stable or Mutable", t.Namespace, t.Name, s.Name, s.Type)
		}
	}
	return nil
}

// Ref is the "namespace/name" key of a namespaced object.
func Ref(namespace, name string) string { return namespace + "/" + name }

// ResolveRef turns a request's object reference into its key: "ns/name" as
// is, a bare "name" in namespace ns (the tenant's). ok is false for an empty
// or malformed reference.
func ResolveRef(ref, ns string) (key string, ok bool) {
	switch i := strings.IndexByte(ref, '/'); {
	case ref == "":
		return "", false
	case i < 0:
		if ns == "" {
			return "", false
		}
		return Ref(ns, ref), true
	case i == 0 || i == len(ref)-1 || strings.IndexByte(ref[i+1:], '/') >= 0:
		return "", false
	default:
		return ref, true
	}
}

// Topology is a resolved PDTopology: the pushed entry plus its defaults.
// Immutable once published.
type Topology struct {
	*PDTopology
	// SkipBelow is SkipPrefillBelowTokens with the default applied.
	SkipBelow int32
	// Locality is KVLocality with "" read as None.
	Locality string
	// prefill and decode are the pool names of each side.
	prefill, decode map[string]bool
}

// HasPrefillPool reports whether the topology declares a prefill pool
// named pool; HasDecodePool, a decode pool.
func (t *Topology) HasPrefillPool(pool string) bool { return t.prefill[pool] }

// HasDecodePool: see HasPrefillPool.
func (t *Topology) HasDecodePool(pool string) bool { return t.decode[pool] }

func resolveTopology(p *PDTopology) *Topology {
	t := &Topology{PDTopology: p, SkipBelow: DefaultSkipPrefillBelowTokens, Locality: p.KVLocality,
		prefill: make(map[string]bool, len(p.PrefillPools)), decode: make(map[string]bool, len(p.DecodePools))}
	if p.SkipPrefillBelowTokens != nil {
		t.SkipBelow = *p.SkipPrefillBelowTokens
	}
	if t.Locality == "" {
		t.Locality = LocalityNone
	}
	for _, pl := range p.PrefillPools {
		t.prefill[pl.Name] = true
	}
	for _, pl := range p.DecodePools {
		t.decode[pl.Name] = true
	}
	return t
}

// TemplateRevision is the revision of a PromptTemplate spec, computed
// exactly as the controller computes status.templateRevision
// (operator/internal/controller TemplateRevision): the first 16 hex digits
// of SHA-256 over the body and then each slot's name, type, required flag
// ("true"/"false") and description, in order, each string preceded by its
// length as an 8-byte big-endian integer.
func TemplateRevision(body string, slots []TemplateSlot) string {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(body)
	for _, sl := range slots {
		field(sl.Name)
		field(sl.Type)
		field(strconv.FormatBool(sl.Required))
		field(sl.Description)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// Template is a resolved PromptTemplate: the pushed entry with its revision
// filled in. Immutable once published.
type Template struct {
	*PromptTemplate
	// Revision is TemplateRevision, or the pushed one when set.
	Revision string
}
