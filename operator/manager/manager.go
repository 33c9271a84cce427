// Package manager wires the inferencecache operator together: scheme,
// webhook certificate, controller-runtime manager, controllers, webhooks and
// probes. cmd/controller parses flags into Options and calls Run.
package manager

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/certs"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
	icwebhook "github.com/inferencecache/inferencecache/operator/internal/webhook"
)

// DefaultInterval is the default push and poll period.
const DefaultInterval = controller.DefaultInterval

// DefaultCacheServerImage is the default --cache-server-image.
const DefaultCacheServerImage = controller.DefaultCacheServerImage

// Options is the operator's configuration; cmd/controller fills it from
// flags.
type Options struct {
	// Namespace is the controller's own namespace (POD_NAMESPACE): it holds
	// the leader election Lease and the webhook certificate Secret.
	Namespace           string
	ServerAddress       string
	PolicyTokenPath     string
	ControllerTokenPath string
	PushInterval        time.Duration
	SnapshotInterval    time.Duration
	// MetricsAddr is where /metrics is served; "" means ":8443" when
	// MetricsSecure, else ":8080"; "0" disables it.
	MetricsAddr string
	// MetricsSecure serves /metrics over HTTPS and only to a bearer token
	// that passes a TokenReview and a SubjectAccessReview (get on the
	// nonResourceURL /metrics); false serves plain HTTP to anyone.
	MetricsSecure bool
	// MetricsCertPath is the directory holding MetricsCertName and
	// MetricsCertKey (default tls.crt, tls.key), re-read when they change;
	// empty serves a self-signed certificate generated at start-up.
	MetricsCertPath    string
	MetricsCertName    string
	MetricsCertKey     string
	ProbeAddr          string
	LeaderElect        bool
	LeaderElectionID   string
	EnableWebhooks     bool
	WebhookHost        string
	WebhookPort        int
	WebhookCertDir     string
	SelfSignedCerts    bool
	WebhookSecretName  string
	WebhookServiceName string
	WebhookConfigName  string
	// MutatingWebhookConfigName is the MutatingWebhookConfiguration (pod
	// injection) whose caBundle is kept.
	MutatingWebhookConfigName string
	// PodInjection configures the mutating pod webhook.
	PodInjection icwebhook.PodInjectorOptions
	// BackendPolicy is what CacheBackends may ask the controller to run
	// (--allowed-backend-images, --allowed-service-accounts): the validating
	// webhook refuses the rest and the reconciler does not provision it.
	BackendPolicy validation.BackendPolicy
	// CacheServerImage is the managed cache server's image
	// (--cache-server-image); empty means DefaultCacheServerImage.
	CacheServerImage string
}

// Scheme returns a scheme with the built-in kinds and inferencecache.io/v1alpha1.
func Scheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	return scheme
}

// ErrNoNamespace is returned when the self-signed certificate or leader
// election needs the controller's namespace and Options.Namespace is empty.
var ErrNoNamespace = errors.New("manager: the controller's namespace (POD_NAMESPACE) is required for --webhook-self-signed and --leader-elect")

// Run starts the operator against the cluster of cfg and blocks until ctx is
// done or the manager fails.
func Run(ctx context.Context, cfg *rest.Config, f Options) error {
	log := ctrl.Log.WithName("setup")
	scheme := Scheme()
	ns := f.Namespace
	if ns == "" && (f.LeaderElect || f.EnableWebhooks && f.SelfSignedCerts) {
		return ErrNoNamespace
	}
	var (
		certOpts certs.Options
		keeper   *certs.Keeper
	)
	if f.EnableWebhooks && f.SelfSignedCerts {
		c, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			return fmt.Errorf("cannot create bootstrap client: %w", err)
		}
		certOpts = certs.Options{
			Namespace: ns, SecretName: f.WebhookSecretName, ServiceName: f.WebhookServiceName,
			CertDir: f.WebhookCertDir, WebhookConfigName: f.WebhookConfigName,
			MutatingWebhookConfigName: f.MutatingWebhookConfigName,
		}
		// The first pass runs before the webhook server starts, which needs
		// the files; the Keeper added below keeps them right afterwards.
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err = certs.Ensure(cctx, c, certOpts)
		cancel()
		if err != nil {
			return err
		}
		keeper = &certs.Keeper{Config: cfg, Scheme: scheme, Client: c, Options: certOpts, Log: ctrl.Log.WithName("certs")}
		log.Info("webhook certificate ready", "secret", ns+"/"+f.WebhookSecretName)
	}

	metricsOpts, err := MetricsServerOptions(f)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		// What the cache keeps of each object (controller.CacheOptions), so
		// the controller's memory follows the objects it works on.
		Cache:                   controller.CacheOptions(),
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  f.ProbeAddr,
		LeaderElection:          f.LeaderElect,
		LeaderElectionID:        f.LeaderElectionID,
		LeaderElectionNamespace: ns,
		// A replica stopping (a rollout, a drain) gives the Lease up, so
		// another leads at once rather than after the lease duration (15 s).
		// Safe: Run returns, and the process exits, once the manager stopped.
		LeaderElectionReleaseOnCancel: true,
		WebhookServer:                 webhook.NewServer(webhook.Options{Host: f.WebhookHost, Port: f.WebhookPort, CertDir: f.WebhookCertDir}),
	})
	if err != nil {
		return fmt.Errorf("cannot create manager: %w", err)
	}
	server := &controller.ServerClient{
		BaseURL:             f.ServerAddress,
		PolicyTokenPath:     f.PolicyTokenPath,
		ControllerTokenPath: f.ControllerTokenPath,
	}
	if err := controller.Setup(mgr, controller.Options{
		Server: server, PushInterval: f.PushInterval, SnapshotInterval: f.SnapshotInterval,
		CacheBackend: controller.CacheBackendOptions{Policy: f.BackendPolicy, Image: f.CacheServerImage},
	}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("cannot add health check: %w", err)
	}
	ready := healthz.Ping
	if f.EnableWebhooks {
		if err := icwebhook.Setup(mgr, mgr.GetAPIReader(), icwebhook.Options{BackendPolicy: f.BackendPolicy}); err != nil {
			return fmt.Errorf("cannot set up webhooks: %w", err)
		}
		icwebhook.SetupPodInjection(mgr, mgr.GetClient(), f.PodInjection)
		if keeper != nil {
			if err := mgr.Add(keeper); err != nil {
				return fmt.Errorf("cannot add the webhook certificate keeper: %w", err)
			}
		}
		ready = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("readyz", ready); err != nil {
		return fmt.Errorf("cannot add ready check: %w", err)
	}
	log.Info("starting manager", "metrics", metricsOpts.BindAddress, "metricsSecure", metricsOpts.SecureServing, "server", f.ServerAddress, "pushInterval", f.PushInterval, "snapshotInterval", f.SnapshotInterval)
	return mgr.Start(ctx)
}

// Default metrics addresses, by --metrics-secure.
const (
	DefaultMetricsSecureAddr   = ":8443"
	DefaultMetricsInsecureAddr = ":8080"
)

// MetricsServerOptions is the metrics server configuration of f: plain
// HTTP, or (MetricsSecure) HTTPS behind controller-runtime's authentication
// and authorization filter, which asks the apiserver to review each
// scraper's bearer token (TokenReview) and whether it may get /metrics
// (SubjectAccessReview). The controller's ServiceAccount needs create on
// both (operator/config/rbac/metrics_auth_role.yaml).
func MetricsServerOptions(f Options) (metricsserver.Options, error) {
	addr := f.MetricsAddr
	if addr == "" {
		addr = DefaultMetricsInsecureAddr
		if f.MetricsSecure {
			addr = DefaultMetricsSecureAddr
		}
	}
	if !f.MetricsSecure {
		if f.MetricsCertPath != "" {
			return metricsserver.Options{}, errors.New("manager: --metrics-cert-path needs --metrics-secure")
		}
		return metricsserver.Options{BindAddress: addr}, nil
	}
	o := metricsserver.Options{
		BindAddress:    addr,
		SecureServing:  true,
		FilterProvider: filters.WithAuthenticationAndAuthorization,
		// HTTP/1.1 only: a scraper gains nothing from HTTP/2, which would
		// bring its rapid-reset exposure (CVE-2023-44487) to this port.
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	}
	if f.MetricsCertPath == "" {
		// controller-runtime generates a self-signed certificate when its
		// CertDir holds none; point it at no directory so a stray
		// /tmp/k8s-metrics-server is never picked up.
		o.CertDir = filepath.Join(os.TempDir(), "inferencecache-no-metrics-cert")
		return o, nil
	}
	o.CertDir, o.CertName, o.KeyName = f.MetricsCertPath, f.MetricsCertName, f.MetricsCertKey
	if o.CertName == "" {
		o.CertName = "tls.crt"
	}
	if o.KeyName == "" {
		o.KeyName = "tls.key"
	}
	// controller-runtime falls back to a self-signed certificate when the
	// files are missing; a path given on purpose must not be ignored.
	for _, name := range []string{o.CertName, o.KeyName} {
		if _, err := os.Stat(filepath.Join(o.CertDir, name)); err != nil {
			return metricsserver.Options{}, fmt.Errorf("manager: metrics certificate: %w", err)
		}
	}
	return o, nil
}
