package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/policy"
)

// propagationLimit bounds every wait for a change to reach the server: a
// watch event pushes at once, and the periodic push is one tick.
const propagationLimit = 15 * time.Second

func waitTenant(t *testing.T, id string, what string, ok func(*policy.Tenant) bool) {
	t.Helper()
	eventually(t, propagationLimit, func() error {
		if got := srv.tenant(id); !ok(got) {
			return fmt.Errorf("%s: server has %+v for %q", what, *got, id)
		}
		return nil
	})
}

// waitAccepted waits for the policy's Accepted condition to have reason and
// returns the condition.
func waitAccepted(t *testing.T, ctx context.Context, cp *v1alpha1.CachePolicy, reason string) metav1.Condition {
	t.Helper()
	var c metav1.Condition
	eventually(t, propagationLimit, func() error {
		var got v1alpha1.CachePolicy
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(cp), &got); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionAccepted)
		if cond == nil || cond.Reason != reason || got.Status.ObservedGeneration != got.Generation || cond.ObservedGeneration != got.Generation {
			return fmt.Errorf("%s status %+v, want reason %s at generation %d", cp.Name, got.Status, reason, got.Generation)
		}
		c = *cond
		return nil
	})
	return c
}

func waitEvent(t *testing.T, ctx context.Context, ns, regarding, reason, fragment string) {
	t.Helper()
	eventually(t, propagationLimit, func() error {
		var evs eventsv1.EventList
		if err := k8s.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == regarding && e.Reason == reason && e.Type == "Warning" && strings.Contains(e.Note, fragment) {
				return nil
			}
		}
		return fmt.Errorf("no Warning %s event on %s/%s among %d events", reason, ns, regarding, len(evs.Items))
	})
}

func TestPropagationCreateUpdateDelete(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "prop-a", false)
	cp := policyObj(ns, "policy", func(s *v1alpha1.CachePolicySpec) {
		s.Eviction = "LFU"
		s.EvictionTTL = &metav1.Duration{Duration: 15 * time.Minute}
		s.MinimumPrefixTokens = ptr(int32(32))
		s.MinimumMatchedTokens = ptr(int32(128))
		s.RoutingFloorScore = ptr("5")
		s.LookupTimeoutMs = ptr(int32(25))
		s.AffinityRouting = "Disabled"
		s.Strategy = &v1alpha1.CachePolicyStrategy{EnableTenantHot: ptr(false)}
	})
	wantOK(t, "create", k8s.Create(ctx, cp))
	waitTenant(t, ns, "created", func(g *policy.Tenant) bool {
		return g.HasPolicy && g.Eviction == policy.LFU && g.TTL == 15*time.Minute && g.MinimumPrefixTokens == 32 &&
			g.MinimumMatchedTokens == 128 && g.RoutingFloorScore == 5 && g.LookupTimeout == 25*time.Millisecond &&
			!g.AffinityRouting && g.EnableChainMatching && !g.RequireChain && !g.EnableTenantHot
	})
	c := waitAccepted(t, ctx, cp, v1alpha1.ReasonAccepted)
	if c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, ns) {
		t.Fatalf("accepted condition %+v", c)
	}

	wantOK(t, "update", update(ctx, cp, func(cp *v1alpha1.CachePolicy) {
		cp.Spec.Eviction = "LRU"
		cp.Spec.RoutingFloorScore = ptr("0")
		cp.Spec.MinimumMatchedTokens = ptr(int32(0))
		cp.Spec.AffinityRouting = "Enabled"
	}))
	waitTenant(t, ns, "updated", func(g *policy.Tenant) bool {
		return g.HasPolicy && g.Eviction == policy.LRU && g.RoutingFloorScore == 0 && g.MinimumMatchedTokens == 0 && g.AffinityRouting
	})
	waitAccepted(t, ctx, cp, v1alpha1.ReasonAccepted) // observedGeneration follows

	wantOK(t, "delete", k8s.Delete(ctx, cp))
	waitTenant(t, ns, "deleted", func(g *policy.Tenant) bool { return !g.HasPolicy && *g == policy.Defaults })
}

func TestPropagationConflictedAndInvalid(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "prop-dup", true) // legacy: the webhook would refuse these
	a := policyObj(ns, "a-zero-ttl", func(s *v1alpha1.CachePolicySpec) { s.EvictionTTL = &metav1.Duration{} })
	b := policyObj(ns, "b-lfu", func(s *v1alpha1.CachePolicySpec) { s.Eviction = "LFU" })
	c := policyObj(ns, "c-lru", func(s *v1alpha1.CachePolicySpec) { s.EvictionTTL = &metav1.Duration{Duration: time.Hour} })
	for _, p := range []*v1alpha1.CachePolicy{c, b, a} {
		wantOK(t, "create "+p.Name, k8s.Create(ctx, p))
	}
	// a is invalid and governs nothing; among the valid ones b wins.
	waitTenant(t, ns, "winner applied", func(g *policy.Tenant) bool {
		return g.HasPolicy && g.Eviction == policy.LFU && g.TTL == policy.DefaultTTL
	})
	inv := waitAccepted(t, ctx, a, v1alpha1.ReasonInvalid)
	if inv.Status != metav1.ConditionFalse || !strings.Contains(inv.Message, "spec.evictionTTL") {
		t.Fatalf("invalid condition %+v", inv)
	}
	waitAccepted(t, ctx, b, v1alpha1.ReasonAccepted)
	con := waitAccepted(t, ctx, c, v1alpha1.ReasonConflicted)
	if con.Status != metav1.ConditionFalse || !strings.Contains(con.Message, `"b-lfu"`) {
		t.Fatalf("conflicted condition %+v", con)
	}
	waitEvent(t, ctx, ns, "a-zero-ttl", v1alpha1.ReasonInvalid, "spec.evictionTTL")
	waitEvent(t, ctx, ns, "c-lru", v1alpha1.ReasonConflicted, `"b-lfu"`)

	// Deleting the winner hands the namespace to the next valid policy.
	wantOK(t, "delete winner", k8s.Delete(ctx, b))
	waitTenant(t, ns, "next winner", func(g *policy.Tenant) bool {
		return g.HasPolicy && g.Eviction == policy.LRU && g.TTL == time.Hour
	})
	waitAccepted(t, ctx, c, v1alpha1.ReasonAccepted)

	// A namespace whose only policy is invalid keeps the server defaults.
	ns2 := namespace(t, ctx, "prop-invalid", true)
	only := policyObj(ns2, "only", func(s *v1alpha1.CachePolicySpec) { s.EvictionTTL = &metav1.Duration{Duration: -time.Minute} })
	wantOK(t, "create invalid", k8s.Create(ctx, only))
	waitAccepted(t, ctx, only, v1alpha1.ReasonInvalid)
	before := srv.pushes.Load()
	eventually(t, propagationLimit, func() error {
		if srv.pushes.Load() < before+2 {
			return errNotYet
		}
		return nil
	})
	if g := srv.tenant(ns2); g.HasPolicy {
		t.Fatalf("invalid policy applied: %+v", *g)
	}
}

func TestPropagationTenants(t *testing.T) {
	ctx := needEnv(t)
	ns1 := namespace(t, ctx, "prop-t1", false)
	ns2 := namespace(t, ctx, "prop-t2", false)
	t1 := tenantObj(ns1, "acme", "prop-acme", ptr(int64(100)))
	wantOK(t, "tenant", k8s.Create(ctx, t1))
	waitTenant(t, "prop-acme", "quota", func(g *policy.Tenant) bool { return g.HasQuota && g.MaxIndexEntries == 100 })

	// The same id in a later namespace is shadowed: the first stays in force.
	t2 := tenantObj(ns2, "acme", "prop-acme", ptr(int64(5)))
	wantOK(t, "cross-namespace duplicate", k8s.Create(ctx, t2))
	before := srv.pushes.Load()
	eventually(t, propagationLimit, func() error {
		if srv.pushes.Load() < before+2 {
			return errNotYet
		}
		return nil
	})
	if g := srv.tenant("prop-acme"); g.MaxIndexEntries != 100 {
		t.Fatalf("shadowed duplicate took effect: %+v", *g)
	}

	wantOK(t, "update quota to 0", update(ctx, t1, func(t *v1alpha1.CacheTenant) { t.Spec.Quota.MaxIndexEntries = ptr(int64(0)) }))
	waitTenant(t, "prop-acme", "zero quota", func(g *policy.Tenant) bool { return g.HasQuota && g.MaxIndexEntries == 0 })

	// Removing the owner hands the id to the duplicate.
	wantOK(t, "delete owner", k8s.Delete(ctx, t1))
	waitTenant(t, "prop-acme", "duplicate takes over", func(g *policy.Tenant) bool { return g.HasQuota && g.MaxIndexEntries == 5 })
	wantOK(t, "delete duplicate", k8s.Delete(ctx, t2))
	waitTenant(t, "prop-acme", "no quota", func(g *policy.Tenant) bool { return !g.HasQuota })

	// A tenant without a quota is not sent.
	wantOK(t, "no-quota tenant", k8s.Create(ctx, tenantObj(ns1, "free", "prop-free", nil)))
	before = srv.pushes.Load()
	eventually(t, propagationLimit, func() error {
		if srv.pushes.Load() < before+2 {
			return errNotYet
		}
		return nil
	})
	for _, q := range srv.store.Load().Load().QuotaTenants() {
		if q == "prop-free" {
			t.Fatal("tenant without quota was pushed")
		}
	}
}

func TestPropagationServerRestartAndTokenRotation(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "prop-restart", false)
	wantOK(t, "create", k8s.Create(ctx, policyObj(ns, "p", func(s *v1alpha1.CachePolicySpec) { s.Eviction = "LFU" })))
	waitTenant(t, ns, "before restart", func(g *policy.Tenant) bool { return g.HasPolicy && g.Eviction == policy.LFU })

	// A restarted server starts empty; the next periodic push restores it.
	if err := srv.restart(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if g := srv.tenant(ns); g.HasPolicy {
		t.Fatal("fresh store is not empty")
	}
	waitTenant(t, ns, "after restart", func(g *policy.Tenant) bool { return g.HasPolicy && g.Eviction == policy.LFU })
	// One tick plus scheduling slack (2 cores, race detector).
	if d := time.Since(start); d > tick+3*time.Second {
		t.Fatalf("re-sync took %s, want within one tick (%s) plus slack", d, tick)
	}

	// The projected token is re-read on every push: a token of the wrong
	// audience is refused by the server's audience gate, and the next
	// rotated, correct token is used as soon as the file changes.
	wrong, err := issueToken(ctx, controllerAud)
	wantOK(t, "issue token", err)
	unauth := srv.policyAuth.unauth.Load()
	writeToken("policy", wrong)
	eventually(t, propagationLimit, func() error {
		if srv.policyAuth.unauth.Load() == unauth {
			return fmt.Errorf("controller-audience token not yet refused on /policy")
		}
		return nil
	})
	fresh, err := issueToken(ctx, policyAud)
	wantOK(t, "issue token", err)
	writeToken("policy", fresh)
	pushes := srv.pushes.Load()
	eventually(t, propagationLimit, func() error {
		if srv.pushes.Load() <= pushes {
			return fmt.Errorf("no push with the rotated token yet")
		}
		return nil
	})
}
