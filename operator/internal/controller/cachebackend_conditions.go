package controller

import (
	"fmt"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// Annotations a user sets on a CacheBackend.
const (
	// RequireKVEventsAnnotation "false" turns the KV-event gate off: an
	// available backend is Ready without having seen a KV event.
	RequireKVEventsAnnotation = "inferencecache.io/require-kv-events"
	// SkipFunctionalProbeAnnotation "true" bypasses the /probe gate
	// (FunctionalProbeOK True/ProbeBypassed).
	SkipFunctionalProbeAnnotation = "inferencecache.io/skip-functional-probe"
)

// DefaultFirstEventTimeout is how long an available backend may wait for its
// first KV event before Ready turns NoKVEventsObserved.
const DefaultFirstEventTimeout = 5 * time.Minute

// backendClass is how the reconciler treats a CacheBackend.
type backendClass int

const (
	// classManaged: the controller provisions an LMCache server (Offload
	// mode, type LMCache). Publishes every condition.
	classManaged backendClass = iota
	// classEventsOnly: nothing is provisioned; only Ready, Degraded and
	// Progressing are published, Ready from the KV-event gate.
	classEventsOnly
	// classExternal: spec.endpoint names a server the controller does not
	// run; only Ready and Progressing are published.
	classExternal
	// classSelfRun: Offload with a type whose cache the controller does not
	// run: SGLangHiCache lives inside the engine, AIBrix, Mooncake and NIXL
	// are run by their own operators. Like EventsOnly, Ready comes from the
	// KV-event gate; EngineCompatibility and EngineKernelsHealthy are
	// published too, since the pod webhook still wires the engines' offload
	// arguments.
	classSelfRun
)

func classify(b *v1alpha1.CacheBackend) backendClass {
	switch {
	case b.Spec.Type == v1alpha1.BackendExternal:
		return classExternal
	case b.Spec.Integration != nil && b.Spec.Integration.Mode == v1alpha1.IntegrationEventsOnly:
		return classEventsOnly
	case b.Spec.Type == "" || b.Spec.Type == v1alpha1.BackendLMCache:
		return classManaged
	default:
		return classSelfRun
	}
}

// published is the set of condition types a class publishes; the others
// are removed from status (a backend whose type or mode changed).
func (c backendClass) published() []string {
	switch c {
	case classExternal:
		return []string{v1alpha1.BackendConditionReady, v1alpha1.BackendConditionProgressing}
	case classEventsOnly:
		return []string{v1alpha1.BackendConditionReady, v1alpha1.BackendConditionDegraded, v1alpha1.BackendConditionProgressing}
	case classSelfRun:
		return []string{v1alpha1.BackendConditionReady, v1alpha1.BackendConditionDegraded, v1alpha1.BackendConditionProgressing,
			v1alpha1.BackendConditionEngineKernelsHealthy, v1alpha1.BackendConditionEngineCompatibility}
	default:
		return []string{
			v1alpha1.BackendConditionReady, v1alpha1.BackendConditionDegraded, v1alpha1.BackendConditionProgressing,
			v1alpha1.BackendConditionFunctionalProbeOK, v1alpha1.BackendConditionT2Degraded,
			v1alpha1.BackendConditionEngineKernelsHealthy, v1alpha1.BackendConditionEngineCompatibility,
		}
	}
}

// Condition reasons of CacheBackend (contract §5.4).
const (
	ReasonBackendReady             = "BackendReady"
	ReasonRolloutInProgress        = "RolloutInProgress"
	ReasonRolloutComplete          = "RolloutComplete"
	ReasonNotProvisioned           = "NotProvisioned"
	ReasonScaledToZero             = "ScaledToZero"
	ReasonReplicasUnavailable      = "ReplicasUnavailable"
	ReasonAwaitingFirstKVEvent     = "AwaitingFirstKVEvent"
	ReasonKVEventsObserved         = "KVEventsObserved"
	ReasonNoKVEventsObserved       = "NoKVEventsObserved"
	ReasonNotDegraded              = "NotDegraded"
	ReasonProbeOK                  = "ProbeOK"
	ReasonProbeBypassed            = "ProbeBypassed"
	ReasonProbeIngestFailed        = "ProbeIngestFailed"
	ReasonProbeRoutingFailed       = "ProbeRoutingFailed"
	ReasonProbeT2Failed            = "ProbeT2Failed"
	ReasonProbeError               = "ProbeError"
	ReasonT2ZeroHitRate            = "T2ZeroHitRate"
	ReasonT2Serving                = "T2Serving"
	ReasonInjectedEngineCrashLoop  = "InjectedEngineCrashLooping"
	ReasonEngineKernelDegraded     = "EngineKernelDegraded"
	ReasonEngineKernelsOK          = "EngineKernelsOK"
	ReasonInjectedEnginesRunning   = "InjectedEnginesRunning"
	ReasonExternalEndpointAccepted = "ExternalEndpointAccepted"
	ReasonExternalEndpointMissing  = "ExternalEndpointMissing"
	ReasonExternalEndpointInvalid  = "ExternalEndpointInvalid"
	// ReasonRolloutFailed: the workload controller reports the rollout as
	// failed (Deployment ProgressDeadlineExceeded or ReplicaFailure).
	ReasonRolloutFailed = "RolloutFailed"
	// ReasonProvisionConflict: an object of the backend's name exists that
	// the backend does not control.
	ReasonProvisionConflict = "ProvisionConflict"
	// ReasonProvisionFailed: the controller could not create or update the
	// backend's objects, or its policy does not allow what the backend asks.
	ReasonProvisionFailed = "ProvisionFailed"
)

// workloadState is what the conditions need of the managed Deployment or
// StatefulSet.
type workloadState struct {
	exists bool
	// desired is the replica count asked of the workload (the HPA's when
	// autoscaling).
	desired int32
	// current says the workload controller observed the latest spec.
	current            bool
	updated, available int32
	// failed describes a rollout the workload controller gave up on; empty
	// when none (StatefulSets report none).
	failed string
}

func (w workloadState) rollingOut() bool {
	return !w.exists || !w.current || w.updated < w.desired
}

// kvGate is the KV-event gate's verdict for an available backend.
type kvGate struct {
	ready  bool
	reason string
	msg    string
	// wait is how long until the gate times out (AwaitingFirstKVEvent only).
	wait time.Duration
}

// requireKVEvents reports whether the gate is on (the default).
func requireKVEvents(b *v1alpha1.CacheBackend) bool {
	return b.Annotations[RequireKVEventsAnnotation] != "false"
}

func firstEventTimeout(b *v1alpha1.CacheBackend) time.Duration {
	if in := b.Spec.Integration; in != nil && in.FirstEventTimeout != nil && in.FirstEventTimeout.Duration > 0 {
		return in.FirstEventTimeout.Duration
	}
	return DefaultFirstEventTimeout
}

// gate evaluates the KV-event gate of an available backend at now; st must
// carry firstAvailableAt.
func gate(b *v1alpha1.CacheBackend, st *v1alpha1.CacheBackendStatus, now time.Time) kvGate {
	if !requireKVEvents(b) {
		return kvGate{ready: true, reason: ReasonBackendReady, msg: "the backend is available; the KV-event gate is off (" + RequireKVEventsAnnotation + ": \"false\")"}
	}
	if st.FirstKVEventObservedAt != nil {
		return kvGate{ready: true, reason: ReasonKVEventsObserved, msg: "the backend is available and the index has seen KV events from its engines"}
	}
	timeout := firstEventTimeout(b)
	anchor := now
	if st.FirstAvailableAt != nil {
		anchor = st.FirstAvailableAt.Time
	}
	if left := anchor.Add(timeout).Sub(now); left > 0 {
		return kvGate{reason: ReasonAwaitingFirstKVEvent, wait: left,
			msg: fmt.Sprintf("waiting up to %s after the backend became available for the first KV event of its engines", timeout)}
	}
	return kvGate{reason: ReasonNoKVEventsObserved,
		msg: fmt.Sprintf("no KV event reached the index within %s of the backend becoming available: check the engines' KV-event publisher and the subscriber sidecar, or set %s: \"false\"", timeout, RequireKVEventsAnnotation)}
}

// conds collects the conditions of one pass.
type conds struct {
	gen  int64
	list *[]metav1.Condition
}

func (c conds) set(typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(c.list, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: c.gen})
}

// managedConditions sets Ready, Degraded and Progressing of a managed
// backend from its workload and the KV gate. It returns the gate (nil when
// the backend is not available, so neither the gate nor the probe applies).
func managedConditions(b *v1alpha1.CacheBackend, w workloadState, now time.Time, c conds) *kvGate {
	st := &b.Status
	ready := func(s metav1.ConditionStatus, reason, msg string) {
		c.set(v1alpha1.BackendConditionReady, s, reason, msg)
	}
	degraded := func(reason, msg string) {
		if reason == ReasonNotDegraded {
			c.set(v1alpha1.BackendConditionDegraded, metav1.ConditionFalse, reason, "the backend serves as configured")
			return
		}
		c.set(v1alpha1.BackendConditionDegraded, metav1.ConditionTrue, reason, msg)
	}
	if w.failed != "" {
		msg := fmt.Sprintf("the rollout failed (%s); %d of %d replicas available", w.failed, w.available, w.desired)
		c.set(v1alpha1.BackendConditionProgressing, metav1.ConditionFalse, ReasonRolloutFailed, msg)
		ready(metav1.ConditionFalse, ReasonRolloutFailed, msg)
		degraded(ReasonRolloutFailed, msg)
		return nil
	}
	if w.rollingOut() {
		c.set(v1alpha1.BackendConditionProgressing, metav1.ConditionTrue, ReasonRolloutInProgress,
			fmt.Sprintf("%d of %d replicas updated", w.updated, w.desired))
	} else {
		c.set(v1alpha1.BackendConditionProgressing, metav1.ConditionFalse, ReasonRolloutComplete, "the workload is at its latest spec")
	}
	switch {
	case w.exists && w.current && w.desired == 0:
		ready(metav1.ConditionFalse, ReasonScaledToZero, "the backend is scaled to zero replicas")
		degraded(ReasonNotDegraded, "")
		return nil
	case w.available == 0 && w.rollingOut():
		ready(metav1.ConditionFalse, ReasonRolloutInProgress, fmt.Sprintf("waiting for the first of %d replicas to become available", w.desired))
		degraded(ReasonNotDegraded, "")
		return nil
	case w.available == 0:
		msg := fmt.Sprintf("0 of %d replicas available", w.desired)
		ready(metav1.ConditionFalse, ReasonReplicasUnavailable, msg)
		degraded(ReasonReplicasUnavailable, msg)
		return nil
	}
	g := gate(b, st, now)
	if g.ready {
		ready(metav1.ConditionTrue, g.reason, g.msg)
	} else {
		ready(metav1.ConditionFalse, g.reason, g.msg)
	}
	switch {
	case w.available < w.desired && !w.rollingOut():
		degraded(ReasonReplicasUnavailable, fmt.Sprintf("%d of %d replicas available", w.available, w.desired))
	case g.reason == ReasonNoKVEventsObserved:
		degraded(ReasonNoKVEventsObserved, g.msg)
	default:
		degraded(ReasonNotDegraded, "")
	}
	return &g
}

// notProvisionedMessage is Progressing's message for a backend the
// controller runs no server for (classEventsOnly, classSelfRun).
func notProvisionedMessage(b *v1alpha1.CacheBackend) string {
	switch {
	case classify(b) == classEventsOnly:
		return "EventsOnly backends provision no server"
	case b.Spec.Type == v1alpha1.BackendSGLangHiCache:
		return "type SGLangHiCache is not provisioned: the hierarchical cache runs inside the SGLang engines"
	default:
		return "type " + string(b.Spec.Type) + " is not provisioned by this controller (only LMCache is): run its cache servers yourself; Ready follows the engines' KV events"
	}
}

// eventsOnlyConditions sets Ready, Degraded and Progressing of a backend
// the controller provisions nothing for (EventsOnly, or a type other than
// LMCache and External): Ready is the KV gate's, clocked from the first
// reconcile (status.firstAvailableAt).
func eventsOnlyConditions(b *v1alpha1.CacheBackend, now time.Time, c conds) kvGate {
	c.set(v1alpha1.BackendConditionProgressing, metav1.ConditionFalse, ReasonNotProvisioned, notProvisionedMessage(b))
	g := gate(b, &b.Status, now)
	if g.ready {
		c.set(v1alpha1.BackendConditionReady, metav1.ConditionTrue, g.reason, g.msg)
	} else {
		c.set(v1alpha1.BackendConditionReady, metav1.ConditionFalse, g.reason, g.msg)
	}
	if g.reason == ReasonNoKVEventsObserved {
		c.set(v1alpha1.BackendConditionDegraded, metav1.ConditionTrue, g.reason, g.msg)
	} else {
		c.set(v1alpha1.BackendConditionDegraded, metav1.ConditionFalse, ReasonNotDegraded, "the backend serves as configured")
	}
	return g
}

// externalConditions sets Ready and Progressing of an External backend
// from its endpoint's validity (err is validation.Endpoint's verdict).
func externalConditions(b *v1alpha1.CacheBackend, err error, c conds) {
	c.set(v1alpha1.BackendConditionProgressing, metav1.ConditionFalse, ReasonNotProvisioned, "External backends are not provisioned by the controller")
	switch {
	case b.Spec.Endpoint == "":
		c.set(v1alpha1.BackendConditionReady, metav1.ConditionFalse, ReasonExternalEndpointMissing, "type External needs spec.endpoint (host:port or lm://host:port)")
	case err != nil:
		c.set(v1alpha1.BackendConditionReady, metav1.ConditionFalse, ReasonExternalEndpointInvalid, "spec.endpoint "+strconv.Quote(b.Spec.Endpoint)+": "+err.Error())
	default:
		c.set(v1alpha1.BackendConditionReady, metav1.ConditionTrue, ReasonExternalEndpointAccepted, "the external endpoint is well-formed")
	}
}

// t2Condition sets T2Degraded from status.indexParticipation.t2HitRate;
// the condition is absent until the tier was queried.
func t2Condition(b *v1alpha1.CacheBackend, c conds) {
	p := b.Status.IndexParticipation
	if p == nil || p.T2HitRate == nil {
		meta.RemoveStatusCondition(c.list, v1alpha1.BackendConditionT2Degraded)
		return
	}
	rate, err := strconv.ParseFloat(*p.T2HitRate, 64)
	if err != nil {
		meta.RemoveStatusCondition(c.list, v1alpha1.BackendConditionT2Degraded)
		return
	}
	if rate == 0 {
		c.set(v1alpha1.BackendConditionT2Degraded, metav1.ConditionTrue, ReasonT2ZeroHitRate,
			"the offload tier was queried and served no hits: check the cache server and its connection from the engines")
		return
	}
	c.set(v1alpha1.BackendConditionT2Degraded, metav1.ConditionFalse, ReasonT2Serving, "the offload tier serves hits (t2HitRate "+*p.T2HitRate+")")
}

// unhealthy reports whether a condition's state is a bad one (for the Event
// type of a transition).
func unhealthy(c *metav1.Condition) bool {
	switch c.Type {
	case v1alpha1.BackendConditionDegraded, v1alpha1.BackendConditionT2Degraded:
		return c.Status == metav1.ConditionTrue
	default:
		return c.Status != metav1.ConditionTrue
	}
}
