package controller

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

func TestServiceFromURL(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want types.NamespacedName
		ok   bool
	}{
		{"http://inferencecache-server.inferencecache-system.svc:8081", nsKey("inferencecache-system", "inferencecache-server"), true},
		{"http://srv.team-a.svc.cluster.local:8081/", nsKey("team-a", "srv"), true},
		{"https://srv.team-a.svc.example.org.", nsKey("team-a", "srv"), true},
		{"http://127.0.0.1:8081", types.NamespacedName{}, false},
		{"http://[::1]:8081", types.NamespacedName{}, false},
		{"http://srv:8081", types.NamespacedName{}, false},
		{"http://srv.team-a:8081", types.NamespacedName{}, false},
		{"http://srv.team-a.cluster.local:8081", types.NamespacedName{}, false},
		{"http://1srv.team-a.svc:8081", types.NamespacedName{}, false}, // not a Service name (DNS-1035)
		{"http://srv.Team_A.svc:8081", types.NamespacedName{}, false},
		{"::not a url", types.NamespacedName{}, false},
	} {
		got, ok := ServiceFromURL(tc.url)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ServiceFromURL(%q) = %v, %v; want %v, %v", tc.url, got, ok, tc.want, tc.ok)
		}
	}
}

// endpoint is a slice endpoint of pod (none when ""), with ready nil, true
// or false.
func endpoint(pod string, ready *bool, addrs ...string) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
	if pod != "" {
		ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: pod}
	}
	return ep
}

func slice(name string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
	return discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "sys", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "server"}},
		AddressType: at, Ports: ports, Endpoints: eps,
	}
}

func port(name string, n int32, proto corev1.Protocol) discoveryv1.EndpointPort {
	p := discoveryv1.EndpointPort{Name: &name, Port: &n}
	if proto != "" {
		p.Protocol = &proto
	}
	return p
}

func TestReadyServers(t *testing.T) {
	internal := []discoveryv1.EndpointPort{port("grpc", 9090, corev1.ProtocolTCP), port("internal", 8081, "")}
	items := []discoveryv1.EndpointSlice{
		slice("s-v6", discoveryv1.AddressTypeIPv6, internal,
			endpoint("pod-b", ptr(true), "fd00::2")), // dual-stack: pod-b's IPv4 address wins
		slice("s-v4-2", discoveryv1.AddressTypeIPv4, internal,
			endpoint("pod-c", nil, "10.0.0.3"),        // nil ready counts as ready
			endpoint("pod-d", ptr(false), "10.0.0.4"), // not ready
			endpoint("", ptr(true), "10.0.0.9"),       // no targetRef: named by its address
			endpoint("pod-e", ptr(true)),              // no address
			endpoint("pod-a", ptr(true), "10.0.0.1")), // also in s-v4-1: pushed once
		slice("s-v4-1", discoveryv1.AddressTypeIPv4, internal,
			endpoint("pod-b", ptr(true), "10.0.0.2"),
			endpoint("pod-a", ptr(true), "10.0.0.11", "10.0.0.1")), // first address in order
		slice("s-fqdn", discoveryv1.AddressTypeFQDN, internal, endpoint("pod-f", ptr(true), "f.example")),
		slice("s-udp", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("internal", 8081, corev1.ProtocolUDP)},
			endpoint("pod-g", ptr(true), "10.0.0.7")),
		slice("s-v6-only", discoveryv1.AddressTypeIPv6, internal, endpoint("pod-h", nil, "fd00::8")),
	}
	got, ok := readyServers(items, "internal", "http")
	want := []serverTarget{
		{Name: "10.0.0.9:8081", Address: "10.0.0.9:8081", URL: "http://10.0.0.9:8081"},
		{Name: "pod-a", Address: "10.0.0.1:8081", URL: "http://10.0.0.1:8081"},
		{Name: "pod-b", Address: "10.0.0.2:8081", URL: "http://10.0.0.2:8081"},
		{Name: "pod-c", Address: "10.0.0.3:8081", URL: "http://10.0.0.3:8081"},
		{Name: "pod-h", Address: "[fd00::8]:8081", URL: "http://[fd00::8]:8081"},
	}
	if !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("readyServers = %v, %+v\nwant %+v", ok, got, want)
	}
	if got, ok := readyServers(items, "admin", "http"); ok || len(got) != 0 {
		t.Fatalf("no slice has port admin: got %v, %+v", ok, got)
	}
	// A slice with the port and no ready endpoint: found, nothing to push to.
	if got, ok := readyServers([]discoveryv1.EndpointSlice{slice("s", discoveryv1.AddressTypeIPv4, internal,
		endpoint("pod-x", ptr(false), "10.0.0.1"))}, "internal", "https"); !ok || len(got) != 0 {
		t.Fatalf("no ready endpoint: got %v, %+v", ok, got)
	}
}

func discoveryScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDiscoverFallsBackToAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const base = "http://server.sys.svc:8081"
	address := []serverTarget{{Name: "server.sys.svc:8081", Address: "server.sys.svc:8081", URL: base}}
	sc := discoveryScheme(t)
	internal := []discoveryv1.EndpointPort{port("internal", 8081, corev1.ProtocolTCP)}
	other := slice("other", discoveryv1.AddressTypeIPv4, internal, endpoint("x", nil, "10.9.9.9"))
	other.Labels[discoveryv1.LabelServiceName] = "other-service"
	forbidden := fake.NewClientBuilder().WithScheme(sc).WithInterceptorFuncs(interceptor.Funcs{
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", errors.New("RBAC"))
		},
	}).Build()
	svc := nsKey("sys", "server")
	for _, tc := range []struct {
		name   string
		d      ServerDiscovery
		target string
		want   []serverTarget
	}{
		{"no service", ServerDiscovery{}, v1alpha1.PropagationTargetAddress, address},
		{"list refused", ServerDiscovery{Slices: forbidden, Service: svc}, v1alpha1.PropagationTargetAddress, address},
		{"no slice of the service", ServerDiscovery{Slices: fake.NewClientBuilder().WithScheme(sc).WithObjects(&other).Build(), Service: svc},
			v1alpha1.PropagationTargetAddress, address},
		{"no port of that name", ServerDiscovery{Slices: fake.NewClientBuilder().WithScheme(sc).WithObjects(
			ptr(slice("s", discoveryv1.AddressTypeIPv4, internal, endpoint("p", nil, "10.0.0.1")))).Build(), Service: svc, PortName: "admin"},
			v1alpha1.PropagationTargetAddress, address},
		{"slices", ServerDiscovery{Slices: fake.NewClientBuilder().WithScheme(sc).WithObjects(&other,
			ptr(slice("s", discoveryv1.AddressTypeIPv4, internal, endpoint("p", nil, "10.0.0.1")))).Build(), Service: svc},
			v1alpha1.PropagationTargetEndpointSlices, []serverTarget{{Name: "p", Address: "10.0.0.1:8081", URL: "http://10.0.0.1:8081"}}},
		{"no ready endpoint", ServerDiscovery{Slices: fake.NewClientBuilder().WithScheme(sc).WithObjects(
			ptr(slice("s", discoveryv1.AddressTypeIPv4, internal, endpoint("p", ptr(false), "10.0.0.1")))).Build(), Service: svc},
			v1alpha1.PropagationTargetEndpointSlices, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.d.discover(ctx, base)
			if got.target != tc.target || !reflect.DeepEqual(got.servers, tc.want) || (got.why == "") != (tc.target == v1alpha1.PropagationTargetEndpointSlices) {
				t.Fatalf("discover = %+v, want %s %+v", got, tc.target, tc.want)
			}
		})
	}
}

func TestDiscoverPortNameFromService(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "sys", Name: "server"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
		{Name: "grpc", Port: 9090},
		{Name: "udp-control", Port: 8081, Protocol: corev1.ProtocolUDP},
		{Name: "control", Port: 8081, Protocol: corev1.ProtocolTCP},
		{Name: "web", Port: 80},
	}}}
	ports := []discoveryv1.EndpointPort{port("control", 7001, ""), port("internal", 7002, ""), port("web", 7003, "")}
	sc := discoveryScheme(t)
	c := fake.NewClientBuilder().WithScheme(sc).WithObjects(svc,
		ptr(slice("s", discoveryv1.AddressTypeIPv4, ports, endpoint("p", nil, "10.0.0.1")))).Build()
	noService := fake.NewClientBuilder().WithScheme(sc).Build()
	single := fake.NewClientBuilder().WithScheme(sc).WithObjects(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "sys", Name: "server"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 8081}}},
	}, ptr(slice("s", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port("", 7000, "")}, endpoint("p", nil, "10.0.0.1")))).Build()
	for _, tc := range []struct {
		name, base, portName string
		slices, services     client.Reader
		want                 string
	}{
		{"single unnamed port", "http://server.sys.svc:8081", "", single, single, "10.0.0.1:7000"},
		{"by the address's port", "http://server.sys.svc:8081", "", c, c, "10.0.0.1:7001"},
		{"default http port", "http://server.sys.svc", "", c, c, "10.0.0.1:7003"},
		{"explicit name", "http://server.sys.svc:8081", "internal", c, c, "10.0.0.1:7002"},
		{"service not readable", "http://server.sys.svc:8081", "", c, noService, "10.0.0.1:7002"},
		{"no such service port", "http://server.sys.svc:9999", "", c, c, "10.0.0.1:7002"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := ServerDiscovery{Slices: tc.slices, Services: tc.services, Service: nsKey("sys", "server"), PortName: tc.portName}
			got := d.discover(ctx, tc.base)
			if got.target != v1alpha1.PropagationTargetEndpointSlices || len(got.servers) != 1 || got.servers[0].Address != tc.want {
				t.Fatalf("discover = %+v, want one server at %s", got, tc.want)
			}
		})
	}
}
