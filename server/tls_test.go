package server_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
	"github.com/inferencecache/inferencecache/servermetrics"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// into dir and returns their paths and the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "inferencecache-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

func TestTLSStartupValidation(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := selfSigned(t, dir)
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, files := range map[string][2]string{
		"cert without key": {certFile, ""},
		"key without cert": {"", keyFile},
		"missing files":    {filepath.Join(dir, "nope.crt"), filepath.Join(dir, "nope.key")},
		"garbage":          {garbage, garbage},
		"swapped":          {keyFile, certFile},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testConfig()
			cfg.TLSCertFile, cfg.TLSKeyFile = files[0], files[1]
			s, err := server.New(cfg)
			if err == nil {
				_ = s.Close()
				t.Fatal("New accepted the TLS config")
			}
			if !errors.Is(err, server.ErrTLSConfig) {
				t.Fatalf("error %v does not wrap ErrTLSConfig", err)
			}
		})
	}
}

// TestTLSServing: with a key pair the gRPC listener speaks TLS only, and
// the gauge says so.
func TestTLSServing(t *testing.T) {
	certFile, keyFile, cert := selfSigned(t, t.TempDir())
	cfg := testConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile = certFile, keyFile
	s := start(t, cfg)
	if !s.TLS() {
		t.Fatal("TLS() = false")
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	conn, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := pb.NewInferenceCacheClient(conn).LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm"})
	if err != nil || resp.GetReasonCode() != rpc.ReasonNoHint {
		t.Fatalf("TLS lookup: %v, %v", resp, err)
	}
	plain, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := pb.NewInferenceCacheClient(plain).LookupRoute(tctx(t), &pb.LookupRouteRequest{}); err == nil {
		t.Fatal("a plaintext client got through a TLS listener")
	}
	if v, _ := servertest.Value(servertest.Scrape(t, s.Server), servermetrics.NameGRPCTLSEnabled, ""); v != 1 {
		t.Fatalf("grpc_tls_enabled = %v, want 1", v)
	}
}
