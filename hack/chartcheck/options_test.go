package chartcheck

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func find(objs []object, kind, name string) object {
	for _, o := range objs {
		if str(o, "kind") == kind && str(o, "metadata", "name") == name {
			return o
		}
	}
	return nil
}

func count(objs []object, kind string) int {
	n := 0
	for _, o := range objs {
		if str(o, "kind") == kind {
			n++
		}
	}
	return n
}

// container returns the first container of a Deployment's pod template.
func container(t *testing.T, objs []object, deployment string) map[string]any {
	t.Helper()
	d := find(objs, "Deployment", deployment)
	if d == nil {
		t.Fatalf("no Deployment %s", deployment)
	}
	cs, _ := dig(d, "spec", "template", "spec", "containers").([]any)
	if len(cs) == 0 {
		t.Fatalf("Deployment %s has no containers", deployment)
	}
	return cs[0].(map[string]any)
}

func args(t *testing.T, objs []object, deployment string) []string {
	t.Helper()
	var out []string
	for _, a := range container(t, objs, deployment)["args"].([]any) {
		out = append(out, a.(string))
	}
	return out
}

func hasArg(t *testing.T, objs []object, deployment, arg string) bool {
	t.Helper()
	return slices.Contains(args(t, objs, deployment), arg)
}

func argWithPrefix(t *testing.T, objs []object, deployment, prefix string) (string, bool) {
	t.Helper()
	for _, a := range args(t, objs, deployment) {
		if v, ok := strings.CutPrefix(a, prefix); ok {
			return v, true
		}
	}
	return "", false
}

func toJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// clusterScoped are the kinds the chart renders without a namespace.
var clusterScoped = []string{
	"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
	"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
}

// TestChartInAnotherNamespace: installed outside inferencecache-system,
// with every option on, nothing names inferencecache-system any more: the
// server address the controller pushes to and its sidecars report to, the
// identity the server accepts, ServiceAccount subjects, the webhook
// Service and the injection webhook's exclusions follow the release
// namespace, and every namespaced object is in it (or, for the picker's,
// in the pool's namespace).
func TestChartInAnotherNamespace(t *testing.T) {
	const ns = "llm-routing"
	objs := renderChart(t, ns, []string{exampleValues("scaleout"), exampleValues("gateway"), exampleValues("monitoring")}, nil)
	for _, o := range objs {
		if strings.Contains(toJSON(t, o), "inferencecache-system") {
			t.Errorf("%s still names inferencecache-system", id(o))
		}
		got := str(o, "metadata", "namespace")
		switch {
		case slices.Contains(clusterScoped, str(o, "kind")):
			if got != "" {
				t.Errorf("%s: cluster-scoped kind in namespace %q", id(o), got)
			}
		case got != ns && got != "team-a":
			t.Errorf("%s: namespace %q, want %q (or the pool's team-a)", id(o), got, ns)
		}
	}
	for _, want := range []string{
		"--server-address=http://inferencecache-server.llm-routing.svc:8081",
		"--kvevent-server-address=inferencecache-server.llm-routing.svc:9090",
	} {
		if !hasArg(t, objs, "inferencecache-controller", want) {
			t.Errorf("controller has no %s: %q", want, args(t, objs, "inferencecache-controller"))
		}
	}
	if want := "--allowed-controller-sa=system:serviceaccount:llm-routing:inferencecache-controller"; !hasArg(t, objs, "inferencecache-server", want) {
		t.Errorf("server has no %s", want)
	}
	mwc := find(objs, "MutatingWebhookConfiguration", "inferencecache-mutating-webhook")
	if !strings.Contains(toJSON(t, dig(mwc, "webhooks")), `"values":["kube-system","kube-public","kube-node-lease","llm-routing"]`) {
		t.Errorf("the injection webhook does not exclude the release namespace: %s", toJSON(t, dig(mwc, "webhooks")))
	}
	pool := find(objs, "Service", "inferencecache-picker")
	if got := str(pool, "spec", "externalName"); got != "inferencecache-server.llm-routing.svc.cluster.local" {
		t.Errorf("picker ExternalName %q", got)
	}
}

// TestChartOptions: what each value switches, beyond the defaults the
// kustomize comparison covers.
func TestChartOptions(t *testing.T) {
	gateway := []string{exampleValues("gateway")}
	for _, tc := range []struct {
		name  string
		files []string
		set   map[string]any
		check func(t *testing.T, objs []object)
	}{
		{"controller metrics over plain HTTP", nil, map[string]any{"controller": map[string]any{"metricsSecure": false},
			"monitoring": map[string]any{"serviceMonitors": map[string]any{"enabled": true}}}, func(t *testing.T, objs []object) {
			for _, a := range []string{"--metrics-bind-address=:8080", "--metrics-secure=false"} {
				if !hasArg(t, objs, "inferencecache-controller", a) {
					t.Errorf("no %s: %q", a, args(t, objs, "inferencecache-controller"))
				}
			}
			for _, o := range []object{find(objs, "Deployment", "inferencecache-controller"), find(objs, "Service", "inferencecache-controller-metrics"),
				find(objs, "ServiceMonitor", "inferencecache-controller")} {
				if o == nil {
					t.Fatal("a controller Deployment, metrics Service or ServiceMonitor is missing")
				}
				if j := toJSON(t, o); (str(o, "kind") != "ServiceMonitor" && !strings.Contains(j, "8080")) || strings.Contains(j, "8443") || strings.Contains(j, "https") || strings.Contains(j, "bearerTokenFile") {
					t.Errorf("%s still serves or scrapes HTTPS: %s", id(o), j)
				}
			}
		}},
		{"crds off", nil, map[string]any{"crds": map[string]any{"install": false}}, func(t *testing.T, objs []object) {
			if n := count(objs, "CustomResourceDefinition"); n != 0 {
				t.Errorf("%d CRDs with crds.install=false", n)
			}
		}},
		{"crds not kept", nil, map[string]any{"crds": map[string]any{"keep": false}}, func(t *testing.T, objs []object) {
			if n := count(objs, "CustomResourceDefinition"); n != 6 {
				t.Errorf("%d CRDs, want 6", n)
			}
			for _, o := range objs {
				if str(o, "kind") == "CustomResourceDefinition" && dig(o, "metadata", "annotations", "helm.sh/resource-policy") != nil {
					t.Errorf("%s keeps helm.sh/resource-policy with crds.keep=false", id(o))
				}
			}
		}},
		{"no network policies", gateway, map[string]any{"networkPolicy": map[string]any{"enabled": false}}, func(t *testing.T, objs []object) {
			if n := count(objs, "NetworkPolicy"); n != 0 {
				t.Errorf("%d NetworkPolicies with networkPolicy.enabled=false", n)
			}
		}},
		{"no PDBs", nil, map[string]any{"server": map[string]any{"pdb": map[string]any{"enabled": false}}, "controller": map[string]any{"pdb": map[string]any{"enabled": false}}}, func(t *testing.T, objs []object) {
			if n := count(objs, "PodDisruptionBudget"); n != 0 {
				t.Errorf("%d PDBs with both disabled", n)
			}
		}},
		{"PDB percentage", nil, map[string]any{"server": map[string]any{"pdb": map[string]any{"maxUnavailable": "50%"}}}, func(t *testing.T, objs []object) {
			if got := dig(find(objs, "PodDisruptionBudget", "inferencecache-server"), "spec", "maxUnavailable"); got != "50%" {
				t.Errorf("server PDB maxUnavailable %v", got)
			}
		}},
		{"tokenizer volume", nil, map[string]any{"server": map[string]any{"tokenizers": map[string]any{"volume": map[string]any{"configMap": map[string]any{"name": "tokenizers"}}}}}, func(t *testing.T, objs []object) {
			if !hasArg(t, objs, "inferencecache-server", "--tokenizer-dir=/var/lib/inferencecache/tokenizers") {
				t.Errorf("no --tokenizer-dir: %q", args(t, objs, "inferencecache-server"))
			}
			d := find(objs, "Deployment", "inferencecache-server")
			if got := toJSON(t, dig(d, "spec", "template", "spec", "volumes")); got != `[{"configMap":{"name":"tokenizers"},"name":"tokenizers"}]` {
				t.Errorf("volumes %s", got)
			}
			if got := toJSON(t, container(t, objs, "inferencecache-server")["volumeMounts"]); got != `[{"mountPath":"/var/lib/inferencecache/tokenizers","name":"tokenizers","readOnly":true}]` {
				t.Errorf("volumeMounts %s", got)
			}
		}},
		{"picker on another port", gateway, map[string]any{"server": map[string]any{"picker": map[string]any{"port": 9102}}}, func(t *testing.T, objs []object) {
			if !hasArg(t, objs, "inferencecache-server", "--ext-proc-bind-address=:9102") {
				t.Errorf("no --ext-proc-bind-address=:9102: %q", args(t, objs, "inferencecache-server"))
			}
			for _, o := range []object{
				find(objs, "Service", "inferencecache-server"), find(objs, "NetworkPolicy", "inferencecache-server-ext-proc"),
				find(objs, "InferencePool", "llama-pool"), find(objs, "Service", "inferencecache-picker"),
				find(objs, "Deployment", "inferencecache-server"),
			} {
				if j := toJSON(t, o); strings.Contains(j, "9002") || !strings.Contains(j, "9102") {
					t.Errorf("%s does not follow the picker port: %s", id(o), j)
				}
			}
		}},
		{"NATS", nil, map[string]any{"nats": map[string]any{"url": "nats://nats.example:4222"}, "server": map[string]any{"replicas": 2}}, func(t *testing.T, objs []object) {
			for _, d := range []string{"inferencecache-server", "inferencecache-controller"} {
				if !hasArg(t, objs, d, "--nats-url=nats://nats.example:4222") {
					t.Errorf("%s has no --nats-url: %q", d, args(t, objs, d))
				}
			}
		}},
		{"open allow-lists", nil, map[string]any{"controller": map[string]any{"allowedBackendImages": []any{}, "allowedServiceAccounts": []any{}}}, func(t *testing.T, objs []object) {
			for _, a := range args(t, objs, "inferencecache-controller") {
				if strings.HasPrefix(a, "--allowed-") {
					t.Errorf("empty allow-lists still pass %s", a)
				}
			}
		}},
		{"allow-lists", nil, map[string]any{"controller": map[string]any{"allowedBackendImages": []any{"ghcr.io/acme/", "lmcache/vllm-openai:"}, "allowedServiceAccounts": []any{"team-a/engine", "cache"}}}, func(t *testing.T, objs []object) {
			for _, want := range []string{"--allowed-backend-images=ghcr.io/acme/,lmcache/vllm-openai:", "--allowed-service-accounts=team-a/engine,cache"} {
				if !hasArg(t, objs, "inferencecache-controller", want) {
					t.Errorf("no %s: %q", want, args(t, objs, "inferencecache-controller"))
				}
			}
		}},
		{"images from another registry", nil, map[string]any{
			"image":      map[string]any{"registry": "registry.example.com/ic", "tag": "v9.9.9", "pullPolicy": "Always"},
			"controller": map[string]any{"image": map[string]any{"tag": "v9.9.10"}, "cacheServerImage": "lmcache/vllm-openai:v0.3.9"},
		}, func(t *testing.T, objs []object) {
			if got := container(t, objs, "inferencecache-server")["image"]; got != "registry.example.com/ic/server:v9.9.9" {
				t.Errorf("server image %v", got)
			}
			if got := container(t, objs, "inferencecache-controller")["image"]; got != "registry.example.com/ic/controller:v9.9.10" {
				t.Errorf("controller image %v", got)
			}
			if v, _ := argWithPrefix(t, objs, "inferencecache-controller", "--kvevent-subscriber-image="); v != "registry.example.com/ic/kvevent-subscriber:v9.9.9" {
				t.Errorf("subscriber image %q", v)
			}
			if !hasArg(t, objs, "inferencecache-controller", "--cache-server-image=lmcache/vllm-openai:v0.3.9") {
				t.Errorf("no --cache-server-image")
			}
			for _, d := range []string{"inferencecache-server", "inferencecache-controller"} {
				if got := container(t, objs, d)["imagePullPolicy"]; got != "Always" {
					t.Errorf("%s imagePullPolicy %v", d, got)
				}
			}
		}},
		{"extra args last", nil, map[string]any{"server": map[string]any{"extraArgs": []any{"--load-aware-routing=false"}}, "controller": map[string]any{"extraArgs": []any{"-v=2"}}}, func(t *testing.T, objs []object) {
			if a := args(t, objs, "inferencecache-server"); a[len(a)-1] != "--load-aware-routing=false" {
				t.Errorf("server args %q", a)
			}
			if a := args(t, objs, "inferencecache-controller"); a[len(a)-1] != "-v=2" {
				t.Errorf("controller args %q", a)
			}
		}},
		{"monitoring labels", []string{exampleValues("monitoring")}, map[string]any{"monitoring": map[string]any{
			"serviceMonitors": map[string]any{"labels": map[string]any{"release": "kps"}},
			"prometheusRule":  map[string]any{"labels": map[string]any{"release": "kps"}},
		}}, func(t *testing.T, objs []object) {
			for _, o := range []object{find(objs, "ServiceMonitor", "inferencecache-server"), find(objs, "ServiceMonitor", "inferencecache-controller"), find(objs, "PrometheusRule", "inferencecache")} {
				if dig(o, "metadata", "labels", "release") != "kps" {
					t.Errorf("%s has no release: kps label", id(o))
				}
			}
		}},
		{"prometheus service account", []string{exampleValues("monitoring")}, map[string]any{"monitoring": map[string]any{
			"serviceMonitors": map[string]any{"prometheusServiceAccount": map[string]any{"name": "kps-kube-prometheus-prometheus", "namespace": "obs"}},
		}}, func(t *testing.T, objs []object) {
			b := find(objs, "ClusterRoleBinding", "inferencecache-metrics-reader")
			if b == nil || toJSON(t, b["subjects"]) != `[{"kind":"ServiceAccount","name":"kps-kube-prometheus-prometheus","namespace":"obs"}]` {
				t.Errorf("metrics-reader binding %s", toJSON(t, b))
			}
		}},
		{"no prometheus service account", []string{exampleValues("monitoring")}, map[string]any{"monitoring": map[string]any{
			"serviceMonitors": map[string]any{"prometheusServiceAccount": map[string]any{"name": ""}},
		}}, func(t *testing.T, objs []object) {
			if b := find(objs, "ClusterRoleBinding", "inferencecache-metrics-reader"); b != nil {
				t.Errorf("metrics-reader bound without a ServiceAccount: %s", toJSON(t, b))
			}
			if find(objs, "ClusterRole", "inferencecache-metrics-reader") == nil {
				t.Error("no ClusterRole inferencecache-metrics-reader")
			}
		}},
		{"scheduling", nil, map[string]any{"server": map[string]any{
			"nodeSelector":      map[string]any{"pool": "cpu"},
			"tolerations":       []any{map[string]any{"key": "dedicated", "operator": "Exists"}},
			"priorityClassName": "system-cluster-critical",
			"podAnnotations":    map[string]any{"a": "b"},
		}, "imagePullSecrets": []any{map[string]any{"name": "regcred"}}}, func(t *testing.T, objs []object) {
			ps := dig(find(objs, "Deployment", "inferencecache-server"), "spec", "template", "spec").(map[string]any)
			if toJSON(t, ps["nodeSelector"]) != `{"pool":"cpu"}` || ps["priorityClassName"] != "system-cluster-critical" ||
				toJSON(t, ps["tolerations"]) != `[{"key":"dedicated","operator":"Exists"}]` || toJSON(t, ps["imagePullSecrets"]) != `[{"name":"regcred"}]` {
				t.Errorf("server pod spec %s", toJSON(t, ps))
			}
			if dig(find(objs, "Deployment", "inferencecache-server"), "spec", "template", "metadata", "annotations", "a") != "b" {
				t.Errorf("no pod annotation")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := tryRenderChart(releaseNamespace, tc.files, tc.set)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, objs)
		})
	}
}

// TestChartRefuses: values that would deploy something broken fail the
// install with a message saying what is missing.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, wantErr string
		set           map[string]any
	}{
		{"picker without its pool", "server.picker.inferencePool.namespace is required",
			map[string]any{"server": map[string]any{"picker": map[string]any{"enabled": true}}}},
		{"pool without a selector", "server.picker.inferencePool.selector is required",
			map[string]any{"server": map[string]any{"picker": map[string]any{"enabled": true, "inferencePool": map[string]any{"namespace": "a", "name": "p", "create": true, "targetPorts": []any{8000}}}}}},
		{"route without a parent", "server.picker.httpRoute.parentRefs is required",
			map[string]any{"server": map[string]any{"picker": map[string]any{"enabled": true, "inferencePool": map[string]any{"namespace": "a", "name": "p"}, "httpRoute": map[string]any{"create": true, "name": "r"}}}}},
		{"pool without ports", "server.picker.inferencePool.targetPorts is required",
			map[string]any{"server": map[string]any{"picker": map[string]any{"enabled": true, "inferencePool": map[string]any{"namespace": "a", "name": "p", "create": true, "selector": map[string]any{"app": "x"}}}}}},
		{"servers without NATS", "server.replicas > 1 needs nats.url",
			map[string]any{"server": map[string]any{"replicas": 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tryRenderChart(releaseNamespace, nil, tc.set)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("render with %v: err %v, want one naming %q", tc.set, err, tc.wantErr)
			}
		})
	}
}
