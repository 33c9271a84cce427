package doctor_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/doctor"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// The controller objects of the install, under the names the doctor
// defaults to.
var ctl = doctor.DefaultController()

const (
	webhookService = "inferencecache-webhook-service"
	// webhookEndpoint is the pod address the webhook Service's EndpointSlice
	// lists; the doctor's dialer maps it to the local TLS server (envtest's
	// apiserver refuses loopback endpoint addresses).
	webhookEndpoint = "10.0.0.10:9443"
)

// pki is a webhook CA and the serving certificate it signed.
type pki struct {
	caPEM   []byte
	serving tls.Certificate
}

// newPKI makes a CA and a serving certificate for dnsName, signed by it.
func newPKI(t *testing.T, dnsName string) pki {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "doctor-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: dnsName}, DNSNames: []string{dnsName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pki{
		caPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		serving: tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey},
	}
}

// controllerInstall creates a healthy controller: its Deployment with every
// replica available, a freshly renewed leader Lease, the webhook Service
// with a ready endpoint served by a local TLS server, and both webhook
// configurations carrying the CA that signed its certificate. The webhooks
// select no namespace, so the apiserver never calls them.
func (in *install) controllerInstall(t *testing.T) {
	t.Helper()
	in.pki = newPKI(t, webhookService+"."+systemNS+".svc")
	ws := httptest.NewUnstartedServer(http.NotFoundHandler())
	ws.TLS = &tls.Config{Certificates: []tls.Certificate{in.pki.serving}, MinVersion: tls.VersionTLS12}
	ws.StartTLS()
	t.Cleanup(ws.Close)
	in.webhookAddr = ws.Listener.Addr().String()

	labels := map[string]string{"app.kubernetes.io/name": "inferencecache-controller"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: ctl.Deployment},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "controller", Image: "controller:test"}}},
			},
		},
	}
	in.create(t, dep, func() {
		dep.Status = appsv1.DeploymentStatus{ObservedGeneration: dep.Generation, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2, AvailableReplicas: 2}
	})

	// A long lease duration keeps the fixture's renewal fresh for the whole
	// test; the expired case sets its own.
	in.create(t, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: ctl.LeaderLease},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr("inferencecache-controller-6f7d9c-abcde_3b1f"), LeaseDurationSeconds: ptr(int32(3600)),
			AcquireTime: ptr(metav1.NewMicroTime(time.Now())), RenewTime: ptr(metav1.NewMicroTime(time.Now())),
		},
	}, nil)

	in.create(t, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: webhookService},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{
			{Name: "webhook", Port: 443, TargetPort: intstr.FromString("webhook")},
		}},
	}, nil)
	in.create(t, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: webhookService + "-x1",
			Labels: map[string]string{discoveryv1.LabelServiceName: webhookService}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{"10.0.0.10"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr("webhook"), Port: ptr(int32(9443)), Protocol: ptr(corev1.ProtocolTCP)}},
	}, nil)

	never := &metav1.LabelSelector{MatchLabels: map[string]string{"inferencecache.io/doctor-test": "never-matches"}}
	ref := func(path string) admissionv1.WebhookClientConfig {
		return admissionv1.WebhookClientConfig{
			Service:  &admissionv1.ServiceReference{Namespace: systemNS, Name: webhookService, Path: ptr(path), Port: ptr(int32(443))},
			CABundle: in.pki.caPEM,
		}
	}
	fail, ignore := admissionv1.Fail, admissionv1.Ignore
	none := admissionv1.SideEffectClassNone
	in.create(t, &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ctl.ValidatingWebhook},
		Webhooks: []admissionv1.ValidatingWebhook{
			{Name: "vcachepolicy.inferencecache.io", ClientConfig: ref("/validate-inferencecache-io-v1alpha1-cachepolicy"),
				Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
					Rule: admissionv1.Rule{APIGroups: []string{"inferencecache.io"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"cachepolicies"}}}},
				FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: never},
			{Name: "vcachetenant.inferencecache.io", ClientConfig: ref("/validate-inferencecache-io-v1alpha1-cachetenant"),
				Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
					Rule: admissionv1.Rule{APIGroups: []string{"inferencecache.io"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"cachetenants"}}}},
				FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: never},
		},
	}, nil)
	in.create(t, &admissionv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ctl.MutatingWebhook},
		Webhooks: []admissionv1.MutatingWebhook{
			{Name: "mpod.inferencecache.io", ClientConfig: ref("/mutate--v1-pod"),
				Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule: admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
				FailurePolicy: &ignore, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: never},
		},
	}, nil)
}

// dial is the doctor's dialer in the tests: the webhook endpoint goes to the
// local TLS server, anything else nowhere.
func (in *install) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if addr == webhookEndpoint {
		var d net.Dialer
		return d.DialContext(ctx, network, in.webhookAddr)
	}
	return nil, &net.OpError{Op: "dial", Net: network, Err: errUnroutable}
}

type unroutable struct{}

func (unroutable) Error() string { return "no route to host (test network)" }

var errUnroutable error = unroutable{}

// project writes the CacheIndex status from the server's live index, as the
// controller's snapshot poll does (tenants with their entries, replicas that
// reported stats), with lastUpdated at now - age.
func (in *install) project(t *testing.T, age time.Duration) {
	t.Helper()
	ctx := ctxT(t)
	snap := in.srv.Engine().Snapshot()
	var ci v1alpha1.CacheIndex
	if err := in.c.Get(ctx, client.ObjectKey{Name: v1alpha1.CacheIndexName}, &ci); err != nil {
		t.Fatal(err)
	}
	st := v1alpha1.CacheIndexStatus{ObservedServer: "http://" + in.srv.InternalAddr().String()}
	st.Prefixes.Summary.Total = snap.TotalPrefixes
	seen := map[string]bool{} // the controller keys replicas by id alone
	for _, r := range snap.Replicas {
		if r.StatsReported && !seen[r.ReplicaID] {
			seen[r.ReplicaID] = true
			st.Replicas = append(st.Replicas, v1alpha1.ReplicaCacheStatus{ID: r.ReplicaID, Tenant: r.Tenant})
		}
	}
	for _, ts := range snap.Tenants {
		st.Tenants = append(st.Tenants, v1alpha1.TenantCacheStatus{ID: ts.TenantID, IndexEntries: ptr(ts.IndexEntries)})
	}
	st.LastUpdated = ptr(metav1.NewTime(time.Now().Add(-age)))
	ci.Status = st
	if err := in.c.Status().Update(ctx, &ci); err != nil {
		t.Fatal(err)
	}
}

// update re-reads obj, applies change and writes it (spec or status when
// status is true).
func (in *install) update(t *testing.T, obj client.Object, status bool, change func()) {
	t.Helper()
	ctx := ctxT(t)
	if err := in.c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		t.Fatal(err)
	}
	change()
	var err error
	if status {
		err = in.c.Status().Update(ctx, obj)
	} else {
		err = in.c.Update(ctx, obj)
	}
	if err != nil {
		t.Fatalf("update %T %s: %v", obj, obj.GetName(), err)
	}
}
