package integration

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	icwebhook "github.com/inferencecache/inferencecache/operator/internal/webhook"
)

func podObj(ns, name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai", Args: []string{"--model=m"}}}}}
}

func envNames(env []corev1.EnvVar) map[string]string {
	out := map[string]string{}
	for _, e := range env {
		out[e.Name] = e.Value
	}
	return out
}

func countFlag(args []string, name string) int {
	n := 0
	for _, a := range args {
		if f, _, _ := strings.Cut(a, "="); f == name {
			n++
		}
	}
	return n
}

// TestPodInjection: the apiserver calls the pod webhook (config rendered
// from operator/config/webhook) and stores the injected pod; unmatched and
// opted-out pods are stored as sent; a pod re-created from an injected one
// is not injected twice.
func TestPodInjection(t *testing.T) {
	ctx := needEnv(t)
	ns := injectionNamespace(t, ctx, "inject")
	sel := map[string]string{"app": "engine"}
	mk := func(name string, mut func(*v1alpha1.CacheBackend)) {
		cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.CacheBackendSpec{
			Type: v1alpha1.BackendExternal, Endpoint: "lm://ext.cache.svc:65432",
			EngineSelector: &v1alpha1.EngineSelector{MatchLabels: sel},
			BackendConfig:  map[string]string{icwebhook.BackendConfigModel: "meta/llama"},
		}}
		if mut != nil {
			mut(cb)
		}
		wantOK(t, "create CacheBackend "+name, k8s.Create(ctx, cb))
	}
	mk("zz-other", nil) // same selector, later name: never chosen
	mk("cb", func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Integration = &v1alpha1.CacheBackendIntegration{EngineOverrides: &v1alpha1.EngineOverrides{
			Args:         []string{"--extra=1"},
			SuppressArgs: []string{"--kv-transfer-config"},
			Env:          []corev1.EnvVar{{Name: "EXTRA", Value: "1"}},
			SuppressEnv:  []string{"LMCACHE_REMOTE_SERDE"},
		}}
	})
	mk("aa-empty", func(cb *v1alpha1.CacheBackend) { cb.Spec.EngineSelector.MatchLabels = map[string]string{} })

	matched := podObj(ns, "matched", map[string]string{"app": "engine", "pod-template-hash": "x"})
	wantOK(t, "create matched pod", k8s.Create(ctx, matched))
	var got corev1.Pod
	wantOK(t, "get matched pod", k8s.Get(ctx, client.ObjectKeyFromObject(matched), &got))
	if by := got.Annotations[icwebhook.AnnotationInjectedBy]; by != ns+"/cb" {
		t.Fatalf("injected-by %q, want %s/cb (annotations %v)", by, ns, got.Annotations)
	}
	if len(got.Spec.Containers) != 2 || got.Spec.Containers[1].Name != icwebhook.SubscriberContainer {
		t.Fatalf("containers %v", got.Spec.Containers)
	}
	eng, sub := got.Spec.Containers[0], got.Spec.Containers[1]
	if !slices.Contains(eng.Args, "--kv-events-config="+icwebhook.KVEventsConfig()) || !slices.Contains(eng.Args, "--extra=1") {
		t.Errorf("engine args %v", eng.Args)
	}
	if countFlag(eng.Args, "--kv-transfer-config") != 0 {
		t.Errorf("suppressed arg injected: %v", eng.Args)
	}
	env := envNames(eng.Env)
	if env["LMCACHE_REMOTE_URL"] != "lm://ext.cache.svc:65432" || env["EXTRA"] != "1" {
		t.Errorf("engine env %v", eng.Env)
	}
	if _, ok := env["LMCACHE_REMOTE_SERDE"]; ok {
		t.Errorf("suppressed env injected: %v", eng.Env)
	}
	if sub.Image != testSubscriberImage {
		t.Errorf("sidecar image %q", sub.Image)
	}
	if cfg := icwebhook.KVEventsConfig(); !strings.Contains(cfg, `"endpoint":"tcp://127.0.0.1:5557"`) || !strings.Contains(cfg, `"replay_endpoint":"tcp://127.0.0.1:5558"`) {
		t.Errorf("kv-events-config %s: want the publisher and the replay on loopback", cfg)
	}
	for _, want := range []string{"--model-id=meta/llama", "--hash-scheme=vllm", "--engine-endpoint=tcp://127.0.0.1:5557",
		"--engine-endpoint-mode=bind", "--engine-replay-endpoint=tcp://127.0.0.1:5558",
		"--replica-id=$(POD_NAME)", "--tenant-id=$(POD_NAMESPACE)", "--ignore-block-removed=true", "--server-address=127.0.0.1:9090"} {
		if !slices.Contains(sub.Args, want) {
			t.Errorf("sidecar args %v lack %s", sub.Args, want)
		}
	}

	// Not selected, empty-selector, opted out by label or by annotation:
	// stored exactly as sent.
	for name, p := range map[string]*corev1.Pod{
		"unmatched":  podObj(ns, "unmatched", map[string]string{"app": "web"}),
		"no-labels":  podObj(ns, "no-labels", nil),
		"opt-out":    podObj(ns, "opt-out", map[string]string{"app": "engine", icwebhook.LabelInject: "false"}),
		"opt-out-an": podObj(ns, "opt-out-an", map[string]string{"app": "engine"}),
	} {
		if name == "opt-out-an" {
			p.Annotations = map[string]string{icwebhook.LabelInject: "false"}
		}
		wantOK(t, "create "+name, k8s.Create(ctx, p))
		var g corev1.Pod
		wantOK(t, "get "+name, k8s.Get(ctx, client.ObjectKeyFromObject(p), &g))
		if _, ok := g.Annotations[icwebhook.AnnotationInjectedBy]; ok || len(g.Spec.Containers) != 1 || len(g.Spec.Containers[0].Args) != 1 {
			t.Errorf("%s was injected: annotations %v, containers %v", name, g.Annotations, g.Spec.Containers)
		}
	}

	// Idempotence: a pod re-created from the injected one's spec (with or
	// without the annotation) is not injected twice.
	for _, keepAnnotation := range []bool{true, false} {
		cp := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("copy-%t", keepAnnotation), Labels: got.Labels},
			Spec: *got.Spec.DeepCopy()}
		if keepAnnotation {
			cp.Annotations = got.Annotations
		}
		cp.Spec.NodeName = ""
		wantOK(t, "create copy", k8s.Create(ctx, cp))
		var g corev1.Pod
		wantOK(t, "get copy", k8s.Get(ctx, client.ObjectKeyFromObject(cp), &g))
		if len(g.Spec.Containers) != 2 || len(g.Spec.Volumes) != len(got.Spec.Volumes) {
			t.Errorf("copy (annotation %t): containers %d, volumes %d", keepAnnotation, len(g.Spec.Containers), len(g.Spec.Volumes))
		}
		if a := g.Spec.Containers[0].Args; countFlag(a, "--kv-events-config") != 1 || countFlag(a, "--extra") != 1 || len(a) != len(eng.Args) {
			t.Errorf("copy (annotation %t): engine args %v", keepAnnotation, a)
		}
		if len(g.Spec.Containers[0].Env) != len(eng.Env) {
			t.Errorf("copy (annotation %t): engine env %v", keepAnnotation, g.Spec.Containers[0].Env)
		}
		if g.Annotations[icwebhook.AnnotationInjectedBy] != ns+"/cb" {
			t.Errorf("copy (annotation %t): annotations %v", keepAnnotation, g.Annotations)
		}
	}
}

// TestPodInjectionCrossNamespace: a backend with allowCrossNamespace claims
// pods of another namespace only when that namespace consents (its
// inferencecache.io/allow-claims-from annotation names the backend's
// namespace); one without allowCrossNamespace never does.
func TestPodInjectionCrossNamespace(t *testing.T) {
	ctx := needEnv(t)
	home := namespace(t, ctx, "inject-home", false)
	other := injectionNamespace(t, ctx, "inject-other")
	for _, c := range []struct {
		name  string
		label string
		cross bool
	}{{"shared", "shared-engine", true}, {"private", "private-engine", false}} {
		wantOK(t, "create "+c.name, k8s.Create(ctx, &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: c.name},
			Spec: v1alpha1.CacheBackendSpec{
				Type: v1alpha1.BackendExternal, Endpoint: "cache.example:8200", AllowCrossNamespace: c.cross,
				Integration:    &v1alpha1.CacheBackendIntegration{Mode: v1alpha1.IntegrationEventsOnly},
				EngineSelector: &v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": c.label}},
			}}))
	}
	injectedBy := func(name, label string) string {
		t.Helper()
		p := podObj(other, name, map[string]string{"app": label})
		wantOK(t, "create pod", k8s.Create(ctx, p))
		var g corev1.Pod
		wantOK(t, "get pod", k8s.Get(ctx, client.ObjectKeyFromObject(p), &g))
		if g.Annotations[icwebhook.AnnotationInjectedBy] != "" && len(g.Spec.Containers) != 1 {
			// No spec.backendConfig.model: engine wiring only, no sidecar.
			t.Errorf("pod %s: sidecar injected without a model: %v", name, g.Spec.Containers)
		}
		return g.Annotations[icwebhook.AnnotationInjectedBy]
	}
	// Without the target namespace's consent, nothing is claimed across.
	if got := injectedBy("before-consent", "shared-engine"); got != "" {
		t.Fatalf("a pod of %s was injected by %q without the namespace's consent", other, got)
	}
	// Consent for another namespace is no consent for home.
	consent := func(value string) {
		t.Helper()
		var n corev1.Namespace
		wantOK(t, "get namespace", k8s.Get(ctx, client.ObjectKey{Name: other}, &n))
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations["inferencecache.io/allow-claims-from"] = value
		wantOK(t, "annotate namespace", k8s.Update(ctx, &n))
	}
	consent("some-other-ns")
	if got := injectedBy("other-consent", "shared-engine"); got != "" {
		t.Fatalf("injected by %q with consent for another namespace only", got)
	}
	consent("some-other-ns, " + home)
	for label, want := range map[string]string{"shared-engine": home + "/shared", "private-engine": ""} {
		if got := injectedBy("consented-"+label, label); got != want {
			t.Errorf("pod %s: injected-by %q, want %q", label, got, want)
		}
	}
}

// TestPodInjectionFailsOpen: the shipped pod webhook, pointed at an address
// where nothing listens, does not stop pods from being created.
func TestPodInjectionFailsOpen(t *testing.T) {
	ctx := needEnv(t)
	ns := injectionNamespace(t, ctx, "inject-open")
	_, mwc, err := loadWebhooks("../../config/webhook")
	wantOK(t, "load webhooks", err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	wantOK(t, "reserve a port", err)
	dead := "https://" + l.Addr().String() + icwebhook.PodInjectionPath
	wantOK(t, "close", l.Close())

	mwc.Name = "inject-fails-open"
	w := &mwc.Webhooks[0]
	shipped := w.FailurePolicy
	if shipped == nil || *shipped != admissionv1.Ignore {
		t.Fatalf("shipped pod webhook failurePolicy %v, want Ignore", w.FailurePolicy)
	}
	w.Name = "dead.inferencecache.io"
	w.ClientConfig = admissionv1.WebhookClientConfig{URL: &dead}
	w.ObjectSelector.MatchLabels = map[string]string{"inject-test": "fails-open"} // only this test's pods
	// First as Fail, to see the apiserver actually call the dead webhook.
	fail := admissionv1.Fail
	w.FailurePolicy = &fail
	wantOK(t, "create dead webhook", k8s.Create(ctx, mwc))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), mwc) })
	create := func() error {
		p := podObj(ns, "", map[string]string{"inject-test": "fails-open"})
		p.GenerateName = "open-"
		return k8s.Create(ctx, p)
	}
	eventually(t, propagationLimit, func() error {
		if create() == nil {
			return fmt.Errorf("the apiserver does not call the dead webhook yet")
		}
		return nil
	})
	// With the shipped policy the same webhook no longer blocks pods.
	wantOK(t, "get webhook", k8s.Get(ctx, client.ObjectKeyFromObject(mwc), mwc))
	mwc.Webhooks[0].FailurePolicy = shipped
	wantOK(t, "update webhook", k8s.Update(ctx, mwc))
	eventually(t, propagationLimit, create)
	for range 3 {
		wantOK(t, "create pod past a dead webhook", create())
	}
}

// TestPodInjectionManagedEndpointAndEvents: a pod created before its managed
// backend was ever reconciled (no status.endpoint; the suite runs no
// CacheBackend reconciler) gets the backend Service's address; what the
// webhook could not wire becomes a Warning Event on the CacheBackend.
func TestPodInjectionManagedEndpointAndEvents(t *testing.T) {
	ctx := needEnv(t)
	ns := injectionNamespace(t, ctx, "inject-managed")
	wantOK(t, "managed backend", k8s.Create(ctx, &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lmc"},
		Spec: v1alpha1.CacheBackendSpec{EngineSelector: &v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "managed"}},
			BackendConfig: map[string]string{icwebhook.BackendConfigModel: "m"}}}))
	wantOK(t, "backend without a model", k8s.Create(ctx, &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nomodel"},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendExternal, Endpoint: "ext:8200",
			EngineSelector: &v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "nomodel"}}}}))

	p := podObj(ns, "managed-0", map[string]string{"app": "managed"})
	wantOK(t, "create pod", k8s.Create(ctx, p))
	var g corev1.Pod
	wantOK(t, "get pod", k8s.Get(ctx, client.ObjectKeyFromObject(p), &g))
	if got := envNames(g.Spec.Containers[0].Env)["LMCACHE_REMOTE_URL"]; got != "lm://lmc."+ns+".svc:8200" {
		t.Fatalf("LMCACHE_REMOTE_URL %q, want the backend Service's address", got)
	}

	wantOK(t, "create pod", k8s.Create(ctx, podObj(ns, "nomodel-0", map[string]string{"app": "nomodel"})))
	eventually(t, propagationLimit, func() error {
		var evs eventsv1.EventList
		if err := k8s.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Kind == "CacheBackend" && e.Regarding.Name == "nomodel" && e.Type == corev1.EventTypeWarning &&
				e.Reason == "InjectionIncomplete" && strings.Contains(e.Note, "backendConfig.model") && strings.Contains(e.Note, "nomodel-0") {
				return nil
			}
		}
		return fmt.Errorf("no InjectionIncomplete Event on CacheBackend nomodel among %d", len(evs.Items))
	})
}

// TestPodInjectionDataParallel: a pod whose engine runs two data-parallel
// ranks is stored with one sidecar that follows both (--data-parallel-size=2:
// rank r bound on 5557+r, replayed from 5559+r, reported as
// $(POD_NAME)-dp<r>), and the engine's config places the replays after the
// last rank's publisher.
func TestPodInjectionDataParallel(t *testing.T) {
	ctx := needEnv(t)
	ns := injectionNamespace(t, ctx, "inject-dp")
	wantOK(t, "backend", k8s.Create(ctx, &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cb"},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendExternal, Endpoint: "ext:8200",
			EngineSelector: &v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "dp"}},
			BackendConfig:  map[string]string{icwebhook.BackendConfigModel: "m"}}}))
	p := podObj(ns, "dp-0", map[string]string{"app": "dp"})
	p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, "--data-parallel-size", "2")
	wantOK(t, "create pod", k8s.Create(ctx, p))
	var g corev1.Pod
	wantOK(t, "get pod", k8s.Get(ctx, client.ObjectKeyFromObject(p), &g))
	if len(g.Spec.Containers) != 2 || g.Spec.Containers[1].Name != icwebhook.SubscriberContainer {
		t.Fatalf("containers %v, want the engine and one sidecar for both ranks", g.Spec.Containers)
	}
	eng, sub := g.Spec.Containers[0], g.Spec.Containers[1]
	var cfg string
	for _, a := range eng.Args {
		if v, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
			cfg = v
		}
	}
	if !strings.Contains(cfg, `"endpoint":"tcp://127.0.0.1:5557"`) || !strings.Contains(cfg, `"replay_endpoint":"tcp://127.0.0.1:5559"`) {
		t.Errorf("engine kv-events-config %q: want publishers from 127.0.0.1:5557, replays from 127.0.0.1:5559", cfg)
	}
	for _, want := range []string{"--replica-id=$(POD_NAME)", "--data-parallel-size=2", "--engine-endpoint=tcp://127.0.0.1:5557",
		"--engine-endpoint-mode=bind", "--engine-replay-endpoint=tcp://127.0.0.1:5559"} {
		if !slices.Contains(sub.Args, want) {
			t.Errorf("sidecar args %v lack %s", sub.Args, want)
		}
	}
	if got := sub.Resources.Limits[corev1.ResourceMemory]; got.String() != "512Mi" {
		t.Errorf("sidecar memory limit %s, want 512Mi (256Mi per rank)", got.String())
	}
}

// TestPodInjectionFollowsOwnEventsConfig: a pod whose engine sets its own
// --kv-events-config (which wins over the webhook's) with a wildcard
// publisher, as vLLM's docs show, gets a sidecar that connects to it on
// loopback instead of binding the port the engine binds.
func TestPodInjectionFollowsOwnEventsConfig(t *testing.T) {
	ctx := needEnv(t)
	ns := injectionNamespace(t, ctx, "inject-own")
	wantOK(t, "backend", k8s.Create(ctx, &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cb"},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendExternal, Endpoint: "ext:8200",
			EngineSelector: &v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "own"}},
			BackendConfig:  map[string]string{icwebhook.BackendConfigModel: "m"}}}))
	p := podObj(ns, "own-0", map[string]string{"app": "own"})
	own := `--kv-events-config={"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv-events"}`
	p.Spec.Containers[0].Args = append(p.Spec.Containers[0].Args, own)
	wantOK(t, "create pod", k8s.Create(ctx, p))
	var g corev1.Pod
	wantOK(t, "get pod", k8s.Get(ctx, client.ObjectKeyFromObject(p), &g))
	if len(g.Spec.Containers) != 2 {
		t.Fatalf("containers %v", g.Spec.Containers)
	}
	if eng := g.Spec.Containers[0].Args; countFlag(eng, "--kv-events-config") != 1 || !slices.Contains(eng, own) {
		t.Errorf("engine args %v: the pod's own --kv-events-config must stay the only one", eng)
	}
	for _, want := range []string{"--engine-endpoint=tcp://127.0.0.1:5557", "--engine-endpoint-mode=connect", "--engine-replay-endpoint=tcp://127.0.0.1:5558"} {
		if sub := g.Spec.Containers[1].Args; !slices.Contains(sub, want) {
			t.Errorf("sidecar args %v lack %s", sub, want)
		}
	}
}

// TestPodInjectionOptInNamespace: the pod webhook is called only for pods of
// namespaces labelled inferencecache.io/injection=enabled; elsewhere a pod a
// CacheBackend selects is stored as sent, and every other pod CREATE in the
// cluster skips the webhook.
func TestPodInjectionOptInNamespace(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "inject-not-enabled", false)
	wantOK(t, "backend", k8s.Create(ctx, &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cb"},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendExternal, Endpoint: "ext:8200",
			EngineSelector: &v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "engine"}}}}))
	p := podObj(ns, "engine-0", map[string]string{"app": "engine"})
	wantOK(t, "create pod", k8s.Create(ctx, p))
	var g corev1.Pod
	wantOK(t, "get pod", k8s.Get(ctx, client.ObjectKeyFromObject(p), &g))
	if by := g.Annotations[icwebhook.AnnotationInjectedBy]; by != "" || len(g.Spec.Containers[0].Args) != 1 {
		t.Fatalf("a pod of a namespace without %s=enabled was injected (by %q): %v", "inferencecache.io/injection", by, g.Spec.Containers[0].Args)
	}
}

// TestPodInjectionPDPlacement: an engine pod selected by a PDTopology pool
// gets a sidecar reporting its role, pool, node and zone (downward API,
// accepted by the apiserver); a pod in no pool reports none.
func TestPodInjectionPDPlacement(t *testing.T) {
	ctx := needEnv(t)
	ns := injectionNamespace(t, ctx, "inject-pd")
	wantOK(t, "backend", k8s.Create(ctx, &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cb"},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendExternal, Endpoint: "ext:8200",
			EngineSelector: &v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "pd"}},
			BackendConfig:  map[string]string{icwebhook.BackendConfigModel: "m"}}}))
	wantOK(t, "topology", k8s.Create(ctx, &v1alpha1.PDTopology{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pd"},
		Spec: v1alpha1.PDTopologySpec{
			PrefillPools: []v1alpha1.PDPool{{Name: "fill", MatchLabels: map[string]string{"app": "pd", "side": "prefill"}}},
			DecodePools:  []v1alpha1.PDPool{{Name: "gen", MatchLabels: map[string]string{"app": "pd", "side": "decode"}}},
		}}))
	sidecar := func(name string, labels map[string]string) corev1.Container {
		t.Helper()
		p := podObj(ns, name, labels)
		wantOK(t, "create pod "+name, k8s.Create(ctx, p))
		var g corev1.Pod
		wantOK(t, "get pod "+name, k8s.Get(ctx, client.ObjectKeyFromObject(p), &g))
		i := slices.IndexFunc(g.Spec.Containers, func(c corev1.Container) bool { return c.Name == icwebhook.SubscriberContainer })
		if i < 0 {
			t.Fatalf("pod %s: no sidecar in %v", name, g.Spec.Containers)
		}
		return g.Spec.Containers[i]
	}
	for _, c := range []struct {
		pod, side, role, pool string
	}{{"p-0", "prefill", "prefill", "fill"}, {"d-0", "decode", "decode", "gen"}} {
		sub := sidecar(c.pod, map[string]string{"app": "pd", "side": c.side, icwebhook.LabelZone: "zone-a"})
		for _, want := range []string{"--role=" + c.role, "--pd-pool=" + c.pool, "--node-name=$(NODE_NAME)", "--zone=$(NODE_ZONE)"} {
			if !slices.Contains(sub.Args, want) {
				t.Errorf("%s: sidecar args %v lack %s", c.pod, sub.Args, want)
			}
		}
		refs := map[string]string{}
		for _, e := range sub.Env {
			if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
				refs[e.Name] = e.ValueFrom.FieldRef.FieldPath
			}
		}
		if refs["NODE_NAME"] != "spec.nodeName" || refs["NODE_ZONE"] != "metadata.labels['topology.kubernetes.io/zone']" {
			t.Errorf("%s: downward API env %v", c.pod, refs)
		}
	}
	if sub := sidecar("plain-0", map[string]string{"app": "pd"}); countFlag(sub.Args, "--role")+countFlag(sub.Args, "--node-name") != 0 {
		t.Errorf("a pod in no pool got placement flags: %v", sub.Args)
	}
}
