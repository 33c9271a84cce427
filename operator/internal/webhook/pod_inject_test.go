package webhook

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
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

	"github.com/inferencecache/inferencecache/kvevents"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/claim"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	"github.com/inferencecache/inferencecache/picker/endpoints"
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
	if eng.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
		t.Errorf("terminationMessagePolicy %q: a crash's log tail would not reach the kernel-fault check", eng.TerminationMessagePolicy)
	}
	// Publisher and replay on loopback: the engine connects its PUB to
	// 127.0.0.1:5557, which the sidecar binds.
	if got := argWith(eng.Args, "--kv-events-config="); got != "--kv-events-config="+KVEventsConfig() || !strings.Contains(got, `"endpoint":"tcp://127.0.0.1:5557"`) ||
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
		"--engine-endpoint=tcp://127.0.0.1:5557", "--engine-endpoint-mode=bind", "--engine-replay-endpoint=tcp://127.0.0.1:5558",
		"--ignore-block-removed=true", "--server-address=srv:9090", "--engine-metrics-url=http://127.0.0.1:8000/metrics"} {
		if !slices.Contains(sub.Args, want) {
			t.Errorf("sidecar args %v lack %s", sub.Args, want)
		}
	}
	if argWith(sub.Args, "--data-parallel-size") != "" || argWith(sub.Args, "--metrics-bind-address") != "" {
		t.Errorf("one rank: sidecar args %v", sub.Args)
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
// config keeps both on loopback: a publisher endpoint the engine connects
// to (the sidecar binds it: --engine-endpoint-mode=bind, at the same
// address) and the replay, which serves any client the engine's history.
func TestKVEventsConfigStaysOnLoopback(t *testing.T) {
	for _, ranks := range []int{1, 2, 8} {
		var cfg struct {
			Endpoint       string `json:"endpoint"`
			ReplayEndpoint string `json:"replay_endpoint"`
		}
		if err := json.Unmarshal([]byte(kvEventsConfig(ranks)), &cfg); err != nil {
			t.Fatal(err)
		}
		e := cfg.Endpoint
		if strings.Contains(e, "*") || strings.Contains(e, "::") || strings.HasPrefix(e, "ipc://") || strings.HasPrefix(e, "inproc://") {
			t.Errorf("%d ranks: the engine would bind publisher %q instead of connecting to the sidecar", ranks, e)
		}
		if e != "tcp://127.0.0.1:5557" {
			t.Errorf("%d ranks: publisher %q, want tcp://127.0.0.1:5557", ranks, e)
		}
		if want := fmt.Sprintf("tcp://127.0.0.1:%d", 5557+ranks); cfg.ReplayEndpoint != want {
			t.Errorf("%d ranks: replay %q, want %s (after the last rank's publisher)", ranks, cfg.ReplayEndpoint, want)
		}
		pod := enginePod(map[string]string{"app": "e"}, fmt.Sprintf("--data-parallel-size=%d", ranks))
		Inject(pod, backend("ns", "cb", map[string]string{"app": "e"}, nil), PodInjectorOptions{SubscriberImage: "sub:1"})
		sub := pod.Spec.Containers[1].Args
		if !slices.Contains(sub, "--engine-endpoint="+e) || !slices.Contains(sub, "--engine-endpoint-mode=bind") ||
			!slices.Contains(sub, "--engine-replay-endpoint="+cfg.ReplayEndpoint) {
			t.Errorf("%d ranks: the sidecar does not bind the engine's publisher endpoint: %v", ranks, sub)
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
// its replay on 5557+R+r; one sidecar follows every rank
// (--data-parallel-size=R), reporting replica $(POD_NAME)-dp<r>. R comes
// from the pod annotation, else from the engine's --data-parallel-size.
func TestInjectDataParallel(t *testing.T) {
	cb := backend("ns", "cb", map[string]string{"app": "e"}, nil)
	check := func(pod *corev1.Pod, ranks int) {
		t.Helper()
		w, changed := Inject(pod, cb, PodInjectorOptions{SubscriberImage: "sub:1"})
		if !changed || len(w) != 0 {
			t.Fatalf("changed %t, warnings %v", changed, w)
		}
		cfg := argWith(pod.Spec.Containers[0].Args, "--kv-events-config=")
		if !strings.Contains(cfg, `"endpoint":"tcp://127.0.0.1:5557"`) || !strings.Contains(cfg, fmt.Sprintf(`"replay_endpoint":"tcp://127.0.0.1:%d"`, 5557+ranks)) {
			t.Errorf("kv-events-config %s", cfg)
		}
		if len(pod.Spec.Containers) != 2 || pod.Spec.Containers[1].Name != SubscriberContainer {
			t.Fatalf("containers %v, want the engine and one sidecar for all %d ranks", pod.Spec.Containers, ranks)
		}
		c := pod.Spec.Containers[1]
		for _, want := range []string{
			"--replica-id=$(POD_NAME)",
			"--engine-endpoint=tcp://127.0.0.1:5557",
			"--engine-endpoint-mode=bind",
			fmt.Sprintf("--engine-replay-endpoint=tcp://127.0.0.1:%d", 5557+ranks),
			fmt.Sprintf("--data-parallel-size=%d", ranks),
			"--state-file=/var/lib/kvevent-subscriber/state",
		} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("sidecar args %v lack %s", c.Args, want)
			}
		}
		if argWith(c.Args, "--metrics-bind-address") != "" || argWith(c.Args, "--data-parallel-rank") != "" {
			t.Errorf("sidecar args %v: one metrics listener (the default), every rank", c.Args)
		}
		// Resources per rank followed.
		if got := c.Resources.Limits[corev1.ResourceMemory]; got.Value() != int64(ranks)*256<<20 {
			t.Errorf("memory limit %s for %d ranks, want %d × 256Mi", got.String(), ranks, ranks)
		}
		if got := c.Resources.Requests[corev1.ResourceCPU]; got.MilliValue() != int64(ranks)*50 {
			t.Errorf("cpu request %s for %d ranks", got.String(), ranks)
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
	if len(one.Spec.Containers) != 2 || one.Spec.Containers[1].Name != SubscriberContainer || !slices.Contains(one.Spec.Containers[1].Args, "--replica-id=$(POD_NAME)") ||
		argWith(one.Spec.Containers[1].Args, "--data-parallel-size") != "" {
		t.Errorf("one rank: %v", one.Spec.Containers)
	}
	if got := one.Spec.Containers[1].Resources.Limits[corev1.ResourceMemory]; got.String() != "256Mi" {
		t.Errorf("one rank: memory limit %s, want 256Mi", got.String())
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

// engineRankEndpoint is the endpoint rank r of a data-parallel engine uses
// for a configured tcp endpoint, by vLLM's and SGLang's rule
// (offset_endpoint_port: the port after the last colon, plus r).
func engineRankEndpoint(t *testing.T, ep string, r int) string {
	t.Helper()
	i := strings.LastIndex(ep, ":")
	port, err := strconv.Atoi(ep[i+1:])
	if err != nil {
		t.Fatalf("endpoint %q: %v", ep, err)
	}
	return ep[:i+1] + strconv.Itoa(port+r)
}

// The injected engine config and sidecar args agree rank by rank, read the
// way each side reads them: the subscriber (kvevents.DataParallel, the
// flags the sidecar gets) binds exactly the publisher endpoints the engine
// connects to and asks the replay endpoints the engine binds, no replay
// port is a publisher port, each rank reports the replica id the endpoint
// picker expects for targetPorts[r] (picker/endpoints.ReplicaID), and each
// has a state file of its own.
func TestInjectedRanksAgreeWithSubscriberAndPicker(t *testing.T) {
	cb := backend("ns", "cb", map[string]string{"app": "e"}, nil)
	for _, ranks := range []int{1, 2, 3, 8} {
		pod := enginePod(map[string]string{"app": "e"}, fmt.Sprintf("--data-parallel-size=%d", ranks))
		Inject(pod, cb, PodInjectorOptions{SubscriberImage: "sub:1"})
		var engine struct {
			Endpoint       string `json:"endpoint"`
			ReplayEndpoint string `json:"replay_endpoint"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(argWith(pod.Spec.Containers[0].Args, "--kv-events-config="), "--kv-events-config=")), &engine); err != nil {
			t.Fatal(err)
		}
		flags := map[string]string{}
		for _, a := range pod.Spec.Containers[1].Args {
			k, v, _ := strings.Cut(a, "=")
			flags[k] = v
		}
		mode, err := kvevents.ParseEndpointMode(flags["--engine-endpoint-mode"])
		if err != nil || mode != kvevents.EndpointBind {
			t.Fatalf("%d ranks: endpoint mode %q, %v", ranks, flags["--engine-endpoint-mode"], err)
		}
		dp := kvevents.DataParallel{Size: 1, Rank: -1}
		if v, ok := flags["--data-parallel-size"]; ok {
			if dp.Size, err = strconv.Atoi(v); err != nil {
				t.Fatal(err)
			}
		}
		if dp.Size != ranks {
			t.Fatalf("%d ranks: the sidecar follows %d", ranks, dp.Size)
		}
		base := kvevents.Config{ReplicaID: "pod-7", ModelID: "m", HashScheme: flags["--hash-scheme"],
			Endpoint: flags["--engine-endpoint"], EndpointMode: mode, ReplayEndpoint: flags["--engine-replay-endpoint"],
			StateFile: flags["--state-file"]}
		pubPorts, repPorts, states := map[string]bool{}, map[string]bool{}, map[string]bool{}
		for _, r := range dp.Ranks() {
			c, err := dp.Config(base, r)
			if err != nil {
				t.Fatal(err)
			}
			if want := engineRankEndpoint(t, engine.Endpoint, r); c.Endpoint != want {
				t.Errorf("%d ranks, rank %d: the sidecar binds %s, the engine connects to %s", ranks, r, c.Endpoint, want)
			}
			if want := engineRankEndpoint(t, engine.ReplayEndpoint, r); c.ReplayEndpoint != want {
				t.Errorf("%d ranks, rank %d: the sidecar replays from %s, the engine binds %s", ranks, r, c.ReplayEndpoint, want)
			}
			if want := endpoints.ReplicaID("pod-7", r, ranks); c.ReplicaID != want {
				t.Errorf("%d ranks, rank %d: replica %q, the endpoint picker expects %q", ranks, r, c.ReplicaID, want)
			}
			// The subscriber accepts the rank's config as it is (a
			// loopback endpoint it may bind).
			if _, err := kvevents.New(c, nil); err != nil {
				t.Errorf("%d ranks, rank %d: %v", ranks, r, err)
			}
			pubPorts[c.Endpoint], repPorts[c.ReplayEndpoint], states[c.StateFile] = true, true, true
		}
		for ep := range repPorts {
			if pubPorts[ep] {
				t.Errorf("%d ranks: %s is a replay and a publisher endpoint", ranks, ep)
			}
		}
		if len(pubPorts) != ranks || len(repPorts) != ranks || len(states) != ranks {
			t.Errorf("%d ranks: %d publisher endpoints, %d replay endpoints, %d state files", ranks, len(pubPorts), len(repPorts), len(states))
		}
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

// The sidecar follows the engine's effective --kv-events-config (the pod's
// own wins over the webhook's, an engineOverrides one replaces it): it
// connects on loopback to an engine that binds (a wildcard endpoint, as in
// vLLM's docs), binds the loopback endpoint of an engine that connects, asks
// the replay where the engine serves it and subscribes to its topic; what it
// cannot reach is a warning and no sidecar, never a sidecar that binds the
// engine's own port or listens for nothing.
func TestInjectFollowsTheEnginesEventsConfig(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		override []string // engineOverrides.args
		suppress bool     // suppressArgs --kv-events-config
		want     []string // sidecar args
		lacks    []string // sidecar arg flags it must not have
		warn     string   // a warning containing this, and no sidecar
	}{
		{name: "the webhook's", want: []string{"--engine-endpoint=tcp://127.0.0.1:5557", "--engine-endpoint-mode=bind",
			"--engine-replay-endpoint=tcp://127.0.0.1:5558", "--topic=kv-events"}},
		{name: "own wildcard", args: []string{`--kv-events-config={"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:6000","replay_endpoint":"tcp://*:6001","topic":"t"}`},
			want: []string{"--engine-endpoint=tcp://127.0.0.1:6000", "--engine-endpoint-mode=connect", "--engine-replay-endpoint=tcp://127.0.0.1:6001", "--topic=t"}},
		{name: "own loopback, split form, defaults", args: []string{"--kv-events-config", `{"endpoint":"tcp://127.0.0.1:7000"}`},
			want: []string{"--engine-endpoint=tcp://127.0.0.1:7000", "--engine-endpoint-mode=bind", "--topic="}, lacks: []string{"--engine-replay-endpoint"}},
		{name: "own IPv6 wildcard, replay on 0.0.0.0", args: []string{`--kv-events-config={"endpoint":"tcp://[::]:6100","replay_endpoint":"tcp://0.0.0.0:6101"}`},
			want: []string{"--engine-endpoint=tcp://127.0.0.1:6100", "--engine-endpoint-mode=connect", "--engine-replay-endpoint=tcp://127.0.0.1:6101"}},
		{name: "own IPv6 loopback", args: []string{`--kv-events-config={"endpoint":"tcp://[::1]:6200","replay_endpoint":"tcp://[::1]:6201"}`},
			want: []string{"--engine-endpoint=tcp://[::1]:6200", "--engine-endpoint-mode=connect", "--engine-replay-endpoint=tcp://[::1]:6201"}},
		{name: "no endpoint: the engines' default", args: []string{`--kv-events-config={"enable_kv_cache_events":true,"publisher":"zmq"}`},
			want: []string{"--engine-endpoint=tcp://127.0.0.1:5557", "--engine-endpoint-mode=connect"}, lacks: []string{"--engine-replay-endpoint"}},
		{name: "override", override: []string{`--kv-events-config={"endpoint":"tcp://*:5557","replay_endpoint":"tcp://127.0.0.1:5600","topic":"kv-events"}`},
			want: []string{"--engine-endpoint=tcp://127.0.0.1:5557", "--engine-endpoint-mode=connect", "--engine-replay-endpoint=tcp://127.0.0.1:5600"}},
		{name: "ipc", args: []string{`--kv-events-config={"endpoint":"ipc:///tmp/kv"}`}, warn: "ipc:///tmp/kv"},
		{name: "connects elsewhere", args: []string{`--kv-events-config={"endpoint":"tcp://10.0.0.5:5557"}`}, warn: "cannot bind"},
		{name: "ipc replay", args: []string{`--kv-events-config={"endpoint":"tcp://*:5557","replay_endpoint":"ipc:///tmp/r"}`}, warn: "ipc:///tmp/r"},
		{name: "not JSON", args: []string{"--kv-events-config=endpoint=tcp://*:5557"}, warn: "cannot parse"},
		{name: "suppressed", suppress: true, warn: "no --kv-events-config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := backend("ns", "cb", map[string]string{"app": "e"}, func(cb *v1alpha1.CacheBackend) {
				cb.Spec.Integration = &v1alpha1.CacheBackendIntegration{Mode: v1alpha1.IntegrationEventsOnly, EngineOverrides: &v1alpha1.EngineOverrides{Args: tc.override}}
				if tc.suppress {
					cb.Spec.Integration.EngineOverrides.SuppressArgs = []string{"--kv-events-config"}
				}
			})
			pod := enginePod(map[string]string{"app": "e"}, tc.args...)
			w, changed := Inject(pod, cb, PodInjectorOptions{SubscriberImage: "sub:1"})
			if !changed {
				t.Fatal("not injected")
			}
			if tc.warn != "" {
				if len(w) != 1 || !strings.Contains(w[0], tc.warn) || !strings.Contains(w[0], "no kvevent-subscriber sidecar") || len(pod.Spec.Containers) != 1 {
					t.Fatalf("warnings %v, %d containers; want one warning naming %q and no sidecar", w, len(pod.Spec.Containers), tc.warn)
				}
				return
			}
			if len(w) != 0 || len(pod.Spec.Containers) != 2 {
				t.Fatalf("warnings %v, %d containers", w, len(pod.Spec.Containers))
			}
			sub := pod.Spec.Containers[1].Args
			for _, want := range tc.want {
				if !slices.Contains(sub, want) {
					t.Errorf("sidecar args %v lack %s", sub, want)
				}
			}
			for _, flag := range tc.lacks {
				if argWith(sub, flag) != "" {
					t.Errorf("sidecar args %v have %s", sub, flag)
				}
			}
		})
	}
}

func TestInjectPlacement(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm"},
		{Name: SubscriberContainer, Args: []string{"--replica-id=$(POD_NAME)", "--zone=us-east-1a"}}}}}
	InjectPlacement(pod, claim.PDPlacement{})
	if got := pod.Spec.Containers[1].Args; len(got) != 2 {
		t.Fatalf("no placement changed the sidecar: %v", got)
	}
	InjectPlacement(pod, claim.PDPlacement{Topology: "pd", Role: claim.RoleBoth})
	sub := pod.Spec.Containers[1]
	// The sidecar's own --zone wins; no --pd-pool without a pool.
	want := []string{"--replica-id=$(POD_NAME)", "--zone=us-east-1a", "--role=both", "--node-name=$(NODE_NAME)"}
	if !slices.Equal(sub.Args, want) {
		t.Errorf("args %v, want %v", sub.Args, want)
	}
	if len(sub.Env) != 2 || sub.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("env %+v", sub.Env)
	}
	InjectPlacement(pod, claim.PDPlacement{Topology: "pd", Role: claim.RoleBoth})
	if len(pod.Spec.Containers[1].Args) != len(want) || len(pod.Spec.Containers[1].Env) != 2 {
		t.Errorf("not idempotent: %+v", pod.Spec.Containers[1])
	}
	bare := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm"}}}}
	InjectPlacement(bare, claim.PDPlacement{Role: claim.RolePrefill})
	if len(bare.Spec.Containers[0].Args) != 0 {
		t.Errorf("a pod without the sidecar was changed: %+v", bare.Spec.Containers)
	}
}
