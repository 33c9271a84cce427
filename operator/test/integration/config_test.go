package integration

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/inferencecache/internal/testbin"
)

// render builds a kustomization directory with the kustomize library, as
// `kubectl apply -k` would, and returns its objects.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		raw, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(raw, &u.Object); err != nil {
			t.Fatalf("%s: %v", r.CurId(), err)
		}
		out = append(out, u)
	}
	return out
}

// dryRunApply server-side applies every object with dryRun=All: the
// apiserver runs schema validation, defaulting, CEL and the admission
// webhooks, and persists nothing.
func dryRunApply(t *testing.T, ctx context.Context, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, u := range objs {
		err := k8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(u),
			client.DryRunAll, client.ForceOwnership, client.FieldOwner("config-test"))
		if err != nil {
			t.Errorf("dry-run apply %s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			return u
		}
	}
	return nil
}

func TestConfigDefaultAppliesToAPIServer(t *testing.T) {
	ctx := needEnv(t)
	objs := render(t, "../../config/default")
	kinds := map[string]int{}
	for _, u := range objs {
		kinds[u.GetKind()]++
		if u.GetNamespace() != "" && u.GetNamespace() != "inferencecache-system" {
			t.Errorf("%s %s in namespace %q", u.GetKind(), u.GetName(), u.GetNamespace())
		}
	}
	want := map[string]int{
		"CustomResourceDefinition": 6, "Namespace": 1, "ServiceAccount": 2, "ClusterRole": 4, "ClusterRoleBinding": 4,
		"Role": 3, "RoleBinding": 3, "Deployment": 2, "Service": 2, "NetworkPolicy": 1, "ValidatingWebhookConfiguration": 1,
		"MutatingWebhookConfiguration": 1,
		"PodDisruptionBudget":          2,
	}
	for k, n := range want {
		if kinds[k] != n {
			t.Errorf("%d %s objects, want %d (all: %v)", kinds[k], k, n, kinds)
		}
	}

	// The wiring the operator's flags and the server's gates depend on.
	vwc := find(objs, "ValidatingWebhookConfiguration", "inferencecache-validating-webhook")
	if vwc == nil {
		t.Fatal("no ValidatingWebhookConfiguration inferencecache-validating-webhook")
	}
	hooks, _, _ := unstructured.NestedSlice(vwc.Object, "webhooks")
	if len(hooks) != 5 { // CachePolicy, CacheTenant, CacheBackend, PDTopology, PromptTemplate
		t.Fatalf("%d webhooks, want 5", len(hooks))
	}
	for _, h := range hooks {
		svc, _, _ := unstructured.NestedStringMap(h.(map[string]any), "clientConfig", "service")
		fp, _, _ := unstructured.NestedString(h.(map[string]any), "failurePolicy")
		if svc["name"] != "inferencecache-webhook-service" || svc["namespace"] != "inferencecache-system" || fp != "Fail" {
			t.Errorf("webhook %v: service %v, failurePolicy %s", h.(map[string]any)["name"], svc, fp)
		}
	}
	ctl := find(objs, "Deployment", "inferencecache-controller")
	text, _ := yaml.Marshal(ctl.Object)
	for _, s := range []string{
		"audience: inferencecache.io/controller", "audience: inferencecache.io/policy",
		"mountPath: /var/run/secrets/inferencecache.io/controller-token",
		"mountPath: /var/run/secrets/inferencecache.io/policy-token",
		"--policy-token-path=/var/run/secrets/inferencecache.io/policy-token/token",
		"--controller-token-path=/var/run/secrets/inferencecache.io/controller-token/token",
		"--webhook-config-name=inferencecache-validating-webhook", "--webhook-service-name=inferencecache-webhook-service",
		"--leader-elect", "serviceAccountName: inferencecache-controller",
	} {
		if !strings.Contains(string(text), s) {
			t.Errorf("controller Deployment lacks %q", s)
		}
	}
	server := find(objs, "Deployment", "inferencecache-server")
	args, _, _ := unstructured.NestedSlice(server.Object, "spec", "template", "spec", "containers")
	st, _ := yaml.Marshal(args)
	if !strings.Contains(string(st), "--allowed-controller-sa=system:serviceaccount:inferencecache-system:inferencecache-controller") {
		t.Errorf("server does not name the controller's ServiceAccount: %s", st)
	}
	svc := find(objs, "Service", "inferencecache-server")
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	var got []string
	for _, p := range ports {
		got = append(got, fmt.Sprint(p.(map[string]any)["port"]))
	}
	if slices.Compare(got, []string{"9090", "8080", "8081"}) != 0 {
		t.Errorf("server Service ports %v", got)
	}
	crb := find(objs, "ClusterRoleBinding", "inferencecache-server-auth-delegator")
	if crb == nil || crb.Object["roleRef"].(map[string]any)["name"] != "system:auth-delegator" {
		t.Errorf("server lacks system:auth-delegator: %v", crb)
	}

	// The namespace must exist for real: a dry-run Namespace is not stored.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "inferencecache-system"}}
	if err := k8s.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	dryRunApply(t, ctx, objs)
}

func TestConfigSamplesApplyThroughWebhooks(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "samples", false)
	objs := render(t, "../../config/samples")
	kinds := map[string]bool{}
	for _, u := range objs {
		kinds[u.GetKind()] = true
		if u.GetKind() != "CacheIndex" {
			u.SetNamespace(ns)
		}
	}
	for _, k := range []string{"CachePolicy", "CacheTenant", "CacheBackend", "PromptTemplate", "PDTopology", "CacheIndex"} {
		if !kinds[k] {
			t.Errorf("no sample of %s", k)
		}
	}
	dryRunApply(t, ctx, objs)
}

// TestConfigRBACLeastPrivilege pins what the controller's ServiceAccount may
// do to what the code calls; TestControllerBinary runs the binary under
// exactly these grants. A new API call needs a new row here and a marker
// (or hand-written rule) in operator/config/rbac.
func TestConfigRBACLeastPrivilege(t *testing.T) {
	objs := render(t, "../../config/default")
	const sa = "inferencecache-controller"
	bound := map[string]bool{} // kind/name of the roles bound to the controller
	for _, u := range objs {
		if k := u.GetKind(); k != "ClusterRoleBinding" && k != "RoleBinding" {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(u.Object, "subjects")
		for _, s := range subjects {
			if s.(map[string]any)["name"] == sa {
				ref, _, _ := unstructured.NestedStringMap(u.Object, "roleRef")
				bound[ref["kind"]+"/"+ref["name"]] = true
			}
		}
	}
	got := map[string][]string{} // "group resource[names]" -> verbs
	for _, u := range objs {
		if !bound[u.GetKind()+"/"+u.GetName()] {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(u.Object, "rules")
		for _, r := range rules {
			r := r.(map[string]any)
			strs := func(k string) []string {
				v, _, _ := unstructured.NestedStringSlice(r, k)
				return v
			}
			for _, g := range strs("apiGroups") {
				for _, res := range strs("resources") {
					key := fmt.Sprintf("%s %s%v", u.GetKind(), strings.TrimPrefix(g+"/"+res, "/"), strs("resourceNames"))
					got[key] = append(got[key], strs("verbs")...)
				}
			}
		}
	}
	want := map[string][]string{
		// PolicyPropagator: informers (list, watch), Accepted condition, Warning Events.
		"ClusterRole inferencecache.io/cachepolicies[]":        {"list", "watch"},
		"ClusterRole inferencecache.io/cachetenants[]":         {"list", "watch"},
		"ClusterRole inferencecache.io/cachepolicies/status[]": {"update"},
		"ClusterRole events.k8s.io/events[]":                   {"create", "patch"},
		// SnapshotPoller: the CacheIndex singleton (get through a live
		// reader when its CRD was installed after start-up), status of
		// CacheIndex and CacheTenant (updates) and of CacheBackend (merge
		// patch of indexParticipation), pod metadata for attribution.
		"ClusterRole inferencecache.io/cacheindices[]":         {"create", "get", "list", "watch"},
		"ClusterRole inferencecache.io/cacheindices/status[]":  {"update"},
		"ClusterRole inferencecache.io/cachetenants/status[]":  {"update"},
		"ClusterRole inferencecache.io/cachebackends[]":        {"list", "watch"},
		"ClusterRole inferencecache.io/cachebackends/status[]": {"patch"},
		"ClusterRole pods[]": {"list", "watch"},
		// Namespace metadata (cached): their consent to cross-namespace
		// claims, read by the reconciler, the attribution and the pod webhook.
		"ClusterRole namespaces[]": {"list", "watch"},
		// CacheBackend reconciler: the server workload, Service and HPA it
		// provisions, engine Deployments it annotates (restart cascade);
		// PromptTemplate reconciler: status.templateRevision.
		"ClusterRole apps/deployments[]":                         {"create", "delete", "list", "patch", "update", "watch"},
		"ClusterRole apps/statefulsets[]":                        {"create", "delete", "list", "update", "watch"},
		"ClusterRole services[]":                                 {"create", "delete", "list", "update", "watch"},
		"ClusterRole autoscaling/horizontalpodautoscalers[]":     {"create", "delete", "list", "update", "watch"},
		"ClusterRole policy/poddisruptionbudgets[]":              {"create", "delete", "list", "update", "watch"},
		"ClusterRole inferencecache.io/prompttemplates[]":        {"list", "watch"},
		"ClusterRole inferencecache.io/pdtopologies[]":           {"list", "watch"},
		"ClusterRole inferencecache.io/pdtopologies/status[]":    {"update"},
		"ClusterRole inferencecache.io/prompttemplates/status[]": {"patch"},
		// PolicyPropagator: the EndpointSlices of the server Service (a
		// cache restricted to its namespace and label), to push to every
		// ready server pod.
		"Role discovery.k8s.io/endpointslices[]": {"list", "watch"},
		// ... and the Service, to name the port the server address targets.
		"Role services[]": {"get"},
		// Leader election: the Lease (client-go LeaseLock: get, create,
		// update) and its core/v1 Events.
		"Role coordination.k8s.io/leases[]": {"create", "get", "update"},
		"Role events[]":                     {"create", "patch"},
		// Self-signed webhook certificate and caBundles, watched by name.
		"Role secrets[inferencecache-webhook-cert]": {"get", "list", "update", "watch"},
		"Role secrets[]": {"create"},
		"ClusterRole admissionregistration.k8s.io/validatingwebhookconfigurations[inferencecache-validating-webhook]": {"get", "list", "update", "watch"},
		"ClusterRole admissionregistration.k8s.io/mutatingwebhookconfigurations[inferencecache-mutating-webhook]":     {"get", "list", "update", "watch"},
		// --metrics-secure: each scraper's token reviewed, and whether it
		// may get /metrics.
		"ClusterRole authentication.k8s.io/tokenreviews[]":        {"create"},
		"ClusterRole authorization.k8s.io/subjectaccessreviews[]": {"create"},
	}
	for k, v := range got {
		slices.Sort(v)
		got[k] = slices.Compact(v)
	}
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			t.Errorf("%s: verbs %v, want %v", k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected grant %s: %v", k, v)
		}
	}
}

// binaryFlags builds the command pkg (a path like ./cmd/server from the
// repository root) and returns its flags (name -> usage lines) as -h lists
// them.
func binaryFlags(t *testing.T, pkg string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, filepath.Base(pkg))
	if err := testbin.Build(ctx, dir, pkg); err != nil {
		t.Fatal(err)
	}
	// The exit status of -h does not matter, only the usage it prints.
	help, _ := exec.CommandContext(ctx, bin, "-h").CombinedOutput()
	flags := map[string]string{}
	var name string
	for _, line := range strings.Split(string(help), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(line, "  -") {
			name = strings.TrimPrefix(f[0], "-")
		}
		if name != "" {
			flags[name] += line + "\n"
		}
	}
	if len(flags) == 0 {
		t.Fatalf("no flags in %s -h:\n%s", pkg, help)
	}
	return flags
}

// TestConfigControllerFlags: every flag the controller Deployment passes, in
// default/ and in scaleout/, is one `cmd/controller -h` lists.
func TestConfigControllerFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/controller; skipped with -short")
	}
	flags := binaryFlags(t, "./cmd/controller")
	for _, dir := range []string{"../../config/default", "../../config/scaleout"} {
		d := find(render(t, dir), "Deployment", "inferencecache-controller")
		for _, a := range podSpec(t, d).Containers[0].Args {
			name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if _, ok := flags[name]; !ok || !strings.HasPrefix(a, "--") {
				t.Errorf("%s: the controller Deployment passes %q, which cmd/controller -h does not list", dir, a)
			}
		}
	}
}

// TestConfigServerWiring checks the routing server's manifests against the
// server binary and against each other: every flag the Deployment passes is
// one `cmd/server -h` lists, the container ports are the server's default
// listeners, and the NetworkPolicy admits :8081 only from the controller's
// pods while leaving :9090 and :8080 open.
func TestConfigServerWiring(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/server; skipped with -short")
	}
	objs := render(t, "../../config/default")
	flags := binaryFlags(t, "./cmd/server")

	server := find(objs, "Deployment", "inferencecache-server")
	containers, _, _ := unstructured.NestedSlice(server.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if _, ok := flags[name]; !ok || !strings.HasPrefix(a, "--") {
			t.Errorf("server Deployment passes %q, which cmd/server -h does not list", a)
		}
	}
	ports := map[string]int64{}
	cports, _, _ := unstructured.NestedSlice(c, "ports")
	for _, p := range cports {
		p := p.(map[string]any)
		ports[p["name"].(string)] = asInt(p["containerPort"])
	}
	for name, flag := range map[string]string{"grpc": "grpc-bind-address", "http": "http-bind-address", "internal": "snapshot-bind-address"} {
		if want := fmt.Sprintf(`(default ":%d")`, ports[name]); !strings.Contains(flags[flag], want) {
			t.Errorf("container port %s=%d is not the default of --%s: %q", name, ports[name], flag, flags[flag])
		}
	}

	podLabels := func(name string) map[string]string {
		d := find(objs, "Deployment", name)
		l, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
		return l
	}
	selects := func(sel, labels map[string]string) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	np := find(objs, "NetworkPolicy", "inferencecache-server")
	sel, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
	if !selects(sel, podLabels("inferencecache-server")) || selects(sel, podLabels("inferencecache-controller")) {
		t.Fatalf("NetworkPolicy podSelector %v does not select exactly the server pods", sel)
	}
	// open[port] is true when any source may reach it; from[port] lists the
	// pod selectors allowed otherwise.
	open, from := map[int64]bool{}, map[int64][]map[string]string{}
	rules, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	for _, r := range rules {
		r := r.(map[string]any)
		peers, _, _ := unstructured.NestedSlice(r, "from")
		rports, _, _ := unstructured.NestedSlice(r, "ports")
		for _, p := range rports {
			port := asInt(p.(map[string]any)["port"])
			if len(peers) == 0 {
				open[port] = true
			}
			for _, peer := range peers {
				ps, _, _ := unstructured.NestedStringMap(peer.(map[string]any), "podSelector", "matchLabels")
				if _, hasNS := peer.(map[string]any)["namespaceSelector"]; hasNS || len(ps) == 0 {
					t.Errorf("ingress peer %v is broader than a pod selector in the server's namespace", peer)
				}
				from[port] = append(from[port], ps)
			}
		}
	}
	if !open[ports["grpc"]] || !open[ports["http"]] {
		t.Errorf("gRPC and public HTTP must stay open: %v", open)
	}
	if open[ports["internal"]] || len(from[ports["internal"]]) != 1 || !selects(from[ports["internal"]][0], podLabels("inferencecache-controller")) {
		t.Errorf("internal :%d must admit only the controller pods: open %v, from %v", ports["internal"], open[ports["internal"]], from[ports["internal"]])
	}
}

// asInt reads a number of a rendered object (JSON numbers decode as float64).
func asInt(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	}
	return -1
}

// TestConfigControllerTokens follows each token flag of the controller
// Deployment to the projected volume mounted there: the file must be that
// volume's ServiceAccount token, bound to the audience the server checks on
// the endpoint the flag serves (contract §4.1).
func TestConfigControllerTokens(t *testing.T) {
	ctl := find(render(t, "../../config/default"), "Deployment", "inferencecache-controller")
	spec, _, _ := unstructured.NestedMap(ctl.Object, "spec", "template", "spec")
	c := spec["containers"].([]any)[0].(map[string]any)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	vols, _, _ := unstructured.NestedSlice(spec, "volumes")
	for flag, aud := range map[string]string{"--policy-token-path": policyAud, "--controller-token-path": controllerAud} {
		var path string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, flag+"="); ok {
				path = v
			}
		}
		var volume string
		for _, m := range mounts {
			m := m.(map[string]any)
			if m["mountPath"] == filepath.Dir(path) {
				volume = m["name"].(string)
			}
		}
		var got []string
		for _, v := range vols {
			v := v.(map[string]any)
			if v["name"] != volume {
				continue
			}
			sources, _, _ := unstructured.NestedSlice(v, "projected", "sources")
			for _, s := range sources {
				a, _, _ := unstructured.NestedString(s.(map[string]any), "serviceAccountToken", "audience")
				p, _, _ := unstructured.NestedString(s.(map[string]any), "serviceAccountToken", "path")
				got = append(got, a+" "+p)
			}
		}
		if want := aud + " " + filepath.Base(path); len(got) != 1 || got[0] != want {
			t.Errorf("%s=%s: volume %q projects %v, want the token %q", flag, path, volume, got, want)
		}
	}
}
