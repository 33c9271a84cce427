package webhook

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/claim"
)

// The pod webhook fails open (failurePolicy Ignore, short timeout): an engine
// pod that misses its injection still serves, only without cache routing.
// The objectSelector skips pods labelled inferencecache.io/inject=false and
// the namespaceSelector (kustomize patch in operator/config/webhook) admits
// only namespaces labelled LabelInjection=enabled, never kube-system,
// kube-node-lease, kube-public or the controller's own namespace, so the
// apiserver does not wait on this webhook for any other pod.
// +kubebuilder:webhook:path=/mutate--v1-pod,mutating=true,failurePolicy=ignore,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=mpod.inferencecache.io,admissionReviewVersions=v1,timeoutSeconds=5,reinvocationPolicy=Never

// Pod annotations and labels of the injection.
const (
	// AnnotationInjectedBy records the CacheBackend (<ns>/<name>) that
	// injected the pod; its presence makes re-admission a no-op, and the
	// snapshot projection attributes the replica through it.
	AnnotationInjectedBy = "inferencecache.io/injected-by"
	// LabelInject set to "false" (as a label, or as an annotation) opts a
	// pod out. As a label the apiserver does not even call the webhook.
	LabelInject = claim.InjectKey
	// LabelInjection set to "enabled" on a Namespace opts its pods in: the
	// shipped webhook configuration's namespaceSelector requires it.
	LabelInjection = "inferencecache.io/injection"
	// AnnotationEngineContainer names the engine container; default: the
	// first container.
	AnnotationEngineContainer = "inferencecache.io/engine-container"
	// AnnotationDataParallelSize is the number of data-parallel ranks the
	// engine runs in the pod (vLLM/SGLang --data-parallel-size); without
	// it the engine container's own --data-parallel-size (-dp, --dp-size)
	// is read. With R > 1 ranks the sidecar follows each rank as a replica
	// of its own (--data-parallel-size).
	AnnotationDataParallelSize = "inferencecache.io/data-parallel-size"
	// maxDataParallelRanks bounds the ranks wired in one pod (ports
	// 5557..5557+2R-1, and the sidecar's resources, which grow with R).
	maxDataParallelRanks = 64
	// SubscriberContainer is the name of the injected sidecar.
	SubscriberContainer = "kvevent-subscriber"
	// subscriberStateVolume is the emptyDir holding the sidecar's state
	// file, so a restarted sidecar resumes its positional index.
	subscriberStateVolume = "kvevent-subscriber-state"
	subscriberStateDir    = "/var/lib/kvevent-subscriber"
	// BackendConfigModel is the spec.backendConfig key of the model id the
	// sidecar reports (contract §7.1, seed era); unset: no sidecar.
	BackendConfigModel = "model"
	// subscriberUser is the sidecar's user and group: the images' nonroot
	// user (hack/images).
	subscriberUser = 65532
	// ReasonInjectionIncomplete is the reason of the Warning Event on a
	// CacheBackend when the webhook could not wire a pod it claims fully.
	ReasonInjectionIncomplete = "InjectionIncomplete"
)

// Engine endpoints inside the pod (contract §7.1/§7.2), all on loopback:
// the sidecar binds 5557 and the engine's KV-event publisher connects to it;
// the engine serves replays at 5558 (ranks: see kvEventsConfig).
const (
	loopback        = "127.0.0.1"
	kvEventsPort    = 5557
	kvEventsTopic   = "kv-events"
	vllmMetricsURL  = "http://127.0.0.1:8000/metrics"
	sglangMetricURL = "http://127.0.0.1:30000/metrics"
)

// PodInjectorOptions configures what the pod webhook injects.
type PodInjectorOptions struct {
	// SubscriberImage is the kvevent-subscriber image; empty injects no
	// sidecar (the engine's KV-event args and env are still injected).
	SubscriberImage string
	// ServerAddress is the routing server's gRPC address the sidecar
	// reports to, e.g. inferencecache-server.inferencecache-system.svc:9090.
	ServerAddress string
	// NATSURL, when set, is the NATS JetStream server the sidecar publishes
	// to instead (its --nats-url; docs/scaleout.md): every routing server
	// consumes the stream, so each builds the same index. ServerAddress is
	// then not passed.
	NATSURL string
}

// PodInjector is the mutating admission handler of Pods. For a pod matched by
// a CacheBackend's spec.engineSelector it injects the kvevent-subscriber
// sidecar and the engine's KV-event (and, in Offload mode, cache connector)
// args and env; see Inject. It never refuses a pod: any failure admits the
// pod unchanged with a warning.
type PodInjector struct {
	// Reader lists CacheBackends. Required.
	Reader  client.Reader
	Decoder admission.Decoder
	Options PodInjectorOptions
	// Recorder receives a Warning Event (ReasonInjectionIncomplete) on the
	// claiming CacheBackend for what could not be wired, besides the
	// admission warning (which only the pod's creator sees, and a
	// Deployment's ReplicaSet controller discards); nil emits none.
	Recorder events.EventRecorder

	// announced rate-limits those Events: at most one per backend and
	// warning per eventInterval, so a large rollout does not flood the API.
	announced rateLimit
}

// eventInterval is the least time between two Events of one backend with
// the same warning.
const eventInterval = time.Minute

// rateLimit remembers when a key last passed.
type rateLimit struct {
	mu   sync.Mutex // guards last
	last map[string]time.Time
}

// allow reports whether key may pass at now, and records it if so. Keys
// older than the interval are dropped on the way, so the map stays as small
// as the set of recent keys.
func (l *rateLimit) allow(key string, now time.Time, every time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t, ok := l.last[key]; ok && now.Sub(t) < every {
		return false
	}
	if l.last == nil {
		l.last = map[string]time.Time{}
	}
	for k, t := range l.last {
		if now.Sub(t) >= every {
			delete(l.last, k)
		}
	}
	l.last[key] = now
	return true
}

// announce emits a Warning Event on cb for each warning about pod.
func (p *PodInjector) announce(cb *v1alpha1.CacheBackend, pod *corev1.Pod, ns string, warnings []string) {
	if p.Recorder == nil {
		return
	}
	name := pod.Name
	if name == "" {
		name = pod.GenerateName + "<generated>"
	}
	now := time.Now()
	for _, w := range warnings {
		if !p.announced.allow(cb.Namespace+"/"+cb.Name+"\x00"+w, now, eventInterval) {
			continue
		}
		p.Recorder.Eventf(cb, nil, corev1.EventTypeWarning, ReasonInjectionIncomplete, "Inject",
			"pod %s/%s: %s (further pods with the same problem are not reported for %s)", ns, name, strings.TrimPrefix(w, "inferencecache: "), eventInterval)
	}
}

var _ admission.Handler = (*PodInjector)(nil)

// Handle implements admission.Handler.
func (p *PodInjector) Handle(ctx context.Context, req admission.Request) admission.Response {
	log := logf.FromContext(ctx)
	var pod corev1.Pod
	if err := p.Decoder.Decode(req, &pod); err != nil {
		// Fail open here too: whether the pod is valid is the apiserver's call.
		return admission.Allowed("").WithWarnings("inferencecache: not injected (fail open): cannot decode the pod: " + err.Error())
	}
	if skip(&pod) {
		return admission.Allowed("")
	}
	ns := cmp.Or(pod.Namespace, req.Namespace)
	cb, err := p.backendFor(ctx, ns, pod.Labels, pod.Annotations)
	if err != nil {
		log.Error(err, "cannot find the CacheBackend of a pod; admitting it uninjected", "namespace", ns, "pod", cmp.Or(pod.Name, pod.GenerateName))
		return admission.Allowed("").WithWarnings("inferencecache: not injected (fail open): " + err.Error())
	}
	if cb == nil {
		return admission.Allowed("")
	}
	hadSubscriber := hasSubscriber(&pod)
	warnings, changed := Inject(&pod, cb, p.Options)
	if changed && !hadSubscriber && hasSubscriber(&pod) {
		var tops v1alpha1.PDTopologyList
		if err := p.Reader.List(ctx, &tops, client.InNamespace(ns)); err != nil {
			// Fail open: the replica reports no role, and the server counts
			// it out of every P/D pool until a restart re-admits it.
			warnings = append(warnings, fmt.Sprintf("inferencecache: cannot list PDTopologies in namespace %q, the sidecar reports no P/D role: %v", ns, err))
		} else {
			InjectPlacement(&pod, claim.PlacementOf(tops.Items, pod.Labels))
		}
	}
	p.announce(cb, &pod, ns, warnings)
	if !changed {
		return admission.Allowed("").WithWarnings(warnings...)
	}
	raw, err := json.Marshal(&pod)
	if err != nil {
		return admission.Allowed("").WithWarnings("inferencecache: not injected (fail open): " + err.Error())
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, raw).WithWarnings(warnings...)
}

// skip reports a pod that opted out or was injected already.
func skip(pod *corev1.Pod) bool {
	if claim.OptedOut(pod.Labels, pod.Annotations) {
		return true
	}
	_, done := pod.Annotations[AnnotationInjectedBy]
	return done
}

// backendFor returns the CacheBackend claiming a pod of namespace ns with
// labels and annotations, claim.Owner: the first of ns by name whose non-empty
// engineSelector.matchLabels the labels contain, else the first by
// (namespace, name) elsewhere that sets allowCrossNamespace and that ns
// consents to (claim.AllowClaimsFromAnnotation); nil when none does. ns's
// backends are listed first, all only when none of them claims, and the
// Namespace is read only when a backend of another namespace could claim.
func (p *PodInjector) backendFor(ctx context.Context, ns string, labels, annotations map[string]string) (*v1alpha1.CacheBackend, error) {
	if p.Reader == nil {
		return nil, ErrNoReader
	}
	var local v1alpha1.CacheBackendList
	if err := p.Reader.List(ctx, &local, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("cannot list CacheBackends in namespace %q: %w", ns, err)
	}
	if cb := claim.Claimant(local.Items, ns, labels, annotations); cb != nil {
		return cb, nil
	}
	var all v1alpha1.CacheBackendList
	if err := p.Reader.List(ctx, &all); err != nil {
		return nil, fmt.Errorf("cannot list CacheBackends: %w", err)
	}
	if !slices.ContainsFunc(all.Items, func(b v1alpha1.CacheBackend) bool {
		return b.Namespace != ns && b.Spec.AllowCrossNamespace && claim.Selects(b.Spec.EngineSelector, labels)
	}) {
		return nil, nil
	}
	nsMeta := &metav1.PartialObjectMetadata{}
	nsMeta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if err := p.Reader.Get(ctx, client.ObjectKey{Name: ns}, nsMeta); err != nil {
		return nil, fmt.Errorf("cannot read namespace %q for its consent to cross-namespace claims: %w", ns, err)
	}
	return claim.Owner(all.Items, claim.Pod{Namespace: ns, NamespaceAnnotations: nsMeta.Annotations, Labels: labels, Annotations: annotations}), nil
}
