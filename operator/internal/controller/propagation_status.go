package controller

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// maxErrorLen bounds a server's error as status quotes it.
const maxErrorLen = 512

// pushReport is the outcome of one pass's push.
type pushReport struct {
	// Target is v1alpha1.PropagationTargetEndpointSlices or
	// v1alpha1.PropagationTargetAddress.
	Target string
	// Service is the server Service, with Target EndpointSlices.
	Service types.NamespacedName
	// Results has one entry per server pushed to, sorted by name.
	Results []pushResult
}

// PropagationStatus adds the outcome of the pass's push to st, the status
// PolicyStatus computed for cp. Only an Accepted policy is pushed, so only
// one has the Propagated condition and status.propagation; they are removed
// from any other (and left alone when rep is nil: nothing was pushed).
//
// Per server, the generation it last acknowledged and when it first did are
// carried over from the current status, so a periodic re-push that changes
// nothing leaves the status equal and unwritten; so is the time its pushes
// started failing.
func PropagationStatus(cp *v1alpha1.CachePolicy, st v1alpha1.CachePolicyStatus, v PolicyVerdict, rep *pushReport, now metav1.Time) v1alpha1.CachePolicyStatus {
	if v.Reason != v1alpha1.ReasonAccepted {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionPropagated)
		st.Propagation = nil
		return st
	}
	if rep == nil {
		return st
	}
	prev := map[string]*v1alpha1.ServerPropagation{}
	if p := st.Propagation; p != nil && p.Target == rep.Target {
		for i := range p.Servers {
			prev[p.Servers[i].Name] = &p.Servers[i]
		}
	}
	gen := cp.Generation
	prop := &v1alpha1.PolicyPropagation{Target: rep.Target, ReadyServers: int32(len(rep.Results))}
	var failed []pushResult
	for _, r := range rep.Results {
		e := v1alpha1.ServerPropagation{Name: r.server.Name, Address: r.server.Address}
		old := prev[e.Name]
		if old != nil {
			e.PushedGeneration, e.AcknowledgedTime = old.PushedGeneration, old.AcknowledgedTime
		}
		if r.err == nil {
			prop.AcknowledgedServers++
			if e.PushedGeneration != gen || e.AcknowledgedTime == nil {
				e.PushedGeneration, e.AcknowledgedTime = gen, &now
			}
		} else {
			failed = append(failed, r)
			e.Error = truncate(r.err.Error(), maxErrorLen)
			e.FailingSince = &now
			if old != nil && old.FailingSince != nil {
				e.FailingSince = old.FailingSince
			}
		}
		prop.Servers = append(prop.Servers, e)
	}
	slices.SortFunc(prop.Servers, func(a, b v1alpha1.ServerPropagation) int {
		if fa, fb := a.Error != "", b.Error != ""; fa != fb {
			if fa {
				return -1 // the servers that did not acknowledge first
			}
			return 1
		}
		return cmp.Compare(a.Name, b.Name)
	})
	if len(prop.Servers) > v1alpha1.MaxPropagationServers {
		prop.Servers = prop.Servers[:v1alpha1.MaxPropagationServers]
	}
	st.Propagation = prop
	meta.SetStatusCondition(&st.Conditions, propagatedCondition(gen, rep, prop.AcknowledgedServers, failed))
	return st
}

// TenantPropagationStatus adds the outcome of the pass's push to st, the
// status of CacheTenant t: the Propagated condition when t's quota is in the
// pushed body (res.Pushed), none otherwise (and st is left alone when rep is
// nil: nothing was pushed). Unlike a CachePolicy, a tenant carries no
// per-server status.propagation; the condition's message names a failing
// server and its error.
func TenantPropagationStatus(t *v1alpha1.CacheTenant, st v1alpha1.CacheTenantStatus, res TenantResolution, rep *pushReport) v1alpha1.CacheTenantStatus {
	st = *st.DeepCopy()
	if !res.Pushed(t) {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionPropagated)
		return st
	}
	if rep == nil {
		return st
	}
	var (
		acked  int32
		failed []pushResult
	)
	for _, r := range rep.Results {
		if r.err == nil {
			acked++
		} else {
			failed = append(failed, r)
		}
	}
	slices.SortFunc(failed, func(a, b pushResult) int { return cmp.Compare(a.server.Name, b.server.Name) })
	meta.SetStatusCondition(&st.Conditions, propagatedCondition(t.Generation, rep, acked, failed))
	return st
}

// propagatedCondition is the Propagated condition for a push that reached
// acked of the servers in rep, failed being the others.
func propagatedCondition(gen int64, rep *pushReport, acked int32, failed []pushResult) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.ConditionPropagated, ObservedGeneration: gen, Status: metav1.ConditionFalse}
	where := "server pods of Service " + nsName(rep.Service)
	switch {
	case len(rep.Results) == 0:
		c.Reason = v1alpha1.ReasonNoReadyServers
		c.Message = fmt.Sprintf("the EndpointSlices of Service %s list no ready server endpoint; nothing was pushed, the next ready pod gets generation %d at once",
			nsName(rep.Service), gen)
	case len(failed) == 0 && rep.Target == v1alpha1.PropagationTargetAddress:
		c.Status, c.Reason = metav1.ConditionTrue, v1alpha1.ReasonAddressAcknowledged
		c.Message = fmt.Sprintf("the server at %s acknowledged generation %d; the server pods behind that address are not enumerated (the server Service's EndpointSlices are not read)",
			rep.Results[0].server.Address, gen)
	case len(failed) == 0:
		c.Status, c.Reason = metav1.ConditionTrue, v1alpha1.ReasonPropagated
		c.Message = fmt.Sprintf("all %d ready %s acknowledged generation %d", len(rep.Results), where, gen)
	default:
		first := failed[0]
		why := fmt.Sprintf("%s (%s): %s", first.server.Name, first.server.Address, truncate(first.err.Error(), maxErrorLen))
		if n := len(failed) - 1; n > 0 {
			why += fmt.Sprintf("; and %d more, see status.propagation.servers", n)
		}
		if acked > 0 {
			c.Reason = v1alpha1.ReasonPartiallyPropagated
			c.Message = fmt.Sprintf("%d of %d ready %s acknowledged generation %d; not acknowledged by %s",
				acked, len(rep.Results), where, gen, why)
		} else {
			c.Reason = v1alpha1.ReasonPushFailed
			c.Message = "no server acknowledged generation " + fmt.Sprint(gen) + ": " + why
		}
	}
	return c
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return strings.TrimSpace(s[:cut]) + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
