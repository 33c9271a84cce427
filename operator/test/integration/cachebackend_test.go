package integration

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/claim"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
)

// controlledBy fails unless obj's controller reference is b.
func controlledBy(t *testing.T, obj metav1.Object, b *v1alpha1.CacheBackend) {
	t.Helper()
	ref := metav1.GetControllerOf(obj)
	if ref == nil || ref.UID != b.UID || ref.Kind != "CacheBackend" {
		t.Fatalf("%s is controlled by %+v, want CacheBackend %s (%s)", obj.GetName(), ref, b.Name, b.UID)
	}
}

func TestCacheBackendProvisioning(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-provision", false)
	// No periodic pass: everything below is driven by the watches (the
	// backend, the objects it owns, the pods it selects).
	startBackendControllerResync(t, ns, time.Hour)
	enginePod(t, ctx, ns, "llama-0", map[string]string{"app": "llama"}, nil)
	enginePod(t, ctx, ns, "llama-1", map[string]string{"app": "llama", "tier": "gpu"}, nil)
	enginePod(t, ctx, ns, "other-0", map[string]string{"app": "other"}, nil)

	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "lmc", "llama", func(b *v1alpha1.CacheBackend) {
		b.Spec.Autoscaling = &v1alpha1.CacheBackendAutoscaling{MinReplicas: ptr(int32(2)), MaxReplicas: 4}
		b.Spec.Template = &v1alpha1.BackendPodOverride{NodeSelector: map[string]string{"pool": "cpu"}, PriorityClassName: "cache"}
	})))
	wantOK(t, "empty-selector backend", k8s.Create(ctx, cbObj(ns, "nosel", "", nil)))

	var b *v1alpha1.CacheBackend
	eventually(t, 15*time.Second, func() error {
		var err error
		if b, err = getBackend(ctx, ns, "lmc"); err != nil {
			return err
		}
		st := b.Status
		if st.Endpoint != "lmc."+ns+".svc:8200" || st.MatchedEnginePods == nil || *st.MatchedEnginePods != 2 ||
			st.FailOpen == nil || !*st.FailOpen || st.ObservedGeneration != b.Generation {
			return fmt.Errorf("status %+v", st)
		}
		if st.EngineSelectorMessage != "2 pod(s) match app=llama" {
			return fmt.Errorf("engineSelectorMessage %q", st.EngineSelectorMessage)
		}
		return nil
	})
	key := types.NamespacedName{Namespace: ns, Name: "lmc"}
	var dep appsv1.Deployment
	wantOK(t, "deployment", k8s.Get(ctx, key, &dep))
	controlledBy(t, &dep, b)
	c := dep.Spec.Template.Spec.Containers
	if len(c) != 1 || c[0].Resources.Requests.Memory().String() != "4Gi" || c[0].Resources.Limits.Memory().String() != "8Gi" {
		t.Fatalf("server container %+v, want the 4Gi/8Gi memory defaults", c)
	}
	if dep.Spec.Template.Spec.NodeSelector["pool"] != "cpu" || dep.Spec.Template.Spec.PriorityClassName != "cache" {
		t.Fatalf("template overrides not applied: %+v", dep.Spec.Template.Spec)
	}
	var svc corev1.Service
	wantOK(t, "service", k8s.Get(ctx, key, &svc))
	controlledBy(t, &svc, b)
	if svc.Spec.Ports[0].Port != 8200 || svc.Spec.Selector[controller.BackendLabel] != "lmc" {
		t.Fatalf("service spec %+v", svc.Spec)
	}
	var hpa autoscalingv2.HorizontalPodAutoscaler
	wantOK(t, "hpa", k8s.Get(ctx, key, &hpa))
	controlledBy(t, &hpa, b)
	if hpa.Spec.ScaleTargetRef.Kind != "Deployment" || *hpa.Spec.MinReplicas != 2 || hpa.Spec.MaxReplicas != 4 ||
		*hpa.Spec.Metrics[0].Resource.Target.AverageUtilization != 80 {
		t.Fatalf("hpa spec %+v", hpa.Spec)
	}

	// Drift is repaired: the Deployment's image and the Service's port come back.
	image := dep.Spec.Template.Spec.Containers[0].Image
	dep.Spec.Template.Spec.Containers[0].Image = "tampered:1"
	wantOK(t, "tamper deployment", k8s.Update(ctx, &dep))
	eventually(t, 10*time.Second, func() error {
		var d appsv1.Deployment
		if err := k8s.Get(ctx, key, &d); err != nil {
			return err
		}
		if got := d.Spec.Template.Spec.Containers[0].Image; got != image {
			return fmt.Errorf("image %q, want %q back", got, image)
		}
		return nil
	})

	// The empty selector claims nothing.
	eventually(t, 10*time.Second, func() error {
		nb, err := getBackend(ctx, ns, "nosel")
		if err != nil {
			return err
		}
		if nb.Status.MatchedEnginePods == nil || *nb.Status.MatchedEnginePods != 0 || !strings.Contains(nb.Status.EngineSelectorMessage, "claims no engine pods") {
			return fmt.Errorf("status %+v", nb.Status)
		}
		return nil
	})

	// StatefulSet, without autoscaling: the Deployment and the HPA go.
	patchBackend(t, ctx, ns, "lmc", func(b *v1alpha1.CacheBackend) {
		b.Spec.DeploymentKind = v1alpha1.DeploymentKindStatefulSet
		b.Spec.Autoscaling = nil
		b.Spec.Replicas = ptr(int32(3))
	})
	eventually(t, 15*time.Second, func() error {
		var sts appsv1.StatefulSet
		if err := k8s.Get(ctx, key, &sts); err != nil {
			return err
		}
		controlledBy(t, &sts, b)
		if *sts.Spec.Replicas != 3 || sts.Spec.ServiceName != "lmc" {
			return fmt.Errorf("statefulset spec %+v", sts.Spec)
		}
		if err := k8s.Get(ctx, key, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("deployment still there (%v)", err)
		}
		if err := k8s.Get(ctx, key, &autoscalingv2.HorizontalPodAutoscaler{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("hpa still there (%v)", err)
		}
		return nil
	})
	// The StatefulSet's status drives the conditions now.
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonRolloutInProgress)
	eventually(t, 10*time.Second, func() error {
		var sts appsv1.StatefulSet
		if err := k8s.Get(ctx, key, &sts); err != nil {
			return err
		}
		sts.Status = appsv1.StatefulSetStatus{ObservedGeneration: sts.Generation, Replicas: 3, UpdatedReplicas: 3, ReadyReplicas: 3, AvailableReplicas: 3}
		return k8s.Status().Update(ctx, &sts)
	})
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonAwaitingFirstKVEvent)
}

func TestCacheBackendReadyReasons(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-ready", false)
	env := startBackendController(t, ns)
	enginePod(t, ctx, ns, "llama-0", map[string]string{"app": "llama"}, nil)
	setSnapshot(t)
	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "lmc", "llama", nil)))

	// No workload status yet: the rollout is in progress.
	b := waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonRolloutInProgress)
	if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionProgressing); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Progressing %+v, want True", c)
	}
	// Rolled out, nothing available.
	setDeploymentStatus(t, ctx, ns, "lmc", 1, 0)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonReplicasUnavailable)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionDegraded, metav1.ConditionTrue, controller.ReasonReplicasUnavailable)
	// Available: the KV gate waits for the first event.
	setDeploymentStatus(t, ctx, ns, "lmc", 1, 1)
	b = waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonAwaitingFirstKVEvent)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionDegraded, metav1.ConditionFalse, controller.ReasonNotDegraded)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionProgressing, metav1.ConditionFalse, controller.ReasonRolloutComplete)
	firstAvailable := b.Status.FirstAvailableAt
	if firstAvailable == nil {
		t.Fatal("firstAvailableAt not set once available")
	}
	if env.probe.calls.Load() != 0 {
		t.Fatal("probed while the KV gate is closed")
	}
	// firstEventTimeout (5m) passes on the test clock.
	env.clock.advance(5*time.Minute + time.Second)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonNoKVEventsObserved)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionDegraded, metav1.ConditionTrue, controller.ReasonNoKVEventsObserved)
	eventually(t, 10*time.Second, func() error {
		var evs eventsv1.EventList
		if err := k8s.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == "lmc" && e.Reason == controller.ReasonNoKVEventsObserved && e.Action == "Ready" && e.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("no Warning Event for Ready=False/NoKVEventsObserved among %d", len(evs.Items))
	})

	// The engine's first KV event reaches the index: the poller projects it,
	// the gate opens, the probe passes.
	setSnapshot(t, controlapi.ReplicaSnapshot{ReplicaID: "llama-0", Tenant: ns, PrefixCount: 4, LastEventAt: time.Now().UTC()})
	b = waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonKVEventsObserved)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionDegraded, metav1.ConditionFalse, controller.ReasonNotDegraded)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionTrue, controller.ReasonProbeOK)
	observed := b.Status.FirstKVEventObservedAt
	if observed == nil || !b.Status.FirstAvailableAt.Equal(firstAvailable) {
		t.Fatalf("firstKVEventObservedAt %v, firstAvailableAt %v (was %v)", observed, b.Status.FirstAvailableAt, firstAvailable)
	}
	// Write-once: the events stopping does not clear it.
	setSnapshot(t)
	eventually(t, 10*time.Second, func() error {
		b, err := getBackend(ctx, ns, "lmc")
		if err != nil {
			return err
		}
		if p := b.Status.IndexParticipation; p == nil || p.LastEventAt != nil {
			return fmt.Errorf("participation %+v not cleared yet", p)
		}
		if b.Status.FirstKVEventObservedAt == nil || !b.Status.FirstKVEventObservedAt.Equal(observed) {
			return fmt.Errorf("firstKVEventObservedAt changed to %v", b.Status.FirstKVEventObservedAt)
		}
		return nil
	})
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonKVEventsObserved)

	// One replica of two available: Ready, but Degraded.
	patchBackend(t, ctx, ns, "lmc", func(b *v1alpha1.CacheBackend) { b.Spec.Replicas = ptr(int32(2)) })
	waitDeploymentReplicas(t, ctx, ns, "lmc", 2)
	setDeploymentStatus(t, ctx, ns, "lmc", 2, 1)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionDegraded, metav1.ConditionTrue, controller.ReasonReplicasUnavailable)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonKVEventsObserved)

	// Scaled to zero.
	patchBackend(t, ctx, ns, "lmc", func(b *v1alpha1.CacheBackend) { b.Spec.Replicas = ptr(int32(0)) })
	waitDeploymentReplicas(t, ctx, ns, "lmc", 0)
	setDeploymentStatus(t, ctx, ns, "lmc", 0, 0)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonScaledToZero)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionDegraded, metav1.ConditionFalse, controller.ReasonNotDegraded)

	// The gate switched off by annotation: available means Ready.
	wantOK(t, "gate-off backend", k8s.Create(ctx, cbObj(ns, "nogate", "llama", func(b *v1alpha1.CacheBackend) {
		b.Annotations = map[string]string{controller.RequireKVEventsAnnotation: "false"}
	})))
	waitCond(t, ctx, ns, "nogate", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonRolloutInProgress)
	setDeploymentStatus(t, ctx, ns, "nogate", 1, 1)
	waitCond(t, ctx, ns, "nogate", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonBackendReady)
}

func TestCacheBackendEventsOnlyAndExternal(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-modes", false)
	legacy := namespace(t, ctx, "cb-modes-legacy", true) // the webhook would refuse bad endpoints
	env := startBackendController(t, ns)
	startBackendController(t, legacy)
	setSnapshot(t)

	// EventsOnly: nothing provisioned, only Ready/Degraded/Progressing.
	wantOK(t, "events-only", k8s.Create(ctx, cbObj(ns, "eo", "llama", func(b *v1alpha1.CacheBackend) {
		b.Spec.Integration = &v1alpha1.CacheBackendIntegration{Mode: v1alpha1.IntegrationEventsOnly}
	})))
	b := waitCond(t, ctx, ns, "eo", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonAwaitingFirstKVEvent)
	if got := conditionTypes(b); !sameSet(got, "Ready", "Degraded", "Progressing") {
		t.Fatalf("EventsOnly conditions %v", got)
	}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "eo"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Fatalf("EventsOnly backend got a Deployment (%v)", err)
	}
	env.clock.advance(6 * time.Minute)
	waitCond(t, ctx, ns, "eo", v1alpha1.BackendConditionDegraded, metav1.ConditionTrue, controller.ReasonNoKVEventsObserved)
	b = waitCond(t, ctx, ns, "eo", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonNoKVEventsObserved)
	if got := conditionTypes(b); !sameSet(got, "Ready", "Degraded", "Progressing") {
		t.Fatalf("EventsOnly conditions %v", got)
	}

	// External: only Ready/Progressing, the endpoint checked.
	wantOK(t, "external", k8s.Create(ctx, cbObj(ns, "ext", "llama", func(b *v1alpha1.CacheBackend) {
		b.Spec.Type = v1alpha1.BackendExternal
		b.Spec.Endpoint = "lm://lmcache.cache.svc:8200"
	})))
	b = waitCond(t, ctx, ns, "ext", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonExternalEndpointAccepted)
	if got := conditionTypes(b); !sameSet(got, "Ready", "Progressing") {
		t.Fatalf("External conditions %v", got)
	}
	if b.Status.Endpoint != "lm://lmcache.cache.svc:8200" {
		t.Fatalf("External status.endpoint %q", b.Status.Endpoint)
	}
	wantOK(t, "external missing", k8s.Create(ctx, cbObj(legacy, "ext-missing", "", func(b *v1alpha1.CacheBackend) {
		b.Spec.Type = v1alpha1.BackendExternal
	})))
	waitCond(t, ctx, legacy, "ext-missing", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonExternalEndpointMissing)
	wantOK(t, "external invalid", k8s.Create(ctx, cbObj(legacy, "ext-bad", "", func(b *v1alpha1.CacheBackend) {
		b.Spec.Type = v1alpha1.BackendExternal
		b.Spec.Endpoint = "::1:8200"
	})))
	b = waitCond(t, ctx, legacy, "ext-bad", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonExternalEndpointInvalid)
	if b.Status.Endpoint != "" {
		t.Fatalf("invalid endpoint published: %q", b.Status.Endpoint)
	}
}

func sameSet(got []string, want ...string) bool {
	g, w := slices.Clone(got), slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	return slices.Equal(g, w)
}

// readyGateOff creates a managed backend whose KV gate is off and whose
// Deployment is available, so the probe gate is what decides Ready.
func readyGateOff(t *testing.T, env *backendEnv, name string, annotations map[string]string) {
	t.Helper()
	ctx := needEnv(t)
	ann := map[string]string{controller.RequireKVEventsAnnotation: "false"}
	for k, v := range annotations {
		ann[k] = v
	}
	wantOK(t, "backend "+name, k8s.Create(ctx, cbObj(env.ns, name, "llama", func(b *v1alpha1.CacheBackend) { b.Annotations = ann })))
	eventually(t, 10*time.Second, func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: env.ns, Name: name}, &appsv1.Deployment{})
	})
	setDeploymentStatus(t, ctx, env.ns, name, 1, 1)
}

func TestCacheBackendProbeGate(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-probe", false)
	env := startBackendController(t, ns)
	key := ns + "/lmc"
	stage := func(stage, result string) float64 {
		v, _ := counterValue("inferencecache_backend_probe_result_total", map[string]string{"backend": key, "stage": stage, "result": result})
		return v
	}

	// Pass: three increments, one per stage.
	readyGateOff(t, env, "lmc", nil)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionTrue, controller.ReasonProbeOK)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonBackendReady)
	if stage("ingest", "ok") != 1 || stage("routing", "ok") != 1 || stage("t2", "ok") != 1 {
		t.Fatalf("probe metric after one pass: ingest %v routing %v t2 %v", stage("ingest", "ok"), stage("routing", "ok"), stage("t2", "ok"))
	}

	// Rate limit: a routing fault is not seen before the 30 s window ends,
	// however many passes run meanwhile.
	env.probe.index.failRouting(true)
	calls := env.probe.calls.Load()
	env.clock.advance(20 * time.Second)
	time.Sleep(time.Second) // five resync passes
	if got := env.probe.calls.Load(); got != calls {
		t.Fatalf("%d /probe calls inside the 30 s window", got-calls)
	}
	env.clock.advance(11 * time.Second)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionFalse, controller.ReasonProbeRoutingFailed)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonProbeRoutingFailed)
	if stage("ingest", "ok") != 2 || stage("routing", "failed") != 1 || stage("t2", "skipped") != 1 {
		t.Fatalf("probe metric after a routing failure: ingest ok %v routing failed %v t2 skipped %v", stage("ingest", "ok"), stage("routing", "failed"), stage("t2", "skipped"))
	}

	// Sticky: a transport failure keeps the stage failure and counts nothing.
	env.probe.refuse.Store(true)
	calls = env.probe.calls.Load()
	env.clock.advance(31 * time.Second)
	eventually(t, 10*time.Second, func() error {
		if env.probe.calls.Load() == calls {
			return errNotYet
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionFalse, controller.ReasonProbeRoutingFailed)
	if stage("ingest", "ok") != 2 || stage("routing", "failed") != 1 {
		t.Fatal("an HTTP-level /probe failure moved the probe metric")
	}

	// Healed: ProbeOK again; then a t2 failure and an ingest failure.
	env.probe.refuse.Store(false)
	env.probe.index.failRouting(false)
	env.clock.advance(31 * time.Second)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionTrue, controller.ReasonProbeOK)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonBackendReady)
	env.probe.t2.fail.Store(true)
	env.clock.advance(31 * time.Second)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonProbeT2Failed)
	env.probe.t2.fail.Store(false)
	env.probe.index.dropIngest.Store(true)
	env.clock.advance(31 * time.Second)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonProbeIngestFailed)
	if stage("t2", "failed") != 1 || stage("ingest", "failed") != 1 {
		t.Fatalf("probe metric: t2 failed %v, ingest failed %v", stage("t2", "failed"), stage("ingest", "failed"))
	}
	env.probe.index.dropIngest.Store(false)

	// Without an earlier stage failure, a transport error is Unknown/ProbeError
	// and does not gate Ready.
	env.probe.refuse.Store(true)
	readyGateOff(t, env, "fresh", nil)
	waitCond(t, ctx, ns, "fresh", v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionUnknown, controller.ReasonProbeError)
	waitCond(t, ctx, ns, "fresh", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonBackendReady)
	env.probe.refuse.Store(false)

	// Bypass: no /probe call at all.
	readyGateOff(t, env, "bypass", map[string]string{controller.SkipFunctionalProbeAnnotation: "true"})
	waitCond(t, ctx, ns, "bypass", v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionTrue, controller.ReasonProbeBypassed)
	waitCond(t, ctx, ns, "bypass", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonBackendReady)
	if _, ok := counterValue("inferencecache_backend_probe_result_total", map[string]string{"backend": ns + "/bypass", "stage": "ingest", "result": "ok"}); ok {
		t.Fatal("a bypassed backend was probed")
	}

	// A deleted backend's series go with it.
	lmc, err := getBackend(ctx, ns, "lmc")
	wantOK(t, "get lmc", err)
	wantOK(t, "delete lmc", k8s.Delete(ctx, lmc))
	eventually(t, 10*time.Second, func() error {
		if _, ok := counterValue("inferencecache_backend_probe_result_total", map[string]string{"backend": key, "stage": "ingest", "result": "ok"}); ok {
			return errNotYet
		}
		return nil
	})
}

func TestCacheBackendT2AndEngineCompatibility(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-t2", false)
	startBackendController(t, ns)
	pod := enginePod(t, ctx, ns, "llama-0", map[string]string{"app": "llama"}, map[string]string{controller.InjectedByAnnotation: ns + "/lmc"})
	setSnapshot(t)
	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "lmc", "llama", nil)))
	b := waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionEngineCompatibility, metav1.ConditionTrue, controller.ReasonInjectedEnginesRunning)
	if meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionT2Degraded) != nil {
		t.Fatal("T2Degraded published before the tier was queried")
	}

	// The tier was queried and served nothing.
	setSnapshot(t, controlapi.ReplicaSnapshot{ReplicaID: "llama-0", Tenant: ns, PrefixCount: 1, LastEventAt: time.Now().UTC(), T2QueryTokens: 256})
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionT2Degraded, metav1.ConditionTrue, controller.ReasonT2ZeroHitRate)
	setSnapshot(t, controlapi.ReplicaSnapshot{ReplicaID: "llama-0", Tenant: ns, PrefixCount: 1, LastEventAt: time.Now().UTC(), T2QueryTokens: 256, T2HitTokens: 64})
	b = waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionT2Degraded, metav1.ConditionFalse, controller.ReasonT2Serving)
	// Advisory: it never gates Ready (still waiting on the rollout here).
	if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionReady); c == nil || strings.HasPrefix(c.Reason, "T2") {
		t.Fatalf("Ready %+v", c)
	}

	// The injected engine crash-loops (the test writes what the kubelet would).
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "engine", Image: "vllm", RestartCount: 4,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 1m0s"}},
	}}
	wantOK(t, "pod status", k8s.Status().Update(ctx, pod))
	b = waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionEngineCompatibility, metav1.ConditionFalse, controller.ReasonInjectedEngineCrashLoop)
	if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionEngineCompatibility); !strings.Contains(c.Message, "llama-0/engine") {
		t.Fatalf("message %q does not name the container", c.Message)
	}
}

// serverPod creates a ready cache-server pod of backend name with the given
// restart count, as the workload controller and kubelet would.
func serverPod(t *testing.T, ns, backend, name string, restarts int32) *corev1.Pod {
	t.Helper()
	ctx := needEnv(t)
	p := enginePod(t, ctx, ns, name, map[string]string{controller.BackendLabel: backend, controller.ComponentLabel: "cache-server"}, nil)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "engine", Image: "vllm", RestartCount: restarts, Ready: true}}
	wantOK(t, "server pod status", k8s.Status().Update(ctx, p))
	return p
}

func TestCacheBackendRestartCascade(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-cascade", false)
	env := startBackendController(t, ns)
	setSnapshot(t)
	engineDep := func(name, app string) {
		engineDeployment(t, ctx, ns, name, map[string]string{"app": app}, nil)
	}
	engineDep("llama", "llama")
	engineDep("other", "other")
	trigger := func(name string) string { return restartTrigger(t, ctx, ns, name) }
	cascades := func() float64 { return cascadeCount(ns, "lmc") }
	instance := func(want string) {
		t.Helper()
		waitServerInstance(t, ctx, ns, "lmc", want)
	}

	// Two replicas, as the two server pods below: a pod gone while the
	// ready ones still cover spec.replicas is a scale-down, not a
	// replacement (TestCacheBackendScaleIsNoReplacement).
	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "lmc", "llama", func(b *v1alpha1.CacheBackend) { b.Spec.Replicas = ptr(int32(2)) })))
	a := serverPod(t, ns, "lmc", "lmc-a", 0)
	b := serverPod(t, ns, "lmc", "lmc-b", 2)
	instance(string(a.UID) + ":0," + string(b.UID) + ":2")
	if trigger("llama") != "" || cascades() != 0 {
		t.Fatal("the first observation cascaded")
	}

	// a is replaced by c: the matching engine Deployment is annotated, the
	// other one is not, and the cascade is counted once.
	wantOK(t, "delete a", k8s.Delete(ctx, a, client.GracePeriodSeconds(0)))
	c := serverPod(t, ns, "lmc", "lmc-c", 0)
	instance(string(b.UID) + ":2," + string(c.UID) + ":0")
	first := trigger("llama")
	if first == "" || trigger("other") != "" {
		t.Fatalf("restart trigger: llama %q, other %q", first, trigger("other"))
	}
	if cascades() != 1 {
		t.Fatalf("cascades %v, want 1", cascades())
	}

	// b restarts within 30 s: nothing happens until the window ends.
	b.Status.ContainerStatuses[0].RestartCount = 3
	wantOK(t, "restart b", k8s.Status().Update(ctx, b))
	env.clock.advance(20 * time.Second)
	time.Sleep(time.Second)
	instance(string(b.UID) + ":2," + string(c.UID) + ":0")
	if trigger("llama") != first || cascades() != 1 {
		t.Fatal("a second cascade inside the 30 s window")
	}
	env.clock.advance(11 * time.Second)
	instance(string(b.UID) + ":3," + string(c.UID) + ":0")
	if second := trigger("llama"); second == first || second == "" || cascades() != 2 {
		t.Fatalf("after the window: trigger %q (was %q), cascades %v", second, first, cascades())
	}
}

// TestCacheBackendScaleIsNoReplacement: scaling the cache server down and
// up changes observedServerInstance without a cascade; a replacement after
// that still cascades.
func TestCacheBackendScaleIsNoReplacement(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-scale", false)
	env := startBackendController(t, ns)
	setSnapshot(t)
	labels := map[string]string{"app": "llama"}
	engineDeployment(t, ctx, ns, "llama", labels, nil)
	trigger := func() string { return restartTrigger(t, ctx, ns, "llama") }
	cascades := func() float64 { return cascadeCount(ns, "lmc") }
	instance := func(want string) {
		t.Helper()
		waitServerInstance(t, ctx, ns, "lmc", want)
	}
	// scale sets spec.replicas and waits until the server Deployment has it.
	scale := func(n int32) {
		t.Helper()
		patchBackend(t, ctx, ns, "lmc", func(b *v1alpha1.CacheBackend) { b.Spec.Replicas = ptr(n) })
		eventually(t, 10*time.Second, func() error {
			var d appsv1.Deployment
			if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "lmc"}, &d); err != nil {
				return err
			}
			if d.Spec.Replicas == nil || *d.Spec.Replicas != n {
				return fmt.Errorf("server replicas %v, want %d", d.Spec.Replicas, n)
			}
			return nil
		})
	}
	quiet := func(what string) {
		t.Helper()
		if trigger() != "" || cascades() != 0 {
			t.Fatalf("%s cascaded: trigger %q, cascades %v", what, trigger(), cascades())
		}
	}

	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "lmc", "llama", func(b *v1alpha1.CacheBackend) { b.Spec.Replicas = ptr(int32(3)) })))
	a := serverPod(t, ns, "lmc", "lmc-a", 0)
	b := serverPod(t, ns, "lmc", "lmc-b", 0)
	c := serverPod(t, ns, "lmc", "lmc-c", 0)
	instance(string(a.UID) + ":0," + string(b.UID) + ":0," + string(c.UID) + ":0")

	// Scale-down 3 -> 1: two pods go, nothing takes their place.
	scale(1)
	wantOK(t, "delete c", k8s.Delete(ctx, c, client.GracePeriodSeconds(0)))
	wantOK(t, "delete b", k8s.Delete(ctx, b, client.GracePeriodSeconds(0)))
	instance(string(a.UID) + ":0")
	env.clock.advance(31 * time.Second) // an open window would not hide a cascade
	time.Sleep(time.Second)
	quiet("a scale-down")

	// Scale-up 1 -> 2.
	scale(2)
	d := serverPod(t, ns, "lmc", "lmc-d", 0)
	instance(string(a.UID) + ":0," + string(d.UID) + ":0")
	time.Sleep(time.Second)
	quiet("a scale-up")

	// A replacement still cascades: a goes, e takes its place.
	wantOK(t, "delete a", k8s.Delete(ctx, a, client.GracePeriodSeconds(0)))
	time.Sleep(500 * time.Millisecond) // a pass sees a gone and e not yet there
	e := serverPod(t, ns, "lmc", "lmc-e", 0)
	instance(string(d.UID) + ":0," + string(e.UID) + ":0")
	if trigger() == "" || cascades() != 1 {
		t.Fatalf("replacement: trigger %q, cascades %v", trigger(), cascades())
	}
}

// TestCacheBackendOptedOutPods: pods that opted out of injection
// (inferencecache.io/inject "false", label or annotation) are not counted in
// matchedEnginePods, do not turn EngineCompatibility False, and a Deployment
// whose pod template opted out is not rolled by the restart cascade.
func TestCacheBackendOptedOutPods(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-optout", false)
	startBackendController(t, ns)
	setSnapshot(t)
	llama := map[string]string{"app": "llama"}
	optOut := map[string]string{claim.InjectKey: "false"}
	enginePod(t, ctx, ns, "llama-0", llama, nil)
	enginePod(t, ctx, ns, "llama-label", map[string]string{"app": "llama", claim.InjectKey: "false"}, nil)
	// Opted out by annotation, and carrying an injected-by copied from an
	// injected pod: it crash-loops, which is not the backend's doing.
	looping := enginePod(t, ctx, ns, "llama-annotation", llama, map[string]string{claim.InjectKey: "false", controller.InjectedByAnnotation: ns + "/lmc"})
	looping.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "engine", Image: "vllm", RestartCount: 4,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
	}}
	wantOK(t, "pod status", k8s.Status().Update(ctx, looping))
	engineDep := func(name string, annotations map[string]string) {
		engineDeployment(t, ctx, ns, name, llama, annotations)
	}
	engineDep("wired", nil)
	engineDep("unwired", optOut)

	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "lmc", "llama", nil)))
	b := waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionEngineCompatibility, metav1.ConditionTrue, controller.ReasonInjectedEnginesRunning)
	if m := b.Status.MatchedEnginePods; m == nil || *m != 1 {
		t.Fatalf("matchedEnginePods %v, want 1 (the opted-out pods are not claimed)", m)
	}
	if msg := b.Status.EngineSelectorMessage; !strings.Contains(msg, "1 pod(s) match app=llama") || !strings.Contains(msg, "2 more match but opted out") {
		t.Fatalf("engineSelectorMessage %q", msg)
	}

	a := serverPod(t, ns, "lmc", "lmc-a", 0)
	eventually(t, 10*time.Second, func() error {
		b, err := getBackend(ctx, ns, "lmc")
		if err != nil {
			return err
		}
		if b.Status.ObservedServerInstance != string(a.UID)+":0" {
			return fmt.Errorf("observedServerInstance %q", b.Status.ObservedServerInstance)
		}
		return nil
	})
	wantOK(t, "delete a", k8s.Delete(ctx, a, client.GracePeriodSeconds(0)))
	serverPod(t, ns, "lmc", "lmc-b", 0)
	trigger := func(name string) string { return restartTrigger(t, ctx, ns, name) }
	eventually(t, 10*time.Second, func() error {
		if trigger("wired") == "" {
			return errors.New("the wired engine Deployment was not rolled")
		}
		return nil
	})
	if got := trigger("unwired"); got != "" {
		t.Fatalf("the opted-out Deployment was rolled (%q)", got)
	}
}

// TestCacheBackendHangingProbe: a server that never answers one backend's
// /probe holds up neither another backend's status (reconciles run
// concurrently) nor its own reconcile past the /probe timeout, well below
// the server client's own timeout.
func TestCacheBackendHangingProbe(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-hang", false)
	const probeTimeout = 8 * time.Second
	env := startBackendControllerWith(t, 200*time.Millisecond, func(o *controller.CacheBackendOptions, s *controller.ServerClient) {
		o.ProbeTimeout = probeTimeout
		s.HTTP.Timeout = 5 * time.Minute // not what bounds /probe
	}, ns)
	setSnapshot(t)
	env.probe.hang.Store(ptr(ns + "/hang"))
	readyGateOff(t, env, "hang", nil)
	eventually(t, 15*time.Second, func() error {
		if env.probe.hung.Load() == 0 {
			return errors.New("the /probe of backend hang has not started")
		}
		return nil
	})
	hungAt := time.Now()

	// Another backend's whole life to ProbeOK (provisioning, status, its own
	// /probe) fits well inside the hanging call.
	readyGateOff(t, env, "fine", nil)
	waitCond(t, ctx, ns, "fine", v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionTrue, controller.ReasonProbeOK)
	if took := time.Since(hungAt); took > probeTimeout/2 {
		t.Fatalf("backend fine reached ProbeOK %v after backend hang's /probe started hanging, want < %v", took, probeTimeout/2)
	}

	// The hanging call ends at the /probe timeout.
	b := waitCond(t, ctx, ns, "hang", v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionUnknown, controller.ReasonProbeError)
	took := time.Since(hungAt)
	if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionFunctionalProbeOK); !strings.Contains(c.Message, "/probe timeout") {
		t.Errorf("ProbeError message %q does not name the /probe timeout", c.Message)
	}
	if took < probeTimeout-time.Second || took > probeTimeout+5*time.Second {
		t.Errorf("the hanging /probe ended after %v, want about %v", took, probeTimeout)
	}
}

// TestCacheBackendTypesNotProvisioned: only type LMCache gets a cache
// server. SGLangHiCache (in-engine), AIBrix, Mooncake and NIXL publish
// Progressing False/NotProvisioned, Ready from the KV-event gate, and
// EngineCompatibility; a backend switched from LMCache loses its objects.
func TestCacheBackendTypesNotProvisioned(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-types", false)
	startBackendController(t, ns)
	setSnapshot(t)
	noObjects := func(name string) error {
		key := types.NamespacedName{Namespace: ns, Name: name}
		if err := k8s.Get(ctx, key, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s has a Deployment (%v)", name, err)
		}
		if err := k8s.Get(ctx, key, &corev1.Service{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s has a Service (%v)", name, err)
		}
		return nil
	}
	for _, typ := range []v1alpha1.CacheBackendType{v1alpha1.BackendSGLangHiCache, v1alpha1.BackendAIBrix, v1alpha1.BackendMooncake, v1alpha1.BackendNIXL} {
		name := strings.ToLower(string(typ))
		wantOK(t, "backend "+name, k8s.Create(ctx, cbObj(ns, name, "llama", func(b *v1alpha1.CacheBackend) { b.Spec.Type = typ })))
		b := waitCond(t, ctx, ns, name, v1alpha1.BackendConditionProgressing, metav1.ConditionFalse, controller.ReasonNotProvisioned)
		if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionProgressing); !strings.Contains(c.Message, string(typ)) {
			t.Errorf("%s: Progressing message %q does not name the type", name, c.Message)
		}
		b = waitCond(t, ctx, ns, name, v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonAwaitingFirstKVEvent)
		eventually(t, 10*time.Second, func() error {
			if b, err := getBackend(ctx, ns, name); err != nil {
				return err
			} else if got := conditionTypes(b); !sameSet(got, "Ready", "Degraded", "Progressing", "EngineCompatibility", "EngineKernelsHealthy") {
				return fmt.Errorf("%s conditions %v", name, got)
			}
			return nil
		})
		if b.Status.Endpoint != "" || b.Status.FirstAvailableAt == nil {
			t.Errorf("%s: endpoint %q, firstAvailableAt %v", name, b.Status.Endpoint, b.Status.FirstAvailableAt)
		}
		if err := noObjects(name); err != nil {
			t.Error(err)
		}
	}

	// Ready follows the engines' KV events (aibrix is first by name, so it
	// claims llama-0).
	enginePod(t, ctx, ns, "llama-0", map[string]string{"app": "llama"}, nil)
	setSnapshot(t, controlapi.ReplicaSnapshot{ReplicaID: "llama-0", Tenant: ns, PrefixCount: 3, LastEventAt: time.Now().UTC()})
	waitCond(t, ctx, ns, "aibrix", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonKVEventsObserved)

	// LMCache is provisioned; switched to SGLangHiCache its objects go.
	wantOK(t, "backend lmc", k8s.Create(ctx, cbObj(ns, "lmc", "other", nil)))
	eventually(t, 10*time.Second, func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "lmc"}, &appsv1.Deployment{})
	})
	patchBackend(t, ctx, ns, "lmc", func(b *v1alpha1.CacheBackend) { b.Spec.Type = v1alpha1.BackendSGLangHiCache })
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionProgressing, metav1.ConditionFalse, controller.ReasonNotProvisioned)
	eventually(t, 10*time.Second, func() error { return noObjects("lmc") })
}

func TestPromptTemplateRevision(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "pt-revision", false)
	startBackendController(t, ns)
	spec := v1alpha1.PromptTemplateSpec{
		Body:  "You are {{persona}}. {{question}}",
		Slots: []v1alpha1.PromptTemplateSlot{{Name: "persona", Type: v1alpha1.SlotStable}, {Name: "question", Type: v1alpha1.SlotMutable, Required: true}},
	}
	for _, name := range []string{"a", "b"} {
		wantOK(t, "template "+name, k8s.Create(ctx, &v1alpha1.PromptTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: *spec.DeepCopy()}))
	}
	revision := func(name string) string {
		var pt v1alpha1.PromptTemplate
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &pt); err != nil {
			return ""
		}
		return pt.Status.TemplateRevision
	}
	want := controller.TemplateRevision(&spec)
	eventually(t, 10*time.Second, func() error {
		if revision("a") != want || revision("b") != want {
			return fmt.Errorf("revisions %q %q, want %q", revision("a"), revision("b"), want)
		}
		return nil
	})
	var pt v1alpha1.PromptTemplate
	wantOK(t, "get a", k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "a"}, &pt))
	pt.Spec.Slots[1].Type = v1alpha1.SlotStable
	wantOK(t, "update a", k8s.Update(ctx, &pt))
	eventually(t, 10*time.Second, func() error {
		if got := revision("a"); got == want || got != controller.TemplateRevision(&pt.Spec) {
			return fmt.Errorf("revision %q after a slot change", got)
		}
		return nil
	})
}

// TestCacheBackendClaimsFollowTheWebhook: two backends of a namespace select
// the same engines. The first by name claims them (the pod webhook's rule),
// so only it counts them in matchedEnginePods, and a replacement of the
// other one's server rolls no engine Deployment (it still counts as one
// cascade decision, as metrics.md says of a zero-match cascade).
func TestCacheBackendClaimsFollowTheWebhook(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-claims", false)
	startBackendController(t, ns)
	setSnapshot(t)
	labels := map[string]string{"app": "llama"}
	enginePod(t, ctx, ns, "llama-0", labels, nil)
	engineDeployment(t, ctx, ns, "llama", labels, nil)
	wantOK(t, "backend aaa", k8s.Create(ctx, cbObj(ns, "aaa", "llama", nil)))
	wantOK(t, "backend lmc", k8s.Create(ctx, cbObj(ns, "lmc", "llama", nil)))
	matched := func(name string, want int32, msg string) {
		t.Helper()
		eventually(t, 10*time.Second, func() error {
			b, err := getBackend(ctx, ns, name)
			if err != nil {
				return err
			}
			if m := b.Status.MatchedEnginePods; m == nil || *m != want || !strings.Contains(b.Status.EngineSelectorMessage, msg) {
				return fmt.Errorf("%s: matchedEnginePods %v, engineSelectorMessage %q; want %d, %q", name, m, b.Status.EngineSelectorMessage, want, msg)
			}
			return nil
		})
	}
	matched("aaa", 1, "1 pod(s) match app=llama")
	matched("lmc", 0, "1 more match but another CacheBackend claims them (e.g. "+ns+"/aaa:")

	a := serverPod(t, ns, "lmc", "lmc-a", 0)
	eventually(t, 10*time.Second, func() error {
		b, err := getBackend(ctx, ns, "lmc")
		if err != nil {
			return err
		}
		if b.Status.ObservedServerInstance != string(a.UID)+":0" {
			return fmt.Errorf("observedServerInstance %q", b.Status.ObservedServerInstance)
		}
		return nil
	})
	wantOK(t, "delete a", k8s.Delete(ctx, a, client.GracePeriodSeconds(0)))
	serverPod(t, ns, "lmc", "lmc-b", 0)
	eventually(t, 10*time.Second, func() error {
		if v, _ := counterValue("inferencecache_backend_server_restart_cascades_total", map[string]string{"namespace": ns, "backend": "lmc", "reason": "server_instance_changed"}); v != 1 {
			return fmt.Errorf("cascades %v, want 1", v)
		}
		return nil
	})
	var d appsv1.Deployment
	wantOK(t, "get llama", k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "llama"}, &d))
	if v := d.Spec.Template.Annotations[controller.RestartTriggerAnnotation]; v != "" {
		t.Fatalf("lmc's cascade rolled the engine Deployment aaa claims (trigger %q)", v)
	}
}

// TestCacheBackendCrossNamespaceClaims: a backend with allowCrossNamespace
// claims engine pods of a namespace without a claimant of its own (the pod
// webhook injects them for it), so it counts them, reports their crash loops
// and rolls their Deployments when its server is replaced.
func TestCacheBackendCrossNamespaceClaims(t *testing.T) {
	ctx := needEnv(t)
	home := namespace(t, ctx, "cb-cross-home", false)
	other := namespace(t, ctx, "cb-cross-other", false)
	startBackendControllerIn(t, 200*time.Millisecond, home, other)
	setSnapshot(t)
	labels := map[string]string{"app": "xllama"}
	pod := enginePod(t, ctx, other, "x-0", labels, map[string]string{controller.InjectedByAnnotation: home + "/shared"})
	engineDeployment(t, ctx, other, "xllama", labels, nil)
	wantOK(t, "backend", k8s.Create(ctx, cbObj(home, "shared", "xllama", func(b *v1alpha1.CacheBackend) { b.Spec.AllowCrossNamespace = true })))
	matched := func(want int32, msg string) {
		t.Helper()
		eventually(t, 10*time.Second, func() error {
			b, err := getBackend(ctx, home, "shared")
			if err != nil {
				return err
			}
			if m := b.Status.MatchedEnginePods; m == nil || *m != want || !strings.Contains(b.Status.EngineSelectorMessage, msg) {
				return fmt.Errorf("matchedEnginePods %v, engineSelectorMessage %q; want %d, %q", m, b.Status.EngineSelectorMessage, want, msg)
			}
			return nil
		})
	}
	// Until the other namespace consents, its pods are not the backend's.
	matched(0, "")
	var n corev1.Namespace
	wantOK(t, "get namespace", k8s.Get(ctx, client.ObjectKey{Name: other}, &n))
	n.Annotations = map[string]string{"inferencecache.io/allow-claims-from": home}
	wantOK(t, "consent", k8s.Update(ctx, &n))
	matched(1, "1 pod(s) match app=xllama")

	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "engine", Image: "vllm", RestartCount: 4,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
	}}
	wantOK(t, "pod status", k8s.Status().Update(ctx, pod))
	b := waitCond(t, ctx, home, "shared", v1alpha1.BackendConditionEngineCompatibility, metav1.ConditionFalse, controller.ReasonInjectedEngineCrashLoop)
	if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionEngineCompatibility); !strings.Contains(c.Message, other+"/x-0/engine") {
		t.Fatalf("message %q does not name the pod", c.Message)
	}

	a := serverPod(t, home, "shared", "shared-a", 0)
	eventually(t, 10*time.Second, func() error {
		b, err := getBackend(ctx, home, "shared")
		if err != nil {
			return err
		}
		if b.Status.ObservedServerInstance != string(a.UID)+":0" {
			return fmt.Errorf("observedServerInstance %q", b.Status.ObservedServerInstance)
		}
		return nil
	})
	wantOK(t, "delete a", k8s.Delete(ctx, a, client.GracePeriodSeconds(0)))
	serverPod(t, home, "shared", "shared-b", 0)
	eventually(t, 10*time.Second, func() error {
		var d appsv1.Deployment
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: other, Name: "xllama"}, &d); err != nil {
			return err
		}
		if d.Spec.Template.Annotations[controller.RestartTriggerAnnotation] == "" {
			return fmt.Errorf("the engine Deployment of %s has no restart trigger", other)
		}
		return nil
	})
}

// TestCacheBackendLeavesForeignObjects: an engine Deployment and Service
// named like the backend are not adopted (rewritten into the cache server,
// then garbage-collected with the backend); a Warning Event says why.
func TestCacheBackendLeavesForeignObjects(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-foreign", false)
	startBackendController(t, ns)
	setSnapshot(t)
	labels := map[string]string{"app": "llama"}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llama"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 8000}}},
	}
	wantOK(t, "service", k8s.Create(ctx, svc))
	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "llama", "llama", nil)))
	eventually(t, 10*time.Second, func() error {
		var evs eventsv1.EventList
		if err := k8s.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == "llama" && e.Reason == "ProvisionConflict" && e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "Service") {
				return nil
			}
		}
		return fmt.Errorf("no ProvisionConflict Event among %d", len(evs.Items))
	})
	var got corev1.Service
	wantOK(t, "get service", k8s.Get(ctx, client.ObjectKeyFromObject(svc), &got))
	if len(got.OwnerReferences) != 0 || got.Spec.Selector["app"] != "llama" || len(got.Spec.Selector) != 1 || got.Spec.Ports[0].Port != 8000 {
		t.Fatalf("the engine Service was taken over: %+v %+v", got.OwnerReferences, got.Spec)
	}
}

// TestCacheBackendInstanceClearedWhenUnmanaged: a backend that stops being
// managed (EventsOnly here) has no server, so observedServerInstance is
// cleared; back to managed, its new server is a first observation, not a
// replacement that rolls the engines.
func TestCacheBackendInstanceClearedWhenUnmanaged(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-unmanaged", false)
	startBackendController(t, ns)
	setSnapshot(t)
	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "lmc", "llama", nil)))
	instance := func(want string) {
		t.Helper()
		waitServerInstance(t, ctx, ns, "lmc", want)
	}
	a := serverPod(t, ns, "lmc", "lmc-a", 0)
	instance(string(a.UID) + ":0")
	setMode := func(m v1alpha1.IntegrationMode) {
		patchBackend(t, ctx, ns, "lmc", func(b *v1alpha1.CacheBackend) {
			b.Spec.Integration = &v1alpha1.CacheBackendIntegration{Mode: m}
		})
	}
	setMode(v1alpha1.IntegrationEventsOnly)
	instance("")
	wantOK(t, "delete a", k8s.Delete(ctx, a, client.GracePeriodSeconds(0)))
	setMode(v1alpha1.IntegrationOffload)
	b := serverPod(t, ns, "lmc", "lmc-b", 0)
	instance(string(b.UID) + ":0")
	if v, ok := counterValue("inferencecache_backend_server_restart_cascades_total", map[string]string{"namespace": ns, "backend": "lmc", "reason": "server_instance_changed"}); ok || v != 0 {
		t.Fatalf("cascades %v: the return to managed cascaded", v)
	}
}

// TestCacheBackendRemoteStorageProbe: a backend with spec.remoteStorage has
// the server's /probe run stage t2 against that store (a real Redis
// protocol server here): ok while it serves, ProbeT2Failed with the cause
// once it is gone. A bad endpoint is refused at admission, without
// echoing its password.
func TestCacheBackendRemoteStorageProbe(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-remote", false)
	env := startBackendController(t, ns)
	mr := miniredis.RunT(t)
	key := ns + "/lmc"
	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "lmc", "llama", func(b *v1alpha1.CacheBackend) {
		b.Annotations = map[string]string{controller.RequireKVEventsAnnotation: "false"}
		b.Spec.RemoteStorage = &v1alpha1.CacheBackendRemoteStorage{Endpoint: "redis://" + mr.Addr() + "/0"}
	})))
	eventually(t, 10*time.Second, func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "lmc"}, &appsv1.Deployment{})
	})
	setDeploymentStatus(t, ctx, ns, "lmc", 1, 1)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionTrue, controller.ReasonProbeOK)
	if v, _ := counterValue("inferencecache_backend_probe_result_total", map[string]string{"backend": key, "stage": "t2", "result": "ok"}); v != 1 {
		t.Fatalf("t2 ok counted %v times, want 1", v)
	}
	if keys := mr.Keys(); len(keys) != 0 {
		t.Fatalf("the probe left keys in the remote tier: %v", keys)
	}

	mr.Close()
	env.clock.advance(31 * time.Second)
	b := waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionFalse, controller.ReasonProbeT2Failed)
	if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionFunctionalProbeOK); !strings.Contains(c.Message, "cannot reach the remote tier") {
		t.Fatalf("message %q does not give the cause", c.Message)
	}

	bad := cbObj(ns, "bad", "llama", func(b *v1alpha1.CacheBackend) {
		b.Spec.RemoteStorage = &v1alpha1.CacheBackendRemoteStorage{Endpoint: "redis://app:s3cret@cache-without-port"}
	})
	err := k8s.Create(ctx, bad)
	wantDenied(t, "remote tier without a port", err, "spec.remoteStorage.endpoint", "want host:port")
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("the refusal echoes the password: %v", err)
	}
}

// An injected engine whose last termination was a GPU-kernel fault turns
// EngineKernelsHealthy False and a Ready backend not Ready
// (EngineKernelDegraded), with a Warning Event; running and ready again,
// with the fault past KernelFaultWindow, it is healthy and Ready returns.
func TestCacheBackendEngineKernels(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-kernels", false)
	env := startBackendController(t, ns)
	setSnapshot(t)
	readyGateOff(t, env, "lmc", map[string]string{controller.SkipFunctionalProbeAnnotation: "true"})
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonBackendReady)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionEngineKernelsHealthy, metav1.ConditionTrue, controller.ReasonEngineKernelsOK)

	pod := enginePod(t, ctx, ns, "llama-0", map[string]string{"app": "llama"}, map[string]string{controller.InjectedByAnnotation: ns + "/lmc"})
	fault := &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", FinishedAt: metav1.Now(),
		Message: "RuntimeError: CUDA error: no kernel image is available for execution on the device"}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "engine", Image: "vllm", RestartCount: 2,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: fault},
	}}
	wantOK(t, "pod status", k8s.Status().Update(ctx, pod))
	b := waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionEngineKernelsHealthy, metav1.ConditionFalse, controller.ReasonEngineKernelDegraded)
	if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionEngineKernelsHealthy); !strings.Contains(c.Message, "llama-0/engine") ||
		!strings.Contains(c.Message, "GPU architecture") {
		t.Fatalf("message %q names neither the container nor the fault", c.Message)
	}
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonEngineKernelDegraded)
	waitEvent(t, ctx, ns, "lmc", controller.ReasonEngineKernelDegraded, "llama-0/engine")

	// Running and ready again four minutes after the fault: still inside
	// the window; once the (controller's) clock passes it, healthy.
	fault.FinishedAt = metav1.NewTime(time.Now().Add(-4 * time.Minute))
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "engine", Image: "vllm", RestartCount: 3, Ready: true,
		State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: fault.FinishedAt}},
		LastTerminationState: corev1.ContainerState{Terminated: fault},
	}}
	wantOK(t, "pod status", k8s.Status().Update(ctx, pod))
	eventually(t, 10*time.Second, func() error {
		var p corev1.Pod
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil || len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
			return errNotYet
		}
		return nil
	})
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionEngineKernelsHealthy, metav1.ConditionFalse, controller.ReasonEngineKernelDegraded)
	env.clock.advance(controller.KernelFaultWindow)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionEngineKernelsHealthy, metav1.ConditionTrue, controller.ReasonEngineKernelsOK)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionTrue, controller.ReasonBackendReady)
}
