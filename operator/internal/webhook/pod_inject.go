package webhook

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/claim"
)

// The pod webhook fails open (failurePolicy Ignore, short timeout): an engine
// pod that misses its injection still serves, only without cache routing.
// The objectSelector skips pods labelled inferencecache.io/inject=false and
// the namespaceSelector (kustomize patch in operator/config/webhook) skips
// kube-system, kube-node-lease, kube-public and the controller's own
// namespace, so the apiserver never waits on this webhook for them.
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
	// AnnotationEngineContainer names the engine container; default: the
	// first container.
	AnnotationEngineContainer = "inferencecache.io/engine-container"
	// SubscriberContainer is the name of the injected sidecar.
	SubscriberContainer = "kvevent-subscriber"
	// subscriberStateVolume is the emptyDir holding the sidecar's state
	// file, so a restarted sidecar resumes its positional index.
	subscriberStateVolume = "kvevent-subscriber-state"
	subscriberStateDir    = "/var/lib/kvevent-subscriber"
	// BackendConfigModel is the spec.backendConfig key of the model id the
	// sidecar reports (contract §7.1, seed era); unset: no sidecar.
	BackendConfigModel = "model"
)

// Engine endpoints inside the pod (contract §7.1/§7.2): the engine publishes
// KV events on every interface at 5557 (replay 5558), the sidecar dials them
// on loopback.
const (
	kvEventsPort    = "5557"
	kvReplayPort    = "5558"
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
	warnings, changed := Inject(&pod, cb, p.Options)
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
