package endpoints

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

func TestReplicaID(t *testing.T) {
	f := func(pod string, rank, ranks int, want string) {
		t.Helper()
		if got := ReplicaID(pod, rank, ranks); got != want {
			t.Errorf("ReplicaID(%q, %d, %d) = %q, want %q", pod, rank, ranks, got, want)
		}
	}
	f("vllm-0", 0, 1, "vllm-0")
	f("vllm-0", 0, 2, "vllm-0-dp0")
	f("vllm-0", 7, 8, "vllm-0-dp7")
}

func TestParsePoolRef(t *testing.T) {
	ref, err := ParsePoolRef("team-a/llama")
	if err != nil || ref != (types.NamespacedName{Namespace: "team-a", Name: "llama"}) {
		t.Fatalf("%v %v", ref, err)
	}
	for _, bad := range []string{"llama", "/llama", "team-a/", "Team/llama", "a/b/c", "team_a/llama"} {
		if _, err := ParsePoolRef(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// pod is a pod with the given ready state and IP.
func pod(name, ip string, ready bool, mutate ...func(*corev1.Pod)) corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{"app": "llm"}},
		Status: corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: st},
		}},
	}
	for _, m := range mutate {
		m(&p)
	}
	return p
}

func ports(n ...int32) []giev1.Port {
	var ps []giev1.Port
	for _, x := range n {
		ps = append(ps, giev1.Port{Number: giev1.PortNumber(x)})
	}
	return ps
}

func TestPodEndpoints(t *testing.T) {
	now := metav1.Now()
	pods := []corev1.Pod{
		pod("c", "10.0.0.3", true),
		pod("a", "10.0.0.1", true),
		pod("unready", "10.0.0.4", false),
		pod("no-ip", "", true),
		pod("terminating", "10.0.0.5", true, func(p *corev1.Pod) { p.DeletionTimestamp = &now }),
		pod("no-condition", "10.0.0.6", true, func(p *corev1.Pod) { p.Status.Conditions = nil }),
		pod("v6", "fd00::7", true),
		pod("b-same-ip-as-a", "10.0.0.1", true), // hostNetwork on a's node
	}
	eps, dups := podEndpoints(pods, ports(8000))
	want := []Endpoint{
		{ReplicaID: "a", Address: "10.0.0.1:8000"},
		{ReplicaID: "c", Address: "10.0.0.3:8000"},
		{ReplicaID: "v6", Address: "[fd00::7]:8000"},
	}
	if !slices.Equal(eps, want) {
		t.Errorf("one port:\n got %+v\nwant %+v", eps, want)
	}
	if !slices.Equal(dups, []string{"b-same-ip-as-a 10.0.0.1:8000"}) {
		t.Errorf("dups %v", dups)
	}

	eps, _ = podEndpoints(pods[:2], ports(8000, 8001))
	want = []Endpoint{
		{ReplicaID: "a-dp0", Address: "10.0.0.1:8000"},
		{ReplicaID: "a-dp1", Address: "10.0.0.1:8001"},
		{ReplicaID: "c-dp0", Address: "10.0.0.3:8000"},
		{ReplicaID: "c-dp1", Address: "10.0.0.3:8001"},
	}
	if !slices.Equal(eps, want) {
		t.Errorf("two ports:\n got %+v\nwant %+v", eps, want)
	}
	if eps, _ := podEndpoints(pods, nil); len(eps) != 0 {
		t.Errorf("no target ports: %+v", eps)
	}
	// The result makes a valid pool (unique addresses and replica ids).
	if _, err := NewPool("ns", "", nil, eps); err != nil {
		t.Error(err)
	}
}

func TestSlimPod(t *testing.T) {
	full := pod("a", "10.0.0.1", true, func(p *corev1.Pod) {
		p.UID, p.ResourceVersion = "uid-1", "42"
		p.Annotations = map[string]string{"big": "annotation"}
		p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
		p.Spec.Containers = []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "vllm"}}
	})
	out, err := slimPod(&full)
	if err != nil {
		t.Fatal(err)
	}
	s := out.(*corev1.Pod)
	if s.Name != "a" || s.Namespace != "ns" || s.UID != "uid-1" || s.ResourceVersion != "42" || s.Labels["app"] != "llm" {
		t.Errorf("metadata lost: %+v", s.ObjectMeta)
	}
	if s.Annotations != nil || s.ManagedFields != nil || len(s.Spec.Containers) != 0 || s.Status.ContainerStatuses != nil {
		t.Errorf("kept more than needed: %+v", s)
	}
	if !podReady(s) || s.Status.PodIP != "10.0.0.1" || len(s.Status.Conditions) != 1 {
		t.Errorf("readiness lost: %+v", s.Status)
	}
	again, _ := slimPod(s) // the informer may transform an object twice
	if !podReady(again.(*corev1.Pod)) {
		t.Error("slimPod is not idempotent")
	}
	if other, _ := slimPod("not a pod"); other != "not a pod" {
		t.Error("slimPod changed a non-pod")
	}
}

func TestNewInferencePoolRejects(t *testing.T) {
	if _, err := NewInferencePool(InferencePoolConfig{Pool: types.NamespacedName{Namespace: "ns", Name: "p"}}); err == nil {
		t.Error("no REST config accepted")
	}
}

// Pool is one atomic load: no allocation for a reader.
func TestPoolReadAllocs(t *testing.T) {
	p, err := NewPool("ns", "", nil, []Endpoint{{ReplicaID: "a", Address: "10.0.0.1:80"}})
	if err != nil {
		t.Fatal(err)
	}
	var s Source = NewFixed(p)
	ip := &InferencePool{}
	ip.pool.Store(p)
	if n := testing.AllocsPerRun(1000, func() {
		if s.Pool() != p || ip.Pool() != p {
			t.Fatal("wrong pool")
		}
		if _, ok := p.ByAddress("10.0.0.1:80"); !ok {
			t.Fatal("lookup")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per read", n)
	}
}

// BenchmarkRebuild is the pool a pod event costs: the Ready pods (in cache
// order) to endpoints, then NewPool.
func BenchmarkRebuild(b *testing.B) {
	for _, c := range []struct{ pods, ports int }{{1000, 1}, {250, 4}} {
		b.Run(fmt.Sprintf("pods=%d/ports=%d", c.pods, c.ports), func(b *testing.B) {
			pods := make([]corev1.Pod, c.pods)
			for i := range pods {
				pods[i] = pod(fmt.Sprintf("engine-%d", i), fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), i%10 != 0)
			}
			rand.New(rand.NewPCG(1, 2)).Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
			ps := ports(8000, 8001, 8002, 8003)[:c.ports]
			b.ReportAllocs()
			for b.Loop() {
				eps, _ := podEndpoints(pods, ps)
				if _, err := NewPool("ns", "", nil, eps); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
