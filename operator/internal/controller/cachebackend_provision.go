package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/validation"
)

// Provisioning constants of a managed backend.
const (
	// DefaultCacheServerImage runs the LMCache server (python3 -m
	// lmcache.v1.server), pinned to a release so a node pulling it later
	// runs what was tested; spec.backendConfig "image" overrides it per
	// backend, CacheBackendOptions.Image (--cache-server-image) per
	// controller.
	DefaultCacheServerImage = "lmcache/vllm-openai:v0.3.15"
	// cacheServerUser is the user and group the cache server runs as: not
	// root (the restricted pod security profile), the images' nonroot id.
	cacheServerUser = 65532
	// cacheServerTmp is the writable scratch directory of the server (its
	// root filesystem is read-only); HOME points there.
	cacheServerTmp = "/tmp"
	// CacheServerPort is the port of the LMCache server (lm://host:8200).
	CacheServerPort = 8200
	// cacheServerContainer names the server container in the pod template.
	cacheServerContainer = "cache-server"
	// BackendLabel on a managed pod names its CacheBackend; with
	// ComponentLabel it selects the backend's server pods.
	BackendLabel   = "inferencecache.io/cache-backend"
	ComponentLabel = "app.kubernetes.io/component"
	componentValue = "cache-server"
	// backendConfigImage is the spec.backendConfig key of the image.
	backendConfigImage = validation.BackendConfigImage
)

// serverLabels are the labels (and selector) of a backend's server pods.
func serverLabels(b *v1alpha1.CacheBackend) map[string]string {
	return map[string]string{
		BackendLabel:                   b.Name,
		ComponentLabel:                 componentValue,
		"app.kubernetes.io/name":       "inferencecache-cache-server",
		"app.kubernetes.io/managed-by": "inferencecache-controller",
	}
}

// serverSelector is the immutable workload selector (a subset of
// serverLabels).
func serverSelector(b *v1alpha1.CacheBackend) map[string]string {
	return map[string]string{BackendLabel: b.Name, ComponentLabel: componentValue}
}

// ManagedEndpoint is the address of a managed backend's cache server, its
// Service <name>.<namespace>.svc:8200: status.endpoint once reconciled, and
// what the pod webhook wires before that.
func ManagedEndpoint(b *v1alpha1.CacheBackend) string {
	return fmt.Sprintf("%s.%s.svc:%d", b.Name, b.Namespace, CacheServerPort)
}

// defaultResources are the server container's resources when spec.resources
// is unset (the CRD defaults it too).
func defaultResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")},
	}
}

// desiredReplicas is the replica count written to the workload; nil while
// an HPA owns it (an existing count is then kept).
func desiredReplicas(b *v1alpha1.CacheBackend) *int32 {
	if b.Spec.Autoscaling != nil {
		return nil
	}
	if b.Spec.Replicas != nil {
		return ptr(*b.Spec.Replicas)
	}
	return ptr(int32(1))
}

// mutatePodTemplate sets the fields of tpl the controller owns and leaves the
// rest (apiserver defaults, other writers' annotations, pod fields
// spec.template never set) alone, so an unchanged backend produces no
// update. workload is the Deployment's or StatefulSet's metadata, where
// applyTemplate records what spec.template set.
func mutatePodTemplate(b *v1alpha1.CacheBackend, image string, tpl *corev1.PodTemplateSpec, workload *metav1.ObjectMeta) {
	if tpl.Labels == nil {
		tpl.Labels = map[string]string{}
	}
	for k, v := range serverLabels(b) {
		tpl.Labels[k] = v
	}
	if img := b.Spec.BackendConfig[backendConfigImage]; img != "" {
		image = img
	}
	res := defaultResources()
	if b.Spec.Resources != nil {
		res = *b.Spec.Resources.DeepCopy()
	}
	i := -1
	for j := range tpl.Spec.Containers {
		if tpl.Spec.Containers[j].Name == cacheServerContainer {
			i = j
		}
	}
	if i < 0 {
		tpl.Spec.Containers = []corev1.Container{{Name: cacheServerContainer}}
		i = 0
	} else if len(tpl.Spec.Containers) > 1 {
		tpl.Spec.Containers = []corev1.Container{tpl.Spec.Containers[i]}
		i = 0
	}
	c := &tpl.Spec.Containers[i]
	c.Image = image
	c.Command = []string{"python3", "-m", "lmcache.v1.server"}
	c.Args = []string{"0.0.0.0", fmt.Sprint(CacheServerPort)}
	c.Ports = []corev1.ContainerPort{{Name: "lm", ContainerPort: CacheServerPort, Protocol: corev1.ProtocolTCP}}
	c.Resources = res
	c.ReadinessProbe = &corev1.Probe{
		ProbeHandler:     corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("lm")}},
		PeriodSeconds:    5,
		TimeoutSeconds:   1,
		SuccessThreshold: 1,
		FailureThreshold: 3,
	}
	// A server that stops accepting connections for a minute is restarted
	// (the restart cascade then reconnects the engines). Every field the
	// apiserver would default is set, so an unchanged backend writes
	// nothing.
	c.LivenessProbe = &corev1.Probe{
		ProbeHandler:        corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("lm")}},
		InitialDelaySeconds: 30,
		PeriodSeconds:       10,
		TimeoutSeconds:      2,
		SuccessThreshold:    1,
		FailureThreshold:    6,
	}
	// The restricted pod security profile: not root, no privilege
	// escalation, no capabilities, RuntimeDefault seccomp, and a read-only
	// root filesystem with an emptyDir for scratch.
	no, yes := false, true
	uid := int64(cacheServerUser)
	tpl.Spec.SecurityContext = &corev1.PodSecurityContext{
		RunAsNonRoot:   &yes,
		RunAsUser:      &uid,
		RunAsGroup:     &uid,
		FSGroup:        &uid,
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	c.SecurityContext = &corev1.SecurityContext{
		AllowPrivilegeEscalation: &no,
		ReadOnlyRootFilesystem:   &yes,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	c.Env = []corev1.EnvVar{{Name: "HOME", Value: cacheServerTmp}}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "tmp", MountPath: cacheServerTmp}}
	tpl.Spec.Volumes = []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	applyTemplate(b.Spec.Template, &tpl.Spec, workload)
}

// TemplateFieldsAnnotation on a managed workload lists (comma-separated,
// sorted) the pod fields spec.template set on it at the last pass, so a
// field removed from spec.template is removed from the workload, and a
// field spec.template never set (another writer's) is left alone.
const TemplateFieldsAnnotation = "inferencecache.io/template-fields"

// templateField is a pod field spec.template may set: whether override o
// sets it, how to copy it into a pod spec, and how to clear it there.
type templateField struct {
	name  string
	sets  func(o *v1alpha1.BackendPodOverride) bool
	copy  func(o *v1alpha1.BackendPodOverride, ps *corev1.PodSpec)
	clear func(ps *corev1.PodSpec)
}

var templateFields = []templateField{
	{"imagePullSecrets",
		func(o *v1alpha1.BackendPodOverride) bool { return len(o.ImagePullSecrets) > 0 },
		func(o *v1alpha1.BackendPodOverride, ps *corev1.PodSpec) { ps.ImagePullSecrets = o.ImagePullSecrets },
		func(ps *corev1.PodSpec) { ps.ImagePullSecrets = nil }},
	{"nodeSelector",
		func(o *v1alpha1.BackendPodOverride) bool { return len(o.NodeSelector) > 0 },
		func(o *v1alpha1.BackendPodOverride, ps *corev1.PodSpec) { ps.NodeSelector = o.NodeSelector },
		func(ps *corev1.PodSpec) { ps.NodeSelector = nil }},
	{"priorityClassName",
		func(o *v1alpha1.BackendPodOverride) bool { return o.PriorityClassName != "" },
		func(o *v1alpha1.BackendPodOverride, ps *corev1.PodSpec) { ps.PriorityClassName = o.PriorityClassName },
		func(ps *corev1.PodSpec) { ps.PriorityClassName = "" }},
	{"runtimeClassName",
		func(o *v1alpha1.BackendPodOverride) bool { return o.RuntimeClassName != nil },
		func(o *v1alpha1.BackendPodOverride, ps *corev1.PodSpec) { ps.RuntimeClassName = o.RuntimeClassName },
		func(ps *corev1.PodSpec) { ps.RuntimeClassName = nil }},
	{"serviceAccountName",
		func(o *v1alpha1.BackendPodOverride) bool { return o.ServiceAccountName != "" },
		func(o *v1alpha1.BackendPodOverride, ps *corev1.PodSpec) { ps.ServiceAccountName = o.ServiceAccountName },
		func(ps *corev1.PodSpec) { ps.ServiceAccountName = "" }},
	{"terminationGracePeriodSeconds",
		func(o *v1alpha1.BackendPodOverride) bool { return o.TerminationGracePeriodSeconds != nil },
		func(o *v1alpha1.BackendPodOverride, ps *corev1.PodSpec) {
			ps.TerminationGracePeriodSeconds = o.TerminationGracePeriodSeconds
		},
		func(ps *corev1.PodSpec) { ps.TerminationGracePeriodSeconds = nil }},
	{"tolerations",
		func(o *v1alpha1.BackendPodOverride) bool { return len(o.Tolerations) > 0 },
		func(o *v1alpha1.BackendPodOverride, ps *corev1.PodSpec) { ps.Tolerations = o.Tolerations },
		func(ps *corev1.PodSpec) { ps.Tolerations = nil }},
}

// applyTemplate copies the fields override o sets into ps and clears those
// the workload's TemplateFieldsAnnotation says it set before and o no
// longer sets; fields o never set are not touched. It records the fields o
// sets in the annotation of workload.
func applyTemplate(o *v1alpha1.BackendPodOverride, ps *corev1.PodSpec, workload *metav1.ObjectMeta) {
	before := strings.Split(workload.Annotations[TemplateFieldsAnnotation], ",")
	var now []string
	for _, f := range templateFields {
		switch {
		case o != nil && f.sets(o):
			f.copy(o, ps)
			now = append(now, f.name)
		case slices.Contains(before, f.name):
			f.clear(ps)
		}
	}
	if len(now) == 0 {
		delete(workload.Annotations, TemplateFieldsAnnotation)
		return
	}
	if workload.Annotations == nil {
		workload.Annotations = map[string]string{}
	}
	workload.Annotations[TemplateFieldsAnnotation] = strings.Join(now, ",")
}

// errNotControlled is provision's error for an object of the backend's name
// that the backend does not control; it is left as it is.
var errNotControlled = errors.New("not controlled by the CacheBackend")

// errNotAllowed is provision's error for a backend that asks for an image or
// a ServiceAccount the controller's policy does not allow.
var errNotAllowed = errors.New("not allowed by the controller's policy")

// provision creates or updates the workload, Service and HPA of a managed
// backend, each controlled by b, deletes the objects b no longer asks for
// (the other workload kind, an HPA without autoscaling), and returns the
// workload's state.
func (r *CacheBackendReconciler) provision(ctx context.Context, b *v1alpha1.CacheBackend) (workloadState, error) {
	var w workloadState
	key := types.NamespacedName{Namespace: b.Namespace, Name: b.Name}
	if errs := r.Options.Policy.CacheBackend(b.Namespace, &b.Spec, field.NewPath("spec")); len(errs) > 0 {
		return w, fmt.Errorf("%w: %s", errNotAllowed, errs.ToAggregate().Error())
	}
	owned := func(obj client.Object) error {
		// An existing object b does not control is someone else's (an
		// engine Deployment or Service named like the backend): adopting it
		// would rewrite it and have it garbage-collected with b.
		if obj.GetResourceVersion() != "" && !metav1.IsControlledBy(obj, b) {
			return fmt.Errorf("%w: %T %s/%s exists; rename the CacheBackend or that object", errNotControlled, obj, obj.GetNamespace(), obj.GetName())
		}
		return controllerutil.SetControllerReference(b, obj, r.Client.Scheme())
	}

	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: b.Namespace, Name: b.Name}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, svc, func() error {
		if svc.Labels == nil {
			svc.Labels = map[string]string{}
		}
		svc.Labels[BackendLabel] = b.Name
		svc.Spec.Selector = serverSelector(b)
		svc.Spec.Ports = []corev1.ServicePort{{Name: "lm", Port: CacheServerPort, TargetPort: intstr.FromString("lm"), Protocol: corev1.ProtocolTCP}}
		return owned(svc)
	}); err != nil {
		return w, fmt.Errorf("cannot apply Service %s: %w", key, err)
	}

	kind := b.Spec.DeploymentKind
	if kind == "" {
		kind = v1alpha1.DeploymentKindDeployment
	}
	replicas := desiredReplicas(b)
	switch kind {
	case v1alpha1.DeploymentKindStatefulSet:
		if err := r.deleteOwned(ctx, b, &appsv1.Deployment{}); err != nil {
			return w, err
		}
		sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: b.Namespace, Name: b.Name}}
		if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, sts, func() error {
			if sts.CreationTimestamp.IsZero() {
				sts.Spec.Selector = &metav1.LabelSelector{MatchLabels: serverSelector(b)}
				sts.Spec.ServiceName = b.Name
			}
			if replicas != nil || sts.Spec.Replicas == nil {
				sts.Spec.Replicas = replicas
			}
			mutatePodTemplate(b, r.image(), &sts.Spec.Template, &sts.ObjectMeta)
			return owned(sts)
		}); err != nil {
			return w, fmt.Errorf("cannot apply StatefulSet %s: %w", key, err)
		}
		w = workloadState{
			exists:    true,
			desired:   deref(sts.Spec.Replicas, 1),
			current:   sts.Status.ObservedGeneration >= sts.Generation,
			updated:   sts.Status.UpdatedReplicas,
			available: sts.Status.AvailableReplicas,
		}
	default:
		if err := r.deleteOwned(ctx, b, &appsv1.StatefulSet{}); err != nil {
			return w, err
		}
		dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: b.Namespace, Name: b.Name}}
		if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, dep, func() error {
			if dep.CreationTimestamp.IsZero() {
				dep.Spec.Selector = &metav1.LabelSelector{MatchLabels: serverSelector(b)}
			}
			if replicas != nil || dep.Spec.Replicas == nil {
				dep.Spec.Replicas = replicas
			}
			mutatePodTemplate(b, r.image(), &dep.Spec.Template, &dep.ObjectMeta)
			return owned(dep)
		}); err != nil {
			return w, fmt.Errorf("cannot apply Deployment %s: %w", key, err)
		}
		w = workloadState{
			exists:    true,
			desired:   deref(dep.Spec.Replicas, 1),
			current:   dep.Status.ObservedGeneration >= dep.Generation,
			updated:   dep.Status.UpdatedReplicas,
			available: dep.Status.AvailableReplicas,
			failed:    rolloutFailure(dep),
		}
	}

	// Voluntary disruptions (a node drain) take one server at a time.
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: b.Namespace, Name: b.Name}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, pdb, func() error {
		one := intstr.FromInt32(1)
		pdb.Spec.MaxUnavailable = &one
		pdb.Spec.MinAvailable = nil
		pdb.Spec.Selector = &metav1.LabelSelector{MatchLabels: serverSelector(b)}
		return owned(pdb)
	}); err != nil {
		return w, fmt.Errorf("cannot apply PodDisruptionBudget %s: %w", key, err)
	}

	if b.Spec.Autoscaling == nil {
		return w, r.deleteOwned(ctx, b, &autoscalingv2.HorizontalPodAutoscaler{})
	}
	as := b.Spec.Autoscaling
	hpa := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: b.Namespace, Name: b.Name}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, hpa, func() error {
		hpa.Spec.ScaleTargetRef = autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: string(kind), Name: b.Name}
		hpa.Spec.MinReplicas = ptr(deref(as.MinReplicas, 1))
		hpa.Spec.MaxReplicas = as.MaxReplicas
		hpa.Spec.Metrics = []autoscalingv2.MetricSpec{{
			Type: autoscalingv2.ResourceMetricSourceType,
			Resource: &autoscalingv2.ResourceMetricSource{
				Name: corev1.ResourceCPU,
				Target: autoscalingv2.MetricTarget{
					Type:               autoscalingv2.UtilizationMetricType,
					AverageUtilization: ptr(deref(as.TargetCPUUtilizationPercent, 80)),
				},
			},
		}}
		return owned(hpa)
	}); err != nil {
		return w, fmt.Errorf("cannot apply HorizontalPodAutoscaler %s: %w", key, err)
	}
	return w, nil
}

// unprovision deletes every object b controls, for a backend that is not
// (or no longer) a managed LMCache one.
func (r *CacheBackendReconciler) unprovision(ctx context.Context, b *v1alpha1.CacheBackend) error {
	for _, obj := range []client.Object{&appsv1.Deployment{}, &appsv1.StatefulSet{}, &corev1.Service{}, &autoscalingv2.HorizontalPodAutoscaler{}, &policyv1.PodDisruptionBudget{}} {
		if err := r.deleteOwned(ctx, b, obj); err != nil {
			return err
		}
	}
	return nil
}

// deleteOwned deletes the object of obj's kind named like b when b controls
// it; objects of the same name that b does not control are left alone.
func (r *CacheBackendReconciler) deleteOwned(ctx context.Context, b *v1alpha1.CacheBackend, obj client.Object) error {
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: b.Name}, obj)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot read %T %s/%s: %w", obj, b.Namespace, b.Name, err)
	}
	if ref := metav1.GetControllerOf(obj); ref == nil || ref.UID != b.UID {
		return nil
	}
	if err := r.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cannot delete %T %s/%s: %w", obj, b.Namespace, b.Name, err)
	}
	return nil
}

// rolloutFailure describes a rollout the Deployment controller reports as
// failed: Progressing False with ProgressDeadlineExceeded (the new pods did
// not become available within progressDeadlineSeconds, e.g. an image that
// does not pull), or ReplicaFailure True (pods cannot be created, e.g. a
// quota). Empty when neither.
func rolloutFailure(d *appsv1.Deployment) string {
	for _, c := range d.Status.Conditions {
		switch {
		case c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse && c.Reason == "ProgressDeadlineExceeded",
			c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue:
			return fmt.Sprintf("Deployment %s: %s: %s", c.Type, c.Reason, c.Message)
		}
	}
	return ""
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
