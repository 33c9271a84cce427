package controller

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/claim"
)

// KernelFaultWindow is how long an engine container that last terminated
// on a GPU-kernel fault keeps EngineKernelsHealthy False once it runs and
// is ready again: long enough that a container crashing, restarting and
// crashing again (CrashLoopBackOff waits up to 5 minutes) never reads as
// healthy in between, short enough that a one-off fault stops gating Ready.
const KernelFaultWindow = 10 * time.Minute

// maxNamedFaults is how many faulted containers the condition names.
const maxNamedFaults = 5

// kernelFaults are the phrases a GPU engine's last words carry when one of
// its compiled kernels cannot run: the image was built for another GPU
// architecture, a native extension (LMCache's c_ops, a flash-attention or
// vLLM _C module) does not match the torch it is loaded into, or a kernel
// faulted on the device. Matched case-insensitively in the termination
// message the kubelet keeps (the webhook sets FallbackToLogsOnError, so a
// crash's log tail lands there). Out-of-memory is deliberately absent: it
// is a sizing problem, not a kernel one, and has its own remedies. The
// order is the order of diagnosis: the first phrase found names the fault.
var kernelFaults = []struct{ phrase, fault string }{
	{"no kernel image is available", "the image's CUDA kernels were not built for this GPU architecture"},
	{"unsupported_ptx_version", "the image's kernels need a newer GPU driver"},
	{"ptx was compiled with an unsupported toolchain", "the image's kernels need a newer GPU driver"},
	{"undefined symbol", "a native extension does not match the torch/CUDA it was loaded into"},
	{"c_ops", "LMCache's CUDA extension (c_ops) failed to load"},
	{"illegal memory access", "a GPU kernel made an illegal memory access"},
	{"device-side assert", "a GPU kernel hit a device-side assert"},
	{"cublas_status_", "a cuBLAS kernel failed"},
	{"cudnn_status_", "a cuDNN kernel failed"},
	{"triton error", "a Triton kernel failed to compile or launch"},
	{"cuda error", "a CUDA kernel call failed"},
}

// kernelPhrase returns the kernelFaults phrase the termination message msg
// carries, or "" when it names no kernel fault. The phrase alone is what
// the controller's cache keeps of the message (slimPod): kernelPhrase of
// it is itself.
func kernelPhrase(msg string) string {
	if msg == "" {
		return ""
	}
	low := strings.ToLower(msg)
	if strings.Contains(low, "out of memory") {
		return ""
	}
	for _, k := range kernelFaults {
		if strings.Contains(low, k.phrase) {
			return k.phrase
		}
	}
	return ""
}

// kernelFault returns what the termination message msg says went wrong
// with a kernel, or "" when it names no kernel fault.
func kernelFault(msg string) string {
	p := kernelPhrase(msg)
	for _, k := range kernelFaults {
		if p != "" && k.phrase == p {
			return k.fault
		}
	}
	return ""
}

// slimTermination is what the controller's cache keeps of a termination:
// a failed one whose message or reason names a kernel fault, as its exit
// code, end and phrase; nil otherwise (a log tail is up to 2 KiB a
// container, which the cache need not hold).
func slimTermination(t *corev1.ContainerStateTerminated) *corev1.ContainerStateTerminated {
	if t == nil || t.ExitCode == 0 {
		return nil
	}
	p := kernelPhrase(t.Message)
	if p == "" {
		p = kernelPhrase(t.Reason)
	}
	if p == "" {
		return nil
	}
	return &corev1.ContainerStateTerminated{ExitCode: t.ExitCode, FinishedAt: t.FinishedAt, Message: p}
}

// lastTermination is the container's most recent termination: the current
// one while it is terminated, else the previous one.
func lastTermination(cs *corev1.ContainerStatus) *corev1.ContainerStateTerminated {
	if t := cs.State.Terminated; t != nil {
		return t
	}
	return cs.LastTerminationState.Terminated
}

// engineKernels sets EngineKernelsHealthy from the pods injected for b
// (opted-out ones excepted, as for EngineCompatibility): False with
// EngineKernelDegraded while any of their containers' last termination
// was a kernel fault (kernelFault) and the container is not ready again,
// or became so less than KernelFaultWindow ago. It returns when the
// verdict changes by itself (a fault ageing out of the window), or 0.
func engineKernels(b *v1alpha1.CacheBackend, pods []corev1.Pod, now time.Time, c conds) time.Duration {
	var faulted []string
	var wait time.Duration
	for i := range pods {
		p := &pods[i]
		if !injectedBy(b, p) || claim.OptedOut(p.Labels, p.Annotations) {
			continue
		}
		for j := range p.Status.ContainerStatuses {
			cs := &p.Status.ContainerStatuses[j]
			t := lastTermination(cs)
			if t == nil || t.ExitCode == 0 {
				continue
			}
			fault := kernelFault(t.Message)
			if fault == "" {
				fault = kernelFault(t.Reason)
			}
			if fault == "" {
				continue
			}
			if cs.Ready && cs.State.Running != nil && !t.FinishedAt.IsZero() {
				left := t.FinishedAt.Add(KernelFaultWindow).Sub(now)
				if left <= 0 {
					continue
				}
				if wait == 0 || left < wait {
					wait = left
				}
			}
			name := p.Name
			if p.Namespace != b.Namespace {
				name = p.Namespace + "/" + p.Name
			}
			faulted = append(faulted, name+"/"+cs.Name+" ("+fault+")")
		}
	}
	if len(faulted) > 0 {
		slices.Sort(faulted)
		// A fleet-wide fault (one bad image) names a few containers, not
		// hundreds: the condition message stays readable and small.
		list := strings.Join(faulted[:min(len(faulted), maxNamedFaults)], ", ")
		if n := len(faulted) - maxNamedFaults; n > 0 {
			list += fmt.Sprintf(" and %d more", n)
		}
		c.set(v1alpha1.BackendConditionEngineKernelsHealthy, metav1.ConditionFalse, ReasonEngineKernelDegraded,
			"engine containers last terminated on a GPU-kernel fault: "+list+
				"; check the engine image against the node's GPU and driver (kubectl describe pod shows the last log lines)")
		return wait
	}
	c.set(v1alpha1.BackendConditionEngineKernelsHealthy, metav1.ConditionTrue, ReasonEngineKernelsOK,
		"no injected engine container's last termination was a GPU-kernel fault, or it has run ready for "+KernelFaultWindow.String()+" since")
	return 0
}

// kernelGate turns Ready False with EngineKernelDegraded when it was True
// and EngineKernelsHealthy is False: a backend whose engines cannot run
// their kernels serves no cache. A Ready already False keeps its own,
// earlier, reason.
func kernelGate(st *v1alpha1.CacheBackendStatus, c conds) {
	k := meta.FindStatusCondition(st.Conditions, v1alpha1.BackendConditionEngineKernelsHealthy)
	r := meta.FindStatusCondition(st.Conditions, v1alpha1.BackendConditionReady)
	if k != nil && k.Status == metav1.ConditionFalse && r != nil && r.Status == metav1.ConditionTrue {
		c.set(v1alpha1.BackendConditionReady, metav1.ConditionFalse, ReasonEngineKernelDegraded, k.Message)
	}
}
