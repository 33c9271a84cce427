package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/policy"
)

func results(gen map[string]error) []pushResult {
	var out []pushResult
	for _, name := range []string{"a", "b", "c", "d"} {
		if err, ok := gen[name]; ok {
			out = append(out, pushResult{server: serverTarget{Name: "pod-" + name, Address: "10.0.0." + name + ":8081"}, err: err})
		}
	}
	return out
}

func TestPropagationStatus(t *testing.T) {
	cp := &v1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Generation: 3}}
	accepted := PolicyVerdict{Reason: v1alpha1.ReasonAccepted}
	svc := nsKey("sys", "server")
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	t2 := metav1.NewTime(t0.Add(2 * time.Minute))
	cond := func(st v1alpha1.CachePolicyStatus) metav1.Condition {
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionPropagated)
		if c == nil {
			t.Fatalf("no Propagated condition in %+v", st)
		}
		return *c
	}
	refused := errors.New("cannot push policy to http://10.0.0.b:8081: HTTP 503: draining")

	// Both acknowledge: True, each at generation 3 since t0.
	st := PropagationStatus(cp, PolicyStatus(cp, v1alpha1.CachePolicyStatus{}, accepted), accepted,
		&pushReport{Target: v1alpha1.PropagationTargetEndpointSlices, Service: svc, Results: results(map[string]error{"a": nil, "b": nil})}, t0)
	if c := cond(st); c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonPropagated || c.ObservedGeneration != 3 ||
		!strings.Contains(c.Message, "all 2 ready server pods of Service sys/server acknowledged generation 3") {
		t.Fatalf("condition %+v", c)
	}
	if p := st.Propagation; p.ReadyServers != 2 || p.AcknowledgedServers != 2 || p.Servers[0].Name != "pod-a" || p.Servers[1].PushedGeneration != 3 || !p.Servers[1].AcknowledgedTime.Equal(&t0) {
		t.Fatalf("propagation %+v", p)
	}

	// The periodic re-push: nothing changes, so nothing is written.
	again := PropagationStatus(cp, PolicyStatus(cp, st, accepted), accepted,
		&pushReport{Target: v1alpha1.PropagationTargetEndpointSlices, Service: svc, Results: results(map[string]error{"a": nil, "b": nil})}, t1)
	if !equality.Semantic.DeepEqual(again, st) {
		t.Fatalf("an unchanged re-push changed the status:\n%+v\n%+v", st, again)
	}

	// A new generation: b refuses and stays at 3 with its error, failing
	// first; a moves to 4; a new pod c gets 4.
	cp.Generation = 4
	st = PropagationStatus(cp, PolicyStatus(cp, st, accepted), accepted,
		&pushReport{Target: v1alpha1.PropagationTargetEndpointSlices, Service: svc, Results: results(map[string]error{"a": nil, "b": refused, "c": nil})}, t1)
	c := cond(st)
	if c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonPartiallyPropagated || c.ObservedGeneration != 4 ||
		!strings.Contains(c.Message, "2 of 3 ready") || !strings.Contains(c.Message, "pod-b (10.0.0.b:8081)") || !strings.Contains(c.Message, "HTTP 503: draining") {
		t.Fatalf("condition %+v", c)
	}
	p := st.Propagation
	if p.AcknowledgedServers != 2 || p.ReadyServers != 3 {
		t.Fatalf("counts %+v", p)
	}
	if b := p.Servers[0]; b.Name != "pod-b" || b.PushedGeneration != 3 || !b.AcknowledgedTime.Equal(&t0) || b.Error != refused.Error() || !b.FailingSince.Equal(&t1) {
		t.Fatalf("failing server %+v", b)
	}
	if a := p.Servers[1]; a.Name != "pod-a" || a.PushedGeneration != 4 || !a.AcknowledgedTime.Equal(&t1) || a.Error != "" || a.FailingSince != nil {
		t.Fatalf("server a %+v", a)
	}

	// b still fails: failingSince stays; then everything fails: PushFailed.
	st = PropagationStatus(cp, st, accepted, &pushReport{Target: v1alpha1.PropagationTargetEndpointSlices, Service: svc,
		Results: results(map[string]error{"a": refused, "b": refused, "c": refused, "d": refused})}, t2)
	if c := cond(st); c.Reason != v1alpha1.ReasonPushFailed || !strings.Contains(c.Message, "no server acknowledged generation 4: pod-a") || !strings.Contains(c.Message, "and 3 more") {
		t.Fatalf("condition %+v", c)
	}
	if b := st.Propagation.Servers[1]; b.Name != "pod-b" || !b.FailingSince.Equal(&t1) {
		t.Fatalf("server b %+v", b)
	}
	if d := st.Propagation.Servers[3]; d.Name != "pod-d" || d.PushedGeneration != 0 || d.AcknowledgedTime != nil || !d.FailingSince.Equal(&t2) {
		t.Fatalf("server d %+v", d)
	}

	// No ready server.
	st = PropagationStatus(cp, st, accepted, &pushReport{Target: v1alpha1.PropagationTargetEndpointSlices, Service: svc}, t2)
	if c := cond(st); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonNoReadyServers || st.Propagation.ReadyServers != 0 || len(st.Propagation.Servers) != 0 {
		t.Fatalf("no ready servers: %+v", st)
	}

	// The configured address: its own reason, honest about what it covers.
	st = PropagationStatus(cp, st, accepted, &pushReport{Target: v1alpha1.PropagationTargetAddress,
		Results: []pushResult{{server: serverTarget{Name: "server.sys.svc:8081", Address: "server.sys.svc:8081"}}}}, t2)
	if c := cond(st); c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonAddressAcknowledged || !strings.Contains(c.Message, "not enumerated") {
		t.Fatalf("address: %+v", c)
	}

	// Not Accepted: no Propagated condition, no propagation; Accepted kept.
	conflicted := PolicyVerdict{Reason: v1alpha1.ReasonConflicted, Winner: nsKey("ns", "a")}
	st = PropagationStatus(cp, PolicyStatus(cp, st, conflicted), conflicted, &pushReport{Target: v1alpha1.PropagationTargetAddress}, t2)
	if meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionPropagated) != nil || st.Propagation != nil ||
		meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionAccepted).Reason != v1alpha1.ReasonConflicted {
		t.Fatalf("conflicted: %+v", st)
	}
}

func TestPropagationStatusBounded(t *testing.T) {
	cp := &v1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Generation: 1}}
	accepted := PolicyVerdict{Reason: v1alpha1.ReasonAccepted}
	var res []pushResult
	for i := range 40 {
		r := pushResult{server: serverTarget{Name: fmt.Sprintf("pod-%02d", i), Address: fmt.Sprintf("10.0.0.%d:8081", i)}}
		if i == 30 || i == 35 {
			r.err = errors.New(strings.Repeat("x", 2000))
		}
		res = append(res, r)
	}
	st := PropagationStatus(cp, v1alpha1.CachePolicyStatus{}, accepted,
		&pushReport{Target: v1alpha1.PropagationTargetEndpointSlices, Service: nsKey("sys", "s"), Results: res}, metav1.Now())
	p := st.Propagation
	if p.ReadyServers != 40 || p.AcknowledgedServers != 38 || len(p.Servers) != v1alpha1.MaxPropagationServers {
		t.Fatalf("counts %d/%d, %d listed", p.AcknowledgedServers, p.ReadyServers, len(p.Servers))
	}
	if p.Servers[0].Name != "pod-30" || p.Servers[1].Name != "pod-35" || p.Servers[2].Name != "pod-00" || len(p.Servers[0].Error) > maxErrorLen {
		t.Fatalf("order or error bound: %+v", p.Servers[:3])
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionPropagated); len(c.Message) > 2*maxErrorLen || !strings.Contains(c.Message, "and 1 more") {
		t.Fatalf("message %d bytes: %q", len(c.Message), c.Message)
	}
	if got := truncate("aé"+strings.Repeat("é", 10), 6); got != "aé…" {
		t.Fatalf("truncate cut a rune: %q", got)
	}
}

// TestPolicyPropagatorFanOut runs passes of the PolicyPropagator against
// three HTTP servers on 127.0.0.1 listed by EndpointSlices: each gets the
// body, one refusing turns Propagated False (a Warning Event) while Accepted
// stays True, and its recovery turns it True (a Normal Event). Ready-only and
// the fallback to the address are covered by TestDiscoverFallsBackToAddress.
func TestPolicyPropagatorFanOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var refuse atomic.Bool // read by server 1's handler, set by the test
	// got[i] is the last body server i accepted, stored by its handler, read
	// by the test.
	var got [3]atomic.Pointer[policy.Body]
	var slices []client.Object
	for i := range got {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if i == 1 && refuse.Load() {
				http.Error(w, "refusing for the test", http.StatusServiceUnavailable)
				return
			}
			b, err := policy.Decode(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			got[i].Store(b)
			w.WriteHeader(http.StatusNoContent)
		}))
		defer s.Close()
		u, _ := url.Parse(s.URL)
		var p int32
		fmt.Sscan(u.Port(), &p)
		es := slice(fmt.Sprintf("s%d", i), discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("internal", p, corev1.ProtocolTCP)},
			endpoint(fmt.Sprintf("pod-%d", i), ptr(true), u.Hostname()))
		slices = append(slices, &es)
	}
	cp := &v1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Generation: 1}, Spec: v1alpha1.CachePolicySpec{Eviction: "LFU"}}
	c := fake.NewClientBuilder().WithScheme(discoveryScheme(t)).WithObjects(append(slices, cp)...).
		WithStatusSubresource(&v1alpha1.CachePolicy{}).Build()
	rec := events.NewFakeRecorder(10)
	prop := &PolicyPropagator{Policies: c, Tenants: c, Status: c, Recorder: rec, Interval: time.Minute,
		Server:  &ServerClient{BaseURL: "http://server.sys.svc:8081", HTTP: &http.Client{Timeout: 5 * time.Second}},
		Servers: ServerDiscovery{Slices: c, Service: nsKey("sys", "server")}}
	pass := func(wantErr bool) v1alpha1.CachePolicyStatus {
		t.Helper()
		res, err := prop.Reconcile(ctx, PropagationKey)
		if (err != nil) != wantErr || !wantErr && res.RequeueAfter != time.Minute {
			t.Fatalf("pass: %+v, %v (want error %v)", res, err, wantErr)
		}
		var now v1alpha1.CachePolicy
		if err := c.Get(ctx, client.ObjectKeyFromObject(cp), &now); err != nil {
			t.Fatal(err)
		}
		if a := meta.FindStatusCondition(now.Status.Conditions, v1alpha1.ConditionAccepted); a == nil || a.Status != metav1.ConditionTrue {
			t.Fatalf("Accepted %+v, want True whatever the push did", a)
		}
		return now.Status
	}
	event := func(want string) {
		t.Helper()
		select {
		case e := <-rec.Events:
			if !strings.HasPrefix(e, want) {
				t.Fatalf("event %q, want %q...", e, want)
			}
		default:
			t.Fatalf("no event, want %q", want)
		}
	}

	st := pass(false)
	for i := range got {
		if b := got[i].Load(); b == nil || len(b.Policies) != 1 || b.Policies[0].Eviction != "lfu" {
			t.Fatalf("server %d got %+v", i, b)
		}
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionPropagated); c.Reason != v1alpha1.ReasonPropagated || st.Propagation.AcknowledgedServers != 3 {
		t.Fatalf("status %+v", st)
	}
	if len(rec.Events) != 0 {
		t.Fatalf("a first True announced: %q", <-rec.Events)
	}

	refuse.Store(true)
	st = pass(true)
	c1 := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionPropagated)
	if c1.Status != metav1.ConditionFalse || c1.Reason != v1alpha1.ReasonPartiallyPropagated || !strings.Contains(c1.Message, "refusing for the test") {
		t.Fatalf("condition %+v", c1)
	}
	event("Warning PartiallyPropagated")
	pass(true) // still failing: no new Event
	if len(rec.Events) != 0 {
		t.Fatalf("a repeated failure announced: %q", <-rec.Events)
	}

	refuse.Store(false)
	st = pass(false)
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionPropagated); c.Status != metav1.ConditionTrue || st.Propagation.AcknowledgedServers != 3 {
		t.Fatalf("status %+v", st)
	}
	event("Normal Propagated")
}

func TestTenantPropagationStatus(t *testing.T) {
	quota := func(ns, name, id string) v1alpha1.CacheTenant {
		q := int64(10)
		return v1alpha1.CacheTenant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 2},
			Spec: v1alpha1.CacheTenantSpec{TenantID: id, Quota: &v1alpha1.CacheTenantQuota{MaxIndexEntries: &q}}}
	}
	owner, shadowed := quota("a", "t", "acme"), quota("b", "t", "acme")
	plain := v1alpha1.CacheTenant{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p"}, Spec: v1alpha1.CacheTenantSpec{TenantID: "plain"}}
	res := ResolveTenants([]v1alpha1.CacheTenant{shadowed, plain, owner})
	svc := nsKey("sys", "server")
	refused := errors.New("HTTP 503: draining")
	f := func(ten *v1alpha1.CacheTenant, st v1alpha1.CacheTenantStatus, rep *pushReport, status metav1.ConditionStatus, reason, fragment string) v1alpha1.CacheTenantStatus {
		t.Helper()
		got := TenantPropagationStatus(ten, st, res, rep)
		c := meta.FindStatusCondition(got.Conditions, v1alpha1.ConditionPropagated)
		switch {
		case status == "" && c != nil:
			t.Errorf("%s/%s: unexpected %+v", ten.Namespace, ten.Name, c)
		case status != "" && (c == nil || c.Status != status || c.Reason != reason || !strings.Contains(c.Message, fragment) || c.ObservedGeneration != 2):
			t.Errorf("%s/%s: condition %+v, want %s/%s with %q", ten.Namespace, ten.Name, c, status, reason, fragment)
		}
		return got
	}
	failing := &pushReport{Target: v1alpha1.PropagationTargetEndpointSlices, Service: svc, Results: results(map[string]error{"a": refused})}
	st := f(&owner, v1alpha1.CacheTenantStatus{}, failing, metav1.ConditionFalse, v1alpha1.ReasonPushFailed, "draining")
	// No push this pass: the last outcome stays.
	st = f(&owner, st, nil, metav1.ConditionFalse, v1alpha1.ReasonPushFailed, "draining")
	partial := &pushReport{Target: v1alpha1.PropagationTargetEndpointSlices, Service: svc, Results: results(map[string]error{"a": nil, "b": refused})}
	st = f(&owner, st, partial, metav1.ConditionFalse, v1alpha1.ReasonPartiallyPropagated, "pod-b")
	ok := &pushReport{Target: v1alpha1.PropagationTargetEndpointSlices, Service: svc, Results: results(map[string]error{"a": nil, "b": nil})}
	st = f(&owner, st, ok, metav1.ConditionTrue, v1alpha1.ReasonPropagated, "generation 2")
	// Not pushed (shadowed, or without a quota): no condition, and a stale
	// one is removed.
	f(&shadowed, st, ok, "", "", "")
	f(&plain, v1alpha1.CacheTenantStatus{}, ok, "", "", "")
	if !res.Pushed(&owner) || res.Pushed(&shadowed) || res.Pushed(&plain) {
		t.Error("Pushed")
	}
}
