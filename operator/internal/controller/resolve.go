package controller

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
	"github.com/inferencecache/inferencecache/policy"
)

// This file is the deterministic core of propagation: it turns the listed
// CachePolicies and CacheTenants into the /policy body and into a verdict per
// object. It does no I/O and does not depend on list order.

// PolicyVerdict is the controller's judgement of one CachePolicy.
type PolicyVerdict struct {
	// Reason is ReasonAccepted, ReasonConflicted or ReasonInvalid.
	Reason string
	// Winner is the policy that governs the namespace when Reason is
	// ReasonConflicted.
	Winner types.NamespacedName
	// Errors are the fields that cannot be honored when Reason is
	// ReasonInvalid.
	Errors field.ErrorList
}

// ResolvePolicies picks the CachePolicy that governs each namespace and
// flattens it to the wire.
//
// A policy with a field the server cannot honor (validation.CachePolicySpec)
// governs nothing and is Invalid. Among the valid policies of a namespace the
// first by name wins; the others are Conflicted. The result is sorted by
// namespace.
func ResolvePolicies(items []v1alpha1.CachePolicy) ([]policy.ResolvedPolicy, map[types.NamespacedName]PolicyVerdict) {
	sorted := make([]*v1alpha1.CachePolicy, len(items))
	for i := range items {
		sorted[i] = &items[i]
	}
	slices.SortFunc(sorted, func(a, b *v1alpha1.CachePolicy) int { return compareNamespacedName(a, b) })
	verdicts := make(map[types.NamespacedName]PolicyVerdict, len(items))
	var wire []policy.ResolvedPolicy
	winners := map[string]types.NamespacedName{}
	for _, cp := range sorted {
		key := client.ObjectKeyFromObject(cp)
		if errs := validation.CachePolicySpec(&cp.Spec, field.NewPath("spec")); len(errs) > 0 {
			verdicts[key] = PolicyVerdict{Reason: v1alpha1.ReasonInvalid, Errors: errs}
			continue
		}
		if w, ok := winners[cp.Namespace]; ok {
			verdicts[key] = PolicyVerdict{Reason: v1alpha1.ReasonConflicted, Winner: w}
			continue
		}
		winners[cp.Namespace] = key
		verdicts[key] = PolicyVerdict{Reason: v1alpha1.ReasonAccepted}
		wire = append(wire, FlattenPolicy(cp))
	}
	return wire, verdicts
}

// FlattenPolicy maps a CachePolicy to its wire form. Absent fields take the
// CRD defaults, so the body says exactly what is in effect:
//
//   - eviction is lower-cased, default "lru";
//   - evictionTTL is sent only when positive (else the server default);
//   - routingFloorScore is parsed as float32; an unparseable, NaN, infinite
//     or negative value becomes 0.1 (ResolvePolicies never lets one through,
//     it reports the policy Invalid instead);
//   - affinityRouting Enabled is true, Disabled false, absent true;
//   - strategy is always sent with all three gates resolved.
func FlattenPolicy(cp *v1alpha1.CachePolicy) policy.ResolvedPolicy {
	s := &cp.Spec
	rp := policy.ResolvedPolicy{
		Namespace:            cp.Namespace,
		Eviction:             strings.ToLower(string(cmp.Or(s.Eviction, v1alpha1.EvictionLRU))),
		MinimumMatchedTokens: policy.DefaultMinimumMatchedTokens,
	}
	if s.EvictionTTL != nil && s.EvictionTTL.Duration > 0 {
		rp.EvictionTTL = s.EvictionTTL.Duration
	}
	if s.MinimumPrefixTokens != nil {
		rp.MinimumPrefixTokens = max(*s.MinimumPrefixTokens, 0)
	}
	if s.MinimumMatchedTokens != nil {
		rp.MinimumMatchedTokens = max(*s.MinimumMatchedTokens, 0)
	}
	if s.LookupTimeoutMs != nil {
		rp.LookupTimeoutMs = max(*s.LookupTimeoutMs, 0)
	}
	floor := policy.DefaultRoutingFloorScore
	if s.RoutingFloorScore != nil {
		if v, err := validation.ParseRoutingFloorScore(*s.RoutingFloorScore); err == nil {
			floor = v
		}
	}
	rp.RoutingFloorScore = &floor
	affinity := s.AffinityRouting != v1alpha1.AffinityRoutingDisabled
	rp.AffinityRouting = &affinity
	st := policy.LookupStrategy{
		EnableChainMatching: ptr(policy.DefaultEnableChainMatching),
		RequireChain:        ptr(policy.DefaultRequireChain),
		EnableTenantHot:     ptr(policy.DefaultEnableTenantHot),
	}
	if in := s.Strategy; in != nil {
		if in.EnableChainMatching != nil {
			st.EnableChainMatching = ptr(*in.EnableChainMatching)
		}
		if in.RequireChain != nil {
			st.RequireChain = ptr(*in.RequireChain)
		}
		if in.EnableTenantHot != nil {
			st.EnableTenantHot = ptr(*in.EnableTenantHot)
		}
	}
	rp.Strategy = &st
	return rp
}

// TenantResolution is which CacheTenant owns each tenant id.
type TenantResolution struct {
	// Wire is one entry per quota-bearing tenant id, sorted by tenant id.
	Wire []policy.ResolvedTenant
	// Owner maps a tenant id to the CacheTenant that owns it.
	Owner map[string]types.NamespacedName
}

// ResolveTenants deduplicates CacheTenants by spec.tenantID. The owner of a
// tenant id is the first by (namespace, name) among the CacheTenants with a
// quota, or, when none has one, the first by (namespace, name) of all. Every
// other CacheTenant with that id is shadowed: it is not enforced and reports
// DuplicateTenantID. Only owners with a quota reach the wire; the reserved
// probe tenant never does.
func ResolveTenants(items []v1alpha1.CacheTenant) TenantResolution {
	sorted := make([]*v1alpha1.CacheTenant, len(items))
	for i := range items {
		sorted[i] = &items[i]
	}
	hasQuota := func(t *v1alpha1.CacheTenant) bool {
		return t.Spec.Quota != nil && t.Spec.Quota.MaxIndexEntries != nil
	}
	// Quota-bearing first, then (namespace, name): the first seen per id wins.
	slices.SortFunc(sorted, func(a, b *v1alpha1.CacheTenant) int {
		if qa, qb := hasQuota(a), hasQuota(b); qa != qb {
			if qa {
				return -1
			}
			return 1
		}
		return compareNamespacedName(a, b)
	})
	res := TenantResolution{Owner: make(map[string]types.NamespacedName, len(items))}
	for _, t := range sorted {
		id := t.Spec.TenantID
		if _, taken := res.Owner[id]; taken || id == "" {
			continue
		}
		res.Owner[id] = client.ObjectKeyFromObject(t)
		if hasQuota(t) && id != policy.ReservedTenantID {
			res.Wire = append(res.Wire, policy.ResolvedTenant{
				TenantID:        id,
				MaxIndexEntries: max(*t.Spec.Quota.MaxIndexEntries, 0),
				IsolationMode:   string(cmp.Or(t.Spec.IsolationMode, v1alpha1.IsolationFairness)),
			})
		}
	}
	slices.SortFunc(res.Wire, func(a, b policy.ResolvedTenant) int { return cmp.Compare(a.TenantID, b.TenantID) })
	return res
}

// Pushed reports whether t's quota is in the pushed body: t owns its tenant
// id and carries spec.quota.maxIndexEntries.
func (res TenantResolution) Pushed(t *v1alpha1.CacheTenant) bool {
	id := t.Spec.TenantID
	if res.Owner[id] != client.ObjectKeyFromObject(t) {
		return false
	}
	_, found := slices.BinarySearchFunc(res.Wire, id, func(w policy.ResolvedTenant, id string) int { return cmp.Compare(w.TenantID, id) })
	return found
}

// BuildBody assembles the version-7 /policy body.
func BuildBody(policies []policy.ResolvedPolicy, tenants []policy.ResolvedTenant) *policy.Body {
	if policies == nil {
		policies = []policy.ResolvedPolicy{}
	}
	b := &policy.Body{Policies: policies, Tenants: tenants}
	// Version 7 unless the body carries a version-8 list: a server that
	// predates schema 8 keeps accepting what the controller pushes.
	b.Version = policy.VersionFor(b)
	return b
}

// compareNamespacedName orders objects by (namespace, name), the order in
// which the first CachePolicy of a namespace and the first CacheTenant of a
// tenant id win.
func compareNamespacedName(a, b metav1.Object) int {
	return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
}

func ptr[T any](v T) *T { return &v }

func nsName(n types.NamespacedName) string { return fmt.Sprintf("%s/%s", n.Namespace, n.Name) }
