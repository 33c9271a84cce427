package doctor

import (
	"fmt"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// Client-side limits: the doctor makes about ten calls.
const (
	kubeQPS   = 50
	kubeBurst = 100
)

// ClusterConfig loads the client configuration the way kubectl does: the
// kubeconfig file (KUBECONFIG or ~/.kube/config when kubeconfig is empty),
// the named context (current when empty), else the in-cluster
// ServiceAccount. namespace is the context's namespace (may be empty).
func ClusterConfig(kubeconfig, context string) (cfg *rest.Config, namespace string, err error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context})
	cfg, err = cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("cannot load the Kubernetes client config: %w", err)
	}
	namespace, _, _ = cc.Namespace()
	return cfg, namespace, nil
}

// NewClusterClient builds the read client of the cluster checks for cfg
// (copied): core, apps, coordination, admissionregistration and discovery v1
// and inferencecache.io/v1alpha1 types, every request bounded by timeout.
func NewClusterClient(cfg *rest.Config, timeout time.Duration) (client.Reader, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = timeout
	cfg.QPS, cfg.Burst = kubeQPS, kubeBurst
	if cfg.UserAgent == "" {
		cfg.UserAgent = "inferencecache-doctor"
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, coordinationv1.AddToScheme,
		admissionv1.AddToScheme, discoveryv1.AddToScheme, v1alpha1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, fmt.Errorf("cannot build the scheme: %w", err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("cannot build the Kubernetes client: %w", err)
	}
	return c, nil
}
