package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/claim"
)

// RestartTriggerAnnotation is patched onto the pod template of the engine
// Deployments a backend selects when its cache server was replaced: the
// rollout reconnects the engines (the LMCache connector does not recover
// from a server restart on its own, LMCache/LMCache#3565).
const RestartTriggerAnnotation = "inferencecache.io/cache-server-restart-trigger"

// serverInstance is status.observedServerInstance of the ready pods among
// pods: "<uid>:<restart-sum>" per pod, sorted by pod name, comma-joined.
func serverInstance(pods []corev1.Pod) string {
	ready := make([]*corev1.Pod, 0, len(pods))
	for i := range pods {
		if podReady(&pods[i]) && pods[i].DeletionTimestamp == nil {
			ready = append(ready, &pods[i])
		}
	}
	slices.SortFunc(ready, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	parts := make([]string, len(ready))
	for i, p := range ready {
		var sum int32
		for _, cs := range p.Status.ContainerStatuses {
			sum += cs.RestartCount
		}
		parts[i] = string(p.UID) + ":" + strconv.Itoa(int(sum))
	}
	return strings.Join(parts, ",")
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// parseInstance maps uid -> restart sum of an observedServerInstance.
func parseInstance(s string) map[string]int {
	out := map[string]int{}
	for part := range strings.SplitSeq(s, ",") {
		uid, n, ok := strings.Cut(part, ":")
		if !ok || uid == "" {
			continue
		}
		v, _ := strconv.Atoi(n)
		out[uid] = v
	}
	return out
}

// instanceStep is what a pass does with the server instance it observed.
type instanceStep int

const (
	// instanceRecord publishes the new instance; the engines need nothing
	// (first observation, scale-up, scale-down, a pod turned unready).
	instanceRecord instanceStep = iota
	// instanceHold keeps the old instance: a replacement is under way (a
	// pod is gone and its successor not ready yet, or a surge pod is up
	// before the pod it replaces is gone); the pass that sees it complete
	// compares against the old instance and cascades.
	instanceHold
	// instanceReplaced: a pod was replaced or restarted; cascade.
	instanceReplaced
)

// judgeInstance decides how the server went from instance old to now
// (contract §5.4). existing holds the uids of the backend's server pods
// that are not terminating, ready or not; desired is the replica count the
// workload asks for. A replacement is a continuing pod whose restart sum
// grew, or a pod of old that is gone while a pod new to old is ready. A
// pod only gone is a scale-down when the ready pods still cover desired,
// else its successor is awaited (hold); a pod only added is a scale-up
// unless it takes the ready pods beyond desired (a rollout's surge pod:
// hold until the pod it replaces goes). Scaling to zero and back replaces
// every pod the engines were connected to, so no ready pod at all holds.
func judgeInstance(old, now string, existing map[types.UID]bool, desired int32) instanceStep {
	switch {
	case now == old:
		return instanceRecord
	case now == "":
		return instanceHold
	case old == "":
		return instanceRecord
	}
	was, cur := parseInstance(old), parseInstance(now)
	gone, added := false, false
	for uid, n := range was {
		if m, ok := cur[uid]; ok && m > n {
			return instanceReplaced
		}
		if !existing[types.UID(uid)] {
			gone = true
		}
	}
	for uid := range cur {
		if _, ok := was[uid]; !ok {
			added = true
		}
	}
	switch {
	case gone && added:
		return instanceReplaced
	case gone && len(cur) < int(desired):
		return instanceHold
	case added && !gone && len(cur) > int(desired):
		return instanceHold
	}
	return instanceRecord
}

// cascade maintains status.observedServerInstance of a managed backend and
// runs the restart cascade when the server was replaced (judgeInstance; w
// is the workload's state), at most once per CascadeInterval: every engine
// Deployment whose pods the backend claims (triggerEngines) gets
// RestartTriggerAnnotation. While the window is closed the old instance is
// kept, so the pending change cascades once the window opens. It returns
// how long until a pending cascade is due.
func (r *CacheBackendReconciler) cascade(ctx context.Context, b *v1alpha1.CacheBackend, scope []client.ListOption, backends []v1alpha1.CacheBackend, nsAnnotations func(string) map[string]string, serverPods []corev1.Pod, w workloadState, now time.Time) (time.Duration, error) {
	cur := serverInstance(serverPods)
	old := b.Status.ObservedServerInstance
	existing := make(map[types.UID]bool, len(serverPods))
	for i := range serverPods {
		if serverPods[i].DeletionTimestamp == nil { // a terminating pod is on its way out
			existing[serverPods[i].UID] = true
		}
	}
	switch judgeInstance(old, cur, existing, w.desired) {
	case instanceHold:
		return 0, nil // the pod watch brings the pass that completes it
	case instanceRecord:
		b.Status.ObservedServerInstance = cur
		return 0, nil
	}
	key := b.Namespace + "/" + b.Name
	left, last, _ := r.cascades.wait(key, now, r.cascadeInterval())
	if last == cur { // cascaded already; the status write was lost
		b.Status.ObservedServerInstance = cur
		return 0, nil
	}
	if left > 0 {
		return left, nil
	}
	n, err := r.triggerEngines(ctx, b, scope, backends, nsAnnotations, cur)
	if err != nil {
		return 0, err
	}
	r.cascades.mark(key, now, cur)
	r.metrics.recordCascade(b.Namespace, b.Name, cur)
	logf.FromContext(ctx).Info("cache server replaced; restarted the engine Deployments", "from", old, "to", cur, "deployments", n)
	if r.Recorder != nil {
		r.Recorder.Eventf(b, nil, corev1.EventTypeNormal, "ServerRestartCascade", "Cascade",
			"the cache server was replaced; annotated %d engine Deployment(s) with %s", n, RestartTriggerAnnotation)
	}
	b.Status.ObservedServerInstance = cur
	return 0, nil
}

// triggerEngines patches RestartTriggerAnnotation onto the pod templates of
// the Deployments in scope (b's namespace, or all with allowCrossNamespace)
// whose pods b claims (claim.Owner over backends, those of the same scope:
// the rule the webhook injects by, so a Deployment wired to another backend,
// of a namespace that does not consent to b's, or whose pod template opted
// out of injection, is not rolled for b's server). The
// value is derived from the new instance, so a retried cascade does not
// roll a Deployment a second time.
func (r *CacheBackendReconciler) triggerEngines(ctx context.Context, b *v1alpha1.CacheBackend, scope []client.ListOption, backends []v1alpha1.CacheBackend, nsAnnotations func(string) map[string]string, instance string) (int, error) {
	if b.Spec.EngineSelector == nil || len(b.Spec.EngineSelector.MatchLabels) == 0 {
		return 0, nil
	}
	key, _ := selectorKey(b.Spec.EngineSelector)
	var deps appsv1.DeploymentList
	if err := r.Client.List(ctx, &deps, append(slices.Clone(scope), client.MatchingFields{DeploymentTemplateLabelIndex: key})...); err != nil {
		return 0, fmt.Errorf("cannot list the engine Deployments of %s/%s: %w", b.Namespace, b.Name, err)
	}
	sum := sha256.Sum256([]byte(instance))
	value := hex.EncodeToString(sum[:8])
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{RestartTriggerAnnotation: value}},
	}}})
	if err != nil {
		return 0, fmt.Errorf("cannot encode the restart trigger: %w", err)
	}
	n := 0
	for i := range deps.Items {
		d := &deps.Items[i]
		if d.Spec.Template.Annotations[RestartTriggerAnnotation] == value || !claim.Selects(b.Spec.EngineSelector, d.Spec.Template.Labels) {
			continue
		}
		tpl := claim.Pod{Namespace: d.Namespace, Labels: d.Spec.Template.Labels, Annotations: d.Spec.Template.Annotations}
		if d.Namespace != b.Namespace {
			tpl.NamespaceAnnotations = nsAnnotations(d.Namespace)
		}
		if !claim.Claims(b, backends, tpl) {
			continue
		}
		if err := r.Client.Patch(ctx, d, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return n, fmt.Errorf("cannot annotate engine Deployment %s/%s: %w", d.Namespace, d.Name, err)
		}
		n++
	}
	return n, nil
}
