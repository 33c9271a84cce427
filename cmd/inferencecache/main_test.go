package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/doctor"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

func runT(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var o, e bytes.Buffer
	code = run(ctx, args, &o, &e)
	return code, o.String(), e.String()
}

func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, doctor.ExitUsage},
		{[]string{"frobnicate"}, doctor.ExitUsage},
		{[]string{"help"}, 0},
		{[]string{"doctor", "-h"}, 0},
		{[]string{"doctor", "--no-such-flag"}, doctor.ExitUsage},
		{[]string{"doctor", "-o", "yaml"}, doctor.ExitUsage},
		{[]string{"doctor", "extra"}, doctor.ExitUsage},
		{[]string{"doctor", "--timeout", "0s"}, doctor.ExitUsage},
		{[]string{"doctor", "--config-only", "--skip-cluster"}, doctor.ExitUsage},
		{[]string{"doctor", "--cacheindex-grace", "0s"}, doctor.ExitUsage},
		{[]string{"doctor", "--controller-namespace", ""}, doctor.ExitUsage},
		{[]string{"doctor", "--skip-cluster", "--grpc-ca-file", missing}, doctor.ExitUsage},
	} {
		if got, _, stderr := runT(t, c.args...); got != c.want {
			t.Errorf("%q: exit %d, want %d (stderr %q)", c.args, got, c.want, stderr)
		}
	}
}

// TestDoctorJSON runs the subcommand against a real in-process server with
// its control auth off: the open control port is a WARN, so exit 1, and the
// JSON report parses and agrees with the exit code.
func TestDoctorJSON(t *testing.T) {
	srv := servertest.Start(t, nil)
	start := time.Now()
	code, out, stderr := runT(t, "doctor", "-o", "json", "--skip-cluster",
		"--grpc-addr", srv.GRPCAddr().String(), "--control-url", srv.InternalAddr().String(), // no scheme: http
		"--controller-token-path", "", "--policy-token-path", "")
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("doctor took %v", elapsed)
	}
	var r struct {
		Findings []doctor.Finding `json:"findings"`
		ExitCode int              `json:"exitCode"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("JSON output does not parse: %v\n%s", err, out)
	}
	if code != doctor.ExitWarn || r.ExitCode != code || stderr != "" {
		t.Fatalf("exit %d, JSON exitCode %d, stderr %q; output:\n%s", code, r.ExitCode, stderr, out)
	}
	var got []string
	for _, f := range r.Findings {
		got = append(got, f.Code+":"+f.Severity.String())
	}
	want := "IC100:OK IC110:OK IC119:WARN IC120:OK IC130:OK"
	if strings.Join(got, " ") != want {
		t.Errorf("findings %v, want %s", got, want)
	}
}

// TestDoctorFailures: an unreachable server and an unloadable kubeconfig
// are FAILs (exit 2), in the table format.
func TestDoctorFailures(t *testing.T) {
	code, out, _ := runT(t, "doctor", "-o", "table", "--timeout", "2s",
		"--grpc-addr", closedAddr(t), "--control-url", "http://"+closedAddr(t),
		"--controller-token-path", "", "--policy-token-path", "",
		"--kubeconfig", filepath.Join(t.TempDir(), "missing"))
	if code != doctor.ExitFail {
		t.Fatalf("exit %d, want 2:\n%s", code, out)
	}
	for _, want := range []string{"FAIL      IC101", "FAIL      IC111", "FAIL      IC200"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// writeCert writes a self-signed ECDSA certificate for 127.0.0.1 and its key
// into dir.
func writeCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7),
		Subject:      pkix.Name{CommonName: "doctor-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for path, block := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: kb}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

// TestDoctorGRPCTLS checks a server that serves gRPC over TLS: healthy with
// --grpc-ca-file, unreachable in plaintext.
func TestDoctorGRPCTLS(t *testing.T) {
	certFile, keyFile := writeCert(t, t.TempDir())
	srv := servertest.Start(t, func(c *server.Config) { c.TLSCertFile, c.TLSKeyFile = certFile, keyFile })
	base := []string{"doctor", "-o", "table", "--skip-cluster", "--control-url", "", "--controller-token-path", "",
		"--policy-token-path", "", "--grpc-addr", srv.GRPCAddr().String()}
	if code, out, _ := runT(t, append(base, "--grpc-ca-file", certFile)...); code != 0 || !strings.Contains(out, "IC100") {
		t.Errorf("TLS: exit %d:\n%s", code, out)
	}
	if code, out, _ := runT(t, base...); code != doctor.ExitFail || !strings.Contains(out, "IC101") {
		t.Errorf("plaintext to a TLS server: exit %d:\n%s", code, out)
	}
}
