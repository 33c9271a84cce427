package controller

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// noKinds is a client for a cluster without the inferencecache.io CRDs.
func noKinds(t *testing.T) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	missing := &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "inferencecache.io", Kind: "CachePolicy"}}
	return fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error { return missing },
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return missing
		},
		Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error { return missing },
	}).Build()
}

// TestCRDsNotInstalled: with no CRDs nothing is pushed, nothing fails, and
// the next tick is scheduled.
func TestCRDsNotInstalled(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path == "/snapshot" {
			_, _ = w.Write([]byte(`{"replicas":[],"tenants":[],"totalPrefixes":0,"hotPrefixes":0}`))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	c := noKinds(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	prop := &PolicyPropagator{Policies: c, Tenants: c, Status: c, Server: &ServerClient{BaseURL: srv.URL}, Interval: 7 * time.Second}
	res, err := prop.Reconcile(ctx, PropagationKey)
	if err != nil || res.RequeueAfter != 7*time.Second {
		t.Fatalf("propagator: %+v, %v", res, err)
	}
	if calls.Load() != 0 {
		t.Fatal("pushed although no CRD is installed")
	}
	poll := &SnapshotPoller{Index: c, Tenants: c, Writer: c, Server: &ServerClient{BaseURL: srv.URL}, Interval: 7 * time.Second}
	res, err = poll.Reconcile(ctx, SnapshotKey)
	if err != nil || res.RequeueAfter != 7*time.Second {
		t.Fatalf("poller: %+v, %v", res, err)
	}
}

func TestKindMissing(t *testing.T) {
	gr := schema.GroupResource{Group: "inferencecache.io", Resource: "cachepolicies"}
	if !kindMissing(&meta.NoKindMatchError{}) || !kindMissing(apierrors.NewNotFound(gr, "")) {
		t.Fatal("not-served kind not recognized")
	}
	if kindMissing(nil) || kindMissing(apierrors.NewNotFound(gr, "p")) || kindMissing(apierrors.NewConflict(gr, "p", nil)) {
		t.Fatal("ordinary error taken for a missing kind")
	}
}
