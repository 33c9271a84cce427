package controller

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// TestReconcileListsSelectedPodsOnly: a pass reads the pods its backend
// selects, serves and injected through field indexes, not every pod of the
// namespace (or, with allowCrossNamespace, of the cluster): the copies a
// pass makes do not grow with the cluster.
func TestReconcileListsSelectedPodsOnly(t *testing.T) {
	const unrelated = 500
	objs := []client.Object{
		&v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cb"},
			Spec: v1alpha1.CacheBackendSpec{Integration: &v1alpha1.CacheBackendIntegration{Mode: v1alpha1.IntegrationEventsOnly},
				EngineSelector: &v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "llama", "tier": "gpu"}}, AllowCrossNamespace: true}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "engine", Labels: map[string]string{"app": "llama", "tier": "gpu"}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "half", Labels: map[string]string{"app": "llama"}}},
	}
	for i := range unrelated {
		objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%3), Name: fmt.Sprintf("web-%d", i), Labels: map[string]string{"app": "web"}}})
	}
	var listed atomic.Int64
	b := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).WithStatusSubresource(&v1alpha1.CacheBackend{}).
		WithInterceptorFuncs(interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			if pl, ok := list.(*corev1.PodList); ok {
				listed.Add(int64(len(pl.Items)))
			}
			return nil
		}})
	for _, f := range IndexedFields() {
		b = b.WithIndex(f.Object, f.Field, f.Extract)
	}
	r := &CacheBackendReconciler{Client: b.Build(), Server: &ServerClient{BaseURL: "http://127.0.0.1:1"}, metrics: newBackendControllerMetrics()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "cb"}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("a pass listed %d of %d pods", listed.Load(), unrelated+2)
	if n := listed.Load(); n > 4 {
		t.Fatalf("a pass listed %d pods; want only those the backend selects, serves or injected (%d unrelated pods in the cluster)", n, unrelated)
	}
	var got v1alpha1.CacheBackend
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "cb"}, &got); err != nil {
		t.Fatal(err)
	}
	if m := got.Status.MatchedEnginePods; m == nil || *m != 1 {
		t.Fatalf("matchedEnginePods %v, want 1", m)
	}
}

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}
