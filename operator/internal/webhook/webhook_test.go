package webhook

import (
	"context"
	"errors"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"strings"
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

func newClient(t *testing.T, failList bool, objs ...client.Object) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...)
	if failList {
		b = b.WithInterceptorFuncs(interceptor.Funcs{List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return errors.New("apiserver unavailable")
		}})
	}
	return b.Build()
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func pol(ns, name string) *v1alpha1.CachePolicy {
	return &v1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

func ten(ns, name, id string) *v1alpha1.CacheTenant {
	return &v1alpha1.CacheTenant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.CacheTenantSpec{TenantID: id}}
}

func TestCachePolicyCreateNamesSmallestSibling(t *testing.T) {
	v := &CachePolicyValidator{Reader: newClient(t, false, pol("ns", "zeta"), pol("ns", "beta"), pol("other", "alpha"))}
	_, err := v.ValidateCreate(ctx(t), pol("ns", "new"))
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `already has CachePolicy "beta"`) || !strings.Contains(err.Error(), "metadata.name: Forbidden") {
		t.Fatalf("err = %v", err)
	}
	if _, err := v.ValidateCreate(ctx(t), pol("empty", "p")); err != nil {
		t.Fatalf("first policy refused: %v", err)
	}
	// Re-validating an object against itself (same name) is not a sibling.
	if _, err := v.ValidateCreate(ctx(t), pol("other", "alpha")); err != nil {
		t.Fatalf("self counted as sibling: %v", err)
	}
}

func TestFailClosed(t *testing.T) {
	for name, v := range map[string]interface {
		create(context.Context) error
	}{
		"policy, no reader":  policyCreate{&CachePolicyValidator{}},
		"policy, list fails": policyCreate{&CachePolicyValidator{Reader: newClient(t, true)}},
		"tenant, no reader":  tenantCreate{&CacheTenantValidator{}},
		"tenant, list fails": tenantCreate{&CacheTenantValidator{Reader: newClient(t, true)}},
	} {
		err := v.create(ctx(t))
		if err == nil {
			t.Errorf("%s: admitted", name)
			continue
		}
		if !strings.Contains(err.Error(), "fail closed") {
			t.Errorf("%s: %v does not say it failed closed", name, err)
		}
	}
	// UPDATE of a tenant that changes its id needs the list too.
	v := &CacheTenantValidator{Reader: newClient(t, true)}
	if _, err := v.ValidateUpdate(ctx(t), ten("ns", "a", "x"), ten("ns", "a", "y")); err == nil {
		t.Error("tenant id change admitted without a list")
	}
	// An UPDATE that leaves the id alone needs no list.
	if _, err := v.ValidateUpdate(ctx(t), ten("ns", "a", "x"), ten("ns", "a", "x")); err != nil {
		t.Errorf("unrelated tenant update refused: %v", err)
	}
}

type policyCreate struct{ v *CachePolicyValidator }

func (p policyCreate) create(c context.Context) error {
	_, err := p.v.ValidateCreate(c, pol("ns", "p"))
	return err
}

type tenantCreate struct{ v *CacheTenantValidator }

func (p tenantCreate) create(c context.Context) error {
	_, err := p.v.ValidateCreate(c, ten("ns", "t", "id"))
	return err
}

func TestCacheTenantDuplicates(t *testing.T) {
	v := &CacheTenantValidator{Reader: newClient(t, false, ten("ns", "b", "acme"), ten("ns", "a", "acme"), ten("other", "c", "globex"))}
	_, err := v.ValidateCreate(ctx(t), ten("ns", "new", "acme"))
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `CacheTenant "a"`) || !strings.Contains(err.Error(), "Duplicate value") {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := v.ValidateCreate(ctx(t), ten("ns", "new", "globex")); err != nil {
		t.Fatalf("cross-namespace duplicate refused: %v", err)
	}
	_, err = v.ValidateUpdate(ctx(t), ten("other", "c", "globex"), ten("other", "c", "inferencecache.io/probe"))
	if err == nil || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("reserved on update: %v", err)
	}
	if _, err := v.ValidateUpdate(ctx(t), ten("x", "p", "inferencecache.io/probe"), ten("x", "p", "inferencecache.io/probe")); err != nil {
		t.Fatalf("legacy reserved id not editable: %v", err)
	}
	if _, err := v.ValidateDelete(ctx(t), ten("ns", "a", "acme")); err != nil {
		t.Fatal(err)
	}
}

func TestCacheBackendUpdateIntroduced(t *testing.T) {
	v := CacheBackendValidator{}
	legacy := &v1alpha1.CacheBackend{Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendExternal}}
	edited := legacy.DeepCopy()
	edited.Spec.Replicas = new(int32)
	if _, err := v.ValidateUpdate(ctx(t), legacy, edited); err != nil {
		t.Fatalf("legacy backend not editable: %v", err)
	}
	edited.Spec.Endpoint = "nope"
	if _, err := v.ValidateUpdate(ctx(t), legacy, edited); err == nil {
		t.Fatal("newly invalid endpoint admitted")
	}
	// A legacy bad endpoint may stay as it is, but not become another bad one.
	legacy.Spec.Endpoint = "http://a:1"
	edited = legacy.DeepCopy()
	edited.Spec.Replicas = new(int32)
	if _, err := v.ValidateUpdate(ctx(t), legacy, edited); err != nil {
		t.Fatalf("legacy bad endpoint not editable: %v", err)
	}
	edited.Spec.Endpoint = "http://b:1"
	if _, err := v.ValidateUpdate(ctx(t), legacy, edited); err == nil {
		t.Fatal("legacy bad endpoint rewritten to another bad one")
	}
}
