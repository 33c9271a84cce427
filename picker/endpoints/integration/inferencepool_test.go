package integration

import (
	"context"
	"errors"
	"maps"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/inferencecache/inferencecache/picker/endpoints"
)

// waitTimeout bounds every wait for the source to catch up with the
// apiserver (generous: CI machines are loaded).
const waitTimeout = 60 * time.Second

// recorder is an Observer that remembers what it was told.
type recorder struct {
	mu       sync.Mutex
	changes  int
	failures map[string]int
}

func (r *recorder) PoolChanged(int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes++
}

func (r *recorder) ReloadFailed(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failures == nil {
		r.failures = map[string]int{}
	}
	r.failures[reason]++
}

func (r *recorder) failed(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures[reason]
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// namespace creates a namespace of its own for the test.
func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ep-"}}
	if err := k8s.Create(ctxFor(t), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// start runs an InferencePool source for ns/name as the user of c until
// the test ends, and waits until it is synced.
func start(t *testing.T, c *rest.Config, ns, name string) (*endpoints.InferencePool, *recorder) {
	t.Helper()
	rec := &recorder{}
	src, err := endpoints.NewInferencePool(endpoints.InferencePoolConfig{REST: c, Pool: types.NamespacedName{Namespace: ns, Name: name}},
		endpoints.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitTimeout):
			t.Errorf("Run did not return within %s of its context ending", waitTimeout)
		}
	})
	select {
	case <-src.Synced():
	case err := <-done:
		t.Fatalf("Run returned before the source synced: %v", err)
	case <-time.After(waitTimeout):
		t.Fatalf("not synced after %s", waitTimeout)
	}
	if src.Pool() == nil {
		t.Fatal("synced with no pool")
	}
	return src, rec
}

// createPool creates an InferencePool selecting app=app on ports.
func createPool(t *testing.T, ns, name, app string, ann map[string]string, ports ...int32) {
	t.Helper()
	ip := &giev1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Spec: giev1.InferencePoolSpec{
			Selector:    giev1.LabelSelector{MatchLabels: map[giev1.LabelKey]giev1.LabelValue{"app": giev1.LabelValue(app)}},
			TargetPorts: targetPorts(ports...),
			EndpointPickerRef: &giev1.EndpointPickerRef{
				Name: "inferencecache-epp", Port: &giev1.Port{Number: 9002},
			},
		},
	}
	if err := k8s.Create(ctxFor(t), ip); err != nil {
		t.Fatal(err)
	}
}

func targetPorts(ports ...int32) []giev1.Port {
	var ps []giev1.Port
	for _, p := range ports {
		ps = append(ps, giev1.Port{Number: giev1.PortNumber(p)})
	}
	return ps
}

// updatePool applies mutate to the pool and writes it back.
func updatePool(t *testing.T, ns, name string, mutate func(*giev1.InferencePool)) {
	t.Helper()
	ctx := ctxFor(t)
	var ip giev1.InferencePool
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &ip); err != nil {
		t.Fatal(err)
	}
	mutate(&ip)
	if err := k8s.Update(ctx, &ip); err != nil {
		t.Fatal(err)
	}
}

// createPod creates a pod labelled app=app and sets its IP and readiness
// through the status subresource (as the kubelet would). A pod on a node
// is deleted gracefully: it stays, terminating, as no kubelet confirms it.
func createPod(t *testing.T, ns, name, app, ip string, ready bool, node string) {
	t.Helper()
	ctx := ctxFor(t)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "engine", Image: "example.invalid/vllm:test"}},
		},
	}
	if err := k8s.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	if node != "" {
		p.Status.HostIP, p.Status.HostIPs = "192.0.2.1", []corev1.HostIP{{IP: "192.0.2.1"}}
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: condition(ready), LastTransitionTime: metav1.Now()}}
	if err := k8s.Status().Update(ctx, p); err != nil {
		t.Fatalf("cannot set the status of pod %s: %v", name, err)
	}
}

func condition(ready bool) corev1.ConditionStatus {
	if ready {
		return corev1.ConditionTrue
	}
	return corev1.ConditionFalse
}

func setReady(t *testing.T, ns, name string, ready bool) {
	t.Helper()
	ctx := ctxFor(t)
	var p corev1.Pod
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: condition(ready), LastTransitionTime: metav1.Now()}}
	if err := k8s.Status().Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
}

func relabel(t *testing.T, ns, name, app string) {
	t.Helper()
	ctx := ctxFor(t)
	var p corev1.Pod
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	p.Labels["app"] = app
	if err := k8s.Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
}

func deletePod(t *testing.T, ns, name string, opts ...client.DeleteOption) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := k8s.Delete(ctxFor(t), p, opts...); err != nil {
		t.Fatal(err)
	}
}

// eps is a pool's endpoints as replica id -> address.
type eps map[string]string

func (e eps) String() string {
	var s []string
	for id, addr := range e {
		s = append(s, id+"="+addr)
	}
	sort.Strings(s)
	return "{" + strings.Join(s, " ") + "}"
}

func endpointsOf(p *endpoints.Pool) eps {
	e := eps{}
	for _, ep := range p.Endpoints {
		e[ep.ReplicaID] = ep.Address
	}
	return e
}

// waitEndpoints waits until the source's pool has exactly want.
func waitEndpoints(t *testing.T, src endpoints.Source, step string, want eps) *endpoints.Pool {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		p := src.Pool()
		if got := endpointsOf(p); maps.Equal(got, want) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: after %s the endpoints are %v, want %v", step, waitTimeout, endpointsOf(p), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestInferencePoolFollowsReadyPods(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	ns, other := namespace(t), namespace(t)
	createPool(t, ns, "llm", "llm", nil, 8000)
	src, _ := start(t, cfg, ns, "llm")
	p := waitEndpoints(t, src, "no pods yet", eps{})
	if p.Tenant != ns || p.HashScheme != endpoints.DefaultHashScheme {
		t.Fatalf("tenant %q, hash scheme %q; want %q, %q", p.Tenant, p.HashScheme, ns, endpoints.DefaultHashScheme)
	}

	// Pods the pool must never list, created first: once the pool's own
	// pods show, these have had their chance to show too.
	createPod(t, other, "intruder", "llm", "10.0.9.1", true, "")
	createPod(t, ns, "other-app", "other", "10.0.9.2", true, "")
	createPod(t, ns, "a", "llm", "10.0.0.1", true, "")
	createPod(t, ns, "b", "llm", "10.0.0.2", true, "")
	createPod(t, ns, "starting", "llm", "10.0.0.3", false, "")
	waitEndpoints(t, src, "Ready pods of the selector, in the namespace", eps{"a": "10.0.0.1:8000", "b": "10.0.0.2:8000"})

	setReady(t, ns, "a", false)
	waitEndpoints(t, src, "a unready", eps{"b": "10.0.0.2:8000"})
	setReady(t, ns, "a", true)
	setReady(t, ns, "starting", true)
	waitEndpoints(t, src, "a and starting ready", eps{"a": "10.0.0.1:8000", "b": "10.0.0.2:8000", "starting": "10.0.0.3:8000"})

	relabel(t, ns, "b", "other")
	waitEndpoints(t, src, "b relabelled", eps{"a": "10.0.0.1:8000", "starting": "10.0.0.3:8000"})

	deletePod(t, ns, "starting")
	waitEndpoints(t, src, "starting deleted", eps{"a": "10.0.0.1:8000"})

	// A pod on a node is deleted gracefully: terminating, still Ready in
	// its status, it must leave at once.
	createPod(t, ns, "on-node", "llm", "10.0.0.4", true, "node-1")
	waitEndpoints(t, src, "on-node ready", eps{"a": "10.0.0.1:8000", "on-node": "10.0.0.4:8000"})
	deletePod(t, ns, "on-node")
	var terminating corev1.Pod
	if err := k8s.Get(ctxFor(t), types.NamespacedName{Namespace: ns, Name: "on-node"}, &terminating); err != nil || terminating.DeletionTimestamp == nil {
		t.Fatalf("on-node is not terminating: %v %v", err, terminating.DeletionTimestamp)
	}
	waitEndpoints(t, src, "on-node terminating", eps{"a": "10.0.0.1:8000"})
	deletePod(t, ns, "on-node", client.GracePeriodSeconds(0))
}

func TestInferencePoolTargetPortsAndReplicaIDs(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	ns := namespace(t)
	createPool(t, ns, "dp", "dp", nil, 8000)
	createPod(t, ns, "engine-0", "dp", "10.1.0.1", true, "")
	createPod(t, ns, "engine-1", "dp", "fd00::2", true, "")
	src, _ := start(t, cfg, ns, "dp")
	waitEndpoints(t, src, "one port", eps{"engine-0": "10.1.0.1:8000", "engine-1": "[fd00::2]:8000"})

	updatePool(t, ns, "dp", func(ip *giev1.InferencePool) { ip.Spec.TargetPorts = targetPorts(8000, 8001, 8002) })
	waitEndpoints(t, src, "three data-parallel ranks", eps{
		"engine-0-dp0": "10.1.0.1:8000", "engine-0-dp1": "10.1.0.1:8001", "engine-0-dp2": "10.1.0.1:8002",
		"engine-1-dp0": "[fd00::2]:8000", "engine-1-dp1": "[fd00::2]:8001", "engine-1-dp2": "[fd00::2]:8002",
	})

	updatePool(t, ns, "dp", func(ip *giev1.InferencePool) { ip.Spec.TargetPorts = targetPorts(9000) })
	waitEndpoints(t, src, "back to one port, another number", eps{"engine-0": "10.1.0.1:9000", "engine-1": "[fd00::2]:9000"})
}

func TestInferencePoolSelectorChange(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	ns := namespace(t)
	createPool(t, ns, "llm", "blue", nil, 8000)
	createPod(t, ns, "blue-0", "blue", "10.2.0.1", true, "")
	createPod(t, ns, "green-0", "green", "10.2.0.2", true, "")
	src, _ := start(t, cfg, ns, "llm")
	waitEndpoints(t, src, "blue", eps{"blue-0": "10.2.0.1:8000"})

	updatePool(t, ns, "llm", func(ip *giev1.InferencePool) {
		ip.Spec.Selector.MatchLabels = map[giev1.LabelKey]giev1.LabelValue{"app": "green"}
	})
	waitEndpoints(t, src, "green", eps{"green-0": "10.2.0.2:8000"})
	// The new pod cache follows changes too.
	createPod(t, ns, "green-1", "green", "10.2.0.3", true, "")
	createPod(t, ns, "blue-1", "blue", "10.2.0.4", true, "")
	waitEndpoints(t, src, "green-1 added", eps{"green-0": "10.2.0.2:8000", "green-1": "10.2.0.3:8000"})
}

func TestInferencePoolAnnotations(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	ns := namespace(t)
	createPool(t, ns, "lora", "lora", map[string]string{
		endpoints.HashSchemeAnnotation: "sglang",
		endpoints.ModelsAnnotation:     `[{"name": "my-lora", "modelId": "meta-llama/Llama-3.1-8B-Instruct", "adapterId": "my-lora"}]`,
	}, 8000)
	createPod(t, ns, "engine-0", "lora", "10.3.0.1", true, "")
	src, rec := start(t, cfg, ns, "lora")
	p := waitEndpoints(t, src, "one pod", eps{"engine-0": "10.3.0.1:8000"})
	want := endpoints.Model{ModelID: "meta-llama/Llama-3.1-8B-Instruct", AdapterID: "my-lora"}
	if p.HashScheme != "sglang" || p.Resolve("my-lora") != want {
		t.Fatalf("hash scheme %q, my-lora -> %+v", p.HashScheme, p.Resolve("my-lora"))
	}

	// A bad model map is reported once and the last good one stays, while
	// the endpoints keep following the pods.
	updatePool(t, ns, "lora", func(ip *giev1.InferencePool) {
		ip.Annotations[endpoints.ModelsAnnotation] = `[{"name": "my-lora", "model": "typo"}]`
	})
	deadline := time.Now().Add(waitTimeout)
	for rec.failed(endpoints.ReasonInvalid) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the bad models annotation was not reported")
		}
		time.Sleep(20 * time.Millisecond)
	}
	createPod(t, ns, "engine-1", "lora", "10.3.0.2", true, "")
	p = waitEndpoints(t, src, "a second pod under the bad annotation", eps{"engine-0": "10.3.0.1:8000", "engine-1": "10.3.0.2:8000"})
	if p.Resolve("my-lora") != want || rec.failed(endpoints.ReasonInvalid) != 1 {
		t.Fatalf("my-lora -> %+v, invalid reported %d times; want the last good map, reported once", p.Resolve("my-lora"), rec.failed(endpoints.ReasonInvalid))
	}

	updatePool(t, ns, "lora", func(ip *giev1.InferencePool) {
		delete(ip.Annotations, endpoints.ModelsAnnotation)
		delete(ip.Annotations, endpoints.HashSchemeAnnotation)
	})
	deadline = time.Now().Add(waitTimeout)
	for p := src.Pool(); p.HashScheme != endpoints.DefaultHashScheme || p.Resolve("my-lora") != (endpoints.Model{ModelID: "my-lora"}); p = src.Pool() {
		if time.Now().After(deadline) {
			t.Fatalf("annotations removed, still hash scheme %q, my-lora -> %+v", p.HashScheme, p.Resolve("my-lora"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestInferencePoolMissingAndDeleted(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	ns := namespace(t)
	createPod(t, ns, "engine-0", "llm", "10.4.0.1", true, "")
	src, _ := start(t, cfg, ns, "late")
	if p := src.Pool(); p.Len() != 0 || p.Tenant != ns {
		t.Fatalf("a missing pool must be synced and empty: %+v", p)
	}

	createPool(t, ns, "late", "llm", nil, 8000)
	waitEndpoints(t, src, "pool created", eps{"engine-0": "10.4.0.1:8000"})

	ip := &giev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "late"}}
	if err := k8s.Delete(ctxFor(t), ip); err != nil {
		t.Fatal(err)
	}
	if p := waitEndpoints(t, src, "pool deleted", eps{}); p.Tenant != ns {
		t.Fatalf("tenant %q", p.Tenant)
	}

	createPool(t, ns, "late", "llm", nil, 8001)
	waitEndpoints(t, src, "pool created again", eps{"engine-0": "10.4.0.1:8001"})
}

// TestInferencePoolRBAC runs the source as a ServiceAccount with exactly
// the Role of the package doc (list and watch, no get, one namespace), and
// as one without it.
func TestInferencePoolRBAC(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	ns := namespace(t)
	createPool(t, ns, "llm", "llm", nil, 8000)
	createPod(t, ns, "engine-0", "llm", "10.5.0.1", true, "")
	as := func(sa string) *rest.Config {
		c := rest.CopyConfig(cfg)
		c.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa,
			Groups: []string{"system:serviceaccounts", "system:authenticated"}}
		return c
	}

	// Without the Role, Run says what to grant.
	src, err := endpoints.NewInferencePool(endpoints.InferencePoolConfig{REST: as("nobody"), Pool: types.NamespacedName{Namespace: ns, Name: "llm"}})
	if err != nil {
		t.Fatal(err)
	}
	err = src.Run(ctxFor(t))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "grant list, watch") {
		t.Fatalf("Run without RBAC: %v; want a Forbidden error saying what to grant", err)
	}

	ctx := ctxFor(t)
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inferencecache-endpoint-picker"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"list", "watch"}},
		},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inferencecache-endpoint-picker"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "picker"}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	picker, rec := start(t, as("picker"), ns, "llm")
	waitEndpoints(t, picker, "as the picker's ServiceAccount", eps{"engine-0": "10.5.0.1:8000"})
	createPod(t, ns, "engine-1", "llm", "10.5.0.2", true, "")
	waitEndpoints(t, picker, "a second pod, as the ServiceAccount", eps{"engine-0": "10.5.0.1:8000", "engine-1": "10.5.0.2:8000"})
	if n := rec.failed(endpoints.ReasonWatch); n != 0 {
		t.Fatalf("%d watch failures under the documented Role", n)
	}
}

// A Run that ends returns nil and closes its caches; a second Run is
// refused.
func TestInferencePoolRunOnce(t *testing.T) {
	requireEnv(t)
	t.Parallel()
	ns := namespace(t)
	src, _ := start(t, cfg, ns, "none")
	if err := src.Run(ctxFor(t)); !errors.Is(err, endpoints.ErrAlreadyRunning) {
		t.Fatalf("second Run: %v", err)
	}
}
