package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/picker"
	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/tokenizer/modeldir"
)

// DefaultPickerAddr is the endpoint picker's ext_proc listen address, the
// port gateways expect an endpoint picker on.
const DefaultPickerAddr = ":9002"

// Health service names of the picker's listener (the endpoint picker
// protocol's health checking).
const (
	PickerLiveness  = "liveness"
	PickerReadiness = "readiness"
)

// PickerConfig configures the endpoint picker (docs/gateway.md): an Envoy
// ext_proc server in this process, on its own listener, answering from the
// same index.
type PickerConfig struct {
	// Addr is the ext_proc listen address; "" turns the picker off.
	Addr string
	// TLS: by default a self-signed certificate made at start (gateways
	// do not verify an endpoint picker's certificate); CertFile and
	// KeyFile supply one; Plaintext turns TLS off.
	CertFile, KeyFile string
	Plaintext         bool
	// Source publishes the endpoints; when it is nil, NewSource builds
	// one with the server's metrics (cmd/server: --inference-pool,
	// --endpoints-file). Without either the picker stays off (one INFO
	// line): it would have nothing to pick from.
	Source    endpoints.Source
	NewSource NewEndpointSource
	// MaxBodyBytes and MaxFallbacks: see picker.Config (0: defaults).
	MaxBodyBytes int
	MaxFallbacks int
	// Tokenizer, when set, replaces the one of --tokenizer-dir (tests
	// and the demo).
	Tokenizer picker.Tokenizer
	// PD makes the pool a prefill/decode pool (--ext-proc-pd, docs/pd.md):
	// picks come from LookupPDRoute for PDTopology, the prefill endpoint
	// in x-prefiller-host-port.
	PD         bool
	PDTopology string
}

// The picker tokenizes with the --tokenizer-dir and tells the index what it
// routed.
var (
	_ picker.Tokenizer = (*modeldir.Dir)(nil)
	_ picker.Feedback  = (*engine.Engine)(nil)
)

// NewEndpointSource builds an endpoint source that reports to obs and logs
// to log.
type NewEndpointSource func(obs endpoints.Observer, log *slog.Logger) (endpoints.Source, error)

// pickerServer is the picker's listener, gRPC server and health.
type pickerServer struct {
	pk     *picker.Picker
	src    endpoints.Source
	grpc   *grpc.Server
	health *health.Server
	lis    net.Listener
	tls    bool
	// srcFailed is set when the source's Run returned an error: the
	// endpoints are no longer kept current, so the picker is not ready.
	srcFailed atomic.Bool
	// mu serializes readiness changes and guards draining.
	mu       sync.Mutex
	draining bool
	ready    bool
}

// newPicker builds the picker when it is configured (nil otherwise).
// dir is the --tokenizer-dir, nil without one.
func (s *Server) newPicker(dir *modeldir.Dir) (*pickerServer, error) {
	pc := s.cfg.Picker
	if pc.Addr == "" {
		return nil, nil
	}
	if pc.Source == nil && pc.NewSource != nil {
		src, err := pc.NewSource(s.metrics.RegisterPickerEndpoints(endpoints.Reasons...), s.log)
		if err != nil {
			return nil, fmt.Errorf("%w: endpoint picker source: %w", ErrInvalidConfig, err)
		}
		pc.Source = src
	}
	if pc.Source == nil {
		s.log.Info("endpoint picker off: no endpoint source (--inference-pool or --endpoints-file)", "ext_proc_addr", pc.Addr)
		return nil, nil
	}
	creds, err := pickerCreds(pc)
	if err != nil {
		return nil, err
	}
	tok := pc.Tokenizer
	if tok == nil && dir != nil {
		// The whole-conversation tokenizer (chat template over every
		// message); without --tokenizer-dir every chat pick falls back
		// (counted as no_tokenizer).
		tok = dir
	}
	var fb picker.Feedback = s.engine
	ps := &pickerServer{src: pc.Source, tls: creds != nil}
	obs := s.metrics.RegisterPicker(picker.Picks, func(fn func(endpoint, replica string, n int64)) {
		if ps.pk == nil {
			return
		}
		ps.pk.Inflight(func(ep endpoints.Endpoint, n int64) { fn(ep.Address, ep.ReplicaID, n) })
	})
	var pd *picker.PDConfig
	if pc.PD {
		pd = &picker.PDConfig{Lookup: s.service, Topology: pc.PDTopology}
	}
	ps.pk, err = picker.New(picker.Config{
		Source: pc.Source, Lookup: s.service, Tokenizer: tok, Feedback: fb, Observer: obs, Logger: s.log,
		MaxBodyBytes: pc.MaxBodyBytes, MaxFallbacks: pc.MaxFallbacks, PD: pd,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: s.cfg.KeepaliveTime, Timeout: s.cfg.KeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: s.cfg.KeepaliveMinTime, PermitWithoutStream: true}),
		// A request body arrives in Envoy's chunks (64 KiB at most); the
		// limit only bounds a misbehaving client.
		grpc.MaxRecvMsgSize(max(s.cfg.MaxRecvMsgBytes, 1<<20)),
		grpc.ChainUnaryInterceptor(s.recoverUnary),
		grpc.ChainStreamInterceptor(s.recoverStream),
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	ps.grpc = grpc.NewServer(opts...)
	ps.pk.Register(ps.grpc)
	ps.health = health.NewServer()
	ps.health.SetServingStatus(PickerLiveness, healthpb.HealthCheckResponse_SERVING)
	ps.setReadyLocked(false)
	healthpb.RegisterHealthServer(ps.grpc, ps.health)
	return ps, nil
}

// setReadyLocked publishes readiness on "", readiness and the ext_proc
// service name; the caller holds mu (or owns ps alone).
func (ps *pickerServer) setReadyLocked(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	ps.ready = ready
	for _, name := range []string{"", PickerReadiness, picker.ServiceName} {
		ps.health.SetServingStatus(name, st)
	}
}

// pickerCreds returns the ext_proc listener's TLS credentials, nil for
// plaintext (validate checked the flags' combination).
func pickerCreds(pc PickerConfig) (credentials.TransportCredentials, error) {
	switch {
	case pc.Plaintext:
		return nil, nil
	case pc.CertFile != "":
		cert, err := tls.LoadX509KeyPair(pc.CertFile, pc.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: cannot load the ext_proc key pair: %w", ErrTLSConfig, err)
		}
		return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), nil
	}
	cert, err := selfSigned()
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), nil
}

// selfSigned makes the ext_proc listener's certificate at start: ECDSA
// P-256, valid for a year, for localhost, the loopback addresses and the
// host name. Gateways skip verification of an endpoint picker's
// certificate (the InferencePool API has no CA field), so it only
// encrypts.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("cannot make the ext_proc TLS key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("cannot draw a certificate serial: %w", err)
	}
	names := []string{"localhost"}
	if h, err := os.Hostname(); err == nil && h != "" {
		names = append(names, h)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "inferencecache endpoint picker"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     names,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("cannot make the ext_proc certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// synced reports whether the source has published what it watches.
func synced(src endpoints.Source) bool {
	select {
	case <-src.Synced():
		return true
	default:
		return false
	}
}

// pickerReadyPoll is how often readiness is re-evaluated.
const pickerReadyPoll = 50 * time.Millisecond

// runPicker runs the endpoint source and keeps readiness current until
// ctx ends: ready when the server is (index ready, NATS caught up where
// used), the source has published a pool and has not failed.
func (s *Server) runPicker(ctx context.Context, wg *sync.WaitGroup) {
	ps := s.picker
	wg.Go(func() {
		if err := ps.src.Run(ctx); err != nil && ctx.Err() == nil {
			ps.srcFailed.Store(true)
			s.log.Error("the endpoint source stopped; the picker keeps its last endpoints and reports not ready", "err", err)
		}
	})
	wg.Go(func() {
		t := time.NewTicker(pickerReadyPoll)
		defer t.Stop()
		for {
			ps.mu.Lock()
			want := s.ready.Load() && synced(ps.src) && ps.src.Pool() != nil && !ps.srcFailed.Load()
			if !ps.draining && want != ps.ready {
				ps.setReadyLocked(want)
				s.log.Info("endpoint picker readiness", "ready", want, "endpoints", ps.src.Pool().Len())
			}
			ps.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
}

// drainHealth turns the picker's health NOT_SERVING (liveness too) ahead
// of its GracefulStop.
func (ps *pickerServer) drainHealth() {
	ps.mu.Lock()
	ps.draining = true
	ps.mu.Unlock()
	ps.health.Shutdown()
}
