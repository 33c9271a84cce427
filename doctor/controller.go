package doctor

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// webhookDialTimeout bounds the TLS handshake with one webhook endpoint. Pod
// addresses are often unroutable from a workstation; the check must not eat
// the run's budget there.
const webhookDialTimeout = time.Second

// minLeaseSlack is the least time past renewTime+leaseDuration before a
// Lease counts as expired, for clock skew between the doctor and the
// leader.
const minLeaseSlack = 15 * time.Second

// checkController checks the controller's Deployment (IC280), its leader
// Lease (IC281), the webhook configurations' caBundles (IC282) and the
// Services their webhooks call (IC283). A read the doctor may not make is an
// IC202 WARN and its check is skipped.
func checkController(ctx context.Context, o *Options, fs *findings) {
	refs := o.Controller
	if refs.Deployment != "" {
		checkDeployment(ctx, o, refs, fs)
	}
	if refs.LeaderLease != "" {
		checkLease(ctx, o, refs, fs, time.Now())
	}
	checkWebhooks(ctx, o, fs)
}

// getErr reports a failed get that is not NotFound (the caller's case).
func getErr(o *Options, what string, err error, fs *findings) {
	if apierrors.IsForbidden(err) {
		fs.add(CodeForbidden, Warn, what, "cannot get: %s; its check was skipped", oneLine(err))
		return
	}
	fs.add(CodeClusterAPI, Fail, o.ClusterHost, "cannot get %s: %s", what, oneLine(err))
}

func checkDeployment(ctx context.Context, o *Options, refs *ControllerRefs, fs *findings) {
	obj := "deployment " + refs.Namespace + "/" + refs.Deployment
	var d appsv1.Deployment
	if err := o.Cluster.Get(ctx, types.NamespacedName{Namespace: refs.Namespace, Name: refs.Deployment}, &d); err != nil {
		if apierrors.IsNotFound(err) {
			fs.add(CodeControllerDeploy, Fail, obj, "not found: no controller runs (no policy push, no status, no webhook server)")
			return
		}
		getErr(o, obj, err, fs)
		return
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	avail := d.Status.AvailableReplicas
	switch {
	case want == 0:
		fs.add(CodeControllerDeploy, Fail, obj, "scaled to 0 replicas")
	case avail == 0:
		fs.add(CodeControllerDeploy, Fail, obj, "0 of %d replicas available (%d ready, %d updated)", want, d.Status.ReadyReplicas, d.Status.UpdatedReplicas)
	case avail < want:
		fs.add(CodeControllerDeploy, Warn, obj, "%d of %d replicas available (%d ready, %d updated): no standby leader or webhook server", avail, want, d.Status.ReadyReplicas, d.Status.UpdatedReplicas)
	default:
		fs.add(CodeControllerDeploy, OK, obj, "%d of %d replicas available", avail, want)
	}
}

// checkLease judges the leader Lease at now: held, and renewed within its
// duration (doubled, at least minLeaseSlack over, for clock skew).
func checkLease(ctx context.Context, o *Options, refs *ControllerRefs, fs *findings, now time.Time) {
	obj := "lease " + refs.Namespace + "/" + refs.LeaderLease
	var l coordinationv1.Lease
	if err := o.Cluster.Get(ctx, types.NamespacedName{Namespace: refs.Namespace, Name: refs.LeaderLease}, &l); err != nil {
		if apierrors.IsNotFound(err) {
			fs.add(CodeLeaderLease, Warn, obj, "not found: no replica has become leader yet (or the controller runs with --leader-elect=false)")
			return
		}
		getErr(o, obj, err, fs)
		return
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if holder == "" {
		fs.add(CodeLeaderLease, Fail, obj, "no holder: the last leader released it and no replica took over")
		return
	}
	if l.Spec.RenewTime == nil {
		fs.add(CodeLeaderLease, Fail, obj, "held by %s but never renewed", holder)
		return
	}
	dur := 15 * time.Second // client-go's default lease duration
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		dur = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	age := now.Sub(l.Spec.RenewTime.Time).Round(time.Second)
	if age > dur+max(dur, minLeaseSlack) {
		fs.add(CodeLeaderLease, Fail, obj, "held by %s but last renewed %s ago (lease duration %s): the leader is gone or hung and no standby took over",
			holder, age, dur)
		return
	}
	fs.add(CodeLeaderLease, OK, obj, "held by %s, renewed %s ago (lease duration %s)", holder, max(age, 0), dur)
}

// webhook is one webhook of a configuration, reduced to what is checked.
type webhook struct {
	name     string
	cfg      admissionv1.WebhookClientConfig
	failOpen bool // failurePolicy Ignore
}

// serviceRef is a webhook Service and port (default 443).
type serviceRef struct {
	namespace, name string
	port            int32
}

func (s serviceRef) String() string {
	return fmt.Sprintf("%s/%s:%d", s.namespace, s.name, s.port)
}

// serviceEndpoints is what checkService found behind a serviceRef: ready
// endpoint addresses (host:port); ok is false when the Service could not be
// checked or has no ready endpoint.
type serviceEndpoints struct {
	ready []string
	ok    bool
}

func checkWebhooks(ctx context.Context, o *Options, fs *findings) {
	type config struct {
		kind, name string
		hooks      []webhook
	}
	var configs []config
	refs := o.Controller
	if refs.ValidatingWebhook != "" {
		var v admissionv1.ValidatingWebhookConfiguration
		if readWebhookConfig(ctx, o, "validatingwebhookconfiguration", refs.ValidatingWebhook, &v, fs) {
			c := config{kind: "validatingwebhookconfiguration", name: v.Name}
			for _, w := range v.Webhooks {
				c.hooks = append(c.hooks, webhook{w.Name, w.ClientConfig, w.FailurePolicy != nil && *w.FailurePolicy == admissionv1.Ignore})
			}
			configs = append(configs, c)
		}
	}
	if refs.MutatingWebhook != "" {
		var m admissionv1.MutatingWebhookConfiguration
		if readWebhookConfig(ctx, o, "mutatingwebhookconfiguration", refs.MutatingWebhook, &m, fs) {
			c := config{kind: "mutatingwebhookconfiguration", name: m.Name}
			for _, w := range m.Webhooks {
				c.hooks = append(c.hooks, webhook{w.Name, w.ClientConfig, w.FailurePolicy != nil && *w.FailurePolicy == admissionv1.Ignore})
			}
			configs = append(configs, c)
		}
	}

	// IC283 once per Service, listing the webhooks that call it.
	callers := map[serviceRef][]webhook{}
	var order []serviceRef
	for _, c := range configs {
		for _, w := range c.hooks {
			if s := w.cfg.Service; s != nil {
				ref := serviceRef{s.Namespace, s.Name, cmp.Or(ptrValue(s.Port), 443)}
				if callers[ref] == nil {
					order = append(order, ref)
				}
				callers[ref] = append(callers[ref], w)
			}
		}
	}
	endpoints := map[serviceRef]serviceEndpoints{}
	for _, ref := range order {
		endpoints[ref] = checkService(ctx, o, ref, callers[ref], fs)
	}

	v := &verifier{o: o, done: map[string]verifyResult{}}
	for _, c := range configs {
		checkCABundles(ctx, c.kind+" "+c.name, c.hooks, endpoints, v, fs)
	}
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// readWebhookConfig gets a cluster-scoped webhook configuration; false when
// it is missing (a WARN: webhooks may be disabled on purpose) or unreadable.
func readWebhookConfig(ctx context.Context, o *Options, kind, name string, obj client.Object, fs *findings) bool {
	what := kind + " " + name
	if err := o.Cluster.Get(ctx, types.NamespacedName{Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			fs.add(CodeWebhookCABundle, Warn, what, "not installed: the controller runs without webhooks (--enable-webhooks=false), or the configuration was deleted")
			return false
		}
		getErr(o, what, err, fs)
		return false
	}
	return true
}

// checkService finds the ready endpoints of a webhook Service (IC283).
func checkService(ctx context.Context, o *Options, ref serviceRef, hooks []webhook, fs *findings) serviceEndpoints {
	obj := "service " + ref.namespace + "/" + ref.name
	names := make([]string, len(hooks))
	failClosed := false
	for i, w := range hooks {
		names[i] = w.name
		failClosed = failClosed || !w.failOpen
	}
	impact := "pods are admitted without injection (failurePolicy Ignore)"
	if failClosed {
		impact = "the apiserver refuses the writes the webhooks guard (failurePolicy Fail)"
	}
	called := "called by " + nameList(names, 4)

	var svc corev1.Service
	if err := o.Cluster.Get(ctx, types.NamespacedName{Namespace: ref.namespace, Name: ref.name}, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			fs.add(CodeWebhookEndpoints, Fail, obj, "not found (%s): %s", called, impact)
		} else {
			getErr(o, obj, err, fs)
		}
		return serviceEndpoints{}
	}
	i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == ref.port })
	if i < 0 {
		fs.add(CodeWebhookEndpoints, Fail, obj, "has no port %d (%s): %s", ref.port, called, impact)
		return serviceEndpoints{}
	}
	portName := svc.Spec.Ports[i].Name

	var sliceList discoveryv1.EndpointSliceList
	if err := o.Cluster.List(ctx, &sliceList, client.InNamespace(ref.namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: ref.name}); err != nil {
		getErr(o, "endpointslices of "+obj, err, fs)
		return serviceEndpoints{}
	}
	var ready []string
	notReady := 0
	for _, es := range sliceList.Items {
		var port int32
		for _, p := range es.Ports {
			if ptrValue(p.Name) == portName && p.Port != nil {
				port = *p.Port
			}
		}
		for _, ep := range es.Endpoints {
			// A nil ready condition means ready (discovery/v1).
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				notReady += len(ep.Addresses)
				continue
			}
			for _, a := range ep.Addresses {
				if port != 0 {
					ready = append(ready, net.JoinHostPort(a, strconv.Itoa(int(port))))
				}
			}
		}
	}
	if len(ready) == 0 {
		fs.add(CodeWebhookEndpoints, Fail, obj, "no ready endpoint for port %d (%d not ready; %s): %s", ref.port, notReady, called, impact)
		return serviceEndpoints{}
	}
	slices.Sort(ready)
	fs.add(CodeWebhookEndpoints, OK, obj, "%s for port %d (%s)", plural(len(ready), "ready endpoint"), ref.port, called)
	return serviceEndpoints{ready: ready, ok: true}
}

// verifyResult is the outcome of one TLS handshake against a caBundle.
type verifyResult struct {
	// unreachable is set when no handshake happened (dial failed).
	unreachable bool
	err         error
	addr        string
}

// verifier dials webhook endpoints once per (endpoint, caBundle, server
// name); several webhooks of a configuration share all three.
type verifier struct {
	o    *Options
	done map[string]verifyResult
}

// verify handshakes with addr as the apiserver would: the server name is
// the Service's DNS name, the roots are the caBundle.
func (v *verifier) verify(ctx context.Context, addr, serverName string, bundle []byte, roots *x509.CertPool) verifyResult {
	sum := sha256.Sum256(bundle)
	key := addr + "|" + serverName + "|" + string(sum[:])
	if r, ok := v.done[key]; ok {
		return r
	}
	dctx, cancel := context.WithTimeout(ctx, webhookDialTimeout)
	defer cancel()
	dial := v.o.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	r := verifyResult{addr: addr}
	conn, err := dial(dctx, "tcp", addr)
	if err != nil {
		r.unreachable, r.err = true, err
	} else {
		tc := tls.Client(conn, &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12})
		r.err = tc.HandshakeContext(dctx)
		if r.err != nil && !isCertError(r.err) {
			r.unreachable = true // timeout or reset: no certificate was judged
		}
		tc.Close()
	}
	v.done[key] = r
	return r
}

// isCertError reports whether a handshake failed on the certificate (not on
// the connection).
func isCertError(err error) bool {
	var (
		unknown   x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verifyErr *tls.CertificateVerificationError
	)
	return errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid) || errors.As(err, &verifyErr)
}

// parseBundle reads the certificates of a caBundle.
func parseBundle(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("cannot parse a certificate: %w", err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return certs, nil
}

// checkCABundles checks every webhook's caBundle of one configuration and
// reports one IC282 finding for it: FAIL when a bundle is empty, unparsable,
// expired or does not verify the served certificate; INFO when the bundles
// parse but no endpoint could be reached to verify them; OK when verified.
func checkCABundles(ctx context.Context, obj string, hooks []webhook, endpoints map[serviceRef]serviceEndpoints, v *verifier, fs *findings) {
	now := time.Now()
	var fails, unverified []string
	verified := map[string]bool{} // endpoint addresses whose certificate verified
	var describe string
	for _, w := range hooks {
		bundle := w.cfg.CABundle
		if len(bundle) == 0 {
			fails = append(fails, w.name+": caBundle is empty")
			continue
		}
		certs, err := parseBundle(bundle)
		if err != nil {
			fails = append(fails, fmt.Sprintf("%s: caBundle holds no usable PEM certificate (%s)", w.name, oneLine(err)))
			continue
		}
		if i := slices.IndexFunc(certs, func(c *x509.Certificate) bool { return now.After(c.NotAfter) }); i >= 0 {
			fails = append(fails, fmt.Sprintf("%s: caBundle certificate %q expired %s", w.name, certs[i].Subject.CommonName, certs[i].NotAfter.UTC().Format(time.RFC3339)))
			continue
		}
		describe = fmt.Sprintf("%s, %q expires %s", plural(len(certs), "certificate"), certs[0].Subject.CommonName, certs[0].NotAfter.UTC().Format(time.RFC3339))
		s := w.cfg.Service
		if s == nil {
			unverified = append(unverified, w.name+" (url clientConfig)")
			continue
		}
		ref := serviceRef{s.Namespace, s.Name, cmp.Or(ptrValue(s.Port), 443)}
		eps := endpoints[ref]
		if !eps.ok {
			unverified = append(unverified, w.name+" (no ready endpoint, IC283)")
			continue
		}
		roots := x509.NewCertPool()
		for _, c := range certs {
			roots.AddCert(c)
		}
		r := v.verify(ctx, eps.ready[0], s.Name+"."+s.Namespace+".svc", bundle, roots)
		switch {
		case r.err == nil:
			verified[r.addr] = true
		case r.unreachable:
			unverified = append(unverified, fmt.Sprintf("%s (%s unreachable from here: %s)", w.name, r.addr, oneLine(r.err)))
		default:
			fails = append(fails, fmt.Sprintf("%s: caBundle does not verify the certificate served at %s: %s", w.name, r.addr, oneLine(r.err)))
		}
	}
	switch {
	case len(hooks) == 0:
		fs.add(CodeWebhookCABundle, Warn, obj, "has no webhooks")
	case len(fails) > 0:
		fs.add(CodeWebhookCABundle, Fail, obj, "%s", strings.Join(fails, "; "))
	case len(unverified) > 0:
		fs.add(CodeWebhookCABundle, Info, obj, "%s: caBundles parse (%s); serving certificate not verified: %s (run the doctor in the cluster to verify)",
			plural(len(hooks), "webhook"), describe, nameList(unverified, 3))
	default:
		addrs := slices.Sorted(maps.Keys(verified))
		fs.add(CodeWebhookCABundle, OK, obj, "%s: caBundle (%s) verifies the serving certificate at %s",
			plural(len(hooks), "webhook"), describe, strings.Join(addrs, ", "))
	}
}
