package chartcheck

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestChartAppliesToAPIServer: with every option on that the kustomize
// comparison does not reach (another namespace, scale-out, the picker, a
// tokenizer volume, percentages, scheduling, pull secrets, extra args,
// dashboards), the chart's objects pass a real kube-apiserver's
// validation: its CRDs install and become Established, and every other
// object is accepted by a server-side dry-run apply. The Prometheus
// operator's, the Gateway API's and the Inference Extension's own kinds
// are left out (their CRDs are not ours); TestChartMatchesKustomize holds
// them to operator/config.
func TestChartAppliesToAPIServer(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KUBEBUILDER_ASSETS is not set (make test sets it from hack/envtest-assets.sh)")
		}
		t.Skip("KUBEBUILDER_ASSETS is not set; export KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh)")
	}
	const ns = "llm-routing"
	objs := renderChart(t, ns, []string{exampleValues("scaleout"), exampleValues("gateway"), exampleValues("monitoring")}, map[string]any{
		"server": map[string]any{
			"picker": map[string]any{
				"inferencePool": map[string]any{"create": false},
				"httpRoute":     map[string]any{"create": false},
			},
			"tokenizers":        map[string]any{"volume": map[string]any{"configMap": map[string]any{"name": "tokenizers"}}},
			"pdb":               map[string]any{"maxUnavailable": "34%"},
			"nodeSelector":      map[string]any{"kubernetes.io/os": "linux"},
			"tolerations":       []any{map[string]any{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}},
			"priorityClassName": "system-cluster-critical",
			"podAnnotations":    map[string]any{"example.com/a": "b"},
			"extraArgs":         []any{"--load-aware-routing=false"},
		},
		"controller": map[string]any{
			"allowedBackendImages":   []any{"ghcr.io/acme/", "lmcache/vllm-openai:"},
			"allowedServiceAccounts": []any{"team-a/engine"},
			"cacheServerImage":       "lmcache/vllm-openai:v0.3.9",
			"extraArgs":              []any{"-v=2"},
		},
		"image":            map[string]any{"pullPolicy": "IfNotPresent"},
		"imagePullSecrets": []any{map[string]any{"name": "regcred"}},
	})

	var crds []*apiextv1.CustomResourceDefinition
	var rest []*unstructured.Unstructured
	for _, o := range objs {
		switch str(o, "apiVersion") {
		case "monitoring.coreos.com/v1", "gateway.networking.k8s.io/v1", "inference.networking.k8s.io/v1":
			continue
		}
		if str(o, "kind") == "CustomResourceDefinition" {
			crd := &apiextv1.CustomResourceDefinition{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o, crd); err != nil {
				t.Fatalf("%s: %v", id(o), err)
			}
			crds = append(crds, crd)
			continue
		}
		rest = append(rest, &unstructured.Unstructured{Object: o})
	}
	if len(crds) != 6 {
		t.Fatalf("the chart renders %d CRDs, want 6", len(crds))
	}

	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		t.Setenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT", "120s")
	}
	env := &envtest.Environment{CRDInstallOptions: envtest.CRDInstallOptions{CRDs: crds}}
	cfg, err := env.Start() // installs the CRDs and waits until they serve
	if err != nil {
		t.Fatalf("envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("envtest stop: %v", err)
		}
	})
	k8s, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, name := range []string{ns, "team-a"} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range rest {
		err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(u),
			client.DryRunAll, client.ForceOwnership, client.FieldOwner("chartcheck"))
		if err != nil {
			t.Errorf("dry-run apply %s: %v", id(u.Object), err)
		}
	}
	if len(rest) < 20 {
		t.Errorf("only %d objects applied", len(rest))
	}
}
