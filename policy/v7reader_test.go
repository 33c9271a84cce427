package policy

// This file is the /policy decoder of a version-7 server, frozen as it was
// shipped (policy/wire.go before version 8, identifiers prefixed v7): the
// "older reader" the version rule of VersionFor is tested against
// (TestOlderReader). Do not edit it to follow wire.go.

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
// minimumMatchedTokens; 5 routingFloorScore; 6 strategy; 7 affinityRouting.
// Versions 4 to 7 are additive and defaultable, so the server accepts any
// version in [v7MinimumAcceptedVersion, v7PropagationVersion] and normalizes the
// fields an older body could not have carried.
const (
	v7PropagationVersion     = 7
	v7MinimumAcceptedVersion = 3
)

// v7MaxBodyBytes caps a /policy body.
const v7MaxBodyBytes = 1 << 20

// Defaults for tenants without a CachePolicy (and, for the pointer fields,
// for a CachePolicy whose field is absent). Both sides of the wire use them.
const (
	v7DefaultTTL                    = 30 * time.Minute
	v7DefaultMinimumMatchedTokens   = int32(64)
	v7DefaultRoutingFloorScore      = float32(0.1)
	v7DefaultEnableChainMatching    = true
	v7DefaultRequireChain           = false
	v7DefaultEnableTenantHot        = true
	v7DefaultAffinityRoutingEnabled = true
	v7DefaultIsolationMode          = "Fairness"
)

// v7Body is the complete replace-on-write payload of POST /policy.
type v7Body struct {
	Version  int                `json:"version"`
	Policies []v7ResolvedPolicy `json:"policies"`
	Tenants  []v7ResolvedTenant `json:"tenants,omitempty"`
}

// v7ResolvedPolicy is one namespace's CachePolicy, flattened by the controller.
// Every field but Namespace is omitempty; the pointer fields distinguish an
// absent field (nil: use the default) from an explicit zero (an opt-out).
type v7ResolvedPolicy struct {
	Namespace            string            `json:"namespace"`
	EvictionTTL          time.Duration     `json:"evictionTTL,omitempty"`
	MinimumPrefixTokens  int32             `json:"minimumPrefixTokens,omitempty"`
	MinimumMatchedTokens int32             `json:"minimumMatchedTokens,omitempty"`
	RoutingFloorScore    *float32          `json:"routingFloorScore,omitempty"`
	LookupTimeoutMs      int32             `json:"lookupTimeoutMs,omitempty"`
	AffinityRouting      *bool             `json:"affinityRouting,omitempty"`
	Eviction             string            `json:"eviction,omitempty"`
	Strategy             *v7LookupStrategy `json:"strategy,omitempty"`
}

// v7LookupStrategy holds the LookupRoute strategy gates. Nil fields take the
// defaults true / false / true.
type v7LookupStrategy struct {
	EnableChainMatching *bool `json:"enableChainMatching,omitempty"`
	RequireChain        *bool `json:"requireChain,omitempty"`
	EnableTenantHot     *bool `json:"enableTenantHot,omitempty"`
}

// v7ResolvedTenant is one quota-bearing CacheTenant, keyed by tenant id.
type v7ResolvedTenant struct {
	TenantID        string `json:"tenantID"`
	MaxIndexEntries int64  `json:"maxIndexEntries"`
	IsolationMode   string `json:"isolationMode,omitempty"`
}

// v7Decode errors. Each wraps enough context to name the problem in an HTTP 400.
var (
	errV7TooLarge           = errors.New("policy: body exceeds 1 MiB")
	errV7UnsupportedVersion = errors.New("policy: unsupported policy snapshot version")
	errV7TrailingData       = errors.New("policy: trailing data after the JSON object")
	errV7EmptyBody          = errors.New("policy: empty body")
)

// v7Decode reads one /policy body from r, rejecting unknown fields, trailing
// content, bodies over v7MaxBodyBytes and versions outside
// [v7MinimumAcceptedVersion, v7PropagationVersion], and normalizes the fields an
// older version could not carry (see v7Normalize).
func v7Decode(r io.Reader) (*v7Body, error) {
	raw, err := io.ReadAll(io.LimitReader(r, v7MaxBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("policy: cannot read body: %w", err)
	}
	if len(raw) > v7MaxBodyBytes {
		return nil, errV7TooLarge
	}
	return v7DecodeBytes(raw)
}

// v7JsonSpace is the whitespace JSON allows between tokens. (bytes.TrimSpace
// would also strip Unicode spaces such as U+00A0, which are not JSON
// whitespace: such a body is invalid JSON, not an empty one.)
const v7JsonSpace = " \t\r\n"

// v7DecodeBytes is v7Decode without the size limit (the caller enforces it).
func v7DecodeBytes(raw []byte) (*v7Body, error) {
	if len(bytes.Trim(raw, v7JsonSpace)) == 0 {
		return nil, errV7EmptyBody
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var b v7Body
	if err := dec.Decode(&b); err != nil {
		return nil, fmt.Errorf("policy: invalid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errV7TrailingData
	}
	if b.Version < v7MinimumAcceptedVersion || b.Version > v7PropagationVersion {
		return nil, fmt.Errorf("%w %d (accepted %d to %d)", errV7UnsupportedVersion, b.Version, v7MinimumAcceptedVersion, v7PropagationVersion)
	}
	v7Normalize(&b)
	return &b, nil
}

// v7Normalize fills the fields that a body of an older schema version could not
// have carried, so the stored shape is the same whichever side of a rollout
// the body came from. Version 7 bodies are left exactly as written, so an
// explicit opt-out (0, false) survives.
//
//	v < 4: minimumMatchedTokens 0 -> 64
//	v < 5: nil routingFloorScore -> 0.1
//	v < 6: nil strategy fields -> true / false / true
//	v < 7: nil affinityRouting -> true
func v7Normalize(b *v7Body) {
	for i := range b.Policies {
		p := &b.Policies[i]
		if b.Version < 4 && p.MinimumMatchedTokens == 0 {
			p.MinimumMatchedTokens = v7DefaultMinimumMatchedTokens
		}
		if b.Version < 5 && p.RoutingFloorScore == nil {
			v := v7DefaultRoutingFloorScore
			p.RoutingFloorScore = &v
		}
		if b.Version < 6 {
			if p.Strategy == nil {
				p.Strategy = &v7LookupStrategy{}
			}
			if p.Strategy.EnableChainMatching == nil {
				p.Strategy.EnableChainMatching = v7Ptr(v7DefaultEnableChainMatching)
			}
			if p.Strategy.RequireChain == nil {
				p.Strategy.RequireChain = v7Ptr(v7DefaultRequireChain)
			}
			if p.Strategy.EnableTenantHot == nil {
				p.Strategy.EnableTenantHot = v7Ptr(v7DefaultEnableTenantHot)
			}
		}
		if b.Version < 7 && p.AffinityRouting == nil {
			p.AffinityRouting = v7Ptr(v7DefaultAffinityRoutingEnabled)
		}
	}
}

func v7Ptr[T any](v T) *T { return &v }
