package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/loadgen"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

// startServer runs a server in process on 127.0.0.1 (gRPC over TLS when
// certFile and keyFile are set) and returns its gRPC address.
func startServer(t *testing.T, certFile, keyFile string) string {
	t.Helper()
	srv := servertest.Start(t, func(cfg *server.Config) {
		cfg.TLSCertFile, cfg.TLSKeyFile = certFile, keyFile
	})
	return srv.GRPCAddr().String()
}

func TestRunAndCompare(t *testing.T) {
	addr := startServer(t, "", "")
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, args := range [][]string{
		{"-addr", addr, "-rate", "200", "-warmup", "200ms", "-duration", "1s", "-json", filepath.Join(dir, "a.json"), "-md", filepath.Join(dir, "a.md"), "-note", "test box"},
		{"run", "-addr", addr, "-mode", "closed", "-concurrency", "2", "-workload", "rag", "-warmup", "0s", "-duration", "1s", "-json", filepath.Join(dir, "b.json"), "-quiet"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(ctx, args, &stdout, &stderr); err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, stderr.String())
		}
		if !strings.Contains(stdout.String(), "| LookupRoute latency |") {
			t.Fatalf("run %d printed no report:\n%s", i, stdout.String())
		}
		if want := "wrote SVG: " + filepath.Join(dir, []string{"a.svg", "b.svg"}[i]) + "\n"; !strings.HasSuffix(stdout.String(), want) {
			t.Errorf("run %d does not end with %q:\n%s", i, want, stdout.String())
		}
		if quiet := i == 1; quiet != (stderr.Len() == 0) {
			t.Errorf("run %d: progress output %q", i, stderr.String())
		}
	}
	// -svg defaults to next to the report: -md's a.md gives a.svg, -json's
	// b.json b.svg.
	for _, name := range []string{"a.svg", "b.svg"} {
		svg, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.HasPrefix(svg, []byte("<svg ")) || !bytes.Contains(svg, []byte("Reason codes per slice")) {
			t.Errorf("%s: %v\n%.200s", name, err, svg)
		}
	}
	a, err := loadgen.LoadReport(filepath.Join(dir, "a.json"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Machine.Note != "test box" || a.Scenario.Rate != 200 {
		t.Errorf("report a: note %q, rate %v", a.Machine.Note, a.Scenario.Rate)
	}
	if md, err := os.ReadFile(filepath.Join(dir, "a.md")); err != nil || !bytes.Contains(md, []byte("Hint ratios")) {
		t.Errorf("Markdown report: %v\n%s", err, md)
	}
	var stdout, stderr bytes.Buffer
	if err := run(ctx, []string{"compare", filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")}, &stdout, &stderr); err != nil {
		t.Fatalf("compare: %v", err)
	}
	if !strings.Contains(stdout.String(), "| throughput /s |") {
		t.Errorf("compare printed:\n%s", stdout.String())
	}
}

func TestSVGPath(t *testing.T) {
	tmp := filepath.Join(os.TempDir(), "loadgen-report.svg")
	for _, c := range []struct {
		flag    string
		reports []string
		want    string
	}{
		{"auto", []string{"", ""}, tmp},
		{"auto", []string{"out/r.md", "out/r.json"}, "out/r.svg"},
		{"auto", []string{"", "r.json"}, "r.svg"},
		{"auto", []string{"report", ""}, "report.svg"},
		{"auto", []string{"odd.svg", ""}, "odd.svg.svg"},
		{"", []string{"r.md"}, ""},
		{"none", []string{"r.md"}, ""},
		{"x/plot.svg", []string{"r.md"}, "x/plot.svg"},
	} {
		if got := svgPath(c.flag, c.reports...); got != c.want {
			t.Errorf("svgPath(%q, %q) = %q, want %q", c.flag, c.reports, got, c.want)
		}
	}
}

func TestFlagErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"-no-such-flag"},
		{"extra-arg"},
		{"-mode", "sideways"},
		{"-tls", "-tls-ca", "testdata/missing.pem"},
		{"compare", "one.json"},
		{"compare", "missing-a.json", "missing-b.json"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(ctx, args, &stdout, &stderr); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
	var stdout, stderr bytes.Buffer
	if err := run(ctx, []string{"-help"}, &stdout, &stderr); err != nil || !strings.Contains(stderr.String(), "-rate") {
		t.Errorf("-help: %v\n%s", err, stderr.String())
	}
}

// writeCert writes a self-signed ECDSA certificate for 127.0.0.1, valid for
// an hour, and its key into dir.
func writeCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(7),
		Subject:      pkix.Name{CommonName: "loadgen-test"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}, &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "loadgen-test"}}, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for path, blk := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writeCert(t, dir)
	addr := startServer(t, certFile, keyFile)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	args := []string{"-addr", addr, "-tls", "-tls-ca", certFile, "-rate", "100", "-warmup", "0s", "-duration", "500ms", "-quiet", "-json", filepath.Join(dir, "r.json"), "-svg", "none"}
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("loadgen over TLS: %v\n%s", err, stderr.String())
	}
	rep, err := loadgen.LoadReport(filepath.Join(dir, "r.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "r.svg")); !os.IsNotExist(err) || strings.Contains(stdout.String(), "wrote SVG") {
		t.Errorf("-svg none wrote an SVG (stat: %v)", err)
	}
	if !rep.Scenario.TLS || rep.Lookups.OK == 0 || rep.Lookups.Errors != 0 {
		t.Fatalf("TLS run: tls %v, %d responses, %d errors", rep.Scenario.TLS, rep.Lookups.OK, rep.Lookups.Errors)
	}
	// Plaintext against a TLS server fails in the populate phase.
	if err := run(ctx, []string{"-addr", addr, "-duration", "500ms", "-quiet"}, &stdout, &stderr); err == nil {
		t.Error("a plaintext run against a TLS server succeeded")
	}
}
