package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

func testClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// verifies reports whether dir's serving certificate chains to a CA of
// bundle for name, and pairs with its key.
func verifies(t *testing.T, dir string, bundle []byte, name string, now time.Time) bool {
	t.Helper()
	crt, _ := os.ReadFile(filepath.Join(dir, keyCert))
	key, _ := os.ReadFile(filepath.Join(dir, keyKey))
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		t.Fatalf("key pair in %s: %v", dir, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return false
	}
	_, err := parseCerts(crt)[0].Verify(x509.VerifyOptions{DNSName: name, Roots: pool, CurrentTime: now})
	return err == nil
}

func TestEnsureReplicasShareCA(t *testing.T) {
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "vwc"},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "a.example.io"}, {Name: "b.example.io"}},
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "mwc"},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "m.example.io"}},
	}
	c := testClient(t, vwc, mwc)
	ctx := testCtx(t)
	o := Options{Namespace: "ns", SecretName: "cert", ServiceName: "svc", CertDir: t.TempDir(),
		WebhookConfigName: "vwc", MutatingWebhookConfigName: "mwc"}
	ca1, err := Ensure(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	// A second replica (another cert dir) shares the CA and signs its own
	// certificate under it.
	o2 := o
	o2.CertDir = t.TempDir()
	ca2, err := Ensure(ctx, c, o2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ca1, ca2) {
		t.Fatal("replicas disagree on the CA")
	}
	a, _ := os.ReadFile(filepath.Join(o.CertDir, keyCert))
	b, _ := os.ReadFile(filepath.Join(o2.CertDir, keyCert))
	if bytes.Equal(a, b) {
		t.Fatal("replicas share one serving certificate; each should sign its own")
	}
	for _, dir := range []string{o.CertDir, o2.CertDir} {
		if !verifies(t, dir, ca1, "svc.ns.svc", time.Now()) {
			t.Fatalf("%s does not chain to the caBundle", dir)
		}
	}
	// A pass with nothing to do leaves the certificate alone.
	if _, err := Ensure(ctx, c, o); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(o.CertDir, keyCert)); !bytes.Equal(a, again) {
		t.Fatal("valid certificate re-signed")
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "vwc"}, vwc); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "mwc"}, mwc); err != nil {
		t.Fatal(err)
	}
	for _, got := range [][]byte{vwc.Webhooks[0].ClientConfig.CABundle, vwc.Webhooks[1].ClientConfig.CABundle, mwc.Webhooks[0].ClientConfig.CABundle} {
		if !bytes.Equal(got, ca1) {
			t.Fatal("caBundle not set")
		}
	}

	// A renamed Service: the CA stays, the certificate is re-signed.
	o3 := o
	o3.ServiceName = "renamed"
	ca3, err := Ensure(ctx, c, o3)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ca1, ca3) || !verifies(t, o.CertDir, ca3, "renamed.ns.svc", time.Now()) {
		t.Fatal("not re-signed for the new name under the same CA")
	}
	if _, err := Ensure(ctx, c, Options{}); err != ErrIncomplete {
		t.Fatalf("incomplete options: %v", err)
	}
}

func TestEnsureRotatesCA(t *testing.T) {
	ctx := testCtx(t)
	c := testClient(t) // no webhook configurations: nothing to patch, no error
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := Options{Namespace: "ns", SecretName: "cert", ServiceName: "svc", CertDir: t.TempDir(), Now: func() time.Time { return now }}
	old, err := Ensure(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	// Inside the CA's last year: a new CA first, the old one kept, and the
	// certificate re-signed by the new one.
	now = now.Add(caValidity - caRenewBefore + time.Hour)
	bundle, err := Ensure(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	certs := parseCerts(bundle)
	if len(certs) != 2 || !bytes.Equal(certs[1].Raw, parseCerts(old)[0].Raw) {
		t.Fatalf("bundle after rotation has %d certs, want new + old", len(certs))
	}
	crt, _ := os.ReadFile(filepath.Join(o.CertDir, keyCert))
	if !LeafValid(crt, certs[0], DNSNames("svc", "ns"), now) {
		t.Fatal("certificate not re-signed by the new CA")
	}
	// Once the old CA expired it leaves the bundle at the next rotation.
	now = now.Add(caValidity)
	bundle, err = Ensure(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(parseCerts(bundle)); n != 1 {
		t.Fatalf("expired CAs kept: %d certs", n)
	}
}

func TestEnsureUpgradesLegacySecret(t *testing.T) {
	ctx := testCtx(t)
	now := time.Now()
	prev, _, err := newAuthority(now, nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := signLeaf(prev, DNSNames("svc", "ns"), now)
	if err != nil {
		t.Fatal(err)
	}
	// What the previous release wrote: a TLS Secret without the CA key.
	legacy := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cert"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{keyCA: prev.bundle, keyCert: leaf[keyCert], keyKey: leaf[keyKey]}}
	c := testClient(t, legacy)
	dir := t.TempDir()
	bundle, err := Ensure(ctx, c, Options{Namespace: "ns", SecretName: "cert", ServiceName: "svc", CertDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	certs := parseCerts(bundle)
	if len(certs) != 2 || !bytes.Equal(certs[1].Raw, prev.cert.Raw) {
		t.Fatal("the legacy CA is not kept in the bundle")
	}
	var sec corev1.Secret
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "cert"}, &sec); err != nil {
		t.Fatal(err)
	}
	if len(sec.Data[keyCAKey]) == 0 || !bytes.Equal(sec.Data[keyCert], leaf[keyCert]) {
		t.Fatal("CA key not stored, or the legacy serving pair dropped (a TLS Secret needs it)")
	}
	if !verifies(t, dir, bundle, "svc.ns.svc", now) {
		t.Fatal("new certificate not trusted")
	}
}

// TestRotationPublishesTheCAFirst: when the CA is rotated, the webhook
// configurations carry the new CA before this replica serves a
// certificate signed by it. Checked at every caBundle write: the
// certificate on disk at that moment must chain to the bundle being
// replaced, which the apiserver still uses.
func TestRotationPublishesTheCAFirst(t *testing.T) {
	ctx := testCtx(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	var violations []string
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "vwc"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "a.example.io"}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vwc).WithInterceptorFuncs(interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if _, ok := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration); ok {
				var cur admissionregistrationv1.ValidatingWebhookConfiguration
				if err := c.Get(ctx, client.ObjectKeyFromObject(obj), &cur); err != nil {
					return err
				}
				if published := cur.Webhooks[0].ClientConfig.CABundle; len(published) > 0 && !chains(mustRead(t, dir), published) {
					violations = append(violations, "the served certificate does not chain to the published caBundle")
				}
			}
			return c.Update(ctx, obj, opts...)
		}}).Build()
	o := Options{Namespace: "ns", SecretName: "cert", ServiceName: "svc", CertDir: dir, WebhookConfigName: "vwc", Now: func() time.Time { return now }}
	if _, err := Ensure(ctx, c, o); err != nil {
		t.Fatal(err)
	}
	now = now.Add(caValidity - caRenewBefore + time.Hour) // the CA's last year: rotate
	bundle, err := Ensure(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(violations) > 0 {
		t.Fatalf("rotation: %v", violations)
	}
	if certs := parseCerts(bundle); len(certs) != 2 || !LeafValid(mustRead(t, dir), certs[0], DNSNames("svc", "ns"), now) {
		t.Fatalf("after rotation: %d CAs in the bundle, certificate not signed by the new one", len(certs))
	}
}

// TestStaleBundleIsNotPublished: a replica that read the Secret before
// another rotated the CA must not put the old bundle back over the new one
// (the other replica already serves a certificate of the new CA).
func TestStaleBundleIsNotPublished(t *testing.T) {
	ctx := testCtx(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "vwc"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "a.example.io"}}}
	c := testClient(t, vwc)
	o := Options{Namespace: "ns", SecretName: "cert", ServiceName: "svc", CertDir: t.TempDir(), WebhookConfigName: "vwc", Now: func() time.Time { return now }}
	old, err := Ensure(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(caValidity - caRenewBefore + time.Hour)
	rotated, err := Ensure(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	err = PatchCABundles(ctx, c, "vwc", "", old)
	if err == nil {
		t.Fatal("the stale bundle was published over the rotated one")
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "vwc"}, vwc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(vwc.Webhooks[0].ClientConfig.CABundle, rotated) {
		t.Fatal("caBundle changed")
	}
}

// chains reports whether the certificate certPEM is signed by a CA of
// bundle, at a time both are valid (the test clock jumps years ahead).
func chains(certPEM, bundle []byte) bool {
	leaf := parseCerts(certPEM)
	pool := x509.NewCertPool()
	if len(leaf) == 0 || !pool.AppendCertsFromPEM(bundle) {
		return false
	}
	_, err := leaf[0].Verify(x509.VerifyOptions{Roots: pool, CurrentTime: leaf[0].NotBefore.Add(time.Hour)})
	return err == nil
}

func mustRead(t *testing.T, dir string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, keyCert))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
