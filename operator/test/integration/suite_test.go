// Package integration runs the operator against a real kube-apiserver and
// etcd (controller-runtime envtest): the CRDs from operator/config/crd, the
// webhooks from operator/config/webhook called by the apiserver, the
// controllers in a manager, and the server's real control handler
// (controlserver, with its TokenReview middleware) on 127.0.0.1, which the
// controller reaches with audience-bound tokens of its ServiceAccount.
//
// One control plane serves every test of the package (TestMain). Tests use
// their own namespaces; the status tests share the server's snapshot and do
// not run in parallel.
//
// KUBEBUILDER_ASSETS must name the folder with etcd and kube-apiserver
// (`bash hack/envtest-assets.sh` builds and prints it). Without it the tests
// skip, except under CI=true where they fail.
package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/controlserver"
	"github.com/inferencecache/inferencecache/controlserver/auth"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
	icwebhook "github.com/inferencecache/inferencecache/operator/internal/webhook"
	"github.com/inferencecache/inferencecache/operator/manager"
	"github.com/inferencecache/inferencecache/policy"
)

// legacyLabel marks a namespace the webhooks do not see (a namespaceSelector
// added in this test only), standing in for objects admitted before a rule
// existed. Removing the label puts the namespace back under the webhooks.
const legacyLabel = "inferencecache.io/test-legacy"

// testSubscriberImage is the sidecar image the suite's pod webhook injects.
const testSubscriberImage = "example.invalid/kvevent-subscriber:test"

// testBackendPolicy is the suite's --allowed-backend-images and
// --allowed-service-accounts.
var testBackendPolicy = validation.BackendPolicy{
	ImagePrefixes:   []string{"registry.example/approved/", "lmcache/vllm-openai"},
	ServiceAccounts: []string{"cache-runner", "wh-allow/special"},
}

// tick is the push and poll interval of the controllers under test.
const tick = time.Second

var (
	skipReason string
	k8s        client.Client
	cfg        *rest.Config
	srv        *testServer
	clientset  kubernetes.Interface
	scheme     *runtime.Scheme
	tokenDir   string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set; CI must run `bash hack/envtest-assets.sh` first")
			return 1
		}
		skipReason = "KUBEBUILDER_ASSETS not set (export KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh))"
		return m.Run()
	}
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		os.Setenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT", "60s")
	}
	// Errors (reconcile failures included) always reach stderr; info logs
	// only with IC_TEST_VERBOSE set.
	verbosity := -1
	if os.Getenv("IC_TEST_VERBOSE") != "" {
		verbosity = 1
	}
	log.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: verbosity}))

	vwc, mwc, err := loadWebhooks(filepath.Join("..", "..", "config", "webhook"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			ValidatingWebhooks: []*admissionv1.ValidatingWebhookConfiguration{vwc},
			MutatingWebhooks:   []*admissionv1.MutatingWebhookConfiguration{mwc},
		},
	}
	start := time.Now()
	cfg, err = env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "envtest:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "envtest started in %s\n", time.Since(start).Round(time.Millisecond))
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "envtest stop:", err)
		}
	}()

	scheme = manager.Scheme()
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tokenDir, err = os.MkdirTemp("", "ic-tokens-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tokenDir)
	if clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := setupIdentity(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv = newTestServer(auth.ReviewerFromClientset(clientset))
	if err := srv.start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.stop()

	wio := &env.WebhookInstallOptions
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
		}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := icwebhook.Setup(mgr, mgr.GetAPIReader(), icwebhook.Options{BackendPolicy: testBackendPolicy}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Live reads, so a CacheBackend a test just created claims the next pod.
	icwebhook.SetupPodInjection(mgr, mgr.GetAPIReader(), icwebhook.PodInjectorOptions{
		SubscriberImage: testSubscriberImage, ServerAddress: "127.0.0.1:9090",
	})
	if err := controller.Setup(mgr, controller.Options{
		Server: &controller.ServerClient{
			BaseURL:             "http://" + srv.addr,
			PolicyTokenPath:     filepath.Join(tokenDir, "policy"),
			ControllerTokenPath: filepath.Join(tokenDir, "controller"),
			HTTP:                &http.Client{Timeout: 2 * time.Second, Transport: testNetTransport()},
		},
		PushInterval:     tick,
		SnapshotInterval: tick,
		// Until a test writes EndpointSlices for it, the Service has none and
		// the policy goes to srv's address.
		ServerService: types.NamespacedName{Namespace: controllerNS, Name: serverService},
		// The CacheBackend tests run that reconciler in a manager of their
		// own, with a test clock and their own /probe server.
		DisableCacheBackend: true,
	}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	if err := waitTLS(net.JoinHostPort(wio.LocalServingHost, fmt.Sprint(wio.LocalServingPort)), 30*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "webhook server:", err)
		return 1
	}
	return m.Run()
}

// loadWebhooks renders operator/config/webhook as kustomize does and
// returns its two configurations under test names (the deployed names stay
// free for the tests that create their own). The validating webhooks get the
// test-only namespaceSelector that exempts legacy namespaces; the pod webhook
// keeps the selectors the kustomization gives it.
func loadWebhooks(dir string) (*admissionv1.ValidatingWebhookConfiguration, *admissionv1.MutatingWebhookConfiguration, error) {
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot render %s: %w", dir, err)
	}
	var (
		vwc admissionv1.ValidatingWebhookConfiguration
		mwc admissionv1.MutatingWebhookConfiguration
	)
	for _, r := range rm.Resources() {
		raw, err := r.AsYAML()
		if err != nil {
			return nil, nil, err
		}
		switch r.GetKind() {
		case "ValidatingWebhookConfiguration":
			err = yaml.UnmarshalStrict(raw, &vwc)
		case "MutatingWebhookConfiguration":
			err = yaml.UnmarshalStrict(raw, &mwc)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("cannot parse %s: %w", r.CurId(), err)
		}
	}
	if len(vwc.Webhooks) == 0 || len(mwc.Webhooks) == 0 {
		return nil, nil, fmt.Errorf("%s lacks a validating or a mutating webhook configuration", dir)
	}
	vwc.Name, mwc.Name = "test-validating-webhook", "test-mutating-webhook"
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: legacyLabel, Operator: metav1.LabelSelectorOpDoesNotExist},
		}}
	}
	return &vwc, &mwc, nil
}

func waitTLS(addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // readiness probe only
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// setupIdentity creates the controller's namespace and ServiceAccount and
// writes its two audience-bound tokens where the controller reads them.
func setupIdentity() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: controllerNS}}); err != nil {
		return err
	}
	if err := k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: controllerNS, Name: controllerSA}}); err != nil {
		return err
	}
	for file, aud := range map[string]string{"policy": policyAud, "controller": controllerAud} {
		tok, err := issueToken(ctx, aud)
		if err != nil {
			return err
		}
		writeToken(file, tok)
	}
	return nil
}

func writeToken(name, tok string) {
	if err := os.WriteFile(filepath.Join(tokenDir, name), []byte(tok+"\n"), 0o600); err != nil {
		panic("BUG: cannot write token: " + err.Error())
	}
}

// needEnv skips the test when the control plane is not available.
func needEnv(t *testing.T) context.Context {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls f every 100 ms until it returns nil, failing the test
// with f's last error after limit.
func eventually(t *testing.T, limit time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %v", limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// namespace creates a namespace (labelled legacy when asked) and deletes it
// at the end of the test.
func namespace(t *testing.T, ctx context.Context, name string, legacy bool) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if legacy {
		ns.Labels = map[string]string{legacyLabel: "true"}
	}
	if err := k8s.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = k8s.Delete(ctx, ns)
	})
	return name
}

// injectionNamespace is namespace, labelled for the pod webhook
// (inferencecache.io/injection=enabled).
func injectionNamespace(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	namespace(t, ctx, name, false)
	eventually(t, 10*time.Second, func() error {
		return update(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, func(n *corev1.Namespace) {
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels[icwebhook.LabelInjection] = "enabled"
		})
	})
	return name
}

// The controller's identity as the server's --allowed-controller-sa names it.
const (
	controllerNS  = "inferencecache-system"
	controllerSA  = "inferencecache-controller"
	policyAud     = "inferencecache.io/policy"
	controllerAud = "inferencecache.io/controller"
)

// testServer is the routing server's internal :8081 listener on 127.0.0.1:
// the real controlserver handler over a policy.Store, behind the real
// TokenReview middleware (controlserver/auth) of both audiences, reviewing
// tokens against the envtest apiserver. The snapshot it serves is set by the
// test. A restart swaps in a fresh store, as a restarted pod would have.
type testServer struct {
	addr     string // fixed after the first start; restarts reuse it
	reviewer auth.Reviewer

	// store is the live policy store; restart swaps in a fresh one. The
	// handler reads it per request, tests read it to check what was applied.
	store atomic.Pointer[policy.Store]
	// snap is served on /snapshot; tests store a new one to change what the
	// poller sees.
	snap atomic.Pointer[controlapi.CacheSnapshot]
	// pushes counts /policy requests answered 204 (written by the handler,
	// read by tests).
	pushes atomic.Int64
	// policyAuth counts the auth outcomes of /policy.
	policyAuth authCounter
	// refuse, when set, is the error text /policy answers with 503 (set by
	// tests, read by the handler).
	refuse atomic.Pointer[string]
	// refuseV8 makes /policy answer a version-8 body 400, as a server that
	// predates schema v8 does (set by tests, read by the handler).
	refuseV8 atomic.Bool

	mu   sync.Mutex   // guards http
	http *http.Server // the running server; nil when stopped
}

// authCounter is an auth.Recorder: the middleware adds to one counter per
// request, from the server's handler goroutines; tests read them.
type authCounter struct{ ok, unauth, other atomic.Int64 }

func (c *authCounter) Record(result string) {
	switch result {
	case auth.ResultOK:
		c.ok.Add(1)
	case auth.ResultUnauth:
		c.unauth.Add(1)
	default:
		c.other.Add(1)
	}
}

type noProber struct{}

func (noProber) Probe(_ context.Context, req controlapi.ProbeRequest) controlapi.ProbeResponse {
	return controlapi.ProbeResponse{Backend: req.Backend, Ingest: controlapi.StageSkipped, Routing: controlapi.StageSkipped, T2: controlapi.StageSkipped}
}

func newTestServer(reviewer auth.Reviewer) *testServer {
	s := &testServer{addr: "127.0.0.1:0", reviewer: reviewer}
	s.store.Store(policy.NewStore())
	s.snap.Store(&controlapi.CacheSnapshot{Replicas: []controlapi.ReplicaSnapshot{}, Tenants: []controlapi.TenantSnapshot{}})
	return s
}

// Snapshot implements controlserver.SnapshotSource.
func (s *testServer) Snapshot() controlapi.CacheSnapshot { return *s.snap.Load() }

func (s *testServer) handler() (http.Handler, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("IC_TEST_VERBOSE") != "" {
		quiet = slog.Default()
	}
	identity := auth.ServiceAccountPrefix + controllerNS + ":" + controllerSA
	pa, err := auth.New(auth.Config{Reviewer: s.reviewer, Audience: policyAud, AllowedIdentity: identity, Recorder: &s.policyAuth, Logger: quiet})
	if err != nil {
		return nil, err
	}
	ca, err := auth.New(auth.Config{Reviewer: s.reviewer, Audience: controllerAud, AllowedIdentity: identity, Logger: quiet})
	if err != nil {
		return nil, err
	}
	h, err := controlserver.NewHandler(controlserver.Config{
		Policies: s.store.Load(), Snapshots: s, Prober: noProber{},
		PolicyAuth: pa.Wrap, SnapshotAuth: ca.Wrap, ProbeAuth: ca.Wrap, Logger: quiet,
	})
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if msg := s.refuse.Load(); msg != nil && r.URL.Path == "/policy" {
			http.Error(w, *msg, http.StatusServiceUnavailable)
			return
		}
		if s.refuseV8.Load() && r.URL.Path == "/policy" {
			body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			var v struct {
				Version int `json:"version"`
			}
			if json.Unmarshal(body, &v) == nil && v.Version >= 8 {
				http.Error(w, "unsupported policy version 8 (test: a version-7 server)", http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if r.URL.Path == "/policy" && rec.status == http.StatusNoContent {
			s.pushes.Add(1)
		}
	}), nil
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (s *testServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, err := s.handler()
	if err != nil {
		return err
	}
	var l net.Listener
	for range 50 { // the old socket may linger for a moment after a restart
		if l, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("test server listen %s: %w", s.addr, err)
	}
	s.addr = l.Addr().String()
	s.http = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func(hs *http.Server) { _ = hs.Serve(l) }(s.http)
	return nil
}

func (s *testServer) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.http.Shutdown(ctx)
		s.http = nil
	}
}

// restart stops the server and starts a new one on the same address with an
// empty store.
func (s *testServer) restart() error {
	s.stop()
	s.store.Store(policy.NewStore())
	return s.start()
}

func (s *testServer) tenant(id string) *policy.Tenant { return s.store.Load().Load().Tenant(id) }

// issueToken asks the apiserver for a token of the controller's
// ServiceAccount bound to audience, as the kubelet's projection does.
func issueToken(ctx context.Context, audience string) (string, error) {
	exp := int64(3600)
	tr, err := clientset.CoreV1().ServiceAccounts(controllerNS).CreateToken(ctx, controllerSA, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: &exp},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("cannot issue a %s token: %w", audience, err)
	}
	return tr.Status.Token, nil
}

// errNotYet is what an eventually condition returns while it waits.
var errNotYet = errors.New("not yet")
