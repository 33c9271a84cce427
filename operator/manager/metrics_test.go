package manager

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMetricsServerOptions(t *testing.T) {
	// Plain HTTP as before --metrics-secure existed: :8080, no filter.
	o, err := MetricsServerOptions(Options{})
	if err != nil || o.BindAddress != ":8080" || o.SecureServing || o.FilterProvider != nil {
		t.Errorf("insecure defaults: %+v, %v", o, err)
	}
	// Secure: :8443, the authn/authz filter, a self-signed certificate
	// (a CertDir holding none), HTTP/1.1 only.
	o, err = MetricsServerOptions(Options{MetricsSecure: true})
	if err != nil || o.BindAddress != ":8443" || !o.SecureServing || o.FilterProvider == nil {
		t.Fatalf("secure defaults: %+v, %v", o, err)
	}
	if _, err := os.Stat(filepath.Join(o.CertDir, "tls.crt")); err == nil {
		t.Errorf("self-signed mode points at a directory with a certificate: %s", o.CertDir)
	}
	var c tls.Config
	for _, f := range o.TLSOpts {
		f(&c)
	}
	if len(c.NextProtos) != 1 || c.NextProtos[0] != "http/1.1" {
		t.Errorf("NextProtos %v, want only http/1.1", c.NextProtos)
	}
	// An explicit address wins; 0 stays 0 (disabled).
	for _, addr := range []string{"127.0.0.1:9999", "0"} {
		if o, _ := MetricsServerOptions(Options{MetricsSecure: true, MetricsAddr: addr}); o.BindAddress != addr {
			t.Errorf("address %q became %q", addr, o.BindAddress)
		}
	}

	dir := t.TempDir()
	// A certificate directory that lacks the files is an error, not a
	// silent fall-back to a self-signed certificate.
	if _, err := MetricsServerOptions(Options{MetricsSecure: true, MetricsCertPath: dir}); err == nil || !strings.Contains(err.Error(), "tls.crt") {
		t.Errorf("missing certificate: %v", err)
	}
	for _, f := range []string{"m.crt", "m.key"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	o, err = MetricsServerOptions(Options{MetricsSecure: true, MetricsCertPath: dir, MetricsCertName: "m.crt", MetricsCertKey: "m.key"})
	if err != nil || o.CertDir != dir || o.CertName != "m.crt" || o.KeyName != "m.key" {
		t.Errorf("certificate files: %+v, %v", o, err)
	}
	if _, err := MetricsServerOptions(Options{MetricsSecure: true, MetricsCertPath: dir}); err == nil {
		t.Error("default file names tls.crt/tls.key accepted in a directory without them")
	}
	// A certificate for a plain HTTP server is a mistake.
	if _, err := MetricsServerOptions(Options{MetricsCertPath: dir}); err == nil {
		t.Error("--metrics-cert-path accepted with --metrics-secure=false")
	}
}
