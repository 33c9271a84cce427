package webhook

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/claim"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
)

func backend(ns, name string, sel map[string]string, mut func(*v1alpha1.CacheBackend)) *v1alpha1.CacheBackend {
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.CacheBackendSpec{EngineSelector: &v1alpha1.EngineSelector{MatchLabels: sel}, BackendConfig: map[string]string{"model": "m"}}}
	if mut != nil {
		mut(cb)
	}
	return cb
}

func nsObj(name, allowFrom string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{claim.AllowClaimsFromAnnotation: allowFrom}}}
}

func enginePod(labels map[string]string, args ...string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm", Args: args}}}}
}

func argWith(list []string, prefix string) string {
	for _, a := range list {
		if strings.HasPrefix(a, prefix) {
			return a
		}
	}
	return ""
}

func TestInjectVLLMOffload(t *testing.T) {
	cb := backend("ns", "cb", map[string]string{"app": "e"}, func(cb *v1alpha1.CacheBackend) { cb.Status.Endpoint = "cb.ns.svc:8200" })
	pod := enginePod(map[string]string{"app": "e"}, "--model=m")
	w, changed := Inject(pod, cb, PodInjectorOptions{SubscriberImage: "sub:1", ServerAddress: "srv:9090"})
	if !changed || len(w) != 0 {
		t.Fatalf("changed %v, warnings %v", changed, w)
	}
	if pod.Annotations[AnnotationInjectedBy] != "ns/cb" {
		t.Fatalf("annotation %v", pod.Annotations)
	}
	eng := pod.Spec.Containers[0]
	// The replay on loopback; the publisher on a wildcard, the only endpoint
	// vLLM and SGLang bind (they connect a PUB socket to any other).
	if got := argWith(eng.Args, "--kv-events-config="); got != "--kv-events-config="+KVEventsConfig() || !strings.Contains(got, `"endpoint":"tcp://*:5557"`) ||
		!strings.Contains(got, `"replay_endpoint":"tcp://127.0.0.1:5558"`) || !strings.Contains(got, `"topic":"kv-events"`) {
		t.Errorf("kv-events-config: %q", got)
	}
	if got := argWith(eng.Args, "--kv-transfer-config="); !strings.Contains(got, `"kv_connector":"LMCacheConnectorV1"`) || !strings.Contains(got, `"kv_role":"kv_both"`) {
		t.Errorf("kv-transfer-config: %q", got)
	}
	if i := slices.IndexFunc(eng.Env, func(e corev1.EnvVar) bool { return e.Name == "LMCACHE_REMOTE_URL" }); i < 0 || eng.Env[i].Value != "lm://cb.ns.svc:8200" {
		t.Errorf("env: %v", eng.Env)
	}
	if len(pod.Spec.Containers) != 2 || pod.Spec.Containers[1].Name != SubscriberContainer {
		t.Fatalf("containers: %v", pod.Spec.Containers)
	}
	sub := pod.Spec.Containers[1]
	for _, want := range []string{"--replica-id=$(POD_NAME)", "--tenant-id=$(POD_NAMESPACE)", "--model-id=m", "--hash-scheme=vllm",
		"--engine-endpoint=tcp://127.0.0.1:5557", "--ignore-block-removed=true", "--server-address=srv:9090", "--engine-metrics-url=http://127.0.0.1:8000/metrics"} {
		if !slices.Contains(sub.Args, want) {
			t.Errorf("sidecar args %v lack %s", sub.Args, want)
		}
	}
	if sub.Image != "sub:1" || len(pod.Spec.Volumes) != 1 {
		t.Errorf("image %q volumes %v", sub.Image, pod.Spec.Volumes)
	}
	// The sidecar runs as the images' nonroot user whatever the pod says,
	// with the restricted profile's settings.
	sc := sub.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532 || sc.RunAsGroup == nil || *sc.RunAsGroup != 65532 ||
		sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("sidecar securityContext %+v", sc)
	}

	// Idempotent: a second pass changes nothing.
	before := pod.DeepCopy()
	if _, changed := Inject(pod, cb, PodInjectorOptions{SubscriberImage: "sub:1"}); changed || !equality.Semantic.DeepEqual(before, pod) {
		t.Fatal("re-injection changed the pod")
	}
}

// The engines bind the publisher only for a wildcard endpoint ("*", "::",
// ipc://, inproc://) and connect it otherwise (vLLM's and SGLang's
// ZmqEventPublisher); the replay ROUTER they always bind. The injected
// config must give a publisher they bind (the sidecar dials it), and the
// replay, which serves any client the engine's history, on loopback.
func TestKVEventsConfigBindsWhereEnginesBind(t *testing.T) {
	for _, ranks := range []int{1, 2, 8} {
		var cfg struct {
			Endpoint       string `json:"endpoint"`
			ReplayEndpoint string `json:"replay_endpoint"`
		}
		if err := json.Unmarshal([]byte(kvEventsConfig(ranks)), &cfg); err != nil {
			t.Fatal(err)
		}
		e := cfg.Endpoint
		if !strings.Contains(e, "*") && !strings.Contains(e, "::") && !strings.HasPrefix(e, "ipc://") && !strings.HasPrefix(e, "inproc://") {
			t.Errorf("%d ranks: publisher %q would be connected, not bound, by the engine", ranks, e)
		}
		if !strings.HasPrefix(cfg.ReplayEndpoint, "tcp://127.0.0.1:") {
			t.Errorf("%d ranks: replay %q is not on loopback", ranks, cfg.ReplayEndpoint)
		}
	}
}

// With a NATS URL the sidecar publishes to JetStream (every server consumes
// it) instead of calling one server.
func TestInjectNATS(t *testing.T) {
	cb := backend("ns", "cb", map[string]string{"app": "e"}, nil)
	pod := enginePod(map[string]string{"app": "e"})
	Inject(pod, cb, PodInjectorOptions{SubscriberImage: "sub:1", ServerAddress: "srv:9090", NATSURL: "nats://nats.nats.svc:4222"})
	sub := pod.Spec.Containers[1].Args
	if !slices.Contains(sub, "--nats-url=nats://nats.nats.svc:4222") || argWith(sub, "--server-address") != "" {
		t.Fatalf("sidecar args %v", sub)
	}
}

// A data-parallel engine (R ranks in one pod) publishes rank r on 5557+r and
// its replay on 5557+R+r; the injection runs one subscriber per rank,
// reporting replica $(POD_NAME)-dp<r>. R comes from the pod annotation, else
// from the engine's --data-parallel-size.
func TestInjectDataParallel(t *testing.T) {
	cb := backend("ns", "cb", map[string]string{"app": "e"}, nil)
	check := func(pod *corev1.Pod, ranks int) {
		t.Helper()
		w, changed := Inject(pod, cb, PodInjectorOptions{SubscriberImage: "sub:1"})
		if !changed || len(w) != 0 {
			t.Fatalf("changed %t, warnings %v", changed, w)
		}
		cfg := argWith(pod.Spec.Containers[0].Args, "--kv-events-config=")
		if !strings.Contains(cfg, `"endpoint":"tcp://*:5557"`) || !strings.Contains(cfg, fmt.Sprintf(`"replay_endpoint":"tcp://127.0.0.1:%d"`, 5557+ranks)) {
			t.Errorf("kv-events-config %s", cfg)
		}
		subs := pod.Spec.Containers[1:]
		if len(subs) != ranks {
			t.Fatalf("%d sidecars, want one per rank (%d)", len(subs), ranks)
		}
		states := map[string]bool{}
		for r, c := range subs {
			if c.Name != fmt.Sprintf("%s-dp%d", SubscriberContainer, r) {
				t.Errorf("rank %d container %q", r, c.Name)
			}
			for _, want := range []string{
				fmt.Sprintf("--replica-id=$(POD_NAME)-dp%d", r),
				fmt.Sprintf("--engine-endpoint=tcp://127.0.0.1:%d", 5557+r),
				fmt.Sprintf("--engine-replay-endpoint=tcp://127.0.0.1:%d", 5557+ranks+r),
				fmt.Sprintf("--metrics-bind-address=:%d", 9091+r),
			} {
				if !slices.Contains(c.Args, want) {
					t.Errorf("rank %d args %v lack %s", r, c.Args, want)
				}
			}
			states[argWith(c.Args, "--state-file=")] = true
		}
		if len(states) != ranks {
			t.Errorf("ranks share state files: %v", states)
		}
		if len(pod.Spec.Volumes) != 1 {
			t.Errorf("volumes %v", pod.Spec.Volumes)
		}
	}
	pod := enginePod(map[string]string{"app": "e"})
	pod.Annotations = map[string]string{"inferencecache.io/data-parallel-size": "2"}
	check(pod, 2)
	check(enginePod(map[string]string{"app": "e"}, "--model=m", "--data-parallel-size", "4"), 4)
	check(enginePod(map[string]string{"app": "e"}, "--data-parallel-size=3"), 3)
	check(enginePod(map[string]string{"app": "e"}, "-dp", "2"), 2)
	// One rank is the plain layout.
	one := enginePod(map[string]string{"app": "e"}, "--data-parallel-size=1")
	Inject(one, cb, PodInjectorOptions{SubscriberImage: "sub:1"})
	if len(one.Spec.Containers) != 2 || one.Spec.Containers[1].Name != SubscriberContainer || !slices.Contains(one.Spec.Containers[1].Args, "--replica-id=$(POD_NAME)") {
		t.Errorf("one rank: %v", one.Spec.Containers)
	}
	// The annotation wins over the args; a bad value is a warning and one rank.
	pod = enginePod(map[string]string{"app": "e"}, "--data-parallel-size=4")
	pod.Annotations = map[string]string{"inferencecache.io/data-parallel-size": "2"}
	check(pod, 2)
	bad := enginePod(map[string]string{"app": "e"})
	bad.Annotations = map[string]string{"inferencecache.io/data-parallel-size": "two"}
	if w, _ := Inject(bad, cb, PodInjectorOptions{SubscriberImage: "sub:1"}); len(w) != 1 || !strings.Contains(w[0], "inferencecache.io/data-parallel-size") || len(bad.Spec.Containers) != 2 {
		t.Errorf("bad annotation: warnings %v, containers %d", w, len(bad.Spec.Containers))
	}
}

// A type the controller neither provisions nor knows the connector of gets
// the KV events only, with a warning, never the LMCache connector.
func TestInjectUnknownConnectorType(t *testing.T) {
	for _, typ := range []v1alpha1.CacheBackendType{v1alpha1.BackendAIBrix, v1alpha1.BackendMooncake, v1alpha1.BackendNIXL} {
		cb := backend("ns", "cb", map[string]string{"app": "e"}, func(cb *v1alpha1.CacheBackend) { cb.Spec.Type = typ })
		pod := enginePod(map[string]string{"app": "e"})
		w, changed := Inject(pod, cb, PodInjectorOptions{SubscriberImage: "sub:1"})
		eng := pod.Spec.Containers[0]
		if !changed || argWith(eng.Args, "--kv-events-config=") == "" {
			t.Errorf("%s: KV events not wired: %v", typ, eng.Args)
		}
		if argWith(eng.Args, "--kv-transfer-config") != "" || len(eng.Env) != 0 {
			t.Errorf("%s: connector wired: args %v env %v", typ, eng.Args, eng.Env)
		}
		if len(w) != 1 || !strings.Contains(w[0], string(typ)) {
			t.Errorf("%s: warnings %v", typ, w)
		}
	}
}

func TestInjectEventsOnlySGLang(t *testing.T) {
	cb := backend("ns", "cb", map[string]string{"app": "e"}, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Integration = &v1alpha1.CacheBackendIntegration{Engine: "sglang", Mode: v1alpha1.IntegrationEventsOnly}
	})
	pod := enginePod(nil)
	if _, changed := Inject(pod, cb, PodInjectorOptions{SubscriberImage: "sub:1"}); !changed {
		t.Fatal("not injected")
	}
	eng := pod.Spec.Containers[0]
	if argWith(eng.Args, "--kv-transfer-config") != "" || len(eng.Env) != 0 || argWith(eng.Args, "--kv-events-config=") == "" {
		t.Errorf("EventsOnly engine: args %v env %v", eng.Args, eng.Env)
	}
	sub := pod.Spec.Containers[1]
	for _, want := range []string{"--hash-scheme=sglang", "--ignore-block-removed=false", "--engine-metrics-url=http://127.0.0.1:30000/metrics"} {
		if !slices.Contains(sub.Args, want) {
			t.Errorf("sidecar args %v lack %s", sub.Args, want)
		}
	}
}

func TestInjectOverridesAndSuppressions(t *testing.T) {
	cb := backend("ns", "cb", map[string]string{"app": "e"}, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Type = v1alpha1.BackendExternal
		cb.Spec.Endpoint = "lm://ext:65432"
		cb.Spec.Integration = &v1alpha1.CacheBackendIntegration{Role: v1alpha1.RoleReadOnly, EngineOverrides: &v1alpha1.EngineOverrides{
			Args:         []string{"--kv-events-config={}", "--extra=1", "--gone=x"},
			SuppressArgs: []string{"--kv-transfer-config", "--gone"},
			Env:          []corev1.EnvVar{{Name: "LMCACHE_REMOTE_SERDE", Value: "cachegen"}, {Name: "EXTRA", Value: "1"}},
			SuppressEnv:  []string{"LMCACHE_LOCAL_CPU"},
		}}
	})
	args, env, w := EngineArgs(cb)
	if len(w) != 0 {
		t.Errorf("warnings %v", w)
	}
	if want := []string{"--kv-events-config={}", "--extra=1"}; !slices.Equal(args, want) {
		t.Errorf("args %v, want %v", args, want)
	}
	names := map[string]string{}
	for _, e := range env {
		names[e.Name] = e.Value
	}
	if names["LMCACHE_REMOTE_URL"] != "lm://ext:65432" || names["LMCACHE_REMOTE_SERDE"] != "cachegen" || names["EXTRA"] != "1" {
		t.Errorf("env %v", env)
	}
	if _, ok := names["LMCACHE_LOCAL_CPU"]; ok {
		t.Errorf("suppressed env kept: %v", env)
	}

	// The pod's own flag and env win over what the webhook would add.
	pod := enginePod(nil, "--extra", "7")
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "EXTRA", Value: "mine"}}
	Inject(pod, cb, PodInjectorOptions{})
	eng := pod.Spec.Containers[0]
	if !slices.Equal(eng.Args, []string{"--extra", "7", "--kv-events-config={}"}) {
		t.Errorf("args %v", eng.Args)
	}
	if eng.Env[0].Value != "mine" || slices.ContainsFunc(eng.Env[1:], func(e corev1.EnvVar) bool { return e.Name == "EXTRA" }) {
		t.Errorf("env %v", eng.Env)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Error("sidecar injected without an image")
	}
}

// An engineOverrides variable that reads a Secret or ConfigMap (admitted
// before the webhook refused it) is not injected.
func TestInjectDropsSecretAndConfigMapRefs(t *testing.T) {
	cb := backend("ns", "cb", nil, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Integration = &v1alpha1.CacheBackendIntegration{Mode: v1alpha1.IntegrationEventsOnly, EngineOverrides: &v1alpha1.EngineOverrides{Env: []corev1.EnvVar{
			{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "k"}}},
			{Name: "C", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{Key: "k"}}},
			{Name: "F", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		}}}
	})
	_, env, w := EngineArgs(cb)
	if len(env) != 1 || env[0].Name != "F" {
		t.Errorf("env %v, want only F", env)
	}
	if len(w) != 2 || !strings.Contains(w[0], "reads a Secret") || !strings.Contains(w[1], "reads a ConfigMap") {
		t.Errorf("warnings %v", w)
	}
}

// A managed backend's endpoint is its Service's name, known before the
// controller writes status.endpoint: a pod created first still gets it.
func TestInjectManagedEndpointBeforeStatus(t *testing.T) {
	cb := backend("ns", "cb", nil, nil) // no status.endpoint yet
	_, env, w := EngineArgs(cb)
	i := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == "LMCACHE_REMOTE_URL" })
	if i < 0 || env[i].Value != "lm://cb.ns.svc:8200" || len(w) != 0 {
		t.Fatalf("env %v, warnings %v; want LMCACHE_REMOTE_URL=lm://cb.ns.svc:8200", env, w)
	}
	// status.endpoint does not override the Service's name either.
	cb.Status.Endpoint = "elsewhere:1"
	if _, env, _ := EngineArgs(cb); !slices.ContainsFunc(env, func(e corev1.EnvVar) bool { return e.Value == "lm://cb.ns.svc:8200" }) {
		t.Fatalf("env %v", env)
	}
}

func TestInjectRoleAndNamedContainer(t *testing.T) {
	cb := backend("ns", "cb", nil, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Integration = &v1alpha1.CacheBackendIntegration{Role: v1alpha1.RoleWriteOnly}
	})
	pod := enginePod(nil)
	pod.Spec.Containers = append([]corev1.Container{{Name: "proxy"}}, pod.Spec.Containers...)
	pod.Annotations = map[string]string{AnnotationEngineContainer: "vllm"}
	w, changed := Inject(pod, cb, PodInjectorOptions{SubscriberImage: "s"})
	if !changed || len(pod.Spec.Containers[0].Args) != 0 {
		t.Fatalf("proxy container touched: %v", pod.Spec.Containers[0])
	}
	if got := argWith(pod.Spec.Containers[1].Args, "--kv-transfer-config="); !strings.Contains(got, "kv_producer") {
		t.Errorf("role: %q", got)
	}
	if len(w) != 0 {
		t.Errorf("warnings %v", w)
	}

	pod = enginePod(nil)
	pod.Annotations = map[string]string{AnnotationEngineContainer: "nope"}
	if _, changed := Inject(pod, cb, PodInjectorOptions{}); changed {
		t.Error("injected without the named container")
	}
	cb.Spec.Integration.Engine = "trtllm"
	if w, changed := Inject(enginePod(nil), cb, PodInjectorOptions{}); changed || len(w) != 1 {
		t.Errorf("unknown engine: changed %v, warnings %v", changed, w)
	}
}

func TestBackendFor(t *testing.T) {
	sel := map[string]string{"app": "e"}
	cross := func(cb *v1alpha1.CacheBackend) { cb.Spec.AllowCrossNamespace = true }
	p := &PodInjector{Reader: newClient(t, false,
		backend("ns", "zz", sel, nil),
		backend("ns", "bb", sel, nil),
		backend("ns", "aa", map[string]string{}, nil), // empty selector claims nothing
		backend("other", "aa", sel, cross),
		backend("third", "aa", map[string]string{"app": "x"}, cross),
		backend("third", "bb", sel, nil), // not cross-namespace
		nsObj("elsewhere", "other, third"),
		nsObj("refusing", "third"),
		nsObj("no-consent", ""),
	)}
	f := func(ns string, labels map[string]string, want string) {
		t.Helper()
		cb, err := p.backendFor(ctx(t), ns, labels, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if cb != nil {
			got = cb.Namespace + "/" + cb.Name
		}
		if got != want {
			t.Errorf("%s %v: %q, want %q", ns, labels, got, want)
		}
	}
	f("ns", sel, "ns/bb")
	f("ns", map[string]string{"app": "y"}, "")
	f("elsewhere", sel, "other/aa")
	f("elsewhere", map[string]string{"app": "x"}, "third/aa")
	f("third", sel, "third/bb")
	f("refusing", sel, "") // consents to third only, whose backend does not select app=e
	f("refusing", map[string]string{"app": "x"}, "third/aa")
	f("no-consent", map[string]string{"app": "x"}, "") // no consent: nothing across

	if _, err := (&PodInjector{Reader: newClient(t, true)}).backendFor(ctx(t), "ns", sel, nil); err == nil {
		t.Error("list failure not reported")
	}
}

func TestHandleFailsOpen(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(enginePod(map[string]string{"app": "e"}))
	req := func(obj []byte) admission.Request {
		return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Create, Namespace: "ns", Object: runtime.RawExtension{Raw: obj},
			Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		}}
	}
	f := func(name string, p *PodInjector, obj []byte, wantPatch bool) {
		t.Helper()
		resp := p.Handle(ctx(t), req(obj))
		if !resp.Allowed {
			t.Errorf("%s: refused: %v", name, resp.Result)
		}
		if got := len(resp.Patches) > 0; got != wantPatch {
			t.Errorf("%s: patches %v, want patch %v", name, resp.Patches, wantPatch)
		}
	}
	dec := admission.NewDecoder(s)
	f("list fails", &PodInjector{Reader: newClient(t, true), Decoder: dec}, raw, false)
	f("no reader", &PodInjector{Decoder: dec}, raw, false)
	f("undecodable", &PodInjector{Reader: newClient(t, false), Decoder: dec}, []byte("{"), false)
	f("no backend", &PodInjector{Reader: newClient(t, false), Decoder: dec}, raw, false)
	f("matched", &PodInjector{Reader: newClient(t, false, backend("ns", "cb", map[string]string{"app": "e"}, nil)), Decoder: dec}, raw, true)
}

// What could not be wired becomes a Warning Event on the backend, once per
// backend and warning per interval.
func TestHandleAnnouncesOncePerInterval(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	rec := events.NewFakeRecorder(16)
	cb := backend("ns", "cb", map[string]string{"app": "e"}, func(cb *v1alpha1.CacheBackend) { cb.Spec.BackendConfig = nil })
	p := &PodInjector{Reader: newClient(t, false, cb), Decoder: admission.NewDecoder(s), Recorder: rec, Options: PodInjectorOptions{SubscriberImage: "sub:1"}}
	raw, _ := json.Marshal(enginePod(map[string]string{"app": "e"}))
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Create, Namespace: "ns",
		Object: runtime.RawExtension{Raw: raw}, Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}}}
	for range 3 {
		if resp := p.Handle(ctx(t), req); !resp.Allowed || len(resp.Warnings) != 1 {
			t.Fatalf("response %+v", resp)
		}
	}
	if n := len(rec.Events); n != 1 {
		t.Fatalf("%d Events for three pods with the same problem, want 1", n)
	}
	if e := <-rec.Events; !strings.Contains(e, "Warning InjectionIncomplete") || !strings.Contains(e, "pod ns/p:") || !strings.Contains(e, "backendConfig.model") {
		t.Errorf("event %q", e)
	}
}

// The snapshot projection attributes replicas through the annotation this
// webhook writes.
func TestInjectedByMatchesAttribution(t *testing.T) {
	if AnnotationInjectedBy != controller.InjectedByAnnotation {
		t.Fatalf("webhook writes %q, the controller reads %q", AnnotationInjectedBy, controller.InjectedByAnnotation)
	}
}
