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

// replaced reports whether the server went from instance old to now in a
// way the engines must recover from: a pod of old no longer exists or is
// terminating (existing lists the uids of the backend's other pods, ready or
// not), or one of them restarted. Pods only added (a scale-up) are not a replacement.
func replaced(old, now string, existing map[types.UID]bool) bool {
	if old == "" || now == "" || old == now {
		return false
	}
	cur := parseInstance(now)
	for uid, n := range parseInstance(old) {
		if !existing[types.UID(uid)] {
			return true
		}
		if m, ok := cur[uid]; ok && m > n {
			return true
		}
	}
	return false
}

// cascade maintains status.observedServerInstance of a managed backend and
// runs the restart cascade when the server was replaced, at most once per
// CascadeInterval: every engine Deployment whose pods the backend claims
// (triggerEngines) gets RestartTriggerAnnotation. While the window is
// closed the old instance is kept, so the pending change cascades once the
// window opens. It returns how long until a pending cascade is due.
func (r *CacheBackendReconciler) cascade(ctx context.Context, b *v1alpha1.CacheBackend, scope []client.ListOption, backends []v1alpha1.CacheBackend, serverPods []corev1.Pod, now time.Time) (time.Duration, error) {
	cur := serverInstance(serverPods)
	old := b.Status.ObservedServerInstance
	if cur == "" || cur == old {
		return 0, nil // no ready server: keep the last instance to compare against
	}
	existing := make(map[types.UID]bool, len(serverPods))
	for i := range serverPods {
		if serverPods[i].DeletionTimestamp == nil { // a terminating pod is on its way out
			existing[serverPods[i].UID] = true
		}
	}
	if !replaced(old, cur, existing) {
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
	n, err := r.triggerEngines(ctx, b, scope, backends, cur)
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
// the rule the webhook injects by, so a Deployment wired to another backend
// is not rolled for b's server). The
// value is derived from the new instance, so a retried cascade does not
// roll a Deployment a second time.
func (r *CacheBackendReconciler) triggerEngines(ctx context.Context, b *v1alpha1.CacheBackend, scope []client.ListOption, backends []v1alpha1.CacheBackend, instance string) (int, error) {
	if b.Spec.EngineSelector == nil || len(b.Spec.EngineSelector.MatchLabels) == 0 {
		return 0, nil
	}
	var deps appsv1.DeploymentList
	if err := r.Client.List(ctx, &deps, scope...); err != nil {
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
		if !claim.Claims(b, backends, d.Namespace, d.Spec.Template.Labels) || d.Spec.Template.Annotations[RestartTriggerAnnotation] == value {
			continue
		}
		if err := r.Client.Patch(ctx, d, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return n, fmt.Errorf("cannot annotate engine Deployment %s/%s: %w", d.Namespace, d.Name, err)
		}
		n++
	}
	return n, nil
}
