// Package certs gives the webhook server a serving certificate without
// cert-manager.
//
// The controller keeps a small private CA (certificate and key) in one
// Secret of its namespace. Every replica:
//
//   - reads that Secret, or creates it once (racing replicas settle on
//     whichever create won);
//   - signs its own serving certificate for the webhook Service under the
//     Secret's CA and writes tls.crt and tls.key where its webhook server
//     reads them (controller-runtime reloads them when they change);
//   - sets the Secret's ca.crt as caBundle on every webhook of the
//     validating and mutating webhook configurations.
//
// So whichever replica the apiserver reaches, its certificate chains to the
// one caBundle, and every replica writes the same caBundle. Keeper repeats
// this whenever the Secret or a webhook configuration changes (a
// configuration deleted and re-applied without a caBundle gets it back at
// once), and hourly to renew certificates before they expire.
//
// The CA is valid 10 years and rotated when less than one is left; ca.crt
// then holds the new CA first and the previous one after it until it
// expires, so certificates signed by either are trusted while the replicas
// re-sign theirs. A replica publishes the bundle before it serves a
// certificate of a new CA, and never writes a bundle older than the one
// published (ErrStaleBundle: it read the Secret before another replica
// rotated), so the apiserver always trusts what every replica serves. A serving certificate is valid one year and re-signed
// with 90 days left, or as soon as it does not chain to the current CA or
// does not cover the Service's names. A Secret written by an older release
// (ca.crt, tls.crt, tls.key and no ca.key) is rotated on first sight.
package certs

import (
	"bytes"
	"context"
	"crypto"
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
	// Namespace and SecretName locate the Secret holding ca.crt and ca.key.
	Namespace  string
	SecretName string
	// ServiceName is the webhook Service; the certificate covers
	// <svc>, <svc>.<ns>, <svc>.<ns>.svc and <svc>.<ns>.svc.cluster.local.
	ServiceName string
	// CertDir receives this replica's tls.crt and tls.key.
	CertDir string
	// WebhookConfigName is the ValidatingWebhookConfiguration whose caBundle
	// is set; empty skips it.
	WebhookConfigName string
	// MutatingWebhookConfigName is the MutatingWebhookConfiguration whose
	// caBundle is set; empty skips it.
	MutatingWebhookConfigName string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// ErrIncomplete is returned when Options lacks a required name.
var ErrIncomplete = errors.New("certs: Namespace, SecretName, ServiceName and CertDir are required")

const (
	caValidity      = 10 * 365 * 24 * time.Hour
	caRenewBefore   = 365 * 24 * time.Hour
	leafValidity    = 365 * 24 * time.Hour
	leafRenewBefore = 90 * 24 * time.Hour
	keyCA           = "ca.crt"
	keyCAKey        = "ca.key"
	keyCert         = corev1.TLSCertKey
	keyKey          = corev1.TLSPrivateKeyKey
	secretManagedBy = "inferencecache-controller"
	pemCertificate  = "CERTIFICATE"
	pemECPrivateKey = "EC PRIVATE KEY"
	caCommonName    = "inferencecache-webhook-ca"
	maxBundleCerts  = 4 // current CA plus the unexpired previous ones
)

func (o *Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// Ensure makes the Secret, this replica's files in CertDir and the
// caBundles agree; see the package doc. A webhook configuration that does
// not exist is skipped. It returns the PEM caBundle.
func Ensure(ctx context.Context, c client.Client, o Options) ([]byte, error) {
	if o.Namespace == "" || o.SecretName == "" || o.ServiceName == "" || o.CertDir == "" {
		return nil, ErrIncomplete
	}
	// The CA goes into the caBundles before this replica serves a
	// certificate it signed: the apiserver trusts only the bundle, so the
	// other order fails every webhook call reaching this replica until the
	// bundle catches up. A patch refused as stale (another replica rotated
	// after this one read the Secret) re-reads the Secret.
	for attempt := 1; ; attempt++ {
		ca, err := ensureCA(ctx, c, &o)
		if err != nil {
			return nil, err
		}
		err = PatchCABundles(ctx, c, o.WebhookConfigName, o.MutatingWebhookConfigName, ca.bundle)
		if errors.Is(err, ErrStaleBundle) && attempt < staleRetries {
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := ensureLeaf(o.CertDir, ca, DNSNames(o.ServiceName, o.Namespace), o.now()); err != nil {
			return nil, err
		}
		return ca.bundle, nil
	}
}

// staleRetries bounds how often Ensure re-reads the Secret after a stale
// bundle.
const staleRetries = 3

// ErrStaleBundle is PatchCABundles' error when a configuration already
// carries a CA newer than any of the bundle it was given: the bundle was
// read before another replica rotated the CA, and writing it would take the
// new CA away from the apiserver while that replica serves under it.
var ErrStaleBundle = errors.New("certs: the caBundle is older than the one published; re-read the CA Secret")

// stale reports whether published holds a CA certificate that ours lacks
// and that is newer than every certificate of ours.
func stale(published, ours []byte) bool {
	mine := parseCerts(ours)
	if len(mine) == 0 {
		return false
	}
	newest := mine[0].NotBefore
	for _, c := range mine[1:] {
		if c.NotBefore.After(newest) {
			newest = c.NotBefore
		}
	}
	for _, p := range parseCerts(published) {
		if p.NotBefore.After(newest) && !slices.ContainsFunc(mine, func(m *x509.Certificate) bool { return bytes.Equal(m.Raw, p.Raw) }) {
			return true
		}
	}
	return false
}

// authority is the CA read from the Secret.
type authority struct {
	cert   *x509.Certificate
	key    crypto.Signer
	bundle []byte // PEM: cert first, then the previous CAs still valid
}

// ensureCA returns the Secret's CA, creating the Secret or rotating its CA
// when it is missing, unreadable or close to expiry.
func ensureCA(ctx context.Context, c client.Client, o *Options) (*authority, error) {
	key := types.NamespacedName{Namespace: o.Namespace, Name: o.SecretName}
	var out *authority
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var sec corev1.Secret
		err := c.Get(ctx, key, &sec)
		switch {
		case apierrors.IsNotFound(err):
			ca, data, err := newAuthority(o.now(), nil)
			if err != nil {
				return err
			}
			sec = corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.SecretName,
					Labels: map[string]string{"app.kubernetes.io/managed-by": secretManagedBy}},
				Type: corev1.SecretTypeOpaque,
				Data: data,
			}
			err = c.Create(ctx, &sec)
			if apierrors.IsAlreadyExists(err) {
				// Another replica won the race: read its CA (as a conflict,
				// so the retry loop goes round again).
				return apierrors.NewConflict(corev1.Resource("secrets"), o.SecretName, err)
			}
			if err != nil {
				return fmt.Errorf("cannot create webhook CA secret %s: %w", key, err)
			}
			out = ca
			return nil
		case err != nil:
			return fmt.Errorf("cannot read webhook CA secret %s: %w", key, err)
		}
		if ca := parseAuthority(sec.Data, o.now()); ca != nil {
			out = ca
			return nil
		}
		ca, data, err := newAuthority(o.now(), sec.Data[keyCA])
		if err != nil {
			return err
		}
		if sec.Data == nil {
			sec.Data = map[string][]byte{}
		}
		sec.Data[keyCA], sec.Data[keyCAKey] = data[keyCA], data[keyCAKey]
		if err := c.Update(ctx, &sec); err != nil {
			// A conflict means another replica rotated first: read its CA.
			return err
		}
		out = ca
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cannot keep webhook CA secret %s: %w", key, err)
	}
	return out, nil
}

// newAuthority creates a CA and its Secret data; the certificates of prev
// (a PEM bundle) that are still valid at now follow the new one in ca.crt.
func newAuthority(now time.Time, prev []byte) (*authority, map[string][]byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: caCommonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot sign CA certificate: %w", err)
	}
	cert, _ := x509.ParseCertificate(der)
	keyDER, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot encode CA key: %w", err)
	}
	bundle := pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der})
	kept := 1
	for _, old := range parseCerts(prev) {
		if kept < maxBundleCerts && now.Before(old.NotAfter) {
			bundle = append(bundle, pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: old.Raw})...)
			kept++
		}
	}
	data := map[string][]byte{keyCA: bundle, keyCAKey: pem.EncodeToMemory(&pem.Block{Type: pemECPrivateKey, Bytes: keyDER})}
	return &authority{cert: cert, key: k, bundle: bundle}, data, nil
}

// parseAuthority returns the CA of Secret data when ca.key matches the first
// certificate of ca.crt, which is a CA with more than caRenewBefore left;
// otherwise nil (the caller rotates).
func parseAuthority(data map[string][]byte, now time.Time) *authority {
	certs := parseCerts(data[keyCA])
	b, _ := pem.Decode(data[keyCAKey])
	if len(certs) == 0 || b == nil {
		return nil
	}
	k, err := x509.ParseECPrivateKey(b.Bytes)
	if err != nil {
		return nil
	}
	ca := certs[0]
	pub, ok := ca.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&k.PublicKey) || !ca.IsCA || now.Add(caRenewBefore).After(ca.NotAfter) || now.Before(ca.NotBefore) {
		return nil
	}
	return &authority{cert: ca, key: k, bundle: data[keyCA]}
}

// ensureLeaf keeps dir's tls.crt and tls.key a serving certificate for dns
// signed by ca, re-signing when it is missing, signed by another CA, short
// of a name, or within leafRenewBefore of expiry.
func ensureLeaf(dir string, ca *authority, dns []string, now time.Time) error {
	cur, _ := os.ReadFile(filepath.Join(dir, keyCert))
	keyPEM, _ := os.ReadFile(filepath.Join(dir, keyKey))
	if len(keyPEM) > 0 && LeafValid(cur, ca.cert, dns, now) {
		return nil
	}
	data, err := signLeaf(ca, dns, now)
	if err != nil {
		return err
	}
	return writeFiles(dir, data)
}

// signLeaf creates a key and a serving certificate for dns signed by ca.
func signLeaf(ca *authority, dns []string, now time.Time) (map[string][]byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("cannot generate serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: dns[0]},
		DNSNames:     dns,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &k.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("cannot sign serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("cannot encode serving key: %w", err)
	}
	return map[string][]byte{
		keyCert: pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der}),
		keyKey:  pem.EncodeToMemory(&pem.Block{Type: pemECPrivateKey, Bytes: keyDER}),
	}, nil
}

// LeafValid reports whether certPEM is a serving certificate signed by ca,
// covering every name in dns, with more than the renewal margin left at now.
func LeafValid(certPEM []byte, ca *x509.Certificate, dns []string, now time.Time) bool {
	certs := parseCerts(certPEM)
	if len(certs) == 0 || ca == nil {
		return false
	}
	leaf := certs[0]
	if now.Add(leafRenewBefore).After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
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

// DNSNames are the names a Service is reached by from the apiserver.
func DNSNames(svc, ns string) []string {
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local"}
}

func parseCerts(p []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, p = pem.Decode(p)
		if b == nil {
			return out
		}
		if b.Type != pemCertificate {
			continue
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic("BUG: crypto/rand failed: " + err.Error())
	}
	return n
}

// writeFiles writes tls.key then tls.crt into dir (0600), each through a
// temporary file and a rename so a reader never sees half a file.
func writeFiles(dir string, data map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("cannot create certificate dir %s: %w", dir, err)
	}
	for _, name := range []string{keyKey, keyCert} {
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

// PatchCABundles sets ca on every webhook of the named validating and
// mutating configurations (an empty name is skipped, a missing
// configuration too), retrying on update conflicts. It refuses, with
// ErrStaleBundle and writing nothing to that configuration, to replace a
// bundle that holds a CA newer than every one of ca.
func PatchCABundles(ctx context.Context, c client.Client, validating, mutating string, ca []byte) error {
	var errs []error
	if validating != "" {
		errs = append(errs, patch(ctx, c, "ValidatingWebhookConfiguration", validating, &admissionregistrationv1.ValidatingWebhookConfiguration{}, ca, func(o client.Object) []*[]byte {
			v := o.(*admissionregistrationv1.ValidatingWebhookConfiguration)
			out := make([]*[]byte, len(v.Webhooks))
			for i := range v.Webhooks {
				out[i] = &v.Webhooks[i].ClientConfig.CABundle
			}
			return out
		}))
	}
	if mutating != "" {
		errs = append(errs, patch(ctx, c, "MutatingWebhookConfiguration", mutating, &admissionregistrationv1.MutatingWebhookConfiguration{}, ca, func(o client.Object) []*[]byte {
			m := o.(*admissionregistrationv1.MutatingWebhookConfiguration)
			out := make([]*[]byte, len(m.Webhooks))
			for i := range m.Webhooks {
				out[i] = &m.Webhooks[i].ClientConfig.CABundle
			}
			return out
		}))
	}
	return errors.Join(errs...)
}

func patch(ctx context.Context, c client.Client, kind, name string, obj client.Object, ca []byte, bundles func(client.Object) []*[]byte) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, types.NamespacedName{Name: name}, obj); err != nil {
			return err
		}
		changed := false
		for _, b := range bundles(obj) {
			if stale(*b, ca) {
				return ErrStaleBundle
			}
			if !bytes.Equal(*b, ca) {
				*b = slices.Clone(ca)
				changed = true
			}
		}
		if !changed {
			return nil
		}
		return c.Update(ctx, obj)
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot set caBundle on %s %s: %w", kind, name, err)
	}
	return nil
}
