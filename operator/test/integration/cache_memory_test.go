package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/internal/controller"
)

// TestCacheStripsWhatTheControllerDoesNotRead: the manager cache the
// controllers run on (controller.CacheOptions) keeps no managedFields, keeps
// of a pod only what the reconcilers read (metadata, readiness, restart
// counts, waiting reasons), and of a Service not controlled by a
// CacheBackend only its metadata, so the controller's memory follows the
// objects it works on, not the size of the cluster's pods and Services.
func TestCacheStripsWhatTheControllerDoesNotRead(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "cache-strip", false)
	const pods = 40
	env := make([]corev1.EnvVar, 30)
	for i := range env {
		env[i] = corev1.EnvVar{Name: fmt.Sprintf("VAR_%d", i), Value: "some configuration value of an unrelated workload"}
	}
	for i := range pods {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("web-%d", i), Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27", Env: env, Args: []string{"--a", "--b"}}}}}
		wantOK(t, "pod", k8s.Create(ctx, p))
		if i == 0 {
			p.Status = corev1.PodStatus{Phase: corev1.PodRunning,
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: "web", Image: "nginx:1.27", ImageID: "sha256:0123", RestartCount: 3,
					State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s restarting failed container"}}}}}
			wantOK(t, "pod status", k8s.Status().Update(ctx, p))
		}
	}
	wantOK(t, "service", k8s.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}))

	opts := controller.CacheOptions()
	opts.Scheme = scheme
	opts.DefaultNamespaces = map[string]cache.Config{ns: {}}
	c, err := cache.New(cfg, opts)
	wantOK(t, "cache", err)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = c.Start(cctx) }()
	var cached corev1.PodList
	eventually(t, 30*time.Second, func() error {
		if err := c.List(ctx, &cached, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(cached.Items) != pods {
			return fmt.Errorf("%d pods cached, want %d", len(cached.Items), pods)
		}
		return nil
	})
	var live corev1.PodList
	wantOK(t, "live list", k8s.List(ctx, &live, client.InNamespace(ns)))
	size := func(items []corev1.Pod) int {
		n := 0
		for i := range items {
			b, _ := json.Marshal(&items[i])
			n += len(b)
		}
		return n / len(items)
	}
	t.Logf("JSON bytes per pod: %d as the apiserver returns it, %d as the controller's cache keeps it", size(live.Items), size(cached.Items))
	for _, p := range cached.Items {
		if len(p.ManagedFields) != 0 || len(p.Spec.Containers) != 0 || p.Labels["app"] != "web" || p.UID == "" {
			t.Fatalf("cached pod %s: managedFields %d, containers %d, labels %v", p.Name, len(p.ManagedFields), len(p.Spec.Containers), p.Labels)
		}
		if p.Name != "web-0" {
			continue
		}
		cs := p.Status.ContainerStatuses
		if len(p.Status.Conditions) != 1 || len(cs) != 1 || cs[0].RestartCount != 3 || cs[0].State.Waiting == nil || cs[0].State.Waiting.Reason != "CrashLoopBackOff" ||
			cs[0].Name != "web" || cs[0].Image != "" || cs[0].State.Waiting.Message != "" {
			t.Fatalf("cached status %+v", p.Status)
		}
	}
	var svcs corev1.ServiceList
	eventually(t, 30*time.Second, func() error {
		if err := c.List(ctx, &svcs, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(svcs.Items) != 1 {
			return errNotYet
		}
		return nil
	})
	if s := svcs.Items[0]; len(s.ManagedFields) != 0 || len(s.Spec.Ports) != 0 || s.Labels["app"] != "web" {
		t.Fatalf("a Service no CacheBackend controls is cached whole: %+v", s)
	}
}
