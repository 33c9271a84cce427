package claim

import (
	"slices"
	"strings"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// Roles a replica reports (the subscriber's --role; docs/pd.md).
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
	RoleBoth    = "both"
)

// PDPlacement is where a pod sits in disaggregated serving: its role and
// the pool it reports (empty: any pool of its role's side). The zero value
// means the pod is in no PDTopology pool, and reports no role.
type PDPlacement struct {
	Topology string // the PDTopology's name
	Role     string
	Pool     string
}

// poolSelects is a PDTopology pool's selection rule, the one the
// PDTopology status counts members by: every matchLabels entry is among
// the pod's labels; a pool without matchLabels selects nothing (an empty
// selector would claim every pod of the namespace).
func poolSelects(p v1alpha1.PDPool, labels map[string]string) bool {
	if len(p.MatchLabels) == 0 {
		return false
	}
	for k, v := range p.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// PlacementOf is the placement of a pod with labels among tops (the
// PDTopologies of its namespace): the first topology by name with a pool
// that selects the pod decides. Selected by prefill pools only the pod is a
// prefill replica, by decode pools only a decode replica, by both sides
// RoleBoth. The pool is named when exactly one pool of the topology
// selects the pod (or one per side, sharing the name); otherwise it is left
// empty and the pod serves any pool of its side, which is what the pools
// that select it have in common.
func PlacementOf(tops []v1alpha1.PDTopology, labels map[string]string) PDPlacement {
	order := make([]*v1alpha1.PDTopology, len(tops))
	for i := range tops {
		order[i] = &tops[i]
	}
	slices.SortFunc(order, func(a, b *v1alpha1.PDTopology) int { return strings.Compare(a.Name, b.Name) })
	for _, t := range order {
		if t.DeletionTimestamp != nil {
			continue
		}
		prefill := selecting(t.Spec.PrefillPools, labels)
		decode := selecting(t.Spec.DecodePools, labels)
		if len(prefill) == 0 && len(decode) == 0 {
			continue
		}
		pl := PDPlacement{Topology: t.Name}
		switch {
		case len(decode) == 0:
			pl.Role = RolePrefill
		case len(prefill) == 0:
			pl.Role = RoleDecode
		default:
			pl.Role = RoleBoth
		}
		names := slices.Compact(slices.Sorted(slices.Values(append(prefill, decode...))))
		if len(names) == 1 && len(prefill) <= 1 && len(decode) <= 1 {
			pl.Pool = names[0]
		}
		return pl
	}
	return PDPlacement{}
}

// selecting is the names of the pools that select labels.
func selecting(pools []v1alpha1.PDPool, labels map[string]string) []string {
	var out []string
	for _, p := range pools {
		if poolSelects(p, labels) {
			out = append(out, p.Name)
		}
	}
	return out
}
