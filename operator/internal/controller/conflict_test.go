package controller

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// TestStatusConflictsRerunQuietly: a status write that loses a
// resourceVersion race, on any kind the poller writes, re-runs the pass
// soon and is not reported as a reconcile error.
func TestStatusConflictsRerunQuietly(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"replicas":[],"tenants":[{"tenantId":"acme","indexEntries":3,"hitRate":0,"memoryUsed":0}],"totalPrefixes":3,"hotPrefixes":0}`))
	}))
	defer srv.Close()
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"CacheIndex", "CacheTenant"} {
		c := fake.NewClientBuilder().WithScheme(s).
			WithObjects(&v1alpha1.CacheIndex{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.CacheIndexName}},
				&v1alpha1.CacheTenant{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t"}, Spec: v1alpha1.CacheTenantSpec{TenantID: "acme"}}).
			WithStatusSubresource(&v1alpha1.CacheIndex{}, &v1alpha1.CacheTenant{}).
			WithInterceptorFuncs(interceptor.Funcs{SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				gvk, _ := c.GroupVersionKindFor(obj)
				if gvk.Kind == kind {
					return apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("x").GroupResource(), obj.GetName(), nil)
				}
				return c.Status().Update(ctx, obj, opts...)
			}}).Build()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		poll := &SnapshotPoller{Index: c, Tenants: c, Writer: c, Server: &ServerClient{BaseURL: srv.URL}, Interval: 7 * time.Second}
		res, err := poll.Reconcile(ctx, SnapshotKey)
		cancel()
		if err != nil || res.RequeueAfter != conflictRetry {
			t.Errorf("conflict on %s: %+v, %v; want a quiet re-run after %s", kind, res, err, conflictRetry)
		}
	}
}
