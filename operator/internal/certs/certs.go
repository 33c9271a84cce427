// Package certs gives the webhook server a serving certificate without
// cert-manager.
//
// The controller keeps a small private CA and a serving certificate for the
// webhook Service in one Secret. At start-up Ensure reads that Secret (or
// creates it, once, racing replicas settle on whichever create won), writes
// tls.crt and tls.key where the webhook server reads them, and sets the CA
// as caBundle on every webhook of the ValidatingWebhookConfiguration. Every
// replica therefore serves a certificate from the same CA, and the caBundle
// is the same whichever replica patched it last.
//
// The CA is valid 10 years and the serving certificate 5; Ensure reissues
// both when the serving certificate has less than a year left or does not
// cover the Service's DNS names. Deleting the Secret and restarting the
// controller rotates them.
package certs

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Options names the objects Ensure works on.
type Options struct {
	// Namespace and SecretName locate the Secret holding ca.crt, tls.crt and
	// tls.key.
	Namespace  string
	SecretName string
	// ServiceName is the webhook Service; the certificate covers
	// <svc>, <svc>.<ns>, <svc>.<ns>.svc and <svc>.<ns>.svc.cluster.local.
	ServiceName string
	// CertDir receives tls.crt and tls.key.
	CertDir string
	// WebhookConfigName is the ValidatingWebhookConfiguration whose caBundle
	// is set; empty skips the patch.
	WebhookConfigName string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// ErrIncomplete is returned when Options lacks a required name.
var ErrIncomplete = errors.New("certs: Namespace, SecretName, ServiceName and CertDir are required")

const (
	caValidity      = 10 * 365 * 24 * time.Hour
	leafValidity    = 5 * 365 * 24 * time.Hour
	renewBefore     = 365 * 24 * time.Hour
	keyCA           = "ca.crt"
	keyCert         = corev1.TLSCertKey
	keyKey          = corev1.TLSPrivateKeyKey
	secretManagedBy = "inferencecache-controller"
)

// Ensure makes the Secret, the files in CertDir and the caBundle agree; see
// the package doc. It returns the PEM CA certificate.
func Ensure(ctx context.Context, c client.Client, o Options) ([]byte, error) {
	if o.Namespace == "" || o.SecretName == "" || o.ServiceName == "" || o.CertDir == "" {
		return nil, ErrIncomplete
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	dns := DNSNames(o.ServiceName, o.Namespace)
	key := types.NamespacedName{Namespace: o.Namespace, Name: o.SecretName}

	var sec corev1.Secret
	err := c.Get(ctx, key, &sec)
	switch {
	case apierrors.IsNotFound(err):
		sec = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.SecretName,
				Labels: map[string]string{"app.kubernetes.io/managed-by": secretManagedBy}},
			Type: corev1.SecretTypeTLS,
		}
		if sec.Data, err = Issue(dns, now()); err != nil {
			return nil, err
		}
		if err = c.Create(ctx, &sec); apierrors.IsAlreadyExists(err) {
			// Another replica won the race: use its certificate.
			err = c.Get(ctx, key, &sec)
		}
		if err != nil {
			return nil, fmt.Errorf("cannot create webhook certificate secret %s: %w", key, err)
		}
	case err != nil:
		return nil, fmt.Errorf("cannot read webhook certificate secret %s: %w", key, err)
	}
	if !Valid(sec.Data, dns, now()) {
		data, err := Issue(dns, now())
		if err != nil {
			return nil, err
		}
		sec.Data = data
		if err := c.Update(ctx, &sec); err != nil {
			// A conflict means another replica reissued first; restart picks it up.
			return nil, fmt.Errorf("cannot update webhook certificate secret %s: %w", key, err)
		}
	}
	if err := writeFiles(o.CertDir, sec.Data); err != nil {
		return nil, err
	}
	ca := sec.Data[keyCA]
	if o.WebhookConfigName != "" {
		if err := patchCABundle(ctx, c, o.WebhookConfigName, ca); err != nil {
			return nil, err
		}
	}
	return ca, nil
}

// DNSNames are the names a Service is reached by from the apiserver.
func DNSNames(svc, ns string) []string {
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local"}
}

// Issue creates a CA and a serving certificate for dns, returned as Secret
// data (ca.crt, tls.crt, tls.key; PEM).
func Issue(dns []string, now time.Time) (map[string][]byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("cannot generate CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "inferencecache-webhook-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("cannot sign CA certificate: %w", err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("cannot generate serving key: %w", err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: dns[0]},
		DNSNames:     dns,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("cannot sign serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		return nil, fmt.Errorf("cannot encode serving key: %w", err)
	}
	return map[string][]byte{
		keyCA:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		keyCert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		keyKey:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// Valid reports whether data holds a serving certificate signed by its CA,
// covering every name in dns, with more than renewBefore left at now.
func Valid(data map[string][]byte, dns []string, now time.Time) bool {
	ca, leaf := parseCert(data[keyCA]), parseCert(data[keyCert])
	if ca == nil || leaf == nil || len(data[keyKey]) == 0 {
		return false
	}
	if now.Add(renewBefore).After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return false
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	for _, name := range dns {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, CurrentTime: now}); err != nil {
			return false
		}
	}
	return true
}

func parseCert(p []byte) *x509.Certificate {
	b, _ := pem.Decode(p)
	if b == nil {
		return nil
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil
	}
	return c
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic("BUG: crypto/rand failed: " + err.Error())
	}
	return n
}

// writeFiles writes tls.crt and tls.key into dir (0600 for the key), each
// through a temporary file and a rename so a reader never sees half a file.
func writeFiles(dir string, data map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("cannot create certificate dir %s: %w", dir, err)
	}
	for _, name := range []string{keyCert, keyKey} {
		tmp, err := os.CreateTemp(dir, "."+name+"-*")
		if err != nil {
			return fmt.Errorf("cannot write %s: %w", name, err)
		}
		_, werr := tmp.Write(data[name])
		cerr := tmp.Close()
		if err := errors.Join(werr, cerr); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("cannot write %s: %w", name, err)
		}
		if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("cannot write %s: %w", name, err)
		}
	}
	return nil
}

// patchCABundle sets ca on every webhook of the named configuration, retrying
// on update conflicts.
func patchCABundle(ctx context.Context, c client.Client, name string, ca []byte) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var vwc admissionregistrationv1.ValidatingWebhookConfiguration
		if err := c.Get(ctx, types.NamespacedName{Name: name}, &vwc); err != nil {
			return err
		}
		changed := false
		for i := range vwc.Webhooks {
			if !bytes.Equal(vwc.Webhooks[i].ClientConfig.CABundle, ca) {
				vwc.Webhooks[i].ClientConfig.CABundle = slices.Clone(ca)
				changed = true
			}
		}
		if !changed {
			return nil
		}
		return c.Update(ctx, &vwc)
	})
	if err != nil {
		return fmt.Errorf("cannot set caBundle on ValidatingWebhookConfiguration %s: %w", name, err)
	}
	return nil
}
