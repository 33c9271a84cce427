package integration

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// TestPropagatedFollowsServer: Accepted judges only the spec, Propagated
// reports the push. While the real control server refuses /policy, then
// while nothing listens at its address, a CachePolicy and a quota-bearing
// CacheTenant stay Accepted / Ready but show Propagated=False (PushFailed,
// with the server's error); once it serves again both become True.
func TestPropagatedFollowsServer(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "prop-honest", false)
	cp := policyObj(ns, "p", nil)
	wantOK(t, "create policy", k8s.Create(ctx, cp))
	ten := tenantObj(ns, "t", "honest-tenant", ptr(int64(100)))
	wantOK(t, "create tenant", k8s.Create(ctx, ten))
	unquoted := tenantObj(ns, "u", "honest-unbounded", nil)
	wantOK(t, "create tenant without quota", k8s.Create(ctx, unquoted))

	stopped := false
	t.Cleanup(func() {
		srv.refuse.Store(nil)
		if stopped {
			if err := srv.start(); err != nil {
				t.Errorf("restart the shared server: %v", err)
			}
		}
	})

	// want waits until both objects' Propagated condition has status and
	// reason and its message contains fragment, while the policy stays
	// Accepted.
	want := func(what string, status metav1.ConditionStatus, fragment string, reasons ...string) {
		t.Helper()
		eventually(t, propagationLimit, func() error {
			var p v1alpha1.CachePolicy
			var tn v1alpha1.CacheTenant
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(cp), &p); err != nil {
				return err
			}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(ten), &tn); err != nil {
				return err
			}
			if a := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionAccepted); a == nil || a.Status != metav1.ConditionTrue {
				return fmt.Errorf("%s: policy not Accepted: %+v", what, a)
			}
			for name, conds := range map[string][]metav1.Condition{"policy": p.Status.Conditions, "tenant": tn.Status.Conditions} {
				c := meta.FindStatusCondition(conds, v1alpha1.ConditionPropagated)
				if c == nil {
					return fmt.Errorf("%s: %s has no Propagated condition", what, name)
				}
				okReason := false
				for _, r := range reasons {
					okReason = okReason || c.Reason == r
				}
				if c.Status != status || !okReason || !strings.Contains(c.Message, fragment) {
					return fmt.Errorf("%s: %s Propagated %s/%s %q, want %s/%v with %q", what, name, c.Status, c.Reason, c.Message, status, reasons, fragment)
				}
			}
			return nil
		})
	}
	acked := []string{v1alpha1.ReasonPropagated, v1alpha1.ReasonAddressAcknowledged}
	want("serving", metav1.ConditionTrue, "acknowledged generation 1", acked...)

	refusal := "policy store is read-only (test refusal)"
	srv.refuse.Store(&refusal)
	want("refusing", metav1.ConditionFalse, refusal, v1alpha1.ReasonPushFailed)

	srv.refuse.Store(nil)
	srv.stop()
	stopped = true
	want("unreachable", metav1.ConditionFalse, "connection refused", v1alpha1.ReasonPushFailed)

	wantOK(t, "restart server", srv.start())
	stopped = false
	want("back", metav1.ConditionTrue, "acknowledged generation 1", acked...)

	// A tenant whose quota is not pushed carries no Propagated condition.
	var u v1alpha1.CacheTenant
	wantOK(t, "get unbounded tenant", k8s.Get(ctx, client.ObjectKeyFromObject(unquoted), &u))
	if c := meta.FindStatusCondition(u.Status.Conditions, v1alpha1.ConditionPropagated); c != nil {
		t.Errorf("tenant without quota has %+v", c)
	}
}
