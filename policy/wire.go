package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Schema versions of the /policy body.
//
// Version history: 2 added tenants; 3 policies[].eviction; 4
// minimumMatchedTokens; 5 routingFloorScore; 6 strategy; 7 affinityRouting;
// 8 pdTopologies and promptTemplates (pd.go). Versions 4 to 8 are additive
// and defaultable, so the server accepts any version in
// [MinimumAcceptedVersion, PropagationVersion] and normalizes the fields an
// older body could not have carried. The version rule for a controller is
// VersionFor.
const (
	PropagationVersion     = 8
	MinimumAcceptedVersion = 3
)

// MaxBodyBytes caps a /policy body.
const MaxBodyBytes = 1 << 20

// ReservedTenantID is the tenant the server's functional self-test writes
// under. It never receives a quota and real traffic cannot reach it.
const ReservedTenantID = "inferencecache.io/probe"

// Defaults for tenants without a CachePolicy (and, for the pointer fields,
// for a CachePolicy whose field is absent). Both sides of the wire use them.
const (
	DefaultTTL                    = 30 * time.Minute
	DefaultMinimumMatchedTokens   = int32(64)
	DefaultRoutingFloorScore      = float32(0.1)
	DefaultEnableChainMatching    = true
	DefaultRequireChain           = false
	DefaultEnableTenantHot        = true
	DefaultAffinityRoutingEnabled = true
	DefaultIsolationMode          = "Fairness"
)

// Body is the complete replace-on-write payload of POST /policy.
type Body struct {
	Version  int              `json:"version"`
	Policies []ResolvedPolicy `json:"policies"`
	Tenants  []ResolvedTenant `json:"tenants,omitempty"`
	// PDTopologies and PromptTemplates are version 8 (pd.go).
	PDTopologies    []PDTopology     `json:"pdTopologies,omitempty"`
	PromptTemplates []PromptTemplate `json:"promptTemplates,omitempty"`
}

// ResolvedPolicy is one namespace's CachePolicy, flattened by the controller.
// Every field but Namespace is omitempty; the pointer fields distinguish an
// absent field (nil: use the default) from an explicit zero (an opt-out).
type ResolvedPolicy struct {
	Namespace            string          `json:"namespace"`
	EvictionTTL          time.Duration   `json:"evictionTTL,omitempty"`
	MinimumPrefixTokens  int32           `json:"minimumPrefixTokens,omitempty"`
	MinimumMatchedTokens int32           `json:"minimumMatchedTokens,omitempty"`
	RoutingFloorScore    *float32        `json:"routingFloorScore,omitempty"`
	LookupTimeoutMs      int32           `json:"lookupTimeoutMs,omitempty"`
	AffinityRouting      *bool           `json:"affinityRouting,omitempty"`
	Eviction             string          `json:"eviction,omitempty"`
	Strategy             *LookupStrategy `json:"strategy,omitempty"`
}

// LookupStrategy holds the LookupRoute strategy gates. Nil fields take the
// defaults true / false / true.
type LookupStrategy struct {
	EnableChainMatching *bool `json:"enableChainMatching,omitempty"`
	RequireChain        *bool `json:"requireChain,omitempty"`
	EnableTenantHot     *bool `json:"enableTenantHot,omitempty"`
}

// ResolvedTenant is one quota-bearing CacheTenant, keyed by tenant id.
type ResolvedTenant struct {
	TenantID        string `json:"tenantID"`
	MaxIndexEntries int64  `json:"maxIndexEntries"`
	IsolationMode   string `json:"isolationMode,omitempty"`
}

// Decode errors. Each wraps enough context to name the problem in an HTTP 400.
var (
	ErrTooLarge           = errors.New("policy: body exceeds 1 MiB")
	ErrUnsupportedVersion = errors.New("policy: unsupported policy snapshot version")
	ErrTrailingData       = errors.New("policy: trailing data after the JSON object")
	ErrEmptyBody          = errors.New("policy: empty body")
)

// Decode reads one /policy body from r, rejecting unknown fields, trailing
// content, bodies over MaxBodyBytes, versions outside
// [MinimumAcceptedVersion, PropagationVersion] and version-8 entries that
// break their schema (ErrInvalidEntry), and normalizes the fields an older
// version could not carry (see Normalize).
func Decode(r io.Reader) (*Body, error) {
	raw, err := io.ReadAll(io.LimitReader(r, MaxBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("policy: cannot read body: %w", err)
	}
	if len(raw) > MaxBodyBytes {
		return nil, ErrTooLarge
	}
	return decodeBytes(raw)
}

// jsonSpace is the whitespace JSON allows between tokens. (bytes.TrimSpace
// would also strip Unicode spaces such as U+00A0, which are not JSON
// whitespace: such a body is invalid JSON, not an empty one.)
const jsonSpace = " \t\r\n"

// decodeBytes is Decode without the size limit (the caller enforces it).
func decodeBytes(raw []byte) (*Body, error) {
	if len(bytes.Trim(raw, jsonSpace)) == 0 {
		return nil, ErrEmptyBody
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var b Body
	if err := dec.Decode(&b); err != nil {
		return nil, fmt.Errorf("policy: invalid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, ErrTrailingData
	}
	if b.Version < MinimumAcceptedVersion || b.Version > PropagationVersion {
		return nil, fmt.Errorf("%w %d (accepted %d to %d)", ErrUnsupportedVersion, b.Version, MinimumAcceptedVersion, PropagationVersion)
	}
	if err := validateV8(&b); err != nil {
		return nil, err
	}
	Normalize(&b)
	return &b, nil
}

// Normalize fills the fields that a body of an older schema version could not
// have carried, so the stored shape is the same whichever side of a rollout
// the body came from. Version 7 and 8 bodies are left exactly as written,
// so an explicit opt-out (0, false) survives. (The version-8 lists need no
// normalization: an older body cannot carry them, and absent means none.)
//
//	v < 4: minimumMatchedTokens 0 -> 64
//	v < 5: nil routingFloorScore -> 0.1
//	v < 6: nil strategy fields -> true / false / true
//	v < 7: nil affinityRouting -> true
func Normalize(b *Body) {
	for i := range b.Policies {
		p := &b.Policies[i]
		if b.Version < 4 && p.MinimumMatchedTokens == 0 {
			p.MinimumMatchedTokens = DefaultMinimumMatchedTokens
		}
		if b.Version < 5 && p.RoutingFloorScore == nil {
			v := DefaultRoutingFloorScore
			p.RoutingFloorScore = &v
		}
		if b.Version < 6 {
			if p.Strategy == nil {
				p.Strategy = &LookupStrategy{}
			}
			if p.Strategy.EnableChainMatching == nil {
				p.Strategy.EnableChainMatching = ptr(DefaultEnableChainMatching)
			}
			if p.Strategy.RequireChain == nil {
				p.Strategy.RequireChain = ptr(DefaultRequireChain)
			}
			if p.Strategy.EnableTenantHot == nil {
				p.Strategy.EnableTenantHot = ptr(DefaultEnableTenantHot)
			}
		}
		if b.Version < 7 && p.AffinityRouting == nil {
			p.AffinityRouting = ptr(DefaultAffinityRoutingEnabled)
		}
	}
}

func ptr[T any](v T) *T { return &v }
