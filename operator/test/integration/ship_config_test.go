package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/inferencecache/inferencecache/internal/testbin"
)

// nonroot is the numeric user and group of the images hack/images builds.
const nonroot = 65532

// podSpec decodes a rendered Deployment's pod template.
func podSpec(t *testing.T, d *unstructured.Unstructured) corev1.PodSpec {
	t.Helper()
	raw, _, _ := unstructured.NestedMap(d.Object, "spec", "template", "spec")
	var ps corev1.PodSpec
	if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(raw, &ps); err != nil {
		t.Fatalf("%s: %v", d.GetName(), err)
	}
	return ps
}

// Every image the overlays deploy is pinned to one version tag, set in
// default/kustomization.yaml; no manifest anywhere names :latest.
func TestConfigImagesPinned(t *testing.T) {
	tags := map[string]bool{}
	subscriber := false
	for _, dir := range []string{"../../config/default", "../../config/scaleout"} {
		for _, u := range render(t, dir) {
			if u.GetKind() != "Deployment" {
				continue
			}
			ps := podSpec(t, u)
			for _, c := range append(ps.InitContainers, ps.Containers...) {
				repo, tag, ok := strings.Cut(c.Image, ":")
				if !ok || !strings.HasPrefix(repo, "ghcr.io/inferencecache/") || tag == "" || tag == "latest" || strings.Contains(c.Image, "@") {
					t.Errorf("%s: %s/%s image %q is not ghcr.io/inferencecache/NAME:VERSION", dir, u.GetName(), c.Name, c.Image)
				}
				tags[tag] = true
				// The injected sidecar's image is a flag of the controller;
				// kustomize's images: cannot reach it, so it must carry the
				// same pinned version by hand.
				for _, a := range c.Args {
					if img, ok := strings.CutPrefix(a, "--kvevent-subscriber-image="); ok {
						repo, tag, _ := strings.Cut(img, ":")
						if repo != "ghcr.io/inferencecache/kvevent-subscriber" {
							t.Errorf("%s: --kvevent-subscriber-image %q is not ghcr.io/inferencecache/kvevent-subscriber", dir, img)
						}
						tags[tag] = true
						subscriber = true
					}
				}
			}
		}
	}
	if !subscriber {
		t.Errorf("no controller passes --kvevent-subscriber-image: injected engine pods would get no sidecar")
	}
	if len(tags) != 1 {
		t.Errorf("images carry the tags %v, want one version", tags)
	}
	latest := regexp.MustCompile(`:latest\b|newTag:\s*["']?latest`)
	err := filepath.WalkDir("../../config", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if latest.Match(b) {
			t.Errorf("%s names the latest tag", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The pods run as the images' nonroot user, and each Deployment has a
// PodDisruptionBudget selecting exactly its pods; the controller spreads
// its replicas over nodes and zones.
func TestConfigPodsSecurityDisruptionSpread(t *testing.T) {
	objs := render(t, "../../config/default")
	for _, name := range []string{"inferencecache-server", "inferencecache-controller"} {
		d := find(objs, "Deployment", name)
		if d == nil {
			t.Fatalf("no Deployment %s", name)
		}
		ps := podSpec(t, d)
		sc := ps.SecurityContext
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != nonroot || sc.RunAsGroup == nil || *sc.RunAsGroup != nonroot ||
			sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("%s: pod securityContext %+v, want runAsNonRoot and %d:%d", name, sc, nonroot, nonroot)
		}
		for _, c := range ps.Containers {
			if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil && *c.SecurityContext.RunAsUser != nonroot {
				t.Errorf("%s/%s overrides runAsUser to %d", name, c.Name, *c.SecurityContext.RunAsUser)
			}
		}

		podLabels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
		pdb := find(objs, "PodDisruptionBudget", name)
		if pdb == nil {
			t.Errorf("no PodDisruptionBudget %s", name)
			continue
		}
		sel, _, _ := unstructured.NestedStringMap(pdb.Object, "spec", "selector", "matchLabels")
		if len(sel) == 0 || !subset(sel, podLabels) {
			t.Errorf("PDB %s selector %v does not select its pods %v", name, sel, podLabels)
		}
		for _, other := range objs {
			if other.GetKind() == "Deployment" && other.GetName() != name {
				l, _, _ := unstructured.NestedStringMap(other.Object, "spec", "template", "metadata", "labels")
				if subset(sel, l) {
					t.Errorf("PDB %s also selects the pods of %s", name, other.GetName())
				}
			}
		}
		// Disruptions must stay possible: a budget no eviction can satisfy
		// blocks every node drain.
		if mu, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "maxUnavailable"); fmt.Sprint(mu) != "1" {
			t.Errorf("PDB %s maxUnavailable %v, want 1", name, mu)
		}
	}

	ps := podSpec(t, find(objs, "Deployment", "inferencecache-controller"))
	keys := map[string]bool{}
	for _, c := range ps.TopologySpreadConstraints {
		if c.LabelSelector == nil || c.LabelSelector.MatchLabels["app.kubernetes.io/name"] != "inferencecache-controller" {
			t.Errorf("spread constraint %s selects %v, not the controller pods", c.TopologyKey, c.LabelSelector)
		}
		if c.WhenUnsatisfiable != corev1.ScheduleAnyway {
			t.Errorf("spread constraint %s is %s: a one-node cluster could not run both replicas", c.TopologyKey, c.WhenUnsatisfiable)
		}
		keys[c.TopologyKey] = true
	}
	if !keys["kubernetes.io/hostname"] || !keys["topology.kubernetes.io/zone"] {
		t.Errorf("controller spreads over %v, want nodes and zones", keys)
	}
}

func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// downward resolves a container's env the way the kubelet does for the
// cases the manifests use: resourceFieldRef of the container's own
// resources (value rounded up to the divisor) and $(VAR) references to
// earlier variables.
func downward(t *testing.T, c corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil:
			r := e.ValueFrom.ResourceFieldRef
			if r.ContainerName != "" && r.ContainerName != c.Name {
				t.Fatalf("%s: resourceFieldRef of container %q", e.Name, r.ContainerName)
			}
			var q resource.Quantity
			switch r.Resource {
			case "limits.memory":
				q = c.Resources.Limits[corev1.ResourceMemory]
			case "requests.memory":
				q = c.Resources.Requests[corev1.ResourceMemory]
			default:
				t.Fatalf("%s: unexpected resource %s", e.Name, r.Resource)
			}
			div := r.Divisor
			if div.IsZero() {
				div = resource.MustParse("1")
			}
			n := (q.Value() + div.Value() - 1) / div.Value()
			env[e.Name] = fmt.Sprint(n)
		case e.ValueFrom == nil:
			env[e.Name] = ref.ReplaceAllStringFunc(e.Value, func(m string) string {
				v, ok := env[m[2:len(m)-1]]
				if !ok {
					t.Errorf("%s refers to %s, which is not defined before it", e.Name, m)
				}
				return v
			})
		}
	}
	return env
}

// TestConfigServerMemoryFromLimit runs the server binary with the args and
// env the kubelet would give the default Deployment's container, and checks
// the index budget and the GC's soft limit it derives stay inside the
// container's memory limit, as the manifests promise.
func TestConfigServerMemoryFromLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/server; skipped with -short")
	}
	d := find(render(t, "../../config/default"), "Deployment", "inferencecache-server")
	c := podSpec(t, d).Containers[0]
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		t.Fatal("the server container has no memory limit")
	}
	if req := c.Resources.Requests[corev1.ResourceMemory]; req.Cmp(limit) != 0 {
		t.Errorf("server memory request %s, want it equal to the limit %s", req.String(), limit.String())
	}
	env := downward(t, c)
	if _, set := env["GOMEMLIMIT"]; set {
		t.Error("GOMEMLIMIT is set in the Deployment: the server derives it from --memory-limit")
	}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	var args []string
	var memFlag bool
	for _, a := range c.Args {
		a = ref.ReplaceAllStringFunc(a, func(m string) string { return env[m[2:len(m)-1]] })
		memFlag = memFlag || strings.HasPrefix(a, "--memory-limit=")
		if strings.HasPrefix(a, "--max-index-bytes") {
			t.Errorf("the Deployment sets %s, which overrides the budget derived from the limit", a)
		}
		// The binary runs here, not in the cluster: no TokenReview, loopback listeners.
		if !strings.HasPrefix(a, "--allowed-controller-sa=") {
			args = append(args, a)
		}
	}
	if !memFlag {
		t.Fatalf("server args %q lack --memory-limit", c.Args)
	}
	if want := fmt.Sprintf("--memory-limit=%d", limit.Value()); !contains(args, want) {
		t.Fatalf("server args resolve to %q, want %s", args, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "server")
	if err := testbin.Build(ctx, dir, "./cmd/server"); err != nil {
		t.Fatal(err)
	}
	args = append(args, "--insecure-disable-auth", "--grpc-bind-address=127.0.0.1:0",
		"--http-bind-address=127.0.0.1:0", "--snapshot-bind-address=127.0.0.1:0")
	runCtx, stop := context.WithTimeout(ctx, 3*time.Second)
	defer stop()
	cmd := exec.CommandContext(runCtx, bin, args...)
	cmd.Env = append(os.Environ(), "GOMEMLIMIT=") // an empty GOMEMLIMIT is unset for the runtime
	out, _ := cmd.CombinedOutput()                // killed at the deadline; the log is what counts
	var got struct {
		Msg           string `json:"msg"`
		MemoryLimit   int64  `json:"memory_limit"`
		MaxIndexBytes int64  `json:"max_index_bytes"`
		GoMemLimit    int64  `json:"gomemlimit"`
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, `"msg":"memory limit"`) {
			if err := json.Unmarshal([]byte(line), &got); err != nil {
				t.Fatalf("%v: %s", err, line)
			}
		}
	}
	if got.MemoryLimit != limit.Value() {
		t.Fatalf("server saw memory limit %d, want %d; output:\n%s", got.MemoryLimit, limit.Value(), out)
	}
	if got.MaxIndexBytes != limit.Value()/2 || got.GoMemLimit != limit.Value()*9/10 {
		t.Errorf("index budget %d and GOMEMLIMIT %d from limit %d, want 50 %% and 90 %%", got.MaxIndexBytes, got.GoMemLimit, limit.Value())
	}
	if !strings.Contains(string(out), fmt.Sprintf(`"max_index_bytes":%d`, limit.Value()/2)) || !strings.Contains(string(out), "serving") {
		t.Errorf("the server did not serve with the derived budget:\n%s", out)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// The controller's GC soft limit is its memory request, below its limit.
func TestConfigControllerMemory(t *testing.T) {
	d := find(render(t, "../../config/default"), "Deployment", "inferencecache-controller")
	c := podSpec(t, d).Containers[0]
	env := downward(t, c)
	gml, ok := env["GOMEMLIMIT"]
	if !ok {
		t.Fatal("controller has no GOMEMLIMIT")
	}
	n, ok := strings.CutSuffix(gml, "MiB")
	var mib int64
	if _, err := fmt.Sscan(n, &mib); !ok || err != nil {
		t.Fatalf("GOMEMLIMIT %q is not N MiB", gml)
	}
	limit := c.Resources.Limits[corev1.ResourceMemory]
	req := c.Resources.Requests[corev1.ResourceMemory]
	if mib<<20 != req.Value() || req.Cmp(limit) >= 0 {
		t.Errorf("GOMEMLIMIT %s, request %s, limit %s: want GOMEMLIMIT = request < limit", gml, req.String(), limit.String())
	}
	if min := resource.MustParse("256Mi"); req.Cmp(min) < 0 {
		t.Errorf("controller memory request %s is below the 256Mi its informers need", req.String())
	}
}

// The monitoring bundle: default/ carries no Prometheus-operator kinds (it
// must apply without those CRDs); prometheus/ has a metrics Service per
// binary that selects its pods and targets the container port serving
// /metrics, a ServiceMonitor scraping each (the controller's over HTTPS
// with Prometheus's token, which the metrics-reader binding authorizes),
// the PrometheusRule and the dashboard ConfigMaps. The Services and ConfigMaps pass a dry-run apply
// (the monitoring.coreos.com kinds cannot: envtest has no Prometheus
// operator; rulestest/ checks the rules).
func TestConfigPrometheus(t *testing.T) {
	ctx := needEnv(t)
	def := render(t, "../../config/default")
	for _, u := range def {
		if strings.HasPrefix(u.GetAPIVersion(), "monitoring.coreos.com/") {
			t.Errorf("default/ holds %s %s, which needs the Prometheus operator", u.GetKind(), u.GetName())
		}
	}
	objs := render(t, "../../config/prometheus")
	kinds := map[string]int{}
	for _, u := range objs {
		kinds[u.GetKind()]++
		if u.GetKind() == "ClusterRoleBinding" {
			continue // cluster-scoped
		}
		if u.GetNamespace() != "inferencecache-system" {
			t.Errorf("%s %s in namespace %q", u.GetKind(), u.GetName(), u.GetNamespace())
		}
	}
	// The ConfigMaps are the Grafana dashboards (../grafana; dashgen/ checks them).
	if kinds["Service"] != 2 || kinds["ServiceMonitor"] != 2 || kinds["PrometheusRule"] != 1 || kinds["ConfigMap"] != 3 || kinds["ClusterRoleBinding"] != 1 || len(objs) != 9 {
		t.Fatalf("prometheus/ renders %v", kinds)
	}
	var dashboards []*unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == "ConfigMap" {
			dashboards = append(dashboards, u)
		}
	}
	dryRunApply(t, ctx, dashboards)

	// The reader binding names the ClusterRole rbac/ ships.
	crb := find(objs, "ClusterRoleBinding", "inferencecache-metrics-reader")
	if crb == nil || find(def, "ClusterRole", "inferencecache-metrics-reader") == nil {
		t.Fatal("no ClusterRoleBinding inferencecache-metrics-reader in prometheus/ or no ClusterRole of that name in default/")
	}
	if ref, _, _ := unstructured.NestedStringMap(crb.Object, "roleRef"); ref["kind"] != "ClusterRole" || ref["name"] != "inferencecache-metrics-reader" {
		t.Errorf("metrics-reader binding refers to %v", ref)
	}
	dryRunApply(t, ctx, []*unstructured.Unstructured{crb})

	for _, bin := range []struct {
		deployment, service, monitor, port string
		secure                             bool
	}{
		{"inferencecache-server", "inferencecache-server-metrics", "inferencecache-server", "http", false},
		{"inferencecache-controller", "inferencecache-controller-metrics", "inferencecache-controller", "metrics", true},
	} {
		d := find(def, "Deployment", bin.deployment)
		podLabels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
		svc := find(objs, "Service", bin.service)
		if svc == nil {
			t.Fatalf("no Service %s", bin.service)
		}
		sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
		if len(sel) == 0 || !subset(sel, podLabels) {
			t.Errorf("Service %s selects %v, not the %s pods", bin.service, sel, bin.deployment)
		}
		ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
		if len(ports) != 1 || ports[0].(map[string]any)["targetPort"] != bin.port {
			t.Errorf("Service %s ports %v, want one targeting the container port %q", bin.service, ports, bin.port)
		}
		ps := podSpec(t, d)
		var metricsPort int32
		for _, p := range ps.Containers[0].Ports {
			if p.Name == bin.port {
				metricsPort = p.ContainerPort
			}
		}
		if metricsPort == 0 {
			t.Errorf("%s has no container port %q", bin.deployment, bin.port)
		}
		// The port is where the binary serves /metrics: the server's public
		// HTTP listener (default :8080), the controller's --metrics-bind-address.
		for _, a := range ps.Containers[0].Args {
			if v, ok := strings.CutPrefix(a, "--metrics-bind-address="); ok && v != fmt.Sprintf(":%d", metricsPort) {
				t.Errorf("%s serves metrics on %s, the Service targets %d", bin.deployment, v, metricsPort)
			}
		}

		sm := find(objs, "ServiceMonitor", bin.monitor)
		if sm == nil {
			t.Fatalf("no ServiceMonitor %s", bin.monitor)
		}
		msel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		if !subset(msel, svc.GetLabels()) {
			t.Errorf("ServiceMonitor %s selects %v, not Service %s %v", bin.monitor, msel, bin.service, svc.GetLabels())
		}
		for _, other := range append(def, objs...) {
			if other.GetKind() == "Service" && other.GetName() != bin.service && subset(msel, other.GetLabels()) {
				t.Errorf("ServiceMonitor %s also selects Service %s", bin.monitor, other.GetName())
			}
		}
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		svcPort := ports[0].(map[string]any)["name"]
		if len(eps) != 1 || eps[0].(map[string]any)["port"] != svcPort || eps[0].(map[string]any)["path"] != "/metrics" {
			t.Fatalf("ServiceMonitor %s endpoints %v, want /metrics on port %v", bin.monitor, eps, svcPort)
		}
		// The controller's /metrics (--metrics-secure, its default) is HTTPS
		// with a self-signed certificate and wants a bearer token.
		ep := eps[0].(map[string]any)
		if bin.secure && contains(ps.Containers[0].Args, "--metrics-secure=false") {
			t.Errorf("%s serves plain HTTP metrics, the ServiceMonitor scrapes HTTPS", bin.deployment)
		}
		skip, _, _ := unstructured.NestedBool(ep, "tlsConfig", "insecureSkipVerify")
		if bin.secure && (ep["scheme"] != "https" || ep["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" || !skip) {
			t.Errorf("ServiceMonitor %s endpoint %v, want https with Prometheus's token and the self-signed certificate accepted", bin.monitor, ep)
		}
		if !bin.secure && ep["scheme"] != nil {
			t.Errorf("ServiceMonitor %s endpoint scheme %v, want the default http", bin.monitor, ep["scheme"])
		}
		dryRunApply(t, ctx, []*unstructured.Unstructured{svc})
	}
}
