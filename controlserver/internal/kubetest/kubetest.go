// Package kubetest starts a real kube-apiserver + etcd (controller-runtime
// envtest) for the controlserver tests and mints ServiceAccount tokens with
// the TokenRequest API. It is imported by tests only.
//
// Binaries come from KUBEBUILDER_ASSETS (hack/envtest-assets.sh). When it is
// unset the calling test is skipped, unless CI=true, where it fails.
package kubetest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// Timeouts. Start tolerates a slow start on a loaded 2-core machine.
const (
	StartTimeout = 60 * time.Second
	StopTimeout  = 30 * time.Second
	callTimeout  = 30 * time.Second
	tokenTTL     = int64(3600) // TokenRequest minimum is 600 s
)

// Env is a running control plane.
type Env struct {
	Env    *envtest.Environment
	Config *rest.Config // cluster-admin (client certificate)
	Client kubernetes.Interface
	// StartDuration is how long envtest.Start took.
	StartDuration time.Duration
}

// Start starts etcd and kube-apiserver and registers their Stop as a test
// cleanup.
func Start(t testing.TB) *Env {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KUBEBUILDER_ASSETS is not set (run: export KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh))")
		}
		t.Skip("KUBEBUILDER_ASSETS is not set; skipping the envtest (kube-apiserver + etcd) test")
	}
	logf.SetLogger(logr.Discard())
	env := &envtest.Environment{ControlPlaneStopTimeout: StopTimeout}
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		env.ControlPlaneStartTimeout = StartTimeout
	}
	start := time.Now()
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest start: %v", err)
	}
	e := &Env{Env: env, Config: cfg, StartDuration: time.Since(start)}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("envtest stop: %v", err)
		}
	})
	t.Logf("envtest.Start took %v", e.StartDuration.Round(time.Millisecond))
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = callTimeout
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.Client = cs
	return e
}

func ctx(t testing.TB) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), callTimeout)
}

// CreateServiceAccount creates the namespace (if missing) and the
// ServiceAccount; envtest runs no controller that would make either.
func (e *Env) CreateServiceAccount(t testing.TB, namespace, name string) {
	t.Helper()
	c, cancel := ctx(t)
	defer cancel()
	_, err := e.Client.CoreV1().Namespaces().Create(c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", namespace, err)
	}
	_, err = e.Client.CoreV1().ServiceAccounts(namespace).Create(c,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create serviceaccount %s/%s: %v", namespace, name, err)
	}
}

// Token mints a token for the ServiceAccount with the TokenRequest API. With
// no audiences the token carries the apiserver's default audience.
func (e *Env) Token(t testing.TB, namespace, name string, audiences ...string) string {
	t.Helper()
	c, cancel := ctx(t)
	defer cancel()
	exp := tokenTTL
	tr, err := e.Client.CoreV1().ServiceAccounts(namespace).CreateToken(c, name, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &exp},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest %s/%s %q: %v", namespace, name, audiences, err)
	}
	if tr.Status.Token == "" {
		t.Fatal("TokenRequest returned an empty token")
	}
	return tr.Status.Token
}

// StopAPIServer stops only the kube-apiserver (etcd keeps running); the
// environment's cleanup still stops the rest.
func (e *Env) StopAPIServer(t testing.TB) {
	t.Helper()
	if err := e.Env.ControlPlane.APIServer.Stop(); err != nil {
		t.Fatalf("stop kube-apiserver: %v", err)
	}
}

// WriteKubeconfig writes a kubeconfig for the admin user into dir and
// returns its path.
func (e *Env) WriteKubeconfig(t testing.TB, dir string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: e.Config.Host, CertificateAuthorityData: e.Config.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: e.Config.CertData, ClientKeyData: e.Config.KeyData, Token: e.Config.BearerToken,
	}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// Tamper returns token with one character of its signature changed.
func Tamper(token string) string {
	i := strings.LastIndexByte(token, '.') + 1 + 10 // well inside the signature
	b := []byte(token)
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}
