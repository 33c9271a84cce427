// Package integration runs the operator against a real kube-apiserver and
// etcd (controller-runtime envtest): the CRDs from operator/config/crd, the
// webhooks from operator/config/webhook called by the apiserver, the
// controllers in a manager, and a routing-server stand-in on 127.0.0.1 that
// applies /policy with the server's own policy.Decode and policy.Store.
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
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	icwebhook "github.com/inferencecache/inferencecache/operator/internal/webhook"
	"github.com/inferencecache/inferencecache/operator/manager"
	"github.com/inferencecache/inferencecache/policy"
)

// legacyLabel marks a namespace the webhooks do not see (a namespaceSelector
// added in this test only), standing in for objects admitted before a rule
// existed. Removing the label puts the namespace back under the webhooks.
const legacyLabel = "inferencecache.io/test-legacy"

// tick is the push and poll interval of the controllers under test.
const tick = time.Second

var (
	skipReason string
	k8s        client.Client
	cfg        *rest.Config
	srv        *fakeServer
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

	vwc, err := loadWebhooks(filepath.Join("..", "..", "config", "webhook", "manifests.yaml"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{ValidatingWebhooks: []*admissionv1.ValidatingWebhookConfiguration{vwc}},
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
	srv = newFakeServer("policy-token-1", "controller-token-1")
	if err := srv.start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.stop()
	writeToken("policy", "policy-token-1")
	writeToken("controller", "controller-token-1")

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
	if err := icwebhook.Setup(mgr, mgr.GetAPIReader()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := controller.Setup(mgr, controller.Options{
		Server: &controller.ServerClient{
			BaseURL:             "http://" + srv.addr,
			PolicyTokenPath:     filepath.Join(tokenDir, "policy"),
			ControllerTokenPath: filepath.Join(tokenDir, "controller"),
			HTTP:                &http.Client{Timeout: 2 * time.Second},
		},
		PushInterval:     tick,
		SnapshotInterval: tick,
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

// loadWebhooks reads the generated webhook configuration and adds the
// test-only namespaceSelector that exempts legacy namespaces.
func loadWebhooks(path string) (*admissionv1.ValidatingWebhookConfiguration, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var vwc admissionv1.ValidatingWebhookConfiguration
	if err := yaml.UnmarshalStrict([]byte(strings.TrimPrefix(string(raw), "---\n")), &vwc); err != nil {
		return nil, fmt.Errorf("cannot parse %s: %w", path, err)
	}
	for i := range vwc.Webhooks {
		vwc.Webhooks[i].NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: legacyLabel, Operator: metav1.LabelSelectorOpDoesNotExist},
		}}
	}
	return &vwc, nil
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

// fakeServer is the server side of /policy and /snapshot on 127.0.0.1: it
// checks the bearer tokens, decodes /policy with policy.Decode and applies it
// to a policy.Store exactly as the routing server does, and serves a
// snapshot the test sets.
type fakeServer struct {
	addr string // fixed after the first start; restarts reuse it

	// policyToken and controllerToken are the tokens accepted now.
	policyToken     atomic.Pointer[string]
	controllerToken atomic.Pointer[string]
	// store is the live policy store; a restart swaps in a fresh one.
	store atomic.Pointer[policy.Store]
	// snap is served on /snapshot.
	snap atomic.Pointer[controlapi.CacheSnapshot]
	// pushes counts accepted /policy requests; rejected counts 401s.
	pushes, rejected atomic.Int64

	mu   sync.Mutex   // guards http
	http *http.Server // the running server; nil when stopped
}

func newFakeServer(policyTok, controllerTok string) *fakeServer {
	f := &fakeServer{addr: "127.0.0.1:0"}
	f.policyToken.Store(&policyTok)
	f.controllerToken.Store(&controllerTok)
	f.store.Store(policy.NewStore())
	f.snap.Store(&controlapi.CacheSnapshot{Replicas: []controlapi.ReplicaSnapshot{}, Tenants: []controlapi.TenantSnapshot{}})
	return f
}

func (f *fakeServer) start() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var l net.Listener
	var err error
	for range 50 { // the old socket may linger for a moment after a restart
		if l, err = net.Listen("tcp", f.addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("fake server listen %s: %w", f.addr, err)
	}
	f.addr = l.Addr().String()
	f.http = &http.Server{Handler: f, ReadHeaderTimeout: 5 * time.Second}
	go func(s *http.Server) { _ = s.Serve(l) }(f.http)
	return nil
}

func (f *fakeServer) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = f.http.Shutdown(ctx)
		f.http = nil
	}
}

// restart stops the server and starts a new one on the same address with an
// empty store, as a restarted server pod would be.
func (f *fakeServer) restart() error {
	f.stop()
	f.store.Store(policy.NewStore())
	return f.start()
}

func (f *fakeServer) tenant(id string) *policy.Tenant { return f.store.Load().Load().Tenant(id) }

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	bearer := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch r.URL.Path {
	case "/policy":
		if r.Method != http.MethodPost && r.Method != http.MethodPut {
			w.Header().Set("Allow", "POST, PUT")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if bearer != *f.policyToken.Load() {
			f.rejected.Add(1)
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		b, err := policy.Decode(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.store.Load().Apply(b)
		f.pushes.Add(1)
		w.WriteHeader(http.StatusNoContent)
	case "/snapshot":
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", "GET")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if bearer != *f.controllerToken.Load() {
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = jsonEncode(w, f.snap.Load())
	default:
		http.NotFound(w, r)
	}
}

func jsonEncode(w http.ResponseWriter, v any) error { return json.NewEncoder(w).Encode(v) }

// errNotYet is what an eventually condition returns while it waits.
var errNotYet = errors.New("not yet")
