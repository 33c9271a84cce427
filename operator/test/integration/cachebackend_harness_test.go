package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/controlserver"
	"github.com/inferencecache/inferencecache/controlserver/auth"
	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/probe"
)

// testClock is the CacheBackend reconciler's clock in these tests: real
// time plus an offset the test advances, so a 5-minute timeout or a 30 s
// window passes at once.
type testClock struct {
	offset atomic.Int64 // nanoseconds added to time.Now; written by the test
}

func (c *testClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

func (c *testClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// faultyIndex is the real engine behind a real probe.Prober, with faults the
// test switches on to make a /probe stage fail.
type faultyIndex struct {
	*engine.Engine
	dropIngest atomic.Bool // Ingest writes nothing
	// hideRouting hides the block from every second LookupRoute: a probe run
	// looks up once in stage ingest and once in stage routing, so routing
	// fails. Set it only through failRouting, which resets lookups.
	hideRouting atomic.Bool
	lookups     atomic.Int64 // LookupRoute calls since failRouting
}

func (f *faultyIndex) failRouting(on bool) {
	f.lookups.Store(0)
	f.hideRouting.Store(on)
}

func (f *faultyIndex) Ingest(u *engine.Update, now int64) engine.IngestResult {
	if f.dropIngest.Load() {
		return engine.IngestResult{Dropped: 1}
	}
	return f.Engine.Ingest(u, now)
}

func (f *faultyIndex) LookupRoute(req *engine.LookupRequest, now int64, res *engine.LookupResult) {
	f.Engine.LookupRoute(req, now, res)
	if f.hideRouting.Load() && f.lookups.Add(1)%2 == 0 {
		res.Strategy, res.Scores = engine.StrategyNone, nil
	}
}

// t2Store is the stage-t2 prober; fail makes the round trip fail. A
// request naming a remote tier (a backend's spec.remoteStorage) gets the
// production prober's real round trip against it.
type t2Store struct{ fail atomic.Bool }

func (s *t2Store) ProbeT2(ctx context.Context, req controlapi.ProbeRequest) error {
	if req.T2Endpoint != "" {
		return probe.RemoteT2{Timeout: time.Second}.ProbeT2(ctx, req)
	}
	if s.fail.Load() {
		return errors.New("tier-2 get returned nothing after put")
	}
	return nil
}

// probeServer is a routing server's internal listener on 127.0.0.1 for the
// CacheBackend tests: the real controlserver handler with the real
// probe.Prober over a real engine, behind the real TokenReview middleware
// of the controller audience.
type probeServer struct {
	addr  string
	index *faultyIndex
	t2    *t2Store
	// calls counts /probe requests that reached the handler; refuse makes
	// /probe answer 503 (an HTTP-level failure). Tests read and set them.
	calls  atomic.Int64
	refuse atomic.Bool
	// hang names a backend (<ns>/<name>) whose /probe requests get no
	// answer until the client gives up (or the test ends); hung counts them.
	hang atomic.Pointer[string]
	hung atomic.Int64
	// hangAll makes every /probe hang like hang does (counted in hung).
	hangAll atomic.Bool
	http    *http.Server
}

func startProbeServer(t *testing.T) *probeServer {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	ps := &probeServer{index: &faultyIndex{Engine: engine.New(engine.Config{})}, t2: &t2Store{}}
	identity := auth.ServiceAccountPrefix + controllerNS + ":" + controllerSA
	ca, err := auth.New(auth.Config{Reviewer: srv.reviewer, Audience: controllerAud, AllowedIdentity: identity, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	h, err := controlserver.NewHandler(controlserver.Config{
		Policies: policy.NewStore(), Snapshots: srv,
		Prober:       probe.New(probe.Config{Index: ps.index, T2: ps.t2, Logger: quiet}),
		PolicyAuth:   ca.Wrap,
		SnapshotAuth: ca.Wrap, ProbeAuth: ca.Wrap, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ps.addr = l.Addr().String()
	stop := make(chan struct{}) // closed when the test ends: hung requests return
	ps.http = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/probe" {
			ps.calls.Add(1)
			if ps.refuse.Load() {
				http.Error(w, "server draining", http.StatusServiceUnavailable)
				return
			}
			if ps.hangAll.Load() {
				ps.hung.Add(1)
				select {
				case <-r.Context().Done():
				case <-stop:
				}
				return
			}
			if hang := ps.hang.Load(); hang != nil {
				body, err := io.ReadAll(io.LimitReader(r.Body, 4<<10))
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				var req controlapi.ProbeRequest
				if json.Unmarshal(body, &req) == nil && req.Backend == *hang {
					ps.hung.Add(1)
					select {
					case <-r.Context().Done():
					case <-stop:
					}
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
		}
		h.ServeHTTP(w, r)
	})}
	go func() { _ = ps.http.Serve(l) }()
	t.Cleanup(func() {
		close(stop)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = ps.http.Shutdown(ctx)
	})
	return ps
}

// backendEnv is one test's CacheBackend controller: a manager of its own
// whose cache sees only the test's namespace, its clock, and its /probe
// server.
type backendEnv struct {
	ns    string
	clock *testClock
	probe *probeServer
}

// startBackendController runs the CacheBackend and PromptTemplate
// reconcilers for namespace ns until the test ends. Their windows are the
// production 30 s, on the test clock; a pass runs at least every 200 ms of
// real time so an advanced clock takes effect at once.
func startBackendController(t *testing.T, ns string) *backendEnv {
	t.Helper()
	return startBackendControllerResync(t, ns, 200*time.Millisecond)
}

// startBackendControllerResync is startBackendController with the longest
// wait between passes set to resync: an hour shows what the watches alone
// do.
func startBackendControllerResync(t *testing.T, ns string, resync time.Duration) *backendEnv {
	t.Helper()
	return startBackendControllerIn(t, resync, ns)
}

// startBackendControllerIn is startBackendControllerResync with the
// manager's cache covering namespaces (the first is backendEnv.ns).
func startBackendControllerIn(t *testing.T, resync time.Duration, namespaces ...string) *backendEnv {
	t.Helper()
	return startBackendControllerWith(t, resync, nil, namespaces...)
}

// startBackendControllerWith is startBackendControllerIn with tune, when
// not nil, adjusting the reconciler's options and /probe client first.
func startBackendControllerWith(t *testing.T, resync time.Duration, tune func(*controller.CacheBackendOptions, *controller.ServerClient), namespaces ...string) *backendEnv {
	t.Helper()
	env := &backendEnv{ns: namespaces[0], clock: &testClock{}, probe: startProbeServer(t)}
	cached := map[string]cache.Config{}
	for _, ns := range namespaces {
		cached[ns] = cache.Config{}
	}
	cacheOpts := controller.CacheOptions() // as cmd/controller runs it
	cacheOpts.DefaultNamespaces = cached
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cacheOpts,
	})
	if err != nil {
		t.Fatal(err)
	}
	server := &controller.ServerClient{
		BaseURL:             "http://" + env.probe.addr,
		ControllerTokenPath: filepath.Join(tokenDir, "controller"),
		HTTP:                &http.Client{Timeout: 2 * time.Second, Transport: testNetTransport()},
	}
	opts := controller.CacheBackendOptions{
		// ProbeInterval and CascadeInterval keep their production defaults
		// (30 s), which the tests check on the test clock.
		Now:                env.clock.Now,
		Resync:             resync,
		SkipNameValidation: true,
	}
	if tune != nil {
		tune(&opts, server)
	}
	if err := controller.SetupCacheBackend(mgr, server, opts); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return env
}

// setSnapshot serves snap from the suite's server (the SnapshotPoller's
// source of indexParticipation) until the test ends.
func setSnapshot(t *testing.T, replicas ...controlapi.ReplicaSnapshot) {
	t.Helper()
	old := srv.snap.Load()
	if replicas == nil {
		replicas = []controlapi.ReplicaSnapshot{}
	}
	srv.snap.Store(&controlapi.CacheSnapshot{Replicas: replicas, Tenants: []controlapi.TenantSnapshot{}})
	t.Cleanup(func() { srv.snap.Store(old) })
}

func getBackend(ctx context.Context, ns, name string) (*v1alpha1.CacheBackend, error) {
	var b v1alpha1.CacheBackend
	err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &b)
	return &b, err
}

// waitCond waits until the backend's condition typ has status and reason.
func waitCond(t *testing.T, ctx context.Context, ns, name, typ string, status metav1.ConditionStatus, reason string) *v1alpha1.CacheBackend {
	t.Helper()
	var last *v1alpha1.CacheBackend
	eventually(t, 15*time.Second, func() error {
		b, err := getBackend(ctx, ns, name)
		if err != nil {
			return err
		}
		last = b
		c := meta.FindStatusCondition(b.Status.Conditions, typ)
		if c == nil {
			return fmt.Errorf("%s: no %s condition yet (conditions %v)", name, typ, b.Status.Conditions)
		}
		if c.Status != status || c.Reason != reason {
			return fmt.Errorf("%s: %s is %s/%s (%s), want %s/%s", name, typ, c.Status, c.Reason, c.Message, status, reason)
		}
		return nil
	})
	return last
}

// conditionTypes lists the condition types of b.
func conditionTypes(b *v1alpha1.CacheBackend) []string {
	out := make([]string, 0, len(b.Status.Conditions))
	for _, c := range b.Status.Conditions {
		out = append(out, c.Type)
	}
	return out
}

// restartTrigger reads the restart-trigger annotation of an engine
// Deployment's pod template.
func restartTrigger(t *testing.T, ctx context.Context, ns, name string) string {
	t.Helper()
	var d appsv1.Deployment
	wantOK(t, "get "+name, k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &d))
	return d.Spec.Template.Annotations[controller.RestartTriggerAnnotation]
}

// cascadeCount is the restart-cascade counter of backend ns/name.
func cascadeCount(ns, name string) float64 {
	v, _ := counterValue("inferencecache_backend_server_restart_cascades_total", map[string]string{"namespace": ns, "backend": name, "reason": "server_instance_changed"})
	return v
}

// waitServerInstance waits until backend ns/name publishes want as its
// observedServerInstance.
func waitServerInstance(t *testing.T, ctx context.Context, ns, name, want string) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		b, err := getBackend(ctx, ns, name)
		if err != nil {
			return err
		}
		if b.Status.ObservedServerInstance != want {
			return fmt.Errorf("observedServerInstance %q, want %q", b.Status.ObservedServerInstance, want)
		}
		return nil
	})
}

// waitDeploymentReplicas waits until the reconciler has set the backend
// Deployment's spec.replicas to n.
func waitDeploymentReplicas(t *testing.T, ctx context.Context, ns, name string, n int32) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		var d appsv1.Deployment
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &d); err != nil {
			return err
		}
		if *d.Spec.Replicas != n {
			return errNotYet
		}
		return nil
	})
}

// setDeploymentStatus writes the status a Deployment controller would.
func setDeploymentStatus(t *testing.T, ctx context.Context, ns, name string, replicas, available int32) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		var d appsv1.Deployment
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &d); err != nil {
			return err
		}
		d.Status = appsv1.DeploymentStatus{
			ObservedGeneration: d.Generation, Replicas: replicas, UpdatedReplicas: replicas,
			ReadyReplicas: available, AvailableReplicas: available, UnavailableReplicas: replicas - available,
		}
		return k8s.Status().Update(ctx, &d)
	})
}

// enginePod creates a pod with labels (and annotations) in ns.
func enginePod(t *testing.T, ctx context.Context, ns, name string, labels, annotations map[string]string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "vllm"}}},
	}
	wantOK(t, "pod "+name, k8s.Create(ctx, p))
	return p
}

// engineDeployment creates an engine Deployment whose pod template carries
// labels (its selector too) and annotations: what the restart cascade rolls.
func engineDeployment(t *testing.T, ctx context.Context, ns, name string, labels, annotations map[string]string) {
	t.Helper()
	wantOK(t, "deployment "+name, k8s.Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: annotations},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "vllm"}}},
			},
		},
	}))
}

// counterValue reads a counter of the controller-runtime registry by its
// full label set; ok is false when the series does not exist.
func counterValue(name string, labels map[string]string) (float64, bool) {
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		return 0, false
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// cbObj is a CacheBackend selecting app=<selector> (none when empty).
func cbObj(ns, name, selector string, mut func(*v1alpha1.CacheBackend)) *v1alpha1.CacheBackend {
	b := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if selector != "" {
		b.Spec.EngineSelector = &v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": selector}}
	}
	if mut != nil {
		mut(b)
	}
	return b
}

// patchBackend applies mut to the live backend, retrying on conflicts.
func patchBackend(t *testing.T, ctx context.Context, ns, name string, mut func(*v1alpha1.CacheBackend)) {
	t.Helper()
	eventually(t, 10*time.Second, func() error {
		b, err := getBackend(ctx, ns, name)
		if err != nil {
			return err
		}
		orig := b.DeepCopy()
		mut(b)
		return k8s.Patch(ctx, b, client.MergeFrom(orig))
	})
}
