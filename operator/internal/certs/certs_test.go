package certs

import (
	"bytes"
	"context"
	"crypto/tls"
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
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestIssueValid(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	dns := DNSNames("svc", "ns")
	data, err := Issue(dns, now)
	if err != nil {
		t.Fatal(err)
	}
	if !Valid(data, dns, now) {
		t.Fatal("fresh certificate not valid")
	}
	if _, err := tls.X509KeyPair(data[keyCert], data[keyKey]); err != nil {
		t.Fatalf("key pair: %v", err)
	}
	if Valid(data, DNSNames("other", "ns"), now) {
		t.Fatal("valid for a name it does not cover")
	}
	if Valid(data, dns, now.Add(leafValidity-renewBefore+time.Hour)) {
		t.Fatal("still valid inside the renewal window")
	}
	other, _ := Issue(dns, now)
	mixed := map[string][]byte{keyCA: other[keyCA], keyCert: data[keyCert], keyKey: data[keyKey]}
	if Valid(mixed, dns, now) {
		t.Fatal("valid under a foreign CA")
	}
	if Valid(nil, dns, now) {
		t.Fatal("empty data valid")
	}
}

func TestEnsure(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "vwc"},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "a.example.io"}, {Name: "b.example.io"}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vwc).Build()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir := t.TempDir()
	o := Options{Namespace: "ns", SecretName: "cert", ServiceName: "svc", CertDir: dir, WebhookConfigName: "vwc"}
	ca1, err := Ensure(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	// A second replica (another cert dir) gets the same CA and certificate.
	o2 := o
	o2.CertDir = t.TempDir()
	ca2, err := Ensure(ctx, c, o2)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ca1, ca2) {
		t.Fatal("replicas disagree on the CA")
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		a, _ := os.ReadFile(filepath.Join(dir, name))
		b, _ := os.ReadFile(filepath.Join(o2.CertDir, name))
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Fatalf("%s differs between replicas", name)
		}
	}
	var got admissionregistrationv1.ValidatingWebhookConfiguration
	if err := c.Get(ctx, types.NamespacedName{Name: "vwc"}, &got); err != nil {
		t.Fatal(err)
	}
	for _, w := range got.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, ca1) {
			t.Fatalf("webhook %s caBundle not set", w.Name)
		}
	}
	// A secret that no longer covers the service is reissued.
	o3 := o
	o3.ServiceName = "renamed"
	ca3, err := Ensure(ctx, c, o3)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(ca1, ca3) {
		t.Fatal("not reissued for a new service name")
	}
	var sec corev1.Secret
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "cert"}, &sec); err != nil {
		t.Fatal(err)
	}
	if !Valid(sec.Data, DNSNames("renamed", "ns"), time.Now()) {
		t.Fatal("stored secret not valid for the new name")
	}
	if _, err := Ensure(ctx, c, Options{}); err != ErrIncomplete {
		t.Fatalf("incomplete options: %v", err)
	}
}
