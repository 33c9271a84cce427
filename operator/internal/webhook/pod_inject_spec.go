package webhook

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
)

// Inject mutates pod for backend cb and reports warnings for what it could
// not do and whether it changed the pod. It is pure and idempotent: a pod
// that carries AnnotationInjectedBy is left alone.
//
// Into the engine container (AnnotationEngineContainer, else the first) it
// adds EngineArgs and EngineEnv, except a flag or variable the container
// already sets (the pod's own value wins). It adds the kvevent-subscriber
// sidecar when o.SubscriberImage is set, the engine is known and
// spec.backendConfig.model names the model; then it annotates the pod with
// AnnotationInjectedBy.
func Inject(pod *corev1.Pod, cb *v1alpha1.CacheBackend, o PodInjectorOptions) (warnings []string, changed bool) {
	if _, done := pod.Annotations[AnnotationInjectedBy]; done {
		return nil, false
	}
	in := integrationOf(cb)
	if in.Engine != "vllm" && in.Engine != "sglang" {
		return []string{fmt.Sprintf("inferencecache: CacheBackend %s/%s selects this pod but its engine %q is not one the webhook knows (vllm, sglang); not injected",
			cb.Namespace, cb.Name, in.Engine)}, false
	}
	idx := engineContainer(pod)
	if idx < 0 {
		return []string{fmt.Sprintf("inferencecache: the pod has no container named %q (annotation %s); not injected",
			pod.Annotations[AnnotationEngineContainer], AnnotationEngineContainer)}, false
	}
	c := &pod.Spec.Containers[idx]
	ranks, w := dataParallelSize(pod, c)
	warnings = append(warnings, w...)
	args, env, w := engineArgs(cb, ranks)
	warnings = append(warnings, w...)
	for _, a := range args {
		if !hasFlag(c, flagName(a)) {
			c.Args = append(c.Args, a)
		}
	}
	for _, e := range env {
		if !slices.ContainsFunc(c.Env, func(x corev1.EnvVar) bool { return x.Name == e.Name }) {
			c.Env = append(c.Env, e)
		}
	}
	if pod.Spec.HostNetwork || in.EngineHostNetwork {
		warnings = append(warnings, fmt.Sprintf("inferencecache: host-network engine pods share the node's ports; two on one node collide on the KV-event port %d", kvEventsPort))
	}

	model := cb.Spec.BackendConfig[BackendConfigModel]
	switch {
	case o.SubscriberImage == "":
		warnings = append(warnings, "inferencecache: the controller runs without --kvevent-subscriber-image; no kvevent-subscriber sidecar was injected")
	case model == "":
		warnings = append(warnings, fmt.Sprintf("inferencecache: CacheBackend %s/%s has no spec.backendConfig.%s; no kvevent-subscriber sidecar was injected",
			cb.Namespace, cb.Name, BackendConfigModel))
	case slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return strings.HasPrefix(c.Name, SubscriberContainer) }):
		// The pod brings its own subscriber.
	case ranks > maxDataParallelRanks:
		warnings = append(warnings, fmt.Sprintf("inferencecache: the engine runs %d data-parallel ranks, more than the %d the webhook wires; no kvevent-subscriber sidecar was injected", ranks, maxDataParallelRanks))
	default:
		for r := range ranks {
			pod.Spec.Containers = append(pod.Spec.Containers, subscriber(in, model, o, rank{index: r, of: ranks}))
		}
		if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == subscriberStateVolume }) {
			pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: subscriberStateVolume,
				VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptrTo(resource.MustParse("64Mi"))}}})
		}
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationInjectedBy] = cb.Namespace + "/" + cb.Name
	return warnings, true
}

// integrationOf is spec.integration with the CRD defaults filled in (an
// object written before the defaults existed, or a unit test, may lack them).
func integrationOf(cb *v1alpha1.CacheBackend) v1alpha1.CacheBackendIntegration {
	var in v1alpha1.CacheBackendIntegration
	if cb.Spec.Integration != nil {
		in = *cb.Spec.Integration
	}
	in.Engine = strings.ToLower(cmp.Or(in.Engine, "vllm"))
	in.Mode = cmp.Or(in.Mode, v1alpha1.IntegrationOffload)
	in.Role = cmp.Or(in.Role, v1alpha1.RoleReadWrite)
	return in
}

// KVEventsConfig is the engine's --kv-events-config value for one rank; see
// kvEventsConfig.
func KVEventsConfig() string { return kvEventsConfig(1) }

// kvEventsConfig is the engine's --kv-events-config value for ranks
// data-parallel ranks (contract §7.2), topic kv-events; vLLM and SGLang
// take the same JSON, and both place rank r at the base port + r.
//
// The replay ROUTER, which hands any client the engine's recent history, is
// bound to loopback: only the sidecars in the pod reach it. The publisher
// cannot be: both engines bind their PUB socket only for an endpoint with a
// wildcard ("*" or "::"; also ipc/inproc) and connect it otherwise, so
// tcp://127.0.0.1:5557 would make the engine dial out to a subscriber that
// dials too. It binds tcp://*:5557. Putting it on loopback needs a
// subscriber that binds its SUB socket (the engine's PUB then connects to
// it); see operator/README.md. Replays follow the last rank's publisher:
// publishers 5557..5557+R-1, replays 5557+R..5557+2R-1 (5557 and 5558 for
// one rank).
func kvEventsConfig(ranks int) string {
	b, _ := json.Marshal(struct {
		Enable         bool   `json:"enable_kv_cache_events"`
		Publisher      string `json:"publisher"`
		Endpoint       string `json:"endpoint"`
		ReplayEndpoint string `json:"replay_endpoint"`
		Topic          string `json:"topic"`
	}{true, "zmq", "tcp://*:" + strconv.Itoa(kvEventsPort), loopbackTCP(kvEventsPort + ranks), kvEventsTopic})
	return string(b)
}

func loopbackTCP(port int) string { return "tcp://" + loopback + ":" + strconv.Itoa(port) }

// dataParallelSize is how many data-parallel ranks the engine container c
// of pod runs: AnnotationDataParallelSize, else the container's
// --data-parallel-size (also -dp, --dp-size, as name=value or name value),
// else 1. A value that is not a positive integer counts as 1, with a
// warning.
func dataParallelSize(pod *corev1.Pod, c *corev1.Container) (int, []string) {
	parse := func(v, from string) (int, []string) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 {
			return 1, []string{fmt.Sprintf("inferencecache: %s %q is not a positive number of data-parallel ranks; wired as one rank", from, v)}
		}
		return n, nil
	}
	if v, ok := pod.Annotations[AnnotationDataParallelSize]; ok {
		return parse(v, "annotation "+AnnotationDataParallelSize)
	}
	argv := slices.Concat(c.Command, c.Args)
	for i, a := range argv {
		name, value, inline := strings.Cut(a, "=")
		if name != "--data-parallel-size" && name != "-dp" && name != "--dp-size" {
			continue
		}
		if !inline {
			if i+1 >= len(argv) {
				return 1, nil
			}
			value = argv[i+1]
		}
		return parse(value, "engine argument "+name)
	}
	return 1, nil
}

// EngineArgs returns the args (as --flag=value) and env the engine container
// of a pod claimed by cb receives: the defaults for spec.integration, amended
// by spec.integration.engineOverrides (an override arg replaces a default of
// the same flag, an override env var one of the same name; a variable that
// reads a Secret or ConfigMap is dropped with a warning) and then stripped
// of suppressArgs (by flag name) and suppressEnv (by name). Warnings say what
// could not be wired.
func EngineArgs(cb *v1alpha1.CacheBackend) (args []string, env []corev1.EnvVar, warnings []string) {
	return engineArgs(cb, 1)
}

// engineArgs is EngineArgs for an engine of ranks data-parallel ranks.
func engineArgs(cb *v1alpha1.CacheBackend, ranks int) (args []string, env []corev1.EnvVar, warnings []string) {
	in := integrationOf(cb)
	args = []string{"--kv-events-config=" + kvEventsConfig(ranks)}
	if in.Mode == v1alpha1.IntegrationOffload {
		var a []string
		var e []corev1.EnvVar
		a, e, warnings = offloadWiring(cb, in)
		args, env = append(args, a...), append(env, e...)
	}
	if ov := in.EngineOverrides; ov != nil {
		for _, a := range ov.Args {
			name := flagName(a)
			if i := slices.IndexFunc(args, func(x string) bool { return flagName(x) == name }); i >= 0 {
				args[i] = a
			} else {
				args = append(args, a)
			}
		}
		for _, e := range ov.Env {
			if kind := validation.EnvReference(e); kind != "" {
				// Refused at admission since; an object admitted before is
				// not obeyed here either.
				warnings = append(warnings, fmt.Sprintf("inferencecache: CacheBackend %s/%s: engineOverrides variable %s reads a %s; not injected (engineOverrides may not read Secrets or ConfigMaps)",
					cb.Namespace, cb.Name, e.Name, kind))
				continue
			}
			if i := slices.IndexFunc(env, func(x corev1.EnvVar) bool { return x.Name == e.Name }); i >= 0 {
				env[i] = e
			} else {
				env = append(env, e)
			}
		}
		args = slices.DeleteFunc(args, func(a string) bool {
			return slices.ContainsFunc(ov.SuppressArgs, func(s string) bool { return flagName(s) == flagName(a) })
		})
		env = slices.DeleteFunc(env, func(e corev1.EnvVar) bool { return slices.Contains(ov.SuppressEnv, e.Name) })
	}
	return args, env, warnings
}

// offloadWiring is the Offload mode's cache connector: LMCache through vLLM's
// KV connector (remote URL = the backend's endpoint) for types LMCache and
// External, SGLang's native hierarchical cache for type SGLangHiCache, and
// nothing (a warning) for the other types.
func offloadWiring(cb *v1alpha1.CacheBackend, in v1alpha1.CacheBackendIntegration) (args []string, env []corev1.EnvVar, warnings []string) {
	if cb.Spec.Type == v1alpha1.BackendSGLangHiCache {
		if in.Engine != "sglang" {
			return nil, nil, []string{fmt.Sprintf("inferencecache: type SGLangHiCache needs engine sglang, not %q; no offload wiring injected", in.Engine)}
		}
		args = []string{"--enable-hierarchical-cache"}
		if h := cb.Spec.HiCache; h != nil {
			if h.SizeGB != nil {
				args = append(args, fmt.Sprintf("--hicache-size=%d", *h.SizeGB))
			}
			if h.Ratio != "" {
				args = append(args, "--hicache-ratio="+h.Ratio)
			}
			if h.WritePolicy != "" {
				args = append(args, "--hicache-write-policy="+string(h.WritePolicy))
			}
			if h.IOBackend != "" {
				args = append(args, "--hicache-io-backend="+string(h.IOBackend))
			}
			if h.MemoryLayout != "" {
				args = append(args, "--hicache-mem-layout="+string(h.MemoryLayout))
			}
		}
		return args, nil, nil
	}
	switch cb.Spec.Type {
	case "", v1alpha1.BackendLMCache, v1alpha1.BackendExternal:
	default:
		// AIBrix, Mooncake, NIXL, ...: the controller neither provisions them
		// nor knows their connector, so only the KV events are wired.
		return nil, nil, []string{fmt.Sprintf("inferencecache: the offload connector of type %q is not wired by inferencecache (KV events only); add it with spec.integration.engineOverrides", cb.Spec.Type)}
	}
	if in.Engine != "vllm" {
		return nil, nil, []string{fmt.Sprintf("inferencecache: the LMCache connector is wired for engine vllm only, not %q; no offload wiring injected", in.Engine)}
	}
	role := map[v1alpha1.IntegrationRole]string{
		v1alpha1.RoleReadWrite: "kv_both", v1alpha1.RoleWriteOnly: "kv_producer", v1alpha1.RoleReadOnly: "kv_consumer",
	}[in.Role]
	b, _ := json.Marshal(struct {
		Connector string `json:"kv_connector"`
		Role      string `json:"kv_role"`
	}{"LMCacheConnectorV1", cmp.Or(role, "kv_both")})
	args = []string{"--kv-transfer-config=" + string(b)}
	env = []corev1.EnvVar{{Name: "LMCACHE_LOCAL_CPU", Value: "False"}}
	// A managed backend's address is its Service's, fixed by its name: a pod
	// admitted before the controller first reconciled the backend gets it
	// too. An External backend's is its spec.endpoint.
	ep := controller.ManagedEndpoint(cb)
	if cb.Spec.Type == v1alpha1.BackendExternal {
		ep = cb.Spec.Endpoint
	}
	if ep == "" {
		warnings = append(warnings, fmt.Sprintf("inferencecache: CacheBackend %s/%s of type External has no spec.endpoint; LMCACHE_REMOTE_URL was not set, recreate the pod once the backend has one",
			cb.Namespace, cb.Name))
		return args, env, warnings
	}
	if !strings.HasPrefix(ep, "lm://") {
		ep = "lm://" + ep
	}
	env = append(env, corev1.EnvVar{Name: "LMCACHE_REMOTE_URL", Value: ep}, corev1.EnvVar{Name: "LMCACHE_REMOTE_SERDE", Value: "naive"})
	return args, env, warnings
}

// rank is the data-parallel rank a subscriber follows: index of of.
type rank struct{ index, of int }

// subscriber is the kvevent-subscriber sidecar of rank r (contract §7.1):
// replica id and tenant id from the downward API, the engine's publisher
// and replay on loopback, evicted blocks re-reported at T2 when an offload
// tier exists. With one rank the replica is the pod ($(POD_NAME)); with
// R > 1 ranks rank r is the replica $(POD_NAME)-dp<r>, in container
// kvevent-subscriber-dp<r>, with its own ports, state file and metrics
// listener.
func subscriber(in v1alpha1.CacheBackendIntegration, model string, o PodInjectorOptions, r rank) corev1.Container {
	metrics := vllmMetricsURL
	if in.Engine == "sglang" {
		metrics = sglangMetricURL
	}
	name, replica, state := SubscriberContainer, "$(POD_NAME)", subscriberStateDir+"/state"
	if r.of > 1 {
		suffix := fmt.Sprintf("-dp%d", r.index)
		name, replica, state = name+suffix, replica+suffix, state+suffix
	}
	args := []string{
		"--replica-id=" + replica,
		"--tenant-id=$(POD_NAMESPACE)",
		"--model-id=" + model,
		"--hash-scheme=" + in.Engine,
		"--engine-endpoint=" + loopbackTCP(kvEventsPort+r.index),
		"--engine-replay-endpoint=" + loopbackTCP(kvEventsPort+r.of+r.index),
		"--topic=" + kvEventsTopic,
		// Rank-filtered engine stats need a subscriber flag that does not
		// exist yet: every rank reports the engine's whole /metrics.
		"--engine-metrics-url=" + metrics,
		fmt.Sprintf("--ignore-block-removed=%t", in.Mode == v1alpha1.IntegrationOffload),
		"--state-file=" + state,
	}
	if r.of > 1 {
		args = append(args, fmt.Sprintf("--metrics-bind-address=:%d", subscriberMetricsPort+r.index))
	}
	switch {
	case o.NATSURL != "":
		args = append(args, "--nats-url="+o.NATSURL)
	case o.ServerAddress != "":
		args = append(args, "--server-address="+o.ServerAddress)
	}
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	no, yes := false, true
	uid := int64(subscriberUser)
	return corev1.Container{
		Name:  name,
		Image: o.SubscriberImage,
		Args:  args,
		Env: []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: field("metadata.name")},
			{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
		},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
		},
		VolumeMounts: []corev1.VolumeMount{{Name: subscriberStateVolume, MountPath: subscriberStateDir}},
		// The restricted profile, and the images' nonroot user set
		// explicitly: the engine pod's own securityContext (often root, for
		// GPU drivers) must not carry over to the sidecar.
		SecurityContext: &corev1.SecurityContext{
			RunAsUser:                &uid,
			RunAsGroup:               &uid,
			RunAsNonRoot:             &yes,
			AllowPrivilegeEscalation: &no,
			ReadOnlyRootFilesystem:   &yes,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

// engineContainer is the index of the engine container, or -1.
func engineContainer(pod *corev1.Pod) int {
	if name := pod.Annotations[AnnotationEngineContainer]; name != "" {
		return slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == name })
	}
	if len(pod.Spec.Containers) == 0 {
		return -1
	}
	return 0
}

// flagName is the flag of an argument: "--x=v" and "--x" give "--x".
func flagName(arg string) string {
	name, _, _ := strings.Cut(arg, "=")
	return name
}

// hasFlag reports whether c's command or args already set flag name.
func hasFlag(c *corev1.Container, name string) bool {
	for _, list := range [][]string{c.Command, c.Args} {
		if slices.ContainsFunc(list, func(a string) bool { return flagName(a) == name }) {
			return true
		}
	}
	return false
}

func ptrTo[T any](v T) *T { return &v }
