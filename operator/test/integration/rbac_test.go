package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/controlserver/auth"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
)

// controllerUser is the controller's ServiceAccount as the apiserver names it.
const controllerUser = auth.ServiceAccountPrefix + controllerNS + ":" + controllerSA

// applyRBAC applies the controller's RBAC from operator/config/rbac (all
// but the ServiceAccount, which setupIdentity created) and removes it when
// the test ends.
func applyRBAC(t *testing.T, ctx context.Context) {
	t.Helper()
	for _, u := range render(t, "../../config/rbac") {
		if u.GetKind() == "ServiceAccount" {
			continue
		}
		wantOK(t, "apply "+u.GetKind()+" "+u.GetName(), k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(u),
			client.ForceOwnership, client.FieldOwner("rbac-test")))
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), u) })
	}
}

// asController is a live client that acts as the controller's
// ServiceAccount, with only the RBAC that account is granted.
func asController(t *testing.T) client.Client {
	t.Helper()
	cl, err := client.New(impersonated(cfg), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// TestControllerWritesUnderShippedRBAC runs the SnapshotPoller's pass, and
// the PolicyPropagator's two writes, as the controller's ServiceAccount
// under the RBAC of operator/config/rbac: every status write, pod list and
// Event must be allowed. (TestControllerBinary covers the reads, leader
// election and the webhook certificate the same way;
// TestConfigRBACLeastPrivilege pins that nothing more is granted.)
func TestControllerWritesUnderShippedRBAC(t *testing.T) {
	ctx := needEnv(t)
	applyRBAC(t, ctx)
	sa := asController(t)
	ns := namespace(t, ctx, "rbac", false)

	cp := policyObj(ns, "p", nil)
	wantOK(t, "policy", k8s.Create(ctx, cp))
	wantOK(t, "tenant", k8s.Create(ctx, tenantObj(ns, "t", "rbac-tenant", ptr(int64(5)))))
	cb := backendObj(ns, "cb", v1alpha1.BackendLMCache, "")
	cb.Spec.EngineSelector = &v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "engine"}}
	wantOK(t, "backend", k8s.Create(ctx, cb))
	wantOK(t, "pod", k8s.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "engine-0", Labels: map[string]string{"app": "engine"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "vllm"}}},
	}))

	// A server of its own: its address (observedServer) and counts differ
	// from the suite's, so the pass writes CacheIndex, CacheTenant and
	// CacheBackend status. An authorized write that loses a race with the
	// suite's controller is a conflict, which the pass absorbs; a forbidden
	// one fails it.
	snap := controlapi.CacheSnapshot{
		Replicas: []controlapi.ReplicaSnapshot{{ReplicaID: "engine-0", Tenant: ns, PrefixCount: 7, LastEventAt: time.Now()}},
		Tenants:  []controlapi.TenantSnapshot{{TenantID: "rbac-tenant", IndexEntries: 7}},
	}
	own := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _ = json.NewEncoder(w).Encode(snap) }))
	defer own.Close()
	poll := &controller.SnapshotPoller{Index: sa, Tenants: sa, Backends: sa, Pods: sa, Writer: sa,
		Server: &controller.ServerClient{BaseURL: own.URL}, Interval: time.Minute}
	if _, err := poll.Reconcile(ctx, controller.SnapshotKey); err != nil {
		t.Fatalf("SnapshotPoller pass as the controller: %v", err)
	}

	// The PolicyPropagator's reads of the server Service's EndpointSlices
	// (its cache lists and watches them in the server's namespace).
	ww, err := client.NewWithWatch(impersonated(cfg), client.Options{Scheme: scheme})
	wantOK(t, "watch client", err)
	sel := client.MatchingLabels{discoveryv1.LabelServiceName: serverService}
	wantOK(t, "EndpointSlice list as the controller", ww.List(ctx, &discoveryv1.EndpointSliceList{}, client.InNamespace(controllerNS), sel))
	w, err := ww.Watch(ctx, &discoveryv1.EndpointSliceList{}, client.InNamespace(controllerNS), sel)
	wantOK(t, "EndpointSlice watch as the controller", err)
	w.Stop()
	if err := sa.Get(ctx, types.NamespacedName{Namespace: controllerNS, Name: serverService}, &corev1.Service{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("Service get as the controller: %v", err)
	}

	// The PolicyPropagator's writes: the Accepted and Propagated conditions
	// (Update) and a Warning Event (create, then patch for a series).
	wantOK(t, "get policy", k8s.Get(ctx, client.ObjectKeyFromObject(cp), cp))
	cp.Status.ObservedGeneration = cp.Generation + 1 // any change
	if err := sa.Status().Update(ctx, cp); err != nil && !apierrors.IsConflict(err) {
		t.Fatalf("CachePolicy status update as the controller: %v", err)
	}
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p.rbac"},
		EventTime:  metav1.NewMicroTime(time.Now()), ReportingController: "inferencecache-controller", ReportingInstance: "test",
		Action: "Resolve", Reason: v1alpha1.ReasonConflicted, Type: corev1.EventTypeWarning, Note: "rbac test",
		Regarding: corev1.ObjectReference{Kind: "CachePolicy", Namespace: ns, Name: "p"},
	}
	wantOK(t, "event create as the controller", sa.Create(ctx, ev))
	series := fmt.Sprintf(`{"series":{"count":2,"lastObservedTime":%q}}`, time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"))
	wantOK(t, "event patch as the controller", sa.Patch(ctx, ev, client.RawPatch(types.MergePatchType, []byte(series))))
}

// impersonated is a copy of c that acts as the controller's ServiceAccount.
func impersonated(c *rest.Config) *rest.Config {
	c = rest.CopyConfig(c)
	c.Impersonate = rest.ImpersonationConfig{UserName: controllerUser}
	return c
}
