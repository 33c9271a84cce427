package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/claim"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
)

// RBAC of the CacheBackend reconciler: it reads everything through the
// manager's cache (list, watch), provisions the server workload, Service and
// HPA (create, update, delete), patches engine Deployments' pod templates,
// and merge-patches CacheBackend status.
// +kubebuilder:rbac:groups=inferencecache.io,resources=cachebackends,verbs=list;watch
// +kubebuilder:rbac:groups=inferencecache.io,resources=cachebackends/status,verbs=patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch;create;update;delete
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=list;watch;create;update;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Default windows of the CacheBackend reconciler (contract §6).
const (
	// DefaultProbeInterval is the least time between two /probe calls for
	// one backend.
	DefaultProbeInterval = 30 * time.Second
	// DefaultMinServerRestartCascadeInterval is the least time between two
	// restart cascades of one backend.
	DefaultMinServerRestartCascadeInterval = 30 * time.Second
	// DefaultProbeTimeout bounds one /probe call, below the server client's
	// own 10 s: a hanging server holds a reconcile worker no longer.
	DefaultProbeTimeout = 5 * time.Second
	// DefaultCacheBackendWorkers is how many backends reconcile at once, so
	// one backend's slow /probe does not hold up the others' status.
	DefaultCacheBackendWorkers = 4
)

// CacheBackendOptions tunes the CacheBackend reconciler; the zero value is
// production's.
type CacheBackendOptions struct {
	// Now is the reconciler's clock (KV-gate timeout, probe and cascade
	// windows, status times); nil means time.Now.
	Now func() time.Time
	// ProbeInterval is the least time between two /probe calls for one
	// backend (default DefaultProbeInterval).
	ProbeInterval time.Duration
	// CascadeInterval is the least time between two restart cascades of one
	// backend (default DefaultMinServerRestartCascadeInterval).
	CascadeInterval time.Duration
	// ProbeTimeout bounds one /probe call (default DefaultProbeTimeout).
	ProbeTimeout time.Duration
	// Workers is how many CacheBackends reconcile concurrently (default
	// DefaultCacheBackendWorkers); one backend is never reconciled twice at
	// once.
	Workers int
	// Resync is the longest a backend waits for its next pass (default
	// DefaultInterval); timers shorter than it fire on time.
	Resync time.Duration
	// Image is the cache server image (default DefaultCacheServerImage).
	Image string
	// Policy is what a backend may ask to run (spec.backendConfig.image,
	// spec.template.serviceAccountName); a backend asking for more is not
	// provisioned. The validating webhook refuses the same at admission;
	// this catches objects admitted before the policy was set.
	Policy validation.BackendPolicy
	// SkipNameValidation lets a process set up the controllers more than
	// once (tests that run a manager per test).
	SkipNameValidation bool
}

// CacheBackendReconciler provisions and reports on CacheBackends.
//
// Reconcile is safe for concurrent use (Options.Workers passes run at once,
// never two of one backend): Client, Server and Recorder are, Options is
// read-only, and the per-backend gates and the metric ledger carry their
// own locks.
//
// Reconcile contract. One work item per CacheBackend, enqueued on any
// change of the backend (status included: the SnapshotPoller's
// indexParticipation feeds the KV gate and T2Degraded), of an object it
// controls (drift is repaired), or of a pod it selects, runs or injected;
// and again when a timer is due (KV-gate timeout, probe, pending cascade),
// at most Resync apart. One pass:
//
//  1. a managed backend (Offload, type LMCache) gets its Deployment or
//     StatefulSet, Service and, with autoscaling, HPA, each controlled by
//     the backend; any other backend (EventsOnly; External; SGLangHiCache,
//     AIBrix, Mooncake, NIXL, which the controller does not run) has them
//     deleted;
//  2. status: endpoint, failOpen, observedGeneration, matchedEnginePods and
//     engineSelectorMessage; the write-once firstAvailableAt and
//     firstKVEventObservedAt;
//  3. conditions (see managedConditions, eventsOnlyConditions (also of the
//     types not provisioned), externalConditions): Ready through the KV-event gate, then the /probe
//     gate; T2Degraded; EngineCompatibility; EngineKernelsHealthy, which
//     turns a True Ready False (kernelGate);
//  4. the restart cascade (cascade);
//  5. one status patch when anything changed, and an Event per condition
//     transition.
type CacheBackendReconciler struct {
	// Client reads through the manager's cache and writes.
	Client client.Client
	// Server is the routing server client (/probe).
	Server *ServerClient
	// Recorder emits condition-transition and cascade Events; nil emits none.
	Recorder events.EventRecorder
	Options  CacheBackendOptions

	metrics *backendControllerMetrics
	// probes and cascades are the per-backend rate limits; they remember
	// the last FunctionalProbeOK verdict and the instance last cascaded to.
	probes   rateGate[metav1.Condition]
	cascades rateGate[string]
	// server is the shared /probe backoff after transport errors.
	server serverBackoff
}

var _ reconcile.Reconciler = (*CacheBackendReconciler)(nil)

func (r *CacheBackendReconciler) now() time.Time {
	if r.Options.Now != nil {
		return r.Options.Now()
	}
	return time.Now()
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (r *CacheBackendReconciler) probeInterval() time.Duration {
	return orDefault(r.Options.ProbeInterval, DefaultProbeInterval)
}

func (r *CacheBackendReconciler) probeTimeout() time.Duration {
	return orDefault(r.Options.ProbeTimeout, DefaultProbeTimeout)
}

func (r *CacheBackendReconciler) cascadeInterval() time.Duration {
	return orDefault(r.Options.CascadeInterval, DefaultMinServerRestartCascadeInterval)
}

func (r *CacheBackendReconciler) image() string {
	if r.Options.Image != "" {
		return r.Options.Image
	}
	return DefaultCacheServerImage
}

// Reconcile runs one pass for a CacheBackend; see the type's doc.
func (r *CacheBackendReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var b v1alpha1.CacheBackend
	if err := r.Client.Get(ctx, req.NamespacedName, &b); err != nil {
		if apierrors.IsNotFound(err) {
			r.probes.forget(req.String())
			r.cascades.forget(req.String())
			r.metrics.forget(req.Namespace, req.Name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if b.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	before := b.DeepCopy()
	now := r.now()
	class := classify(&b)
	st := &b.Status
	c := conds{gen: b.Generation, list: &st.Conditions}
	resync := orDefault(r.Options.Resync, DefaultInterval)
	next := resync
	due := func(d time.Duration) {
		if d > 0 && d < next {
			next = d
		}
	}

	// b's engines are in its namespace, or anywhere when it claims across
	// namespaces (the pod webhook injects such pods for it).
	scope := []client.ListOption{client.InNamespace(b.Namespace)}
	if b.Spec.AllowCrossNamespace {
		scope = nil
	}
	pods, err := r.podsOf(ctx, &b, scope)
	if err != nil {
		return reconcile.Result{}, err
	}
	var backends v1alpha1.CacheBackendList
	if err := r.Client.List(ctx, &backends, scope...); err != nil {
		return reconcile.Result{}, fmt.Errorf("cannot list the CacheBackends beside %s: %w", req, err)
	}
	nsAnn := &namespaceAnnotations{reader: r.Client}
	m := matchEngines(&b, backends.Items, pods.selected, nsAnn.of(ctx))
	if nsAnn.err != nil {
		return reconcile.Result{}, nsAnn.err
	}
	st.MatchedEnginePods = ptr(int32(m.claimed))
	st.EngineSelectorMessage = selectorMessage(&b, m)
	st.FailOpen = ptr(b.Spec.Integration == nil || b.Spec.Integration.FailOpen == nil || *b.Spec.Integration.FailOpen)
	st.ObservedGeneration = b.Generation
	if p := st.IndexParticipation; st.FirstKVEventObservedAt == nil && p != nil && (p.LastEventAt != nil || p.PrefixCount > 0) {
		st.FirstKVEventObservedAt = ptr(metav1.NewTime(now.UTC().Truncate(time.Second)))
	}

	var passErr error
	if class != classManaged {
		// No server of ours runs: an instance kept from a managed past
		// would read as a replacement (and roll the engines) on return.
		st.ObservedServerInstance = ""
	}
	switch class {
	case classExternal:
		if err := r.unprovision(ctx, &b); err != nil {
			return reconcile.Result{}, err
		}
		err := validation.Endpoint(b.Spec.Endpoint)
		st.Endpoint = ""
		if b.Spec.Endpoint != "" && err == nil {
			st.Endpoint = b.Spec.Endpoint
		}
		externalConditions(&b, err, c)
	case classEventsOnly, classSelfRun:
		if err := r.unprovision(ctx, &b); err != nil {
			return reconcile.Result{}, err
		}
		st.Endpoint = ""
		if st.FirstAvailableAt == nil {
			st.FirstAvailableAt = ptr(metav1.NewTime(now.UTC().Truncate(time.Second)))
		}
		g := eventsOnlyConditions(&b, now, c)
		due(g.wait)
		if class == classSelfRun {
			engineCompatibility(&b, pods.injected, c)
			due(engineKernels(&b, pods.injected, now, c))
			kernelGate(st, c)
		}
	default:
		w, err := r.provision(ctx, &b)
		if err != nil {
			if apierrors.IsConflict(err) {
				// A stale cache: the next pass reads the object again.
				return reconcile.Result{RequeueAfter: conflictRetry}, nil
			}
			// The reason reaches status (and, on the transition, an Event)
			// rather than only the log.
			reason := ReasonProvisionFailed
			if errors.Is(err, errNotControlled) {
				reason = ReasonProvisionConflict
			}
			c.set(v1alpha1.BackendConditionReady, metav1.ConditionFalse, reason, err.Error())
			c.set(v1alpha1.BackendConditionProgressing, metav1.ConditionFalse, reason, err.Error())
			if !errors.Is(err, errNotControlled) && !errors.Is(err, errNotAllowed) {
				passErr = err // transient: retried with backoff
			}
			break
		}
		st.Endpoint = ManagedEndpoint(&b)
		if st.FirstAvailableAt == nil && w.available > 0 {
			st.FirstAvailableAt = ptr(metav1.NewTime(now.UTC().Truncate(time.Second)))
		}
		g := managedConditions(&b, w, now, c)
		gateReady := g != nil && g.ready
		if g != nil {
			due(g.wait)
		}
		// The probe runs only behind an open KV gate; a bypass is published
		// whatever the gate says.
		if gateReady || b.Annotations[SkipFunctionalProbeAnnotation] == "true" {
			due(r.probe(ctx, &b, now, c))
		}
		if fp := meta.FindStatusCondition(st.Conditions, v1alpha1.BackendConditionFunctionalProbeOK); gateReady && fp != nil && fp.Status == metav1.ConditionFalse {
			c.set(v1alpha1.BackendConditionReady, metav1.ConditionFalse, fp.Reason, "the functional probe failed: "+fp.Message)
		}
		t2Condition(&b, c)
		engineCompatibility(&b, pods.injected, c)
		due(engineKernels(&b, pods.injected, now, c))
		kernelGate(st, c)
		wait, err := r.cascade(ctx, &b, scope, backends.Items, nsAnn.of(ctx), serverPods(&b, pods.served), w, now)
		passErr = err
		due(wait)
	}
	for _, cond := range slices.Clone(st.Conditions) {
		if !slices.Contains(class.published(), cond.Type) {
			meta.RemoveStatusCondition(&st.Conditions, cond.Type)
		}
	}

	if !equality.Semantic.DeepEqual(before.Status, b.Status) {
		// The lock makes a pass that read a stale backend from the cache fail
		// (and re-run) rather than write over a newer status, such as the
		// observedServerInstance the cascade compares against.
		if err := r.Client.Status().Patch(ctx, &b, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				return reconcile.Result{RequeueAfter: conflictRetry}, nil
			}
			return reconcile.Result{}, fmt.Errorf("cannot write status of CacheBackend %s: %w", req, err)
		}
		r.announce(&b, before)
	}
	if passErr != nil {
		return reconcile.Result{}, passErr
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

// backendPods are the pods one pass of a backend reads, each set listed
// through a field index of the cache (IndexedFields), so a pass copies
// these and not every pod of its scope.
type backendPods struct {
	// selected carry the label pair of the backend's selector (selectorKey):
	// a superset of those its selector matches.
	selected []corev1.Pod
	// served carry the backend's BackendLabel: its cache-server pods, and
	// any other pod so labelled (serverPods filters them).
	served []corev1.Pod
	// injected carry the backend's injected-by annotation.
	injected []corev1.Pod
}

// podsOf lists the pods of b within scope.
func (r *CacheBackendReconciler) podsOf(ctx context.Context, b *v1alpha1.CacheBackend, scope []client.ListOption) (backendPods, error) {
	var out backendPods
	list := func(into *[]corev1.Pod, opts ...client.ListOption) error {
		var pl corev1.PodList
		if err := r.Client.List(ctx, &pl, opts...); err != nil {
			return fmt.Errorf("cannot list the pods of CacheBackend %s/%s: %w", b.Namespace, b.Name, err)
		}
		*into = pl.Items
		return nil
	}
	if key, ok := selectorKey(b.Spec.EngineSelector); ok {
		if err := list(&out.selected, append(slices.Clone(scope), client.MatchingFields{PodLabelIndex: key})...); err != nil {
			return out, err
		}
	}
	if err := list(&out.served, client.InNamespace(b.Namespace), client.MatchingFields{PodLabelIndex: BackendLabel + "=" + b.Name}); err != nil {
		return out, err
	}
	return out, list(&out.injected, append(slices.Clone(scope), client.MatchingFields{PodInjectedByIndex: b.Namespace + "/" + b.Name})...)
}

// engineMatch is how many pods of b's namespace b claims, and how many more
// its selector matches that an earlier backend by name claims.
type engineMatch struct {
	claimed  int
	shadowed int
	// optedOut counts pods b's selector matches that opted out of injection
	// (claim.OptedOut): the controller never wires them, so no backend
	// claims them.
	optedOut int
	// unconsented counts pods b's selector matches in other namespaces that
	// do not consent to b's (claim.AllowClaimsFromAnnotation).
	unconsented int
	// shadowedBy names (<ns>/<name>) one backend that claims pods b's
	// selector matches.
	shadowedBy string
}

// matchEngines counts the pods b claims among pods under claim.Owner over
// backends (those of b's namespace, and of every namespace when b sets
// allowCrossNamespace; b included): the rule the pod webhook injects by, so
// matchedEnginePods counts the pods a creation would wire to b (not those
// that opted out of injection, nor those of a namespace that does not
// consent). nsAnnotations returns a Namespace's annotations. An empty
// selector claims none.
func matchEngines(b *v1alpha1.CacheBackend, backends []v1alpha1.CacheBackend, pods []corev1.Pod, nsAnnotations func(string) map[string]string) engineMatch {
	var m engineMatch
	for i := range pods {
		p := &pods[i]
		if !claim.Selects(b.Spec.EngineSelector, p.Labels) {
			continue
		}
		if p.Namespace != b.Namespace && !b.Spec.AllowCrossNamespace {
			continue
		}
		if claim.OptedOut(p.Labels, p.Annotations) {
			m.optedOut++
			continue
		}
		pod := claim.Pod{Namespace: p.Namespace, Labels: p.Labels, Annotations: p.Annotations}
		if p.Namespace != b.Namespace {
			if pod.NamespaceAnnotations = nsAnnotations(p.Namespace); !claim.Reaches(b, pod) {
				if claim.Claimant(backends, p.Namespace, p.Labels, p.Annotations) == nil {
					m.unconsented++
				}
				continue
			}
		}
		if o := claim.Owner(backends, pod); o == nil || o.Namespace != b.Namespace || o.Name != b.Name {
			if o != nil {
				m.shadowed++
				m.shadowedBy = o.Namespace + "/" + o.Name
			}
			continue
		}
		m.claimed++
	}
	return m
}

// namespaceAnnotations reads Namespace annotations (metadata only, through
// the manager's cache), each namespace once per pass. The first error other
// than NotFound is kept in err and the namespace reads as unannotated (no
// consent) meanwhile.
type namespaceAnnotations struct {
	reader client.Reader
	seen   map[string]map[string]string
	err    error
}

// of returns the lookup function bound to ctx.
func (n *namespaceAnnotations) of(ctx context.Context) func(string) map[string]string {
	return func(ns string) map[string]string {
		if a, ok := n.seen[ns]; ok {
			return a
		}
		if n.seen == nil {
			n.seen = map[string]map[string]string{}
		}
		meta := &metav1.PartialObjectMetadata{}
		meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
		err := n.reader.Get(ctx, client.ObjectKey{Name: ns}, meta)
		if err != nil && !apierrors.IsNotFound(err) && n.err == nil {
			n.err = fmt.Errorf("cannot read namespace %s for its consent to cross-namespace claims: %w", ns, err)
		}
		n.seen[ns] = meta.Annotations
		return meta.Annotations
	}
}

func selectorMessage(b *v1alpha1.CacheBackend, m engineMatch) string {
	if b.Spec.EngineSelector == nil || len(b.Spec.EngineSelector.MatchLabels) == 0 {
		return "spec.engineSelector.matchLabels is empty; an empty selector claims no engine pods"
	}
	keys := make([]string, 0, len(b.Spec.EngineSelector.MatchLabels))
	for k, v := range b.Spec.EngineSelector.MatchLabels {
		keys = append(keys, k+"="+v)
	}
	slices.Sort(keys)
	sel := strings.Join(keys, ",")
	msg := fmt.Sprintf("%d pod(s) match %s", m.claimed, sel)
	switch {
	case m.claimed > 0:
	case b.Spec.AllowCrossNamespace:
		msg = "no pod matches " + sel
	default:
		msg = "no pod in " + b.Namespace + " matches " + sel
	}
	if m.shadowed > 0 {
		msg += fmt.Sprintf("; %d more match but another CacheBackend claims them (e.g. %s: the first by name of the pod's namespace, else by namespace and name with allowCrossNamespace)", m.shadowed, m.shadowedBy)
	}
	if m.optedOut > 0 {
		msg += fmt.Sprintf("; %d more match but opted out of injection (%s: \"false\")", m.optedOut, claim.InjectKey)
	}
	if m.unconsented > 0 {
		msg += fmt.Sprintf("; %d more match in other namespaces that do not consent (annotate the Namespace with %s: %q)", m.unconsented, claim.AllowClaimsFromAnnotation, b.Namespace)
	}
	return msg
}

// serverPods returns b's cache-server pods.
func serverPods(b *v1alpha1.CacheBackend, pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		if p.Namespace == b.Namespace && p.Labels[BackendLabel] == b.Name && p.Labels[ComponentLabel] == componentValue {
			out = append(out, p)
		}
	}
	return out
}

// injectedBy reports whether pod was injected for b.
func injectedBy(b *v1alpha1.CacheBackend, p *corev1.Pod) bool {
	return strings.TrimSpace(p.Annotations[InjectedByAnnotation]) == b.Namespace+"/"+b.Name
}

// engineCompatibility sets EngineCompatibility from the pods injected for
// b, opted-out ones excepted (an annotation copied from an injected pod
// does not make the controller answerable for them): False while any of
// them is in CrashLoopBackOff.
func engineCompatibility(b *v1alpha1.CacheBackend, pods []corev1.Pod, c conds) {
	var looping []string
	for i := range pods {
		p := &pods[i]
		if !injectedBy(b, p) || claim.OptedOut(p.Labels, p.Annotations) {
			continue
		}
		for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			if w := cs.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
				name := p.Name
				if p.Namespace != b.Namespace {
					name = p.Namespace + "/" + p.Name
				}
				looping = append(looping, name+"/"+cs.Name)
			}
		}
	}
	if len(looping) > 0 {
		slices.Sort(looping)
		c.set(v1alpha1.BackendConditionEngineCompatibility, metav1.ConditionFalse, ReasonInjectedEngineCrashLoop,
			"injected engine containers in CrashLoopBackOff: "+strings.Join(looping, ", ")+"; check their logs for rejected cache arguments or a connector/engine version mismatch")
		return
	}
	c.set(v1alpha1.BackendConditionEngineCompatibility, metav1.ConditionTrue, ReasonInjectedEnginesRunning, "no injected engine pod is crash-looping")
}

// announce emits an Event per condition whose status or reason changed: a
// Warning when it turned bad, a Normal one otherwise (a first good state
// included).
func (r *CacheBackendReconciler) announce(b, before *v1alpha1.CacheBackend) {
	if r.Recorder == nil {
		return
	}
	for i := range b.Status.Conditions {
		now := &b.Status.Conditions[i]
		old := meta.FindStatusCondition(before.Status.Conditions, now.Type)
		if old != nil && old.Status == now.Status && old.Reason == now.Reason {
			continue
		}
		typ := corev1.EventTypeNormal
		if unhealthy(now) {
			typ = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(b, nil, typ, now.Reason, now.Type, "%s=%s: %s", now.Type, now.Status, now.Message)
	}
}

// backendsOfPod maps a pod to the CacheBackends it concerns: the one whose
// server it runs, the one that injected it, and every one whose selector
// matches it, of its namespace or with allowCrossNamespace (not only its
// claimant: a backend that lost or won the claim recounts too).
func backendsOfPod(ctx context.Context, c client.Reader, p *corev1.Pod) []reconcile.Request {
	seen := map[types.NamespacedName]bool{}
	if name := p.Labels[BackendLabel]; name != "" {
		seen[types.NamespacedName{Namespace: p.Namespace, Name: name}] = true
	}
	if ns, name, ok := strings.Cut(strings.TrimSpace(p.Annotations[InjectedByAnnotation]), "/"); ok {
		seen[types.NamespacedName{Namespace: ns, Name: name}] = true
	}
	var list v1alpha1.CacheBackendList
	if err := c.List(ctx, &list); err == nil {
		for i := range list.Items {
			b := &list.Items[i]
			if (b.Namespace == p.Namespace || b.Spec.AllowCrossNamespace) && claim.Selects(b.Spec.EngineSelector, p.Labels) {
				seen[types.NamespacedName{Namespace: b.Namespace, Name: b.Name}] = true
			}
		}
	}
	out := make([]reconcile.Request, 0, len(seen))
	for k := range seen {
		out = append(out, reconcile.Request{NamespacedName: k})
	}
	return out
}

// crossNamespaceBackends lists the backends that set allowCrossNamespace.
func crossNamespaceBackends(ctx context.Context, c client.Reader) []reconcile.Request {
	var list v1alpha1.CacheBackendList
	if err := c.List(ctx, &list); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if b := &list.Items[i]; b.Spec.AllowCrossNamespace {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: b.Namespace, Name: b.Name}})
		}
	}
	return out
}

// consentChanged passes Namespace events that can change a cross-namespace
// claim: a namespace created or deleted, or its consent annotation edited.
var consentChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetAnnotations()[claim.AllowClaimsFromAnnotation] != e.ObjectNew.GetAnnotations()[claim.AllowClaimsFromAnnotation]
	},
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// SetupCacheBackend registers the CacheBackend and PromptTemplate
// reconcilers with mgr. server is the routing server client of /probe.
func SetupCacheBackend(mgr ctrl.Manager, server *ServerClient, o CacheBackendOptions) error {
	m, err := registeredBackendControllerMetrics()
	if err != nil {
		return fmt.Errorf("cannot register the CacheBackend metrics: %w", err)
	}
	for _, f := range IndexedFields() {
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), f.Object, f.Field, f.Extract); err != nil {
			return fmt.Errorf("cannot index %T by %s: %w", f.Object, f.Field, err)
		}
	}
	r := &CacheBackendReconciler{
		Client:   mgr.GetClient(),
		Server:   server,
		Recorder: mgr.GetEventRecorder("inferencecache-controller"),
		Options:  o,
		metrics:  m,
	}
	opts := controller.Options{SkipNameValidation: ptr(o.SkipNameValidation)}
	workers := o.Workers
	if workers <= 0 {
		workers = DefaultCacheBackendWorkers
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("cachebackend").
		WithOptions(controller.Options{SkipNameValidation: opts.SkipNameValidation, MaxConcurrentReconciles: workers}).
		For(&v1alpha1.CacheBackend{}).
		Owns(&appsv1.Deployment{}).
		Owns(&appsv1.StatefulSet{}).
		Owns(&corev1.Service{}).
		Owns(&autoscalingv2.HorizontalPodAutoscaler{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
			p, ok := obj.(*corev1.Pod)
			if !ok {
				return nil
			}
			return backendsOfPod(ctx, mgr.GetClient(), p)
		})).
		// A namespace's consent to cross-namespace claims changes which pods
		// the backends with allowCrossNamespace claim.
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return crossNamespaceBackends(ctx, mgr.GetClient())
		}), builder.OnlyMetadata, builder.WithPredicates(consentChanged)).
		Complete(r)
	if err != nil {
		return fmt.Errorf("cannot set up the CacheBackend controller: %w", err)
	}
	pt := &PromptTemplateReconciler{Client: mgr.GetClient()}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("prompttemplate").
		WithOptions(opts).
		For(&v1alpha1.PromptTemplate{}).
		Complete(pt)
	if err != nil {
		return fmt.Errorf("cannot set up the PromptTemplate controller: %w", err)
	}
	return nil
}
