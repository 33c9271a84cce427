package kvevents

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// GRPCSink delivers to the InferenceCache service. It is safe for
// concurrent use (the forwarder calls it from one goroutine anyway).
type GRPCSink struct {
	client icv1.InferenceCacheClient
	log    *slog.Logger
}

var _ Sink = (*GRPCSink)(nil)

// NewGRPCSink returns a sink over conn; log may be nil.
func NewGRPCSink(conn grpc.ClientConnInterface, log *slog.Logger) *GRPCSink {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &GRPCSink{client: icv1.NewInferenceCacheClient(conn), log: log}
}

// ReportCacheState opens one client stream, sends u, half-closes and waits
// for the Ack.
func (s *GRPCSink) ReportCacheState(ctx context.Context, u *icv1.CacheStateUpdate) error {
	stream, err := s.client.ReportCacheState(ctx)
	if err != nil {
		return fmt.Errorf("cannot open ReportCacheState: %w", err)
	}
	if err := stream.Send(u); err != nil {
		// The stream's real status comes with CloseAndRecv.
		if _, rerr := stream.CloseAndRecv(); rerr != nil {
			err = rerr
		}
		return fmt.Errorf("cannot send ReportCacheState: %w", err)
	}
	ack, err := stream.CloseAndRecv()
	if err != nil {
		return fmt.Errorf("cannot finish ReportCacheState: %w", err)
	}
	s.checkAck("ReportCacheState", ack)
	return nil
}

// PublishEvent sends one event.
func (s *GRPCSink) PublishEvent(ctx context.Context, e *icv1.CacheEvent) error {
	ack, err := s.client.PublishEvent(ctx, e)
	if err != nil {
		return fmt.Errorf("cannot publish %s: %w", e.GetType(), err)
	}
	s.checkAck("PublishEvent", ack)
	return nil
}

// checkAck logs a refusal. The contract's server always accepts; a refused
// message would be refused again, so it is not retried.
func (s *GRPCSink) checkAck(rpc string, ack *icv1.Ack) {
	if !ack.GetAccepted() {
		s.log.Warn("server refused an update; not retrying", "rpc", rpc, "reason", ack.GetReasonCode())
	}
}

// TLSFiles names the optional client TLS material. With none set the
// connection is plaintext (the server's default).
type TLSFiles struct {
	// CAFile verifies the server; empty uses the system roots.
	CAFile string
	// CertFile and KeyFile present a client certificate (mTLS).
	CertFile, KeyFile string
	// ServerName overrides the name checked in the server certificate.
	ServerName string
	// Enable turns TLS on even without any file (system roots).
	Enable bool
}

func (t TLSFiles) enabled() bool {
	return t.Enable || t.CAFile != "" || t.CertFile != "" || t.KeyFile != ""
}

// Config builds the client tls.Config.
func (t TLSFiles) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("cannot use CA file %s: no PEM certificate", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("kvevents: a client certificate needs both a cert and a key file")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("cannot load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// DialServer returns a client connection to the inferencecache server.
// The connection is lazy: it dials on first use and reconnects by itself.
func DialServer(address string, t TLSFiles, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if t.enabled() {
		cfg, err := t.Config()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(address, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("cannot create a client for %s: %w", address, err)
	}
	return conn, nil
}
