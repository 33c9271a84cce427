package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
)

// TestCacheBackendServerHardening: the managed cache server runs a pinned
// image (the controller's, replaceable by its option/flag) under the
// restricted pod security profile, with a liveness probe and a
// PodDisruptionBudget the backend controls.
func TestCacheBackendServerHardening(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-hardening", false)
	const image = "registry.example/approved/lmcache:v9"
	startBackendControllerWith(t, 200*time.Millisecond, func(o *controller.CacheBackendOptions, _ *controller.ServerClient) {
		o.Image = image
	}, ns)
	setSnapshot(t)
	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "lmc", "llama", nil)))
	key := types.NamespacedName{Namespace: ns, Name: "lmc"}
	var dep appsv1.Deployment
	eventually(t, 10*time.Second, func() error { return k8s.Get(ctx, key, &dep) })
	b, err := getBackend(ctx, ns, "lmc")
	wantOK(t, "get backend", err)

	ps := dep.Spec.Template.Spec
	c := ps.Containers[0]
	if c.Image != image {
		t.Errorf("image %q, want the controller's %q", c.Image, image)
	}
	if strings.HasSuffix(controller.DefaultCacheServerImage, ":latest") || !strings.Contains(controller.DefaultCacheServerImage, ":") {
		t.Errorf("default image %q is not pinned", controller.DefaultCacheServerImage)
	}
	psc := ps.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v", psc)
	}
	csc := c.SecurityContext
	if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation || csc.Capabilities == nil ||
		!slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
		t.Errorf("container securityContext %+v", csc)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.TCPSocket == nil {
		t.Errorf("liveness probe %+v", c.LivenessProbe)
	}
	var pdb policyv1.PodDisruptionBudget
	eventually(t, 10*time.Second, func() error { return k8s.Get(ctx, key, &pdb) })
	controlledBy(t, &pdb, b)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.Selector == nil ||
		pdb.Spec.Selector.MatchLabels[controller.BackendLabel] != "lmc" {
		t.Errorf("pdb spec %+v", pdb.Spec)
	}
	// An EventsOnly backend runs no server and keeps no PDB.
	patchBackend(t, ctx, ns, "lmc", func(b *v1alpha1.CacheBackend) {
		b.Spec.Integration = &v1alpha1.CacheBackendIntegration{Mode: v1alpha1.IntegrationEventsOnly}
	})
	eventually(t, 10*time.Second, func() error {
		if err := k8s.Get(ctx, key, &policyv1.PodDisruptionBudget{}); err == nil {
			return fmt.Errorf("PDB still there")
		}
		return nil
	})
}

// TestCacheBackendRolloutFailure: a rollout the Deployment controller gave
// up on (ProgressDeadlineExceeded) or cannot create pods for
// (ReplicaFailure) is Ready False RolloutFailed, not an endless
// RolloutInProgress.
func TestCacheBackendRolloutFailure(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-rollout-fail", false)
	startBackendController(t, ns)
	setSnapshot(t)
	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "lmc", "llama", nil)))
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonRolloutInProgress)
	setConditions := func(conds ...appsv1.DeploymentCondition) {
		t.Helper()
		eventually(t, 10*time.Second, func() error {
			var d appsv1.Deployment
			if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "lmc"}, &d); err != nil {
				return err
			}
			d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, UnavailableReplicas: 1, Conditions: conds}
			return k8s.Status().Update(ctx, &d)
		})
	}
	setConditions(appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse,
		Reason: "ProgressDeadlineExceeded", Message: `ReplicaSet "lmc-1" has timed out progressing.`})
	b := waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonRolloutFailed)
	if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionReady); !strings.Contains(c.Message, "timed out progressing") {
		t.Errorf("Ready message %q does not carry the Deployment's", c.Message)
	}
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionProgressing, metav1.ConditionFalse, controller.ReasonRolloutFailed)
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionDegraded, metav1.ConditionTrue, controller.ReasonRolloutFailed)

	setConditions(appsv1.DeploymentCondition{Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue,
		Reason: "FailedCreate", Message: `pods "lmc-1-x" is forbidden: exceeded quota`})
	eventually(t, 10*time.Second, func() error {
		b, err := getBackend(ctx, ns, "lmc")
		if err != nil {
			return err
		}
		if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionReady); c == nil || c.Reason != controller.ReasonRolloutFailed || !strings.Contains(c.Message, "exceeded quota") {
			return fmt.Errorf("Ready %+v, want RolloutFailed carrying the Deployment's message", c)
		}
		return nil
	})
	// Recovered.
	setConditions(appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetAvailable"})
	waitCond(t, ctx, ns, "lmc", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonReplicasUnavailable)
}

// TestCacheBackendProvisionErrorsInStatus: a backend the controller cannot
// provision says why in status (Ready and Progressing False with the
// reason and the error), not only in the controller's log.
func TestCacheBackendProvisionErrorsInStatus(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-provision-err", true) // legacy: admitted before the webhook's rules
	startBackendControllerWith(t, 200*time.Millisecond, func(o *controller.CacheBackendOptions, _ *controller.ServerClient) {
		o.Policy = validation.BackendPolicy{ImagePrefixes: []string{"registry.example/approved/"}}
	}, ns)
	setSnapshot(t)
	wantOK(t, "foreign service", k8s.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}))
	wantOK(t, "backend named like it", k8s.Create(ctx, cbObj(ns, "taken", "llama", nil)))
	b := waitCond(t, ctx, ns, "taken", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonProvisionConflict)
	if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionReady); !strings.Contains(c.Message, "Service") {
		t.Errorf("message %q", c.Message)
	}
	waitCond(t, ctx, ns, "taken", v1alpha1.BackendConditionProgressing, metav1.ConditionFalse, controller.ReasonProvisionConflict)

	wantOK(t, "backend with a refused image", k8s.Create(ctx, cbObj(ns, "img", "llama", func(b *v1alpha1.CacheBackend) {
		b.Spec.BackendConfig = map[string]string{"image": "docker.io/evil/miner:1"}
	})))
	b = waitCond(t, ctx, ns, "img", v1alpha1.BackendConditionReady, metav1.ConditionFalse, controller.ReasonProvisionFailed)
	if c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionReady); !strings.Contains(c.Message, "not allowed") {
		t.Errorf("message %q", c.Message)
	}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "img"}, &appsv1.Deployment{}); err == nil {
		t.Error("the refused image was provisioned")
	}
}

// TestCacheBackendProbeBacksOff: while the routing server does not answer
// (every /probe hangs until the client's timeout), one failed call makes the
// reconciler back off: the other backends' passes do not each hold a worker
// for the /probe timeout, they report the outage and retry when the backoff
// ends. Once the server answers again every backend is probed.
func TestCacheBackendProbeBacksOff(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-backoff", false)
	const backends, workers = 12, 2
	env := startBackendControllerWith(t, 200*time.Millisecond, func(o *controller.CacheBackendOptions, _ *controller.ServerClient) {
		o.ProbeTimeout = time.Second
		o.Workers = workers
	}, ns)
	setSnapshot(t)
	env.probe.hangAll.Store(true)
	for i := range backends {
		readyGateOff(t, env, fmt.Sprintf("b%02d", i), nil)
	}
	for i := range backends {
		waitCond(t, ctx, ns, fmt.Sprintf("b%02d", i), v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionUnknown, controller.ReasonProbeError)
	}
	// Without the backoff every backend's pass hangs for the timeout: 12
	// calls. With it: the calls in flight when the first failed (one per
	// worker) plus a retry per backoff step.
	t.Logf("%d /probe calls hung for %d backends (%d workers)", env.probe.hung.Load(), backends, workers)
	if n := env.probe.hung.Load(); n > backends/2 {
		t.Fatalf("%d /probe calls hung for %d backends, want at most %d: the reconciler did not back off", n, backends, backends/2)
	}
	env.probe.hangAll.Store(false)
	env.clock.advance(controller.DefaultProbeInterval + time.Second) // the backends probed before the outage may probe again
	for i := range backends {
		waitCond(t, ctx, ns, fmt.Sprintf("b%02d", i), v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionTrue, controller.ReasonProbeOK)
	}
}

// TestCacheBackendTemplateRemoval: removing spec.template (or one of its
// fields) removes from the workload what it had set, and only that: a field
// someone else set on the Deployment is left alone.
func TestCacheBackendTemplateRemoval(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cb-template", false)
	startBackendController(t, ns)
	setSnapshot(t)
	grace := int64(7)
	wantOK(t, "backend", k8s.Create(ctx, cbObj(ns, "lmc", "llama", func(b *v1alpha1.CacheBackend) {
		b.Spec.Template = &v1alpha1.BackendPodOverride{
			NodeSelector: map[string]string{"pool": "cpu"}, PriorityClassName: "cache",
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "pull"}}, TerminationGracePeriodSeconds: &grace,
		}
	})))
	key := types.NamespacedName{Namespace: ns, Name: "lmc"}
	get := func() *appsv1.Deployment {
		t.Helper()
		var d appsv1.Deployment
		wantOK(t, "get deployment", k8s.Get(ctx, key, &d))
		return &d
	}
	eventually(t, 10*time.Second, func() error {
		var d appsv1.Deployment
		if err := k8s.Get(ctx, key, &d); err != nil {
			return err
		}
		if d.Spec.Template.Spec.NodeSelector["pool"] != "cpu" {
			return fmt.Errorf("template not applied yet: %+v", d.Spec.Template.Spec.NodeSelector)
		}
		return nil
	})
	// Someone else adds a toleration to the Deployment.
	eventually(t, 10*time.Second, func() error {
		d := get()
		d.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists}}
		return k8s.Update(ctx, d)
	})
	// One field goes, then the whole template.
	patchBackend(t, ctx, ns, "lmc", func(b *v1alpha1.CacheBackend) { b.Spec.Template.PriorityClassName = "" })
	eventually(t, 10*time.Second, func() error {
		if d := get(); d.Spec.Template.Spec.PriorityClassName != "" || d.Spec.Template.Spec.NodeSelector["pool"] != "cpu" {
			return fmt.Errorf("priorityClassName %q, nodeSelector %v", d.Spec.Template.Spec.PriorityClassName, d.Spec.Template.Spec.NodeSelector)
		}
		return nil
	})
	patchBackend(t, ctx, ns, "lmc", func(b *v1alpha1.CacheBackend) { b.Spec.Template = nil })
	eventually(t, 10*time.Second, func() error {
		ps := get().Spec.Template.Spec
		if len(ps.NodeSelector) != 0 || len(ps.ImagePullSecrets) != 0 || ps.TerminationGracePeriodSeconds == nil || *ps.TerminationGracePeriodSeconds == grace {
			return fmt.Errorf("template fields kept after spec.template was removed: nodeSelector %v, imagePullSecrets %v, grace %v",
				ps.NodeSelector, ps.ImagePullSecrets, ps.TerminationGracePeriodSeconds)
		}
		return nil
	})
	if ps := get().Spec.Template.Spec; len(ps.Tolerations) != 1 || ps.Tolerations[0].Key != "gpu" {
		t.Fatalf("the toleration another writer set is gone: %v", ps.Tolerations)
	}
}
