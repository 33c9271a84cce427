// Command controller runs the inferencecache operator: the CachePolicy /
// CacheTenant propagation to the routing server, the CacheIndex and
// CacheTenant status projection of the server's snapshot, the validating
// admission webhooks and the engine pod-injection webhook. All wiring lives in operator/manager.
package main

import (
	"flag"
	"os"
	"strings"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/inferencecache/inferencecache/operator/manager"
)

func main() {
	var o manager.Options
	flag.StringVar(&o.ServerAddress, "server-address", "http://inferencecache-server.inferencecache-system.svc:8081", "Internal (:8081) address of the routing server. When it names a Service (NAME.NAMESPACE.svc) the policy is pushed to every ready pod of its EndpointSlices, else to this address; /snapshot is read here.")
	flag.StringVar(&o.PolicyTokenPath, "policy-token-path", "/var/run/secrets/inferencecache.io/policy-token/token", "File of the projected token with audience inferencecache.io/policy, sent to /policy (re-read on every push). Empty sends none.")
	flag.StringVar(&o.ControllerTokenPath, "controller-token-path", "/var/run/secrets/inferencecache.io/controller-token/token", "File of the projected token with audience inferencecache.io/controller, sent to /snapshot (re-read on every poll). Empty sends none.")
	flag.DurationVar(&o.PushInterval, "push-interval", manager.DefaultInterval, "Period of the full policy re-push.")
	flag.DurationVar(&o.SnapshotInterval, "snapshot-interval", manager.DefaultInterval, "Period of the /snapshot poll.")
	flag.StringVar(&o.MetricsAddr, "metrics-bind-address", "", "Address of the Prometheus /metrics endpoint; empty means :8443 with --metrics-secure, else :8080; 0 disables it.")
	flag.BoolVar(&o.MetricsSecure, "metrics-secure", true, "Serve /metrics over HTTPS, only to a bearer token the apiserver authenticates (TokenReview) and authorizes for get on /metrics (SubjectAccessReview; ClusterRole inferencecache-metrics-reader). false serves plain HTTP to anyone who reaches the port.")
	flag.StringVar(&o.MetricsCertPath, "metrics-cert-path", "", "Directory of the metrics server's certificate and key (e.g. a cert-manager Secret), reloaded when they change; empty serves a self-signed certificate generated at start-up.")
	flag.StringVar(&o.MetricsCertName, "metrics-cert-name", "tls.crt", "Certificate file name in --metrics-cert-path.")
	flag.StringVar(&o.MetricsCertKey, "metrics-cert-key", "tls.key", "Key file name in --metrics-cert-path.")
	flag.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz.")
	flag.BoolVar(&o.LeaderElect, "leader-elect", true, "Elect a leader so only one replica runs the controllers (webhooks run on every replica); needs POD_NAMESPACE. --leader-elect=false for a single replica run outside a cluster.")
	flag.StringVar(&o.LeaderElectionID, "leader-election-id", "inferencecache-controller.inferencecache.io", "Name of the leader election Lease.")
	flag.BoolVar(&o.EnableWebhooks, "enable-webhooks", true, "Serve the validating admission webhooks.")
	flag.StringVar(&o.WebhookHost, "webhook-host", "", "Address the webhook server binds; empty means all interfaces.")
	flag.IntVar(&o.WebhookPort, "webhook-port", 9443, "Port of the webhook server.")
	flag.StringVar(&o.WebhookCertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs", "Directory holding the webhook server's tls.crt and tls.key.")
	flag.BoolVar(&o.SelfSignedCerts, "webhook-self-signed", true, "Issue the webhook certificate from a CA kept in --webhook-secret-name and set the caBundle; false expects tls.crt/tls.key mounted in --webhook-cert-dir (e.g. by cert-manager).")
	flag.StringVar(&o.WebhookSecretName, "webhook-secret-name", "inferencecache-webhook-cert", "Secret (in the pod's namespace, POD_NAMESPACE) that keeps the self-signed webhook CA and certificate.")
	flag.StringVar(&o.WebhookServiceName, "webhook-service-name", "inferencecache-webhook-service", "Service the apiserver calls the webhooks through.")
	flag.StringVar(&o.WebhookConfigName, "webhook-config-name", "inferencecache-validating-webhook", "ValidatingWebhookConfiguration whose caBundle is kept.")
	flag.StringVar(&o.MutatingWebhookConfigName, "mutating-webhook-config-name", "inferencecache-mutating-webhook", "MutatingWebhookConfiguration (engine pod injection) whose caBundle is kept.")
	flag.StringVar(&o.PodInjection.SubscriberImage, "kvevent-subscriber-image", "", "Image of the kvevent-subscriber sidecar injected into engine pods a CacheBackend selects; empty injects the engine's KV-event args and env but no sidecar.")
	flag.StringVar(&o.PodInjection.ServerAddress, "kvevent-server-address", "inferencecache-server.inferencecache-system.svc:9090", "gRPC address of the routing server the injected sidecar reports to.")
	flag.StringVar(&o.PodInjection.NATSURL, "nats-url", "", "NATS JetStream URL the injected sidecars publish to (their --nats-url) instead of --kvevent-server-address, so every routing server consuming the stream gets the same index (docs/scaleout.md); the scaleout overlay sets it to the servers' --nats-url. Empty: gRPC to one server.")
	flag.StringVar(&o.CacheServerImage, "cache-server-image", manager.DefaultCacheServerImage, "Image of the LMCache server the controller runs for a managed CacheBackend (one without spec.backendConfig.image); pin a tag or a digest.")
	flag.Func("allowed-backend-images", "Comma-separated image prefixes a CacheBackend's spec.backendConfig.image may name (e.g. ghcr.io/acme/,lmcache/vllm-openai:); the validating webhook refuses others and they are not provisioned. Empty allows any image.", func(v string) error {
		o.BackendPolicy.ImagePrefixes = splitList(v)
		return nil
	})
	flag.Func("allowed-service-accounts", "Comma-separated ServiceAccounts a CacheBackend's spec.template.serviceAccountName may name: NAME (any namespace) or NAMESPACE/NAME; the validating webhook refuses others and they are not provisioned. Empty allows any.", func(v string) error {
		o.BackendPolicy.ServiceAccounts = splitList(v)
		return nil
	})
	klog.InitFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(klog.NewKlogr())

	o.Namespace = os.Getenv("POD_NAMESPACE")
	cfg, err := ctrl.GetConfig()
	if err != nil {
		ctrl.Log.Error(err, "cannot load kubeconfig")
		os.Exit(1)
	}
	if err := manager.Run(ctrl.SetupSignalHandler(), cfg, o); err != nil {
		ctrl.Log.Error(err, "controller failed")
		os.Exit(1)
	}
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(v string) []string {
	var out []string
	for item := range strings.SplitSeq(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
