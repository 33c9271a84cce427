package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

func TestKernelFault(t *testing.T) {
	for msg, want := range map[string]bool{
		"":              false,
		"Error":         false,
		"exit status 1": false,
		"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB":                                                                false,
		"RuntimeError: CUDA error: out of memory":                                                                                               false,
		"RuntimeError: CUDA error: no kernel image is available for execution on the device":                                                    true,
		"ImportError: /usr/lib/python3/site-packages/lmcache/c_ops.cpython-312-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi": true,
		"ModuleNotFoundError: No module named 'lmcache.c_ops'":                                                                                  true,
		"torch.AcceleratorError: CUDA error: an illegal memory access was encountered":                                                          true,
		"RuntimeError: CUDA error: device-side assert triggered":                                                                                true,
		"RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`":                                                  true,
		"the provided PTX was compiled with an unsupported toolchain; CUDA_ERROR_UNSUPPORTED_PTX_VERSION":                                       true,
	} {
		if got := kernelFault(msg) != ""; got != want {
			t.Errorf("kernelFault(%q) = %q, want a fault: %v", msg, kernelFault(msg), want)
		}
	}
	if got := kernelFault("ImportError: lmcache/c_ops.so: undefined symbol: x"); !strings.Contains(got, "native extension") {
		t.Errorf("the first phrase in diagnosis order names the fault: %q", got)
	}
}

func TestEngineKernels(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	b := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lmc"}}
	injected := map[string]string{InjectedByAnnotation: "ns/lmc"}
	fault := "RuntimeError: CUDA error: no kernel image is available for execution on the device"
	pod := func(name string, ann map[string]string, cs corev1.ContainerStatus) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: ann},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{cs}}}
	}
	terminated := func(msg string, code int32, finished time.Time) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error", Message: msg, FinishedAt: metav1.NewTime(finished)}
	}
	crashing := corev1.ContainerStatus{Name: "engine", RestartCount: 3,
		State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: terminated(fault, 1, now.Add(-time.Minute))}}
	runningSince := func(finished time.Time) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "engine", Ready: true, RestartCount: 1,
			State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(finished)}},
			LastTerminationState: corev1.ContainerState{Terminated: terminated(fault, 1, finished)}}
	}
	f := func(name string, pods []corev1.Pod, wantStatus metav1.ConditionStatus, wantWait time.Duration, wantInMsg string) {
		t.Helper()
		b.Status.Conditions = []metav1.Condition{{Type: v1alpha1.BackendConditionReady, Status: metav1.ConditionTrue, Reason: ReasonBackendReady}}
		c := conds{list: &b.Status.Conditions}
		wait := engineKernels(b, pods, now, c)
		kernelGate(&b.Status, c)
		k := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionEngineKernelsHealthy)
		r := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionReady)
		if k == nil || k.Status != wantStatus || wait != wantWait || !strings.Contains(k.Message, wantInMsg) {
			t.Errorf("%s: %+v wait %v, want %s wait %v with %q", name, k, wait, wantStatus, wantWait, wantInMsg)
			return
		}
		if wantStatus == metav1.ConditionFalse && (r.Status != metav1.ConditionFalse || r.Reason != ReasonEngineKernelDegraded) {
			t.Errorf("%s: Ready %s/%s, want False/%s", name, r.Status, r.Reason, ReasonEngineKernelDegraded)
		}
		if wantStatus == metav1.ConditionTrue && (r.Status != metav1.ConditionTrue || k.Reason != ReasonEngineKernelsOK) {
			t.Errorf("%s: Ready %s/%s, kernels %s", name, r.Status, r.Reason, k.Reason)
		}
	}
	f("no pods", nil, metav1.ConditionTrue, 0, "")
	f("crash-looping on a kernel fault", []corev1.Pod{pod("e-0", injected, crashing)}, metav1.ConditionFalse, 0, "e-0/engine (the image's CUDA kernels were not built")
	f("terminated now", []corev1.Pod{pod("e-0", injected, corev1.ContainerStatus{Name: "engine",
		State: corev1.ContainerState{Terminated: terminated(fault, 1, now)}})}, metav1.ConditionFalse, 0, "e-0/engine")
	f("running again, fault 4 min ago", []corev1.Pod{pod("e-0", injected, runningSince(now.Add(-4*time.Minute)))},
		metav1.ConditionFalse, 6*time.Minute, "e-0/engine")
	f("running again, fault past the window", []corev1.Pod{pod("e-0", injected, runningSince(now.Add(-KernelFaultWindow-time.Second)))},
		metav1.ConditionTrue, 0, "")
	oom := crashing
	oom.LastTerminationState.Terminated = terminated("torch.OutOfMemoryError: CUDA out of memory", 1, now)
	f("out of memory is not a kernel fault", []corev1.Pod{pod("e-0", injected, oom)}, metav1.ConditionTrue, 0, "")
	clean := crashing
	clean.LastTerminationState.Terminated = terminated(fault, 0, now)
	f("a clean exit is no fault", []corev1.Pod{pod("e-0", injected, clean)}, metav1.ConditionTrue, 0, "")
	f("not injected by this backend", []corev1.Pod{pod("e-0", map[string]string{InjectedByAnnotation: "ns/other"}, crashing)}, metav1.ConditionTrue, 0, "")

	many := make([]corev1.Pod, 8)
	for i := range many {
		many[i] = pod(fmt.Sprintf("e-%d", i), injected, crashing)
	}
	f("a fleet-wide fault names five", many, metav1.ConditionFalse, 0, "e-4/engine (the image's CUDA kernels were not built for this GPU architecture) and 3 more")

	// A Ready already False keeps its reason.
	b.Status.Conditions = []metav1.Condition{{Type: v1alpha1.BackendConditionReady, Status: metav1.ConditionFalse, Reason: ReasonReplicasUnavailable}}
	c := conds{list: &b.Status.Conditions}
	engineKernels(b, []corev1.Pod{pod("e-0", injected, crashing)}, now, c)
	kernelGate(&b.Status, c)
	if r := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionReady); r.Reason != ReasonReplicasUnavailable {
		t.Errorf("Ready reason %s, want the earlier %s", r.Reason, ReasonReplicasUnavailable)
	}
}

// What the cache keeps of a pod (slimPod) is enough for the verdict: the
// phrase of a kernel fault, not the log tail; nothing of another failure.
func TestSlimPodKeepsKernelFaults(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	tail := strings.Repeat("INFO loading weights\n", 90) + "RuntimeError: CUDA error: an illegal memory access was encountered\n"
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "e-0", Annotations: map[string]string{InjectedByAnnotation: "ns/lmc"}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
			{Name: "engine", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: tail, FinishedAt: metav1.NewTime(now)}}},
			{Name: "sidecar", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Message: "flag provided but not defined"}}},
		}}}
	out, err := slimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	s := out.(*corev1.Pod)
	if got := s.Status.ContainerStatuses[0].LastTerminationState.Terminated; got == nil || got.Message != "illegal memory access" || !got.FinishedAt.Equal(&p.Status.ContainerStatuses[0].LastTerminationState.Terminated.FinishedAt) {
		t.Fatalf("kept %+v", got)
	}
	if got := s.Status.ContainerStatuses[1].State.Terminated; got != nil {
		t.Fatalf("kept a termination that is no kernel fault: %+v", got)
	}
	b := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "lmc"}}
	engineKernels(b, []corev1.Pod{*s}, now, conds{list: &b.Status.Conditions})
	if k := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionEngineKernelsHealthy); k.Status != metav1.ConditionFalse ||
		!strings.Contains(k.Message, "illegal memory access") {
		t.Fatalf("verdict from the slim pod: %+v", k)
	}
}
