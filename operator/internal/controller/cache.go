package controller

import (
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// CacheOptions are the manager cache options the controllers are written
// for. The CacheBackend reconciler watches pods, Deployments, StatefulSets,
// Services, HPAs and PodDisruptionBudgets cluster-wide (engine pods and
// Deployments are anywhere; the objects it provisions must be seen to be
// repaired), so what the cache keeps of each object decides how the
// controller's memory grows with the cluster:
//
//   - no object keeps its managedFields (often the larger half of it);
//   - a pod keeps its metadata, its conditions' type and status, and per
//     container its name, readiness, restart count, waiting reason, start
//     and a termination only when it was a GPU-kernel fault (slimTermination):
//     what the reconciler reads (selection, readiness, the restart cascade,
//     CrashLoopBackOff, EngineKernelsHealthy), not its spec;
//   - a Deployment, StatefulSet, Service, HPA or PodDisruptionBudget not
//     controlled by a CacheBackend keeps its metadata (and a Deployment its
//     selector and pod template's labels and annotations, which the restart
//     cascade matches), which is all the reconciler needs to leave it alone.
//
// Code reading these kinds from the cache gets the stripped objects; read
// them live (the manager's APIReader) for anything else.
func CacheOptions() cache.Options {
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:                            {Transform: slimPod},
			&appsv1.Deployment{}:                     {Transform: slimDeployment},
			&appsv1.StatefulSet{}:                    {Transform: slimUnlessControlled},
			&corev1.Service{}:                        {Transform: slimUnlessControlled},
			&autoscalingv2.HorizontalPodAutoscaler{}: {Transform: slimUnlessControlled},
			&policyv1.PodDisruptionBudget{}:          {Transform: slimUnlessControlled},
		},
	}
}

var stripManagedFields = cache.TransformStripManagedFields()

// slimPod keeps of a pod what the reconcilers read (see CacheOptions).
// Anything else (the metadata-only pod informer's PartialObjectMetadata)
// only loses its managedFields.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return stripManagedFields(obj)
	}
	out := &corev1.Pod{TypeMeta: p.TypeMeta, ObjectMeta: p.ObjectMeta}
	out.ManagedFields = nil
	out.Status.Phase = p.Status.Phase
	for _, c := range p.Status.Conditions {
		out.Status.Conditions = append(out.Status.Conditions, corev1.PodCondition{Type: c.Type, Status: c.Status})
	}
	slim := func(in []corev1.ContainerStatus) []corev1.ContainerStatus {
		var cs []corev1.ContainerStatus
		for _, s := range in {
			c := corev1.ContainerStatus{Name: s.Name, Ready: s.Ready, RestartCount: s.RestartCount}
			if w := s.State.Waiting; w != nil {
				c.State.Waiting = &corev1.ContainerStateWaiting{Reason: w.Reason}
			}
			if r := s.State.Running; r != nil {
				c.State.Running = &corev1.ContainerStateRunning{StartedAt: r.StartedAt}
			}
			c.State.Terminated = slimTermination(s.State.Terminated)
			c.LastTerminationState.Terminated = slimTermination(s.LastTerminationState.Terminated)
			cs = append(cs, c)
		}
		return cs
	}
	out.Status.InitContainerStatuses = slim(p.Status.InitContainerStatuses)
	out.Status.ContainerStatuses = slim(p.Status.ContainerStatuses)
	return out, nil
}

// controlledByBackend reports whether a CacheBackend controls obj.
func controlledByBackend(obj metav1.Object) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.Kind == "CacheBackend" && strings.HasPrefix(ref.APIVersion, v1alpha1.GroupVersion.Group+"/")
}

// slimDeployment keeps a Deployment a CacheBackend controls whole, and of
// any other its metadata, selector and pod template metadata.
func slimDeployment(obj any) (any, error) {
	d, ok := obj.(*appsv1.Deployment)
	if !ok || controlledByBackend(d) {
		return stripManagedFields(obj)
	}
	out := &appsv1.Deployment{TypeMeta: d.TypeMeta, ObjectMeta: d.ObjectMeta}
	out.ManagedFields = nil
	out.Spec.Selector = d.Spec.Selector
	out.Spec.Template.ObjectMeta = d.Spec.Template.ObjectMeta
	return out, nil
}

// slimUnlessControlled keeps an object a CacheBackend controls whole and
// only the metadata of any other.
func slimUnlessControlled(obj any) (any, error) {
	o, ok := obj.(client.Object)
	if !ok || controlledByBackend(o) {
		return stripManagedFields(obj)
	}
	var out client.Object
	switch v := o.(type) {
	case *appsv1.StatefulSet:
		out = &appsv1.StatefulSet{TypeMeta: v.TypeMeta, ObjectMeta: v.ObjectMeta}
	case *corev1.Service:
		out = &corev1.Service{TypeMeta: v.TypeMeta, ObjectMeta: v.ObjectMeta}
	case *autoscalingv2.HorizontalPodAutoscaler:
		out = &autoscalingv2.HorizontalPodAutoscaler{TypeMeta: v.TypeMeta, ObjectMeta: v.ObjectMeta}
	case *policyv1.PodDisruptionBudget:
		out = &policyv1.PodDisruptionBudget{TypeMeta: v.TypeMeta, ObjectMeta: v.ObjectMeta}
	default:
		return stripManagedFields(obj)
	}
	out.SetManagedFields(nil)
	return out, nil
}

// Field indexes of the manager's cache.
const (
	// PodLabelIndex indexes pods by each of their labels, as "key=value".
	PodLabelIndex = "inferencecache.io/pod-label"
	// PodInjectedByIndex indexes pods by their injected-by annotation.
	PodInjectedByIndex = "inferencecache.io/injected-by"
	// DeploymentTemplateLabelIndex indexes Deployments by each label of
	// their pod template, as "key=value".
	DeploymentTemplateLabelIndex = "inferencecache.io/template-label"
)

// IndexedField is one field index: obj's kind, the field's name and what
// it extracts.
type IndexedField struct {
	Object  client.Object
	Field   string
	Extract client.IndexerFunc
}

// IndexedFields are the field indexes the CacheBackend reconciler lists
// through, so a pass copies the pods and Deployments its backend selects,
// serves or injected, not every one of the namespace or the cluster.
func IndexedFields() []IndexedField {
	return []IndexedField{
		{&corev1.Pod{}, PodLabelIndex, func(o client.Object) []string { return labelPairs(o.GetLabels()) }},
		{&corev1.Pod{}, PodInjectedByIndex, func(o client.Object) []string {
			if v := strings.TrimSpace(o.GetAnnotations()[InjectedByAnnotation]); v != "" {
				return []string{v}
			}
			return nil
		}},
		{&appsv1.Deployment{}, DeploymentTemplateLabelIndex, func(o client.Object) []string {
			d, ok := o.(*appsv1.Deployment)
			if !ok {
				return nil
			}
			return labelPairs(d.Spec.Template.Labels)
		}},
	}
}

// labelPairs is labels as "key=value" strings.
func labelPairs(labels map[string]string) []string {
	out := make([]string, 0, len(labels))
	for k, v := range labels {
		out = append(out, k+"="+v)
	}
	return out
}

// selectorKey is the index value of sel's pods: its smallest "key=value"
// (every pod sel selects carries it); ok is false for a selector that
// selects nothing.
func selectorKey(sel *v1alpha1.EngineSelector) (string, bool) {
	if sel == nil || len(sel.MatchLabels) == 0 {
		return "", false
	}
	return slices.Min(labelPairs(sel.MatchLabels)), true
}
