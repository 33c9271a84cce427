package auth

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Client-side limits of the clientset NewKubeReviewer builds. Reviews are
// cached, so steady state is about one review per endpoint per CacheTTL; the
// limits only matter for bursts of distinct tokens.
const (
	kubeQPS   = 50
	kubeBurst = 100
)

// NewKubeReviewer builds a Reviewer on a *kubernetes.Clientset: from the file
// kubeconfig when it is non-empty (the server's --kubeconfig), otherwise from
// the in-cluster ServiceAccount config. The ServiceAccount needs create on
// tokenreviews.authentication.k8s.io (e.g. ClusterRole
// system:auth-delegator).
func NewKubeReviewer(kubeconfig string) (Reviewer, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("auth: cannot load the Kubernetes client config: %w", err)
	}
	return NewReviewerForConfig(cfg)
}

// NewReviewerForConfig builds a Reviewer on a *kubernetes.Clientset for cfg
// (copied; a zero Timeout becomes DefaultReviewTimeout, zero QPS/Burst are
// raised to 50/100).
func NewReviewerForConfig(cfg *rest.Config) (Reviewer, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultReviewTimeout
	}
	if cfg.QPS == 0 {
		cfg.QPS = kubeQPS
	}
	if cfg.Burst == 0 {
		cfg.Burst = kubeBurst
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = "inferencecache-server/auth"
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("auth: cannot build the Kubernetes clientset: %w", err)
	}
	return ReviewerFromClientset(cs), nil
}

// ReviewerFromClientset returns cs's TokenReviews client.
func ReviewerFromClientset(cs kubernetes.Interface) Reviewer {
	return cs.AuthenticationV1().TokenReviews()
}
