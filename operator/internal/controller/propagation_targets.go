package controller

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// This file finds the routing servers a propagation pass pushes to (every
// ready endpoint of the server Service, from its EndpointSlices, or the
// configured address when those cannot be read) and pushes to them.

// RBAC: the EndpointSlices of the server Service, listed and watched through
// a cache restricted to its namespace and its kubernetes.io/service-name
// label. A Role in the namespace the server runs in (the one of
// operator/config), not a ClusterRole.
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=list;watch,namespace=inferencecache-system
//
// The server Service itself is read (get) on each pass to name the port the
// server address targets.
// +kubebuilder:rbac:groups="",resources=services,verbs=get,namespace=inferencecache-system

// DefaultServerPortName is the name of the server Service's port of the
// internal listener (/policy, :8081) in operator/config/server, used when
// the Service cannot be read.
const DefaultServerPortName = "internal"

// maxConcurrentPushes bounds the /policy requests in flight in one pass.
const maxConcurrentPushes = 8

// serverTarget is one routing server a pass pushes the policy to.
type serverTarget struct {
	// Name is the server pod (the endpoint's targetRef) or, without one,
	// Address.
	Name string
	// Address is host:port.
	Address string
	// URL is the base URL: the configured address's scheme and Address.
	URL string
}

// ServerDiscovery finds the routing servers to push the policy to.
type ServerDiscovery struct {
	// Slices reads the EndpointSlices of Service; nil pushes to the
	// configured address only.
	Slices client.Reader
	// Services reads the Service (a live reader: one get per pass); nil
	// means PortName or DefaultServerPortName.
	Services client.Reader
	// Service is the server Service.
	Service types.NamespacedName
	// PortName is the name of the Service port, and so of the EndpointSlice
	// port, of the server's internal listener. "" means the name of the
	// Service's port whose number is the server address's port, or, when
	// the Service cannot be read or has no such port, DefaultServerPortName.
	PortName string
}

// serverSet is what one discovery found.
type serverSet struct {
	// target is v1alpha1.PropagationTargetEndpointSlices or
	// v1alpha1.PropagationTargetAddress.
	target string
	// servers are the servers to push to, sorted by name. Empty with
	// target EndpointSlices when the Service has no ready endpoint.
	servers []serverTarget
	// why says, with target Address, why the pods were not enumerated.
	why string
}

// discover lists the Service's EndpointSlices and returns its ready
// endpoints. When the slices cannot be read (no Service configured, an
// error such as RBAC refusing the list, no slice, no slice with the port)
// it returns the configured address base instead.
func (d *ServerDiscovery) discover(ctx context.Context, base string) serverSet {
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		// The push to it fails and says why; there is nothing to enumerate.
		return serverSet{target: v1alpha1.PropagationTargetAddress, servers: []serverTarget{{Name: base, Address: base, URL: base}}, why: "the server address is not a URL"}
	}
	fallback := func(why string) serverSet {
		return serverSet{target: v1alpha1.PropagationTargetAddress, servers: []serverTarget{{Name: u.Host, Address: u.Host, URL: base}}, why: why}
	}
	if d.Slices == nil || d.Service.Name == "" {
		return fallback("no server Service is configured")
	}
	var list discoveryv1.EndpointSliceList
	if err := d.Slices.List(ctx, &list, client.InNamespace(d.Service.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: d.Service.Name}); err != nil {
		return fallback(fmt.Sprintf("cannot list the EndpointSlices of Service %s: %v", nsName(d.Service), err))
	}
	if len(list.Items) == 0 {
		return fallback(fmt.Sprintf("Service %s has no EndpointSlice", nsName(d.Service)))
	}
	port := d.portName(ctx, u)
	servers, ok := readyServers(list.Items, port, u.Scheme)
	if !ok {
		return fallback(fmt.Sprintf("no EndpointSlice of Service %s has a TCP port named %q", nsName(d.Service), port))
	}
	return serverSet{target: v1alpha1.PropagationTargetEndpointSlices, servers: servers}
}

// portName is the name of the EndpointSlice port to push to: PortName, or
// the name of the server Service's port that the address u targets (its port
// number, or 80 / 443 by scheme), or DefaultServerPortName.
func (d *ServerDiscovery) portName(ctx context.Context, u *url.URL) string {
	if d.PortName != "" || d.Services == nil {
		return cmp.Or(d.PortName, DefaultServerPortName)
	}
	want := u.Port()
	if want == "" {
		want = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	var svc corev1.Service
	if err := d.Services.Get(ctx, d.Service, &svc); err != nil {
		return DefaultServerPortName
	}
	for _, p := range svc.Spec.Ports {
		if fmt.Sprint(p.Port) == want && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
			return p.Name // "" for the only port of a single-port Service, as in its slices
		}
	}
	return DefaultServerPortName
}

// readyServers picks the servers from the EndpointSlices of the server
// Service: every ready endpoint (a nil ready condition counts as ready, as
// the API documents) with an IP address, in a slice with a TCP port named
// portName, at that port. A pod listed twice (a dual-stack pod has a slice
// per address family; a pod moving between slices may briefly be in both)
// is pushed to once, at the first of its addresses in (addressType, address)
// order. ok is false when no slice has the port. The result is sorted by
// name.
func readyServers(items []discoveryv1.EndpointSlice, portName, scheme string) (servers []serverTarget, ok bool) {
	sorted := make([]*discoveryv1.EndpointSlice, len(items))
	for i := range items {
		sorted[i] = &items[i]
	}
	slices.SortFunc(sorted, func(a, b *discoveryv1.EndpointSlice) int {
		return cmp.Or(cmp.Compare(a.AddressType, b.AddressType), cmp.Compare(a.Name, b.Name))
	})
	seen := map[string]bool{} // by name: a pod is pushed to once
	for _, s := range sorted {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue // FQDN endpoints name no pod
		}
		port := slicePort(s, portName)
		if port == 0 {
			continue
		}
		ok = true
		for i := range s.Endpoints {
			ep := &s.Endpoints[i]
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready || len(ep.Addresses) == 0 {
				continue
			}
			addrs := slices.Clone(ep.Addresses)
			slices.Sort(addrs)
			addr := net.JoinHostPort(addrs[0], fmt.Sprint(port))
			name := addr
			if r := ep.TargetRef; r != nil && r.Kind == "Pod" && r.Name != "" {
				name = r.Name
			}
			if seen[name] {
				continue
			}
			seen[name] = true
			servers = append(servers, serverTarget{Name: name, Address: addr, URL: scheme + "://" + addr})
		}
	}
	slices.SortFunc(servers, func(a, b serverTarget) int { return cmp.Compare(a.Name, b.Name) })
	return servers, ok
}

// slicePort is the number of the TCP port named name in s, or 0.
func slicePort(s *discoveryv1.EndpointSlice, name string) int32 {
	for _, p := range s.Ports {
		if p.Name == nil || *p.Name != name || p.Port == nil {
			continue
		}
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		return *p.Port
	}
	return 0
}

// ServiceFromURL names the Service an in-cluster server address points at,
// http://NAME.NAMESPACE.svc[.cluster domain][:port]. ok is false for any
// other host (an IP address, a bare or two-label name), which leaves the
// controller pushing to the address only.
func ServiceFromURL(raw string) (svc types.NamespacedName, ok bool) {
	u, err := url.Parse(raw)
	if err != nil {
		return svc, false
	}
	labels := strings.Split(strings.TrimSuffix(u.Hostname(), "."), ".")
	if len(labels) < 3 || labels[2] != "svc" {
		return svc, false
	}
	if len(validation.IsDNS1035Label(labels[0])) > 0 || len(validation.IsDNS1123Label(labels[1])) > 0 {
		return svc, false
	}
	return types.NamespacedName{Namespace: labels[1], Name: labels[0]}, true
}

// pushResult is the outcome of the push to one server.
type pushResult struct {
	server serverTarget
	// err is why the server did not take the pass's policy (nil: it did,
	// maybe without the version-8 lists, see refused).
	err error
	// refused is the server's refusal of the version-8 body when it then
	// took the version-7 fallback; nil otherwise.
	refused error
}

// pushAll pushes raw to every server, at most maxConcurrentPushes at a time;
// each request is bounded by the ServerClient's timeout and ctx. A server
// that refuses raw with HTTP 400 is sent fallback once when it is non-nil
// (the version-7 body, for a server that predates version 8). The results
// are in the order of servers.
func pushAll(ctx context.Context, c *ServerClient, servers []serverTarget, raw, fallback []byte) []pushResult {
	res := make([]pushResult, len(servers))
	sem := make(chan struct{}, maxConcurrentPushes)
	var wg sync.WaitGroup
	for i := range servers {
		res[i].server = servers[i]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			// Each goroutine writes only its own element.
			err := c.PushPolicyTo(ctx, servers[i].URL, raw)
			if err != nil && fallback != nil && refusedBody(err) {
				if err7 := c.PushPolicyTo(ctx, servers[i].URL, fallback); err7 != nil {
					err = fmt.Errorf("%w; the version-7 fallback failed too: %w", err, err7)
				} else {
					res[i].refused, err = err, nil
				}
			}
			res[i].err = err
		})
	}
	wg.Wait()
	return res
}
