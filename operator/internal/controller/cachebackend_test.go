package controller

import (
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

func TestManagedConditions(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	type want struct{ ready, readyReason, degraded, degradedReason string }
	f := func(name string, w workloadState, mut func(*v1alpha1.CacheBackend), now time.Time, exp want) {
		t.Helper()
		b := &v1alpha1.CacheBackend{}
		b.Status.FirstAvailableAt = &metav1.Time{Time: t0}
		if mut != nil {
			mut(b)
		}
		managedConditions(b, w, now, conds{list: &b.Status.Conditions})
		r := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionReady)
		d := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionDegraded)
		if string(r.Status) != exp.ready || r.Reason != exp.readyReason || string(d.Status) != exp.degraded || d.Reason != exp.degradedReason {
			t.Errorf("%s: Ready %s/%s Degraded %s/%s, want %+v", name, r.Status, r.Reason, d.Status, d.Reason, exp)
		}
	}
	up := workloadState{exists: true, current: true, desired: 2, updated: 2, available: 2}
	f("no workload", workloadState{}, nil, t0, want{"False", ReasonRolloutInProgress, "False", ReasonNotDegraded})
	f("stale generation", workloadState{exists: true, desired: 1}, nil, t0, want{"False", ReasonRolloutInProgress, "False", ReasonNotDegraded})
	f("scaled to zero", workloadState{exists: true, current: true}, nil, t0, want{"False", ReasonScaledToZero, "False", ReasonNotDegraded})
	f("none available", workloadState{exists: true, current: true, desired: 2, updated: 2}, nil, t0, want{"False", ReasonReplicasUnavailable, "True", ReasonReplicasUnavailable})
	f("awaiting", up, nil, t0.Add(4*time.Minute), want{"False", ReasonAwaitingFirstKVEvent, "False", ReasonNotDegraded})
	f("timed out", up, nil, t0.Add(5*time.Minute), want{"False", ReasonNoKVEventsObserved, "True", ReasonNoKVEventsObserved})
	f("custom timeout", up, func(b *v1alpha1.CacheBackend) {
		b.Spec.Integration = &v1alpha1.CacheBackendIntegration{FirstEventTimeout: &metav1.Duration{Duration: time.Minute}}
	}, t0.Add(2*time.Minute), want{"False", ReasonNoKVEventsObserved, "True", ReasonNoKVEventsObserved})
	f("observed", up, func(b *v1alpha1.CacheBackend) { b.Status.FirstKVEventObservedAt = &metav1.Time{Time: t0} },
		t0.Add(time.Hour), want{"True", ReasonKVEventsObserved, "False", ReasonNotDegraded})
	f("gate off", up, func(b *v1alpha1.CacheBackend) { b.Annotations = map[string]string{RequireKVEventsAnnotation: "false"} },
		t0.Add(time.Hour), want{"True", ReasonBackendReady, "False", ReasonNotDegraded})
	f("partly available", workloadState{exists: true, current: true, desired: 2, updated: 2, available: 1},
		func(b *v1alpha1.CacheBackend) { b.Annotations = map[string]string{RequireKVEventsAnnotation: "false"} },
		t0, want{"True", ReasonBackendReady, "True", ReasonReplicasUnavailable})
}

func TestT2Condition(t *testing.T) {
	f := func(rate *string, wantStatus, wantReason string) {
		t.Helper()
		b := &v1alpha1.CacheBackend{}
		if rate != nil {
			b.Status.IndexParticipation = &v1alpha1.IndexParticipation{T2HitRate: rate}
		}
		t2Condition(b, conds{list: &b.Status.Conditions})
		c := meta.FindStatusCondition(b.Status.Conditions, v1alpha1.BackendConditionT2Degraded)
		if wantStatus == "" {
			if c != nil {
				t.Errorf("rate %v: condition %+v, want none", rate, c)
			}
			return
		}
		if c == nil || string(c.Status) != wantStatus || c.Reason != wantReason {
			t.Errorf("rate %v: condition %+v, want %s/%s", *rate, c, wantStatus, wantReason)
		}
	}
	f(nil, "", "")
	f(ptr("0"), "True", ReasonT2ZeroHitRate)
	f(ptr("0.25"), "False", ReasonT2Serving)
	f(ptr("1"), "False", ReasonT2Serving)
}

func TestProbeVerdict(t *testing.T) {
	f := func(in, rt, t2, wantStatus, wantReason string) {
		t.Helper()
		s, r, _ := probeVerdict(controlapi.ProbeResponse{Ingest: in, Routing: rt, T2: t2})
		if string(s) != wantStatus || r != wantReason {
			t.Errorf("%s/%s/%s: %s/%s, want %s/%s", in, rt, t2, s, r, wantStatus, wantReason)
		}
	}
	f("ok", "ok", "ok", "True", ReasonProbeOK)
	f("ok", "ok", "skipped", "True", ReasonProbeOK)
	f("failed", "skipped", "skipped", "False", ReasonProbeIngestFailed)
	f("ok", "failed", "skipped", "False", ReasonProbeRoutingFailed)
	f("ok", "ok", "failed", "False", ReasonProbeT2Failed)

	b := &v1alpha1.CacheBackend{}
	b.Namespace, b.Name = "ml", "lmc"
	b.Spec.Integration = &v1alpha1.CacheBackendIntegration{Engine: "SGLang"}
	req := probeRequest(b)
	if req != (controlapi.ProbeRequest{Backend: "ml/lmc", Model: ProbeModel, HashScheme: "sglang", BackendType: "LMCache"}) {
		t.Errorf("probe request %+v", req)
	}
}

func TestServerInstanceAndJudge(t *testing.T) {
	pod := func(name, uid string, ready bool, restarts ...int32) corev1.Pod {
		p := corev1.Pod{}
		p.Name, p.UID = name, types.UID(uid)
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		for _, n := range restarts {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{RestartCount: n})
		}
		return p
	}
	got := serverInstance([]corev1.Pod{pod("b", "u2", true, 1, 2), pod("c", "u3", false), pod("a", "u1", true)})
	if got != "u1:0,u2:3" {
		t.Fatalf("serverInstance %q", got)
	}
	// f checks a step from old to now with the non-terminating pods exist
	// (ready or not) and the workload's desired replica count.
	f := func(old, now string, exist []types.UID, desired int32, want instanceStep) {
		t.Helper()
		m := map[types.UID]bool{}
		for _, u := range exist {
			m[u] = true
		}
		if got := judgeInstance(old, now, m, desired); got != want {
			t.Errorf("judgeInstance(%q, %q, %v, %d) = %d, want %d", old, now, exist, desired, got, want)
		}
	}
	f("", "u1:0", []types.UID{"u1"}, 1, instanceRecord)                              // first observation
	f("u1:0", "u1:0", []types.UID{"u1"}, 1, instanceRecord)                          // unchanged
	f("u1:0", "u1:0,u2:0", []types.UID{"u1", "u2"}, 2, instanceRecord)               // scale-up
	f("u1:0,u2:0", "u1:0", []types.UID{"u1"}, 1, instanceRecord)                     // scale-down: u2 gone, desired met
	f("u1:0,u2:0,u3:0", "u1:0", []types.UID{"u1"}, 1, instanceRecord)                // scale-down by two
	f("u1:0,u2:0", "u1:0", []types.UID{"u1", "u2"}, 2, instanceRecord)               // u2 not ready but still there
	f("u1:0", "u1:1", []types.UID{"u1"}, 1, instanceReplaced)                        // restart
	f("u1:0,u2:0", "u1:0,u2:1", []types.UID{"u1", "u2"}, 1, instanceReplaced)        // restart during a scale-down
	f("u9:0", "u1:0", []types.UID{"u1"}, 1, instanceReplaced)                        // replacement seen at once
	f("u1:0,u2:0", "u2:0", []types.UID{"u2"}, 2, instanceHold)                       // u1 gone, its successor not ready yet
	f("u1:0,u2:0", "u2:0", []types.UID{"u2", "u3"}, 2, instanceHold)                 // successor u3 exists, not ready
	f("u1:0,u2:0", "u2:0,u3:0", []types.UID{"u2", "u3"}, 2, instanceReplaced)        // ... and is ready: replaced
	f("u1:0,u2:0", "u1:0,u2:0,u3:0", []types.UID{"u1", "u2", "u3"}, 2, instanceHold) // surge pod of a rollout
	f("u1:0,u2:0", "u2:0,u3:0", []types.UID{"u2", "u3"}, 2, instanceReplaced)        // ... whose old pod went
	f("u1:0,u2:0", "u2:0,u3:0", []types.UID{"u1", "u2", "u3"}, 2, instanceRecord)    // u1 only unready: no pod gone
	f("u1:0", "", nil, 0, instanceHold)                                              // scaled to zero: kept
	f("u1:0", "u5:0", []types.UID{"u5"}, 1, instanceReplaced)                        // ... and back: every pod replaced
}

func TestTemplateRevision(t *testing.T) {
	a := v1alpha1.PromptTemplateSpec{Body: "x {{s}}", Slots: []v1alpha1.PromptTemplateSlot{{Name: "s", Type: v1alpha1.SlotStable}}}
	b := *a.DeepCopy()
	if TemplateRevision(&a) != TemplateRevision(&b) || len(TemplateRevision(&a)) != 16 {
		t.Fatalf("equal specs: %q %q", TemplateRevision(&a), TemplateRevision(&b))
	}
	b.Slots[0].Required = true
	if TemplateRevision(&a) == TemplateRevision(&b) {
		t.Fatal("a slot change kept the revision")
	}
	c := *a.DeepCopy()
	c.Body = "y {{s}}"
	if TemplateRevision(&a) == TemplateRevision(&c) {
		t.Fatal("a body change kept the revision")
	}
}

// TestClassify: only Offload LMCache (the default type) is provisioned.
func TestClassify(t *testing.T) {
	f := func(typ v1alpha1.CacheBackendType, mode v1alpha1.IntegrationMode, want backendClass) {
		t.Helper()
		b := &v1alpha1.CacheBackend{Spec: v1alpha1.CacheBackendSpec{Type: typ}}
		if mode != "" {
			b.Spec.Integration = &v1alpha1.CacheBackendIntegration{Mode: mode}
		}
		if got := classify(b); got != want {
			t.Errorf("classify(%q, %q) = %d, want %d", typ, mode, got, want)
		}
	}
	f("", "", classManaged)
	f(v1alpha1.BackendLMCache, v1alpha1.IntegrationOffload, classManaged)
	f(v1alpha1.BackendLMCache, v1alpha1.IntegrationEventsOnly, classEventsOnly)
	f(v1alpha1.BackendSGLangHiCache, "", classSelfRun)
	f(v1alpha1.BackendAIBrix, v1alpha1.IntegrationOffload, classSelfRun)
	f(v1alpha1.BackendMooncake, "", classSelfRun)
	f(v1alpha1.BackendNIXL, "", classSelfRun)
	f(v1alpha1.BackendNIXL, v1alpha1.IntegrationEventsOnly, classEventsOnly)
	f(v1alpha1.BackendExternal, v1alpha1.IntegrationEventsOnly, classExternal)
}

// applyTemplate sets what the override sets, clears what it set before and
// no longer sets, and leaves everything else alone.
func TestApplyTemplate(t *testing.T) {
	var wm metav1.ObjectMeta
	ps := corev1.PodSpec{Tolerations: []corev1.Toleration{{Key: "theirs"}}, SchedulerName: "theirs"}
	o := &v1alpha1.BackendPodOverride{NodeSelector: map[string]string{"a": "b"}, PriorityClassName: "p"}
	applyTemplate(o, &ps, &wm)
	if ps.NodeSelector["a"] != "b" || ps.PriorityClassName != "p" || len(ps.Tolerations) != 1 || wm.Annotations[TemplateFieldsAnnotation] != "nodeSelector,priorityClassName" {
		t.Fatalf("after set: %+v %v", ps, wm.Annotations)
	}
	o.PriorityClassName = ""
	applyTemplate(o, &ps, &wm)
	if ps.PriorityClassName != "" || ps.NodeSelector["a"] != "b" || wm.Annotations[TemplateFieldsAnnotation] != "nodeSelector" {
		t.Fatalf("after dropping one field: %+v %v", ps, wm.Annotations)
	}
	ps.PriorityClassName = "someone-else" // set by another writer, not tracked
	applyTemplate(nil, &ps, &wm)
	if ps.NodeSelector != nil || ps.PriorityClassName != "someone-else" || len(ps.Tolerations) != 1 || ps.SchedulerName != "theirs" {
		t.Fatalf("after removing the template: %+v", ps)
	}
	if _, ok := wm.Annotations[TemplateFieldsAnnotation]; ok {
		t.Fatalf("annotation kept: %v", wm.Annotations)
	}
}

func TestServerBackoff(t *testing.T) {
	var s serverBackoff
	now := time.Unix(1000, 0)
	if w, _ := s.hold(now); w != 0 {
		t.Fatalf("hold %v before any failure", w)
	}
	err := errors.New("connection refused")
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
		if got := s.failed(now, err, 5*time.Second); got != want {
			t.Fatalf("failure %d: backoff %v, want %v", i, got, want)
		}
	}
	if w, why := s.hold(now.Add(time.Second)); w != 4*time.Second || why != "connection refused" {
		t.Fatalf("hold %v %q", w, why)
	}
	s.answered()
	if w, _ := s.hold(now); w != 0 {
		t.Fatalf("hold %v after an answer", w)
	}
	if got := s.failed(now, err, 5*time.Second); got != time.Second {
		t.Fatalf("backoff after an answer %v, want it to start over", got)
	}
	if !transportError(&url.Error{Op: "Post", URL: "http://x", Err: err}) || transportError(fmt.Errorf("cannot probe: 503")) {
		t.Fatal("transportError misclassifies")
	}
}
