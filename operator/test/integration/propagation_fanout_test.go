package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/inferencecache/inferencecache/controlserver/auth"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	"github.com/inferencecache/inferencecache/policy"
)

// serverService is the server Service of the suite's controller
// (controller.Options.ServerService). It has no EndpointSlice except while
// TestPropagationFanOut runs, so every other test's pushes go to srv's
// address (the controller's fallback).
const serverService = "inferencecache-server"

// testNet is where the fan-out test's server pods "live". The apiserver
// refuses loopback addresses in an EndpointSlice, so the slices list
// addresses of TEST-NET-1 (RFC 5737, never routed) and the controller's
// transport (testNetTransport) dials 127.0.0.1 at the same port instead:
// the pushes are real HTTP requests to the real in-process servers, and all
// traffic stays on 127.0.0.1.
var testNet = netip.MustParsePrefix("192.0.2.0/24")

// testNetTransport is the suite controller's HTTP transport: an address in
// testNet is dialed on 127.0.0.1 at the same port; any other as given.
func testNetTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	d := &net.Dialer{Timeout: 2 * time.Second}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if ap, err := netip.ParseAddrPort(addr); err == nil && testNet.Contains(ap.Addr()) {
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ap.Port())))
		}
		return d.DialContext(ctx, network, addr)
	}
	return tr
}

// fanoutManagedBy marks the EndpointSlices the test writes (envtest runs no
// endpoint controller).
const fanoutManagedBy = "propagation-fanout-test"

// TestPropagationFanOut: with the server Service's EndpointSlices listing
// two ready server pods (two real in-process servers on 127.0.0.1), both get
// the policy and status.propagation lists each; a third pod gets it within
// half a tick of its slice appearing (the EndpointSlice watch); a server
// refusing the push turns Propagated False with its error
// (PartiallyPropagated, a Warning Event, its pushedGeneration stays behind)
// and True again once it acknowledges (a Normal Event); a server that is down
// likewise, and a restarted one gets the policy again; Accepted stays True
// throughout; without slices the push goes back to the configured address.
// The slice port pushed to is the one named like the Service port the
// address targets (not the default name), and a not-ready endpoint gets
// nothing.
func TestPropagationFanOut(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "prop-fanout", false)

	servers := map[string]*testServer{}
	for _, name := range []string{"server-a", "server-b", "server-c"} {
		s := newTestServer(auth.ReviewerFromClientset(clientset))
		wantOK(t, "start "+name, s.start())
		t.Cleanup(s.stop)
		servers[name] = s
	}
	// The Service's port that the controller's server address targets (srv's
	// port number) is named "control", not the default "internal": the
	// controller must take the slice port's name from the Service.
	_, srvPort, err := net.SplitHostPort(srv.addr)
	wantOK(t, "split address", err)
	sp, err := strconv.Atoi(srvPort)
	wantOK(t, "parse port", err)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: controllerNS, Name: serverService},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app.kubernetes.io/name": serverService},
			Ports: []corev1.ServicePort{
				{Name: "grpc", Port: 9090, TargetPort: intstr.FromString("grpc")},
				{Name: "control", Port: int32(sp), TargetPort: intstr.FromString("control")},
			},
		},
	}
	wantOK(t, "create Service", k8s.Create(ctx, svc))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = k8s.DeleteAllOf(ctx, &discoveryv1.EndpointSlice{}, client.InNamespace(controllerNS),
			client.MatchingLabels{discoveryv1.LabelManagedBy: fanoutManagedBy})
		_ = k8s.Delete(ctx, svc)
	})
	// Each server's pod address: its own TEST-NET-1 address, at the port it
	// listens on 127.0.0.1.
	podIP := map[string]string{"server-a": "192.0.2.1", "server-b": "192.0.2.2", "server-c": "192.0.2.3"}
	addSlice := func(name string, extra ...discoveryv1.Endpoint) {
		t.Helper()
		_, port, err := net.SplitHostPort(servers[name].addr)
		wantOK(t, "split address", err)
		p, err := strconv.Atoi(port)
		wantOK(t, "parse port", err)
		host := podIP[name]
		es := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: controllerNS, Name: serverService + "-" + name, Labels: map[string]string{
				discoveryv1.LabelServiceName: serverService, discoveryv1.LabelManagedBy: fanoutManagedBy,
			}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: append([]discoveryv1.Endpoint{{
				Addresses:  []string{host},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: controllerNS, Name: name},
			}}, extra...),
			Ports: []discoveryv1.EndpointPort{
				// Not the port the Service maps the server address to: never pushed to.
				{Name: ptr("grpc"), Port: ptr(int32(1)), Protocol: ptr(corev1.ProtocolTCP)},
				{Name: ptr("internal"), Port: ptr(int32(2)), Protocol: ptr(corev1.ProtocolTCP)},
				{Name: ptr("control"), Port: ptr(int32(p)), Protocol: ptr(corev1.ProtocolTCP)},
			},
		}
		wantOK(t, "create EndpointSlice for "+name, k8s.Create(ctx, es))
	}
	// server-a's slice also lists a pod that is not ready: it gets nothing.
	notReady := discoveryv1.Endpoint{
		Addresses:  []string{"192.0.2.99"},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(false)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: controllerNS, Name: "server-not-ready"},
	}
	addSlice("server-a", notReady)
	addSlice("server-b")

	cp := policyObj(ns, "policy", func(s *v1alpha1.CachePolicySpec) { s.Eviction = "LFU" })
	wantOK(t, "create policy", k8s.Create(ctx, cp))
	for _, name := range []string{"server-a", "server-b"} {
		waitServerTenant(t, servers[name], name, ns, func(g *policy.Tenant) bool { return g.HasPolicy && g.Eviction == policy.LFU })
	}
	waitPropagation(t, ctx, cp, "both pods acknowledged generation 1", func(p propagationView) error {
		return p.want(v1alpha1.ReasonPropagated, map[string]int64{"server-a": 1, "server-b": 1})
	})

	// A third ready pod: pushed to as soon as its slice appears (the
	// EndpointSlice watch triggers a pass; measured 14-36 ms here). The slice
	// is created just after a periodic pass pushed to server-a, so the next
	// periodic pass is about a tick away: without the watch server-c would
	// wait that long, which the bound of half a tick tells apart.
	waitNextPush(t, servers["server-a"], tick+3*time.Second)
	start := time.Now()
	addSlice("server-c")
	deadline := start.Add(tick / 2)
	for !servers["server-c"].tenant(ns).HasPolicy {
		if time.Now().After(deadline) {
			t.Fatalf("server-c has no policy %s after its EndpointSlice appeared, want within half a tick (%s): the EndpointSlice watch should trigger a pass", time.Since(start), tick/2)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("new server pod got the policy %s after its EndpointSlice was created (tick %s)", time.Since(start).Round(time.Millisecond), tick)
	waitPropagation(t, ctx, cp, "three pods", func(p propagationView) error {
		return p.want(v1alpha1.ReasonPropagated, map[string]int64{"server-a": 1, "server-b": 1, "server-c": 1})
	})

	// server-b refuses: Propagated False with its error; a new generation
	// reaches the others while server-b stays at the old one.
	const refusal = "server-b is draining (test refusal)"
	servers["server-b"].refuse.Store(ptr(refusal))
	wantOK(t, "update policy", update(ctx, cp, func(cp *v1alpha1.CachePolicy) { cp.Spec.Eviction = "LRU" }))
	for _, name := range []string{"server-a", "server-c"} {
		waitServerTenant(t, servers[name], name, ns, func(g *policy.Tenant) bool { return g.HasPolicy && g.Eviction == policy.LRU })
	}
	waitPropagation(t, ctx, cp, "server-b refusing", func(p propagationView) error {
		if err := p.want(v1alpha1.ReasonPartiallyPropagated, map[string]int64{"server-a": 2, "server-b": 1, "server-c": 2}); err != nil {
			return err
		}
		if !strings.Contains(p.propagated.Message, refusal) || !strings.Contains(p.propagated.Message, "2 of 3") {
			return fmt.Errorf("Propagated message %q does not carry the server's error", p.propagated.Message)
		}
		first := p.status.Propagation.Servers[0]
		if first.Name != "server-b" || !strings.Contains(first.Error, refusal) || first.FailingSince == nil {
			return fmt.Errorf("failing server not listed first with its error: %+v", first)
		}
		return nil
	})
	if g := servers["server-b"].tenant(ns); g.Eviction != policy.LFU {
		t.Fatalf("refusing server applied the new policy: %+v", *g)
	}
	waitPolicyEvent(t, ctx, ns, cp.Name, corev1.EventTypeWarning, v1alpha1.ReasonPartiallyPropagated, refusal)

	// server-b acknowledges again: Propagated True, every pod at generation 2.
	servers["server-b"].refuse.Store(nil)
	waitServerTenant(t, servers["server-b"], "server-b", ns, func(g *policy.Tenant) bool { return g.HasPolicy && g.Eviction == policy.LRU })
	waitPropagation(t, ctx, cp, "server-b back", func(p propagationView) error {
		return p.want(v1alpha1.ReasonPropagated, map[string]int64{"server-a": 2, "server-b": 2, "server-c": 2})
	})
	waitPolicyEvent(t, ctx, ns, cp.Name, corev1.EventTypeNormal, v1alpha1.ReasonPropagated, "all 3 ready server pods")

	// server-c is down (its endpoint still listed ready): False with the
	// transport error; back with an empty store, it is pushed to again.
	servers["server-c"].stop()
	waitPropagation(t, ctx, cp, "server-c down", func(p propagationView) error {
		if err := p.want(v1alpha1.ReasonPartiallyPropagated, map[string]int64{"server-a": 2, "server-b": 2, "server-c": 2}, "server-c"); err != nil {
			return err
		}
		if first := p.status.Propagation.Servers[0]; first.Name != "server-c" || !strings.Contains(first.Error, "connection refused") {
			return fmt.Errorf("down server not listed first with its error: %+v", first)
		}
		return nil
	})
	wantOK(t, "restart server-c", servers["server-c"].restart())
	waitServerTenant(t, servers["server-c"], "server-c", ns, func(g *policy.Tenant) bool { return g.HasPolicy && g.Eviction == policy.LRU })
	waitPropagation(t, ctx, cp, "server-c back", func(p propagationView) error {
		return p.want(v1alpha1.ReasonPropagated, map[string]int64{"server-a": 2, "server-b": 2, "server-c": 2})
	})

	// Without EndpointSlices the controller pushes to the configured address
	// again (srv), and says so.
	wantOK(t, "delete EndpointSlices", k8s.DeleteAllOf(ctx, &discoveryv1.EndpointSlice{}, client.InNamespace(controllerNS),
		client.MatchingLabels{discoveryv1.LabelManagedBy: fanoutManagedBy}))
	waitTenant(t, ns, "fallback to the address", func(g *policy.Tenant) bool { return g.HasPolicy && g.Eviction == policy.LRU })
	waitPropagation(t, ctx, cp, "fallback", func(p propagationView) error {
		return p.want(v1alpha1.ReasonAddressAcknowledged, map[string]int64{srv.addr: 2})
	})
}

// propagationView is a CachePolicy's status as the fan-out test checks it.
type propagationView struct {
	status     v1alpha1.CachePolicyStatus
	generation int64
	propagated metav1.Condition
}

// want checks that the policy is Accepted, Propagated has reason and the
// current generation, and status.propagation lists exactly the servers of
// gens, each at its pushed generation, acknowledged unless behind or named
// in failing.
func (p propagationView) want(reason string, gens map[string]int64, failing ...string) error {
	acc := meta.FindStatusCondition(p.status.Conditions, v1alpha1.ConditionAccepted)
	if acc == nil || acc.Status != metav1.ConditionTrue {
		return fmt.Errorf("accepted condition %+v, want True", acc) // never expected while waiting: see waitPropagation
	}
	if p.propagated.Reason != reason || p.propagated.ObservedGeneration != p.generation {
		return fmt.Errorf("propagated %+v, want reason %s at generation %d", p.propagated, reason, p.generation)
	}
	wantStatus := metav1.ConditionTrue
	if reason == v1alpha1.ReasonPartiallyPropagated || reason == v1alpha1.ReasonPushFailed {
		wantStatus = metav1.ConditionFalse
	}
	if p.propagated.Status != wantStatus {
		return fmt.Errorf("propagated %+v, want status %s", p.propagated, wantStatus)
	}
	prop := p.status.Propagation
	if prop == nil || int(prop.ReadyServers) != len(gens) || len(prop.Servers) != len(gens) {
		return fmt.Errorf("propagation %+v, want %d servers", prop, len(gens))
	}
	acked := int32(0)
	for _, s := range prop.Servers {
		g, ok := gens[s.Name]
		if !ok || s.PushedGeneration != g || s.AcknowledgedTime == nil {
			return fmt.Errorf("server %+v, want one of %v", s, gens)
		}
		if (s.Error == "") != (g == p.generation && !slices.Contains(failing, s.Name)) {
			return fmt.Errorf("server %+v: error iff behind generation %d or failing %v", s, p.generation, failing)
		}
		if s.Error == "" {
			acked++
		}
	}
	if prop.AcknowledgedServers != acked {
		return fmt.Errorf("acknowledgedServers %d, want %d", prop.AcknowledgedServers, acked)
	}
	return nil
}

// waitPropagation waits until check accepts the policy's status. Accepted
// must be True on every read: a failed push never touches it.
func waitPropagation(t *testing.T, ctx context.Context, cp *v1alpha1.CachePolicy, what string, check func(propagationView) error) {
	t.Helper()
	eventually(t, propagationLimit, func() error {
		var got v1alpha1.CachePolicy
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(cp), &got); err != nil {
			return err
		}
		if acc := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionAccepted); acc != nil && acc.Status != metav1.ConditionTrue {
			t.Fatalf("%s: Accepted %+v, want True throughout", what, acc)
		}
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionPropagated)
		if c == nil {
			return fmt.Errorf("%s: no Propagated condition in %+v", what, got.Status)
		}
		if err := check(propagationView{status: got.Status, generation: got.Generation, propagated: *c}); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
}

// waitNextPush returns as soon as s acknowledges another push, polling
// every millisecond for at most limit.
func waitNextPush(t *testing.T, s *testServer, limit time.Duration) {
	t.Helper()
	before := s.pushes.Load()
	deadline := time.Now().Add(limit)
	for s.pushes.Load() == before {
		if time.Now().After(deadline) {
			t.Fatalf("no push within %s", limit)
		}
		time.Sleep(time.Millisecond)
	}
}

func waitServerTenant(t *testing.T, s *testServer, name, id string, ok func(*policy.Tenant) bool) {
	t.Helper()
	eventually(t, propagationLimit, func() error {
		if got := s.tenant(id); !ok(got) {
			return fmt.Errorf("%s has %+v for %q", name, *got, id)
		}
		return nil
	})
}

func waitPolicyEvent(t *testing.T, ctx context.Context, ns, regarding, typ, reason, fragment string) {
	t.Helper()
	eventually(t, propagationLimit, func() error {
		var evs eventsv1.EventList
		if err := k8s.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == regarding && e.Type == typ && e.Reason == reason && strings.Contains(e.Note, fragment) {
				return nil
			}
		}
		return fmt.Errorf("no %s %s event on %s/%s containing %q among %d events", typ, reason, ns, regarding, fragment, len(evs.Items))
	})
}

// TestPropagationSlicesForbidden: a controller whose RBAC does not grant the
// server Service's EndpointSlices (its Role is in another namespace) still
// starts, and pushes to the configured address. (A watch of slices it may
// not list would keep it from starting.)
func TestPropagationSlicesForbidden(t *testing.T) {
	ctx := needEnv(t)
	applyRBAC(t, ctx) // the Role for EndpointSlices is in controllerNS, not in "elsewhere"
	ns := namespace(t, ctx, "prop-forbidden", false)
	wantOK(t, "create policy", k8s.Create(ctx, policyObj(ns, "policy", func(s *v1alpha1.CachePolicySpec) { s.Eviction = "LFU" })))

	own := newTestServer(auth.ReviewerFromClientset(clientset))
	wantOK(t, "start server", own.start())
	t.Cleanup(own.stop)
	mgr, err := ctrl.NewManager(impersonated(cfg), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr(true)}, // the suite's manager runs controllers of the same names
	})
	wantOK(t, "manager", err)
	wantOK(t, "setup", controller.Setup(mgr, controller.Options{
		Server: &controller.ServerClient{
			BaseURL:         "http://" + own.addr,
			PolicyTokenPath: filepath.Join(tokenDir, "policy"),
			HTTP:            &http.Client{Timeout: 2 * time.Second},
		},
		PushInterval:    tick,
		DisableSnapshot: true,
		ServerService:   types.NamespacedName{Namespace: "elsewhere", Name: serverService},
	}))
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			wantOK(t, "manager", err)
		case <-time.After(30 * time.Second):
			t.Error("manager did not stop within 30 s")
		}
	}()
	waitServerTenant(t, own, "the configured address", ns, func(g *policy.Tenant) bool { return g.HasPolicy && g.Eviction == policy.LFU })
}
