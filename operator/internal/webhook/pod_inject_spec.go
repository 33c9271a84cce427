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
	"github.com/inferencecache/inferencecache/operator/claim"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
)

// Inject mutates pod for backend cb and reports warnings for what it could
// not do and whether it changed the pod. It is pure and idempotent: a pod
// that carries AnnotationInjectedBy is left alone.
//
// Into the engine container (AnnotationEngineContainer, else the first) it
// adds EngineArgs and EngineEnv, except a flag or variable the container
// already sets (the pod's own value wins), and sets its
// terminationMessagePolicy to FallbackToLogsOnError (for the controller's
// GPU-kernel fault check). It adds the kvevent-subscriber
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
	// A crash's log tail becomes the termination message the controller
	// reads for GPU-kernel faults (EngineKernelsHealthy). It differs from
	// the API default, File, only when the container failed without
	// writing a message, so no termination message a pod writes is lost.
	if c.TerminationMessagePolicy == "" || c.TerminationMessagePolicy == corev1.TerminationMessageReadFile {
		c.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	}
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
	events, eventsErr := engineEvents(c)
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
	case eventsErr != nil:
		warnings = append(warnings, fmt.Sprintf("inferencecache: %v; no kvevent-subscriber sidecar was injected", eventsErr))
	default:
		pod.Spec.Containers = append(pod.Spec.Containers, subscriber(in, model, o, ranks, events))
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
// take the same JSON, and both place rank r at the configured ports + r.
//
// Everything stays on loopback, inside the pod. The replay ROUTER, which
// hands any client the engine's recent history, the engines always bind.
// The PUB socket they bind only for an endpoint with a wildcard ("*" or
// "::"; also ipc/inproc) and connect otherwise: tcp://127.0.0.1:5557 makes
// the engine connect, and the sidecar binds that address
// (--engine-endpoint-mode=bind), so the live events never reach the pod
// network either. Publishers 5557..5557+R-1, replays after the last rank,
// 5557+R..5557+2R-1 (5557 and 5558 for one rank), so no replay port is
// another rank's publisher port.
func kvEventsConfig(ranks int) string {
	b, _ := json.Marshal(struct {
		Enable         bool   `json:"enable_kv_cache_events"`
		Publisher      string `json:"publisher"`
		Endpoint       string `json:"endpoint"`
		ReplayEndpoint string `json:"replay_endpoint"`
		Topic          string `json:"topic"`
	}{true, "zmq", loopbackTCP(kvEventsPort), replayEndpoint(ranks), kvEventsTopic})
	return string(b)
}

// replayEndpoint is rank 0's replay endpoint for ranks data-parallel ranks:
// the port after the last rank's publisher.
func replayEndpoint(ranks int) string { return loopbackTCP(kvEventsPort + ranks) }

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

// subscriber is the kvevent-subscriber sidecar (contract §7.1): replica id
// and tenant id from the downward API, the engine's KV events as ev says
// (with the webhook's own config: the publisher bound by the sidecar on
// loopback, the engine connecting to it, and the replay on loopback),
// evicted blocks re-reported at T2 when an offload tier exists.
// One sidecar follows every data-parallel rank of the engine
// (--data-parallel-size R): rank r on the ports + r, reported as replica
// $(POD_NAME)-dp<r> (with one rank $(POD_NAME); the endpoint picker's
// rule), with its own state file (<state-file>.dp<r>) and its rank's series
// of the engine's /metrics, on one metrics listener whose series carry a
// dp_rank label. Its resources grow with R.
func subscriber(in v1alpha1.CacheBackendIntegration, model string, o PodInjectorOptions, ranks int, ev eventsWiring) corev1.Container {
	metrics := vllmMetricsURL
	if in.Engine == "sglang" {
		metrics = sglangMetricURL
	}
	mode := "connect"
	if ev.bind {
		mode = "bind"
	}
	args := []string{
		"--replica-id=$(POD_NAME)",
		"--tenant-id=$(POD_NAMESPACE)",
		"--model-id=" + model,
		"--hash-scheme=" + in.Engine,
		"--engine-endpoint=" + ev.endpoint,
		"--engine-endpoint-mode=" + mode,
	}
	if ev.replay != "" {
		args = append(args, "--engine-replay-endpoint="+ev.replay)
	}
	args = append(args,
		"--topic="+ev.topic,
		"--engine-metrics-url="+metrics,
		fmt.Sprintf("--ignore-block-removed=%t", in.Mode == v1alpha1.IntegrationOffload),
		"--state-file="+subscriberStateDir+"/state",
	)
	if ranks > 1 {
		args = append(args, fmt.Sprintf("--data-parallel-size=%d", ranks))
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
	// Per rank followed: 50m CPU and 64Mi requested, 256Mi at most.
	n := int64(ranks)
	return corev1.Container{
		Name:  SubscriberContainer,
		Image: o.SubscriberImage,
		Args:  args,
		Env: []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: field("metadata.name")},
			{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
		},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(50*n, resource.DecimalSI),
				corev1.ResourceMemory: *resource.NewQuantity(n*64<<20, resource.BinarySI)},
			Limits: corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(n*256<<20, resource.BinarySI)},
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

// Downward-API variables of the sidecar's placement flags.
const (
	envNodeName = "NODE_NAME"
	envNodeZone = "NODE_ZONE"
	// LabelZone is the well-known zone label; the sidecar reports the
	// pod's own (the downward API cannot read the node's labels), so set
	// it on the pods (e.g. one Deployment per zone) for zone locality.
	LabelZone = "topology.kubernetes.io/zone"
)

// InjectPlacement adds the P/D placement flags to the injected sidecar:
// --role and --pd-pool from pl, and --node-name / --zone through the
// downward API (spec.nodeName, the pod's LabelZone label) for the
// topology's kvLocality. A zero pl (the pod is in no pool) or a pod
// without the sidecar is left alone; a flag the sidecar has is kept.
func InjectPlacement(pod *corev1.Pod, pl claim.PDPlacement) {
	if pl.Role == "" {
		return
	}
	i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == SubscriberContainer })
	if i < 0 {
		return
	}
	c := &pod.Spec.Containers[i]
	args := []string{"--role=" + pl.Role}
	if pl.Pool != "" {
		args = append(args, "--pd-pool="+pl.Pool)
	}
	args = append(args, "--node-name=$("+envNodeName+")", "--zone=$("+envNodeZone+")")
	for _, a := range args {
		if !hasFlag(c, flagName(a)) {
			c.Args = append(c.Args, a)
		}
	}
	for _, e := range []corev1.EnvVar{
		{Name: envNodeName, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: envNodeZone, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['" + LabelZone + "']"}}},
	} {
		if !slices.ContainsFunc(c.Env, func(x corev1.EnvVar) bool { return x.Name == e.Name }) {
			c.Env = append(c.Env, e)
		}
	}
}

// hasSubscriber reports whether pod has the sidecar container.
func hasSubscriber(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == SubscriberContainer })
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
