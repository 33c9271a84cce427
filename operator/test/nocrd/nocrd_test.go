// Package nocrd runs the controllers against a real apiserver on which the
// inferencecache.io CRDs are not installed at start-up: they must stay quiet
// (no error logged, nothing pushed) and pick the kinds up once the CRDs are
// installed, without a restart.
package nocrd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/controlserver"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	"github.com/inferencecache/inferencecache/operator/manager"
	"github.com/inferencecache/inferencecache/policy"
)

// errorSink is a logr sink that counts Error calls and keeps their text.
type errorSink struct {
	mu     sync.Mutex // guards errors
	errors []string
}

func (s *errorSink) Init(logr.RuntimeInfo)    {}
func (s *errorSink) Enabled(int) bool         { return false }
func (s *errorSink) Info(int, string, ...any) {}
func (s *errorSink) Error(err error, msg string, kv ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errors = append(s.errors, fmt.Sprintf("%s: %v %v", msg, err, kv))
}
func (s *errorSink) WithValues(...any) logr.LogSink { return s }
func (s *errorSink) WithName(string) logr.LogSink   { return s }
func (s *errorSink) logged() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.errors...)
}

type emptySnapshot struct{}

func (emptySnapshot) Snapshot() controlapi.CacheSnapshot {
	return controlapi.CacheSnapshot{Replicas: []controlapi.ReplicaSnapshot{}, Tenants: []controlapi.TenantSnapshot{}}
}

type noProber struct{}

func (noProber) Probe(context.Context, controlapi.ProbeRequest) controlapi.ProbeResponse {
	return controlapi.ProbeResponse{}
}

func TestQuietWithoutCRDsThenPickedUp(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KUBEBUILDER_ASSETS is not set; CI must run `bash hack/envtest-assets.sh` first")
		}
		t.Skip("KUBEBUILDER_ASSETS not set (export KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh))")
	}
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		t.Setenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT", "60s")
	}
	sink := &errorSink{}
	logf.SetLogger(logr.New(sink))
	env := &envtest.Environment{} // no CRDs
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The routing server's control handler, auth off (no token files).
	store := policy.NewStore()
	var pushes atomic.Int64
	h, err := controlserver.NewHandler(controlserver.Config{Policies: store, Snapshots: emptySnapshot{}, Prober: noProber{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/policy" {
			pushes.Add(1)
		}
		h.ServeHTTP(w, r)
	})}
	go func() { _ = hs.Serve(l) }()
	defer hs.Close()

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: manager.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := controller.Setup(mgr, controller.Options{
		Server:       &controller.ServerClient{BaseURL: "http://" + l.Addr().String()},
		PushInterval: 500 * time.Millisecond, SnapshotInterval: 500 * time.Millisecond,
		CRDPollInterval: time.Second,
	}); err != nil {
		t.Fatal(err)
	}
	mctx, mcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() {
		mcancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("manager did not stop")
		}
	}()

	// Several ticks without the CRDs: nothing pushed, nothing logged as an error.
	time.Sleep(2 * time.Second)
	if n := pushes.Load(); n != 0 {
		t.Fatalf("%d pushes without any CRD", n)
	}
	if errs := sink.logged(); len(errs) != 0 {
		t.Fatalf("errors logged without CRDs:\n%s", strings.Join(errs, "\n"))
	}

	// Install the CRDs; a CachePolicy is picked up by the live lists.
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join("..", "..", "config", "crd", "bases")}, ErrorIfPathMissing: true,
	}); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "late"}}); err != nil {
		t.Fatal(err)
	}
	cp := &v1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "late", Name: "p"}, Spec: v1alpha1.CachePolicySpec{Eviction: "LFU"}}
	deadline := time.Now().Add(30 * time.Second)
	for { // the apiserver serves a new CRD a moment after it is Established
		if err = c.Create(ctx, cp); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	for !store.Load().Tenant("late").HasPolicy {
		if time.Now().After(deadline) {
			t.Fatal("the CachePolicy created after the CRDs was not pushed within 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := store.Load().Tenant("late"); got.Eviction != policy.LFU {
		t.Fatalf("pushed %+v", *got)
	}
	// The snapshot poller creates the CacheIndex singleton now that it can.
	for {
		var ci v1alpha1.CacheIndex
		err := c.Get(ctx, client.ObjectKey{Name: v1alpha1.CacheIndexName}, &ci)
		if err == nil && ci.Status.ObservedServer != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CacheIndex not created and projected after the CRDs were installed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The CacheBackend and PromptTemplate reconcilers switch on by
	// themselves: a backend gets its status, a template its revision.
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "late", Name: "cb"}, Spec: v1alpha1.CacheBackendSpec{
		Integration: &v1alpha1.CacheBackendIntegration{Mode: v1alpha1.IntegrationEventsOnly}}}
	if err := c.Create(ctx, cb); err != nil {
		t.Fatal(err)
	}
	pt := &v1alpha1.PromptTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "late", Name: "pt"}, Spec: v1alpha1.PromptTemplateSpec{Body: "hello {{name}}",
		Slots: []v1alpha1.PromptTemplateSlot{{Name: "name", Type: v1alpha1.SlotMutable}}}}
	if err := c.Create(ctx, pt); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		var got v1alpha1.CacheBackend
		errB := c.Get(ctx, client.ObjectKeyFromObject(cb), &got)
		var gotPT v1alpha1.PromptTemplate
		errP := c.Get(ctx, client.ObjectKeyFromObject(pt), &gotPT)
		if errB == nil && errP == nil && got.Status.ObservedGeneration == got.Generation && gotPT.Status.TemplateRevision != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the CacheBackend and PromptTemplate reconcilers did not start after their CRDs were installed: backend status %+v (%v), template status %+v (%v)",
				got.Status, errB, gotPT.Status, errP)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if errs := sink.logged(); len(errs) != 0 {
		t.Fatalf("errors logged:\n%s", strings.Join(errs, "\n"))
	}
}
