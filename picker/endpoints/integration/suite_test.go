// Package integration runs the InferencePool endpoint source against a real
// kube-apiserver and etcd (controller-runtime envtest), with the
// InferencePool CRD read from the Gateway API Inference Extension module in
// the module cache (nothing is copied into this repository).
//
// One control plane serves every test of the package (TestMain); each test
// works in namespaces of its own. There is no kubelet: tests set pod IPs and
// readiness through the status subresource.
//
// KUBEBUILDER_ASSETS must name the folder with etcd and kube-apiserver
// (`bash hack/envtest-assets.sh` builds and prints it). Without it the tests
// skip, except under CI=true where they fail.
package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

var (
	skipReason string
	cfg        *rest.Config
	k8s        client.Client
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
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
	// The sources log their errors; info, warnings and debug only with IC_TEST_VERBOSE set.
	level := slog.LevelError
	if os.Getenv("IC_TEST_VERBOSE") != "" {
		level = slog.LevelDebug
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))

	crd, err := inferencePoolCRD()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env := &envtest.Environment{CRDInstallOptions: envtest.CRDInstallOptions{Paths: []string{crd}, ErrorIfPathMissing: true}}
	start := time.Now()
	if cfg, err = env.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "envtest:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "envtest started in %s\n", time.Since(start).Round(time.Millisecond))
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "envtest stop:", err)
		}
	}()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := giev1.Install(scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if k8s, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// inferencePoolCRD is the path of the InferencePool CRD in the module
// cache, at the version go.mod requires.
func inferencePoolCRD() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const mod = "sigs.k8s.io/gateway-api-inference-extension"
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", mod).Output()
	if err != nil {
		return "", fmt.Errorf("cannot find %s in the module cache (go list -m): %w", mod, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("%s is not downloaded: run go mod download %s", mod, mod)
	}
	path := filepath.Join(dir, "config", "crd", "bases", "inference.networking.k8s.io_inferencepools.yaml")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("cannot find the InferencePool CRD: %w", err)
	}
	return path, nil
}

func requireEnv(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}
