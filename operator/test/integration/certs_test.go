package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/internal/certs"
)

// keeperConfigs are webhook configurations matching nothing, to receive the
// caBundle.
func keeperConfigs(vname, mname string) (*admissionv1.ValidatingWebhookConfiguration, *admissionv1.MutatingWebhookConfiguration) {
	none := admissionv1.SideEffectClassNone
	ignore := admissionv1.Ignore
	path := "/unused"
	cc := admissionv1.WebhookClientConfig{Service: &admissionv1.ServiceReference{Namespace: controllerNS, Name: "keeper-test", Path: &path}}
	rules := []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create},
		Rule: admissionv1.Rule{APIGroups: []string{"keeper-test.invalid"}, APIVersions: []string{"v1"}, Resources: []string{"nothing"}}}}
	v := &admissionv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: vname}, Webhooks: []admissionv1.ValidatingWebhook{
		{Name: "a.keeper-test.io", ClientConfig: cc, Rules: rules, SideEffects: &none, FailurePolicy: &ignore, AdmissionReviewVersions: []string{"v1"}},
		{Name: "b.keeper-test.io", ClientConfig: cc, Rules: rules, SideEffects: &none, FailurePolicy: &ignore, AdmissionReviewVersions: []string{"v1"}},
	}}
	m := &admissionv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: mname}, Webhooks: []admissionv1.MutatingWebhook{
		{Name: "m.keeper-test.io", ClientConfig: cc, Rules: rules, SideEffects: &none, FailurePolicy: &ignore, AdmissionReviewVersions: []string{"v1"}},
	}}
	return v, m
}

// serveDir serves TLS on 127.0.0.1 with the certificate files of dir, read
// at every handshake (as controller-runtime's watcher would reload them).
func serveDir(t *testing.T, dir string) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
		return &c, err
	}})
	wantOK(t, "listen", err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	return l.Addr().String()
}

// trusted dials addr verifying against bundle for the Service's name.
func trusted(addr string, bundle []byte) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		return errors.New("empty caBundle")
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr,
		&tls.Config{RootCAs: pool, ServerName: "keeper-test." + controllerNS + ".svc"})
	if err != nil {
		return err
	}
	return conn.Close()
}

// TestWebhookCertificateKeepers runs two certificate keepers (two controller
// replicas) against the apiserver: each serves its own certificate, both
// trusted by the one caBundle set on the validating and mutating
// configurations; a configuration deleted and re-created without a caBundle
// gets it back; a deleted CA Secret is re-created and both replicas move to
// the new CA.
func TestWebhookCertificateKeepers(t *testing.T) {
	ctx := needEnv(t)
	vwc, mwc := keeperConfigs("keeper-test-validating", "keeper-test-mutating")
	wantOK(t, "create validating", k8s.Create(ctx, vwc.DeepCopy()))
	wantOK(t, "create mutating", k8s.Create(ctx, mwc.DeepCopy()))
	secret := client.ObjectKey{Namespace: controllerNS, Name: "keeper-test-cert"}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = k8s.Delete(ctx, vwc)
		_ = k8s.Delete(ctx, mwc)
		_ = k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secret.Namespace, Name: secret.Name}})
	})

	kctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var addrs []string
	for i := range 2 {
		dir := t.TempDir()
		k := &certs.Keeper{Config: cfg, Scheme: scheme, Client: k8s, Log: logr.Discard(), Options: certs.Options{
			Namespace: controllerNS, SecretName: secret.Name, ServiceName: "keeper-test", CertDir: dir,
			WebhookConfigName: vwc.Name, MutatingWebhookConfigName: mwc.Name,
		}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := k.Start(kctx); err != nil {
				t.Errorf("keeper %d: %v", i, err)
			}
		}()
		addrs = append(addrs, serveDir(t, dir))
	}
	defer func() { stop(); wg.Wait() }()

	// bundles returns the caBundles of both configurations, requiring every
	// webhook to carry the same one.
	bundles := func() ([]byte, error) {
		var v admissionv1.ValidatingWebhookConfiguration
		var m admissionv1.MutatingWebhookConfiguration
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(vwc), &v); err != nil {
			return nil, err
		}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(mwc), &m); err != nil {
			return nil, err
		}
		got := [][]byte{v.Webhooks[0].ClientConfig.CABundle, v.Webhooks[1].ClientConfig.CABundle, m.Webhooks[0].ClientConfig.CABundle}
		for _, b := range got {
			if len(b) == 0 || !bytes.Equal(b, got[0]) {
				return nil, errors.New("caBundle unset or not the same on every webhook")
			}
		}
		return got[0], nil
	}
	// allTrusted waits until both replicas serve certificates the current
	// caBundle (equal to the Secret's ca.crt) trusts, and returns it.
	allTrusted := func(what string) []byte {
		t.Helper()
		var bundle []byte
		eventually(t, 30*time.Second, func() error {
			b, err := bundles()
			if err != nil {
				return err
			}
			var sec corev1.Secret
			if err := k8s.Get(ctx, secret, &sec); err != nil {
				return err
			}
			if !bytes.Equal(b, sec.Data["ca.crt"]) {
				return errors.New("caBundle is not the Secret's ca.crt")
			}
			for i, a := range addrs {
				if err := trusted(a, b); err != nil {
					return fmt.Errorf("%s: replica %d: %w", what, i, err)
				}
			}
			bundle = b
			return nil
		})
		return bundle
	}
	first := allTrusted("start")

	// Each replica signed its own certificate.
	leaf := func(addr string) []byte {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reading the served certificate only
		wantOK(t, "dial", err)
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Raw
	}
	if bytes.Equal(leaf(addrs[0]), leaf(addrs[1])) {
		t.Error("both replicas serve the same certificate")
	}

	// Deleted and re-created (as `kubectl apply` of the manifests would,
	// without a caBundle): the caBundle comes back, unchanged.
	wantOK(t, "delete validating", k8s.Delete(ctx, vwc))
	wantOK(t, "delete mutating", k8s.Delete(ctx, mwc))
	fresh, freshM := keeperConfigs(vwc.Name, mwc.Name)
	wantOK(t, "re-create validating", k8s.Create(ctx, fresh))
	wantOK(t, "re-create mutating", k8s.Create(ctx, freshM))
	start := time.Now()
	if again := allTrusted("re-created configurations"); !bytes.Equal(again, first) {
		t.Error("caBundle changed although the CA did not")
	}
	t.Logf("caBundle restored %s after re-creation", time.Since(start).Round(time.Millisecond))

	// The CA Secret deleted: a new CA, set everywhere, and both replicas
	// re-sign under it.
	wantOK(t, "delete secret", k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secret.Namespace, Name: secret.Name}}))
	eventually(t, 30*time.Second, func() error {
		b, err := bundles()
		if err != nil {
			return err
		}
		if bytes.Equal(b, first) {
			return errors.New("caBundle still the deleted CA's")
		}
		return nil
	})
	allTrusted("new CA")
}
