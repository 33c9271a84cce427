package kvevents

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// InstanceIDHeader is the gRPC response header carrying the server's
// instance id (rpc.InstanceIDHeader, repeated here so the sidecar does not
// link the server's packages; a test keeps the two equal).
const InstanceIDHeader = "inferencecache-server-instance-id"

// GRPCSink delivers to the InferenceCache service. It is safe for
// concurrent use (the forwarder calls it from one goroutine anyway).
//
// It also watches the server (ServerWatcher): the server's instance id
// comes in the response header InstanceIDHeader of both RPCs; a new id,
// or a success after a call failed with codes.Unavailable (the connection
// was lost), moves ServerEpoch.
type GRPCSink struct {
	client icv1.InferenceCacheClient
	log    *slog.Logger

	// mu guards the fields below, written after every call.
	mu       sync.Mutex
	instance string // last instance id seen; "" before any (or from a server without one)
	epoch    uint64
	reason   string // why epoch last moved
	lost     bool   // a call failed with Unavailable since the last success
}

var (
	_ Sink          = (*GRPCSink)(nil)
	_ ServerWatcher = (*GRPCSink)(nil)
)

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
		s.observe(nil, err)
		return fmt.Errorf("cannot open ReportCacheState: %w", err)
	}
	if err := stream.Send(u); err != nil {
		// The stream's real status comes with CloseAndRecv.
		if _, rerr := stream.CloseAndRecv(); rerr != nil {
			err = rerr
		}
		s.observe(nil, err)
		return fmt.Errorf("cannot send ReportCacheState: %w", err)
	}
	ack, err := stream.CloseAndRecv()
	if err != nil {
		s.observe(nil, err)
		return fmt.Errorf("cannot finish ReportCacheState: %w", err)
	}
	md, _ := stream.Header() // available once CloseAndRecv returned
	s.observe(md, nil)
	s.checkAck("ReportCacheState", ack)
	return nil
}

// PublishEvent sends one event.
func (s *GRPCSink) PublishEvent(ctx context.Context, e *icv1.CacheEvent) error {
	var md metadata.MD
	ack, err := s.client.PublishEvent(ctx, e, grpc.Header(&md))
	s.observe(md, err)
	if err != nil {
		return fmt.Errorf("cannot publish %s: %w", e.GetType(), err)
	}
	s.checkAck("PublishEvent", ack)
	return nil
}

// observe updates the server watch after a call.
func (s *GRPCSink) observe(md metadata.MD, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if status.Code(err) == codes.Unavailable {
			s.lost = true
		}
		return
	}
	if s.lost {
		s.lost = false
		s.epoch++
		s.reason = RereportServerReconnect
	}
	ids := md.Get(InstanceIDHeader)
	if len(ids) == 0 || ids[0] == s.instance {
		return
	}
	if s.instance != "" {
		s.log.Info("the inferencecache server restarted (new instance id)", "old", s.instance, "new", ids[0])
		s.epoch++
		s.reason = RereportServerRestart
	}
	s.instance = ids[0]
}

// ServerEpoch implements ServerWatcher.
func (s *GRPCSink) ServerEpoch() (uint64, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch, s.reason
}

// ServerInstance returns the last server instance id seen ("" before any).
func (s *GRPCSink) ServerInstance() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.instance
}

// checkAck logs a refusal. The contract's server always accepts; a refused
// message would be refused again, so it is not retried.
func (s *GRPCSink) checkAck(rpc string, ack *icv1.Ack) {
	if !ack.GetAccepted() {
		refusedAckLog.Warn(context.Background(), s.log, "server refused an update; not retrying", "rpc", rpc, "reason", ack.GetReasonCode())
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

// Connection defaults of DialServer: reconnection backs off from 250 ms to
// at most 5 s (gRPC's own default grows to 2 min, which would leave an idle
// subscriber blind to a restarted server for that long), and an idle
// connection is pinged every 30 s so a peer that vanished without closing
// it (a lost node) is noticed. The server permits pings every 10 s.
var (
	dialBackoff   = backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second}
	dialKeepalive = keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}
)

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
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: dialBackoff, MinConnectTimeout: 5 * time.Second}),
		grpc.WithKeepaliveParams(dialKeepalive),
	}
	conn, err := grpc.NewClient(address, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("cannot create a client for %s: %w", address, err)
	}
	return conn, nil
}
