// Package server wires the cache server: the index, the policy store, the
// gRPC service (with grpc.health.v1 and server reflection), the public HTTP
// listener (/healthz, /readyz, /metrics, optional /debug/pprof) and the
// internal control listener (/policy, /snapshot, /probe behind TokenReview
// auth), plus the TTL sweeper, the graceful drain and, with a NATS URL, the
// consumer of the producer-report stream (bus.go, docs/scaleout.md). A handler panic on any
// listener fails its request, not the process (see recover.go).
//
// cmd/server is a thin flag layer over it; tests, the load generator and the
// demo start a real server in process:
//
//	cfg := server.DefaultConfig()
//	cfg.GRPCAddr, cfg.HTTPAddr, cfg.InternalAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
//	cfg.InsecureDisableAuth = true
//	srv, err := server.New(cfg)   // validates, binds all three listeners
//	go srv.Run(ctx)               // serves until ctx ends, then drains
//	<-srv.Ready()
//	conn, _ := grpc.NewClient(srv.GRPCAddr().String(), ...)
//
// New binds the listeners, so the addresses (port 0 resolved) are known
// before Run. Tests start one through server/servertest, which does the
// above with bounded waits and stops the server when the test ends.
package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/controlserver"
	"github.com/inferencecache/inferencecache/controlserver/auth"
	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/internal/ratelog"
	"github.com/inferencecache/inferencecache/picker"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/probe"
	"github.com/inferencecache/inferencecache/rpc"
	"github.com/inferencecache/inferencecache/servermetrics"
	"github.com/inferencecache/inferencecache/tokenizer/modeldir"
)

// Defaults (contract §4.1, §6).
const (
	DefaultGRPCAddr           = ":9090"
	DefaultHTTPAddr           = ":8080"
	DefaultInternalAddr       = ":8081"
	DefaultControllerAudience = "inferencecache.io/controller"
	DefaultPolicyAudience     = "inferencecache.io/policy"
	DefaultDrainTimeout       = 20 * time.Second
	DefaultMaxRecvMsgBytes    = 8 << 20
	DefaultKeepaliveTime      = 30 * time.Second
	DefaultKeepaliveTimeout   = 10 * time.Second
	DefaultKeepaliveMinTime   = 10 * time.Second
)

// Flow-control windows of every gRPC stream and connection (see
// grpc.InitialWindowSize in New).
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// ServiceName is the gRPC service's full name (health and reflection).
const ServiceName = "inferencecache.v1alpha1.InferenceCache"

// Config configures a Server. Start from DefaultConfig.
type Config struct {
	// Listen addresses: gRPC, public HTTP and internal control HTTP.
	GRPCAddr, HTTPAddr, InternalAddr string

	// TLSCertFile and TLSKeyFile turn on TLS for gRPC: both or neither.
	TLSCertFile, TLSKeyFile string

	// MaxIndexEntries caps replica x key entries (0 = unbounded);
	// MaxIndexBytes caps the index's accounted memory (0 = none).
	MaxIndexEntries, MaxIndexBytes int64
	// EngineBlockSize is the block size token_ids are fingerprinted at.
	EngineBlockSize int
	// TokenizerDir serves prompt_text (--tokenizer-dir): model M's
	// tokenizer.json and tokenizer_config.json are read from TokenizerDir/M/
	// on first use (tokenizer/modeldir). Empty: no tokenizer, prompt_text
	// fails open to NO_HINT.
	TokenizerDir string
	// TokenizerRetryAfter is how long a model's failed tokenizer load is
	// remembered; 0 means modeldir.DefaultRetryAfter.
	TokenizerRetryAfter time.Duration
	// SweepInterval is the TTL sweep period.
	SweepInterval time.Duration
	// Load configures load-aware routing (docs/routing.md); Enabled false
	// answers every lookup exactly as the contract ranks it.
	Load engine.LoadConfig

	// EnablePprof mounts /debug/pprof/ on the public listener.
	EnablePprof bool

	// MetricsModels always get their own lookup series (--metrics-models);
	// other models get them only while the index holds keys for them and
	// they are among the MetricsMaxModels busiest.
	MetricsModels []string
	// MetricsMaxModels bounds the models the index holds that keep series
	// of their own, the busiest first (--metrics-max-models); 0 means
	// servermetrics.DefaultMaxModels.
	MetricsMaxModels int
	// MetricsMaxScrapes bounds the /metrics scrapes gathering at once, more
	// answered 503 (--metrics-max-scrapes); 0 means
	// servermetrics.DefaultMaxScrapesInFlight.
	MetricsMaxScrapes int
	// MetricsScrapeTimeout bounds one /metrics scrape, answered 503 past it
	// (--metrics-scrape-timeout); 0 means servermetrics.DefaultScrapeTimeout.
	MetricsScrapeTimeout time.Duration
	// MetricsModelGrace is how long a model that drained to 0 keys keeps its
	// own series (--metrics-model-grace); 0 means
	// servermetrics.DefaultModelGrace.
	MetricsModelGrace time.Duration

	// Control endpoint auth. With InsecureDisableAuth the three endpoints
	// are open (development only; logged at ERROR). Otherwise
	// AllowedControllerSA ("system:serviceaccount:<ns>:<name>") is required
	// and reviews run against Kubeconfig, or the in-cluster config when it
	// is empty, unless Reviewer is set (tests).
	InsecureDisableAuth bool
	AllowedControllerSA string
	ControllerAudience  string
	PolicyAudience      string
	Kubeconfig          string
	Reviewer            auth.Reviewer

	// gRPC transport.
	KeepaliveTime, KeepaliveTimeout, KeepaliveMinTime time.Duration
	MaxRecvMsgBytes                                   int

	// DrainTimeout bounds GracefulStop on shutdown; after it, the server
	// stops hard.
	DrainTimeout time.Duration

	// Logger; nil means slog.Default().
	Logger *slog.Logger

	// WrapIndex, when set, wraps the index the gRPC service reads (tests
	// inject slow or failing lookups with it).
	WrapIndex func(rpc.Index) rpc.Index
	// T2 is the probe's tier-2 prober; nil means probe.RemoteT2 (a put/get
	// round trip against the remote tier a /probe request names).
	T2 probe.T2Prober

	// wrapHTTP, set only by tests (export_test.go), wraps each HTTP
	// listener's handler inside the panic recovery; listener is "http" or
	// "control".
	wrapHTTP func(listener string, h http.Handler) http.Handler
	// MaxClockSkew bounds how far in the future producer timestamps may lie
	// (rpc.Config.MaxClockSkew); 0 means rpc.DefaultMaxClockSkew.
	MaxClockSkew time.Duration

	// NATS, when its URL is set, feeds the index from a NATS JetStream
	// stream too (bus.go, docs/scaleout.md); the server is ready only once
	// it caught up with the stream.
	NATS NATSConfig

	// Picker is the endpoint picker for gateways (picker.go,
	// docs/gateway.md).
	Picker PickerConfig

	// MaxObserverStreams bounds the StreamCacheEvents streams, and the
	// StreamMetrics streams, open at once (0: rpc.DefaultMaxStreams);
	// EventStreamBuffer is each StreamCacheEvents subscriber's buffer in
	// events (0: rpc.DefaultEventBuffer).
	MaxObserverStreams, EventStreamBuffer int
}

// DefaultConfig returns the production defaults (auth enabled, so
// AllowedControllerSA must still be set, or InsecureDisableAuth).
func DefaultConfig() Config {
	return Config{
		GRPCAddr:             DefaultGRPCAddr,
		HTTPAddr:             DefaultHTTPAddr,
		InternalAddr:         DefaultInternalAddr,
		MaxIndexEntries:      engine.DefaultMaxEntries,
		EngineBlockSize:      rpc.DefaultEngineBlockSize,
		SweepInterval:        engine.DefaultSweepInterval,
		Load:                 engine.DefaultLoadConfig(),
		ControllerAudience:   DefaultControllerAudience,
		PolicyAudience:       DefaultPolicyAudience,
		KeepaliveTime:        DefaultKeepaliveTime,
		KeepaliveTimeout:     DefaultKeepaliveTimeout,
		KeepaliveMinTime:     DefaultKeepaliveMinTime,
		MaxRecvMsgBytes:      DefaultMaxRecvMsgBytes,
		DrainTimeout:         DefaultDrainTimeout,
		MetricsModelGrace:    servermetrics.DefaultModelGrace,
		MetricsMaxModels:     servermetrics.DefaultMaxModels,
		MetricsMaxScrapes:    servermetrics.DefaultMaxScrapesInFlight,
		MetricsScrapeTimeout: servermetrics.DefaultScrapeTimeout,
		Picker:               PickerConfig{Addr: DefaultPickerAddr},
	}
}

// Errors of New.
var (
	ErrInvalidConfig = errors.New("server: invalid config")
	ErrTLSConfig     = errors.New("server: invalid TLS config")
)

// Server is one cache server. Create it with New and run it with Run. Its
// accessors are safe for concurrent use. Every field but ready, readyCh and
// ran is set by New and only read afterwards.
type Server struct {
	cfg Config
	log *slog.Logger
	// panicLogs rate-limits the recovered-panic log per listener (built by
	// New, read-only afterwards; the limiters are safe for concurrent use).
	panicLogs map[string]*ratelog.Limiter
	// instanceID is random per New: producers read it from the gRPC
	// response headers of ReportCacheState and PublishEvent, the
	// controller from /snapshot, and both take a change for a restart.
	instanceID string

	engine   *engine.Engine
	policies *policy.Store
	metrics  *servermetrics.Metrics
	service  *rpc.Service
	prober   *probe.Prober

	grpc     *grpc.Server
	health   *health.Server
	public   *http.Server
	internal *http.Server
	tls      bool

	grpcLis, httpLis, intLis net.Listener

	// picker is the endpoint picker, nil when it is off; set by New.
	picker *pickerServer

	// NATS consumption (nil without --nats-url), set by New.
	bus     *bus.Consumer
	busApp  *busApplier
	busConn *nats.Conn

	// readyMu serializes the ready transitions (becoming ready once caught
	// up, the drain) and guards draining.
	readyMu  sync.Mutex
	draining bool

	// ready is true while the server serves: Run stores true once its
	// listeners are serving (and, with NATS, it caught up with the stream;
	// markReady) and false when the drain begins; the /readyz handler loads
	// it.
	ready atomic.Bool
	// readyCh is closed by Run, once, when the server first becomes ready.
	readyCh chan struct{}
	// ran is set by the first Run (CompareAndSwap), so a second Run fails
	// and Close leaves the listeners to the running server.
	ran atomic.Bool
}

// New validates cfg, builds every component and binds the three listeners.
// On error nothing stays bound.
func New(cfg Config) (*Server, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := validate(&cfg); err != nil {
		return nil, err
	}
	creds, err := loadTLS(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return nil, err
	}

	id, err := newInstanceID()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, instanceID: id, readyCh: make(chan struct{}), tls: creds != nil, panicLogs: newPanicLogs()}
	s.metrics, err = servermetrics.NewWithOptions(servermetrics.Options{
		Models: cfg.MetricsModels, MaxModels: cfg.MetricsMaxModels, ModelGrace: cfg.MetricsModelGrace,
		MaxScrapesInFlight: cfg.MetricsMaxScrapes, ScrapeTimeout: cfg.MetricsScrapeTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: --metrics-models or --metrics-model-grace: %w", ErrInvalidConfig, err)
	}
	s.metrics.SetTLSEnabled(s.tls)
	s.policies = policy.NewStore()
	s.engine = engine.New(engine.Config{
		MaxEntries: cfg.MaxIndexEntries,
		MaxBytes:   cfg.MaxIndexBytes,
		Policies:   s.policies,
		Metrics:    s.metrics,
		Load:       cfg.Load,
	})
	s.metrics.RegisterIndex(s.engine.Memory)
	s.metrics.RegisterLoads(s.engine.Loads)
	s.metrics.DeclareDropReasons(rpc.DropReasons...)
	var tok rpc.Tokenizer
	var ttok rpc.TemplateTokenizer
	var dir *modeldir.Dir
	if cfg.TokenizerDir != "" {
		dir, err = modeldir.New(modeldir.Config{
			Root:       cfg.TokenizerDir,
			Observer:   s.metrics.RegisterTokenizer(modeldir.Reasons...),
			RetryAfter: cfg.TokenizerRetryAfter,
			Logger:     log,
		})
		if err != nil {
			return nil, fmt.Errorf("%w: --tokenizer-dir: %w", ErrInvalidConfig, err)
		}
		tok = dir
		ttok = promptTokenizer{dir}
	}
	var idx rpc.Index = s.engine
	if cfg.WrapIndex != nil {
		idx = cfg.WrapIndex(idx)
	}
	features := s.metrics.RegisterFeatures(rpc.PDReasons, rpc.RenderReasons, streamNames, rpc.StreamOutcomes, func(stream string) int64 {
		if stream == rpc.StreamMetricsName {
			return s.service.MetricStreamsOpen()
		}
		return s.service.EventStreamsOpen()
	})
	s.service, err = rpc.NewService(rpc.Config{
		Index:     idx,
		Policies:  s.policies,
		Observer:  s.metrics,
		Drops:     s.metrics,
		BlockSize: cfg.EngineBlockSize,
		Tokenizer: tok,
		Logger:    log,

		InstanceID:   id,
		MaxClockSkew: cfg.MaxClockSkew,
		Producer:     s.metrics,

		TemplateTokenizer: ttok,
		MaxStreams:        cfg.MaxObserverStreams,
		EventBuffer:       cfg.EventStreamBuffer,
		Metrics:           gatherSamples{s.metrics.Registry()},
		Features:          features,
	})
	if err != nil {
		return nil, fmt.Errorf("cannot build the gRPC service: %w", err)
	}
	s.metrics.RegisterLookupStreams(s.service.LookupStreamsOpen)
	if s.picker, err = s.newPicker(dir); err != nil {
		return nil, err
	}
	t2 := cfg.T2
	if t2 == nil {
		t2 = probe.RemoteT2{}
	}
	s.prober = probe.New(probe.Config{Index: s.engine, T2: t2, Logger: log})

	control, err := s.controlHandler()
	if err != nil {
		return nil, err
	}

	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: cfg.KeepaliveTime, Timeout: cfg.KeepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: cfg.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.MaxRecvMsgSize(cfg.MaxRecvMsgBytes),
		// No grpc.NumStreamWorkers: it cut server CPU per lookup by ~6 % but
		// worsened the chat p99.9 by 1.15-1.26x (profiles/README.md).
		// Fixed flow-control windows turn off grpc's BDP estimator, which
		// otherwise sends a PING with the first DATA frame after each ack:
		// about one extra frame out and one in per unary call at low
		// concurrency. The connection window is the estimator's cap (16 MiB),
		// so a client can push no more unread data per connection than
		// before; one stream gets a quarter of it.
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		// Outermost: a handler panic fails its call, not the process.
		grpc.ChainUnaryInterceptor(s.recoverUnary),
		grpc.ChainStreamInterceptor(s.recoverStream),
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	// The codec decodes LookupRoute and ReportCacheState into pooled memory
	// (rpc.Register's handlers); nothing here keeps a sent message.
	opts = append(opts, rpc.ServerOptions()...)
	s.grpc = grpc.NewServer(opts...)
	rpc.Register(s.grpc, s.service)
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)

	public := s.publicHandler()
	if cfg.wrapHTTP != nil {
		public, control = cfg.wrapHTTP("http", public), cfg.wrapHTTP("control", control)
	}
	s.public = &http.Server{Handler: s.recoverHTTP(servermetrics.ListenerHTTP, public), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	s.internal = &http.Server{Handler: s.recoverHTTP(servermetrics.ListenerControl, control), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}

	if cfg.NATS.URL != "" {
		if err := s.newBus(); err != nil {
			return nil, err
		}
	}
	if err := s.listen(); err != nil {
		s.closeBus()
		return nil, err
	}
	return s, nil
}

// validate checks cfg and fills zero durations with defaults.
func validate(cfg *Config) error {
	for _, a := range []struct{ flag, v string }{
		{"--controller-audience", cfg.ControllerAudience},
		{"--policy-audience", cfg.PolicyAudience},
	} {
		switch {
		case a.v == "":
			return fmt.Errorf("%w: %s must not be empty", ErrInvalidConfig, a.flag)
		case strings.TrimSpace(a.v) != a.v:
			return fmt.Errorf("%w: %s %q has surrounding whitespace", ErrInvalidConfig, a.flag, a.v)
		}
	}
	if !cfg.InsecureDisableAuth && cfg.AllowedControllerSA == "" {
		return fmt.Errorf("%w: --allowed-controller-sa is required unless --insecure-disable-auth", ErrInvalidConfig)
	}
	switch {
	case cfg.GRPCAddr == "" || cfg.HTTPAddr == "" || cfg.InternalAddr == "":
		return fmt.Errorf("%w: every listen address must be set", ErrInvalidConfig)
	case cfg.MaxIndexEntries < 0:
		return fmt.Errorf("%w: negative --max-index-entries %d", ErrInvalidConfig, cfg.MaxIndexEntries)
	case cfg.MaxIndexBytes < 0:
		return fmt.Errorf("%w: negative --max-index-bytes %d", ErrInvalidConfig, cfg.MaxIndexBytes)
	case cfg.EngineBlockSize <= 0:
		return fmt.Errorf("%w: --engine-block-size must be positive, got %d", ErrInvalidConfig, cfg.EngineBlockSize)
	case cfg.SweepInterval <= 0:
		return fmt.Errorf("%w: --sweep-interval must be positive, got %v", ErrInvalidConfig, cfg.SweepInterval)
	case cfg.MaxRecvMsgBytes < 0:
		return fmt.Errorf("%w: negative max receive message size %d", ErrInvalidConfig, cfg.MaxRecvMsgBytes)
	case cfg.MetricsModelGrace < 0:
		return fmt.Errorf("%w: negative --metrics-model-grace %v", ErrInvalidConfig, cfg.MetricsModelGrace)
	case cfg.MetricsMaxModels < 0:
		return fmt.Errorf("%w: negative --metrics-max-models %d", ErrInvalidConfig, cfg.MetricsMaxModels)
	case cfg.MetricsMaxScrapes < 0:
		return fmt.Errorf("%w: negative --metrics-max-scrapes %d", ErrInvalidConfig, cfg.MetricsMaxScrapes)
	case cfg.MetricsScrapeTimeout < 0:
		return fmt.Errorf("%w: negative --metrics-scrape-timeout %v", ErrInvalidConfig, cfg.MetricsScrapeTimeout)
	case cfg.Load.Validate() != nil:
		return fmt.Errorf("%w: %w", ErrInvalidConfig, cfg.Load.Validate())
	case cfg.MaxClockSkew < 0:
		return fmt.Errorf("%w: negative max clock skew %v", ErrInvalidConfig, cfg.MaxClockSkew)
	}
	switch pc := cfg.Picker; {
	case pc.Plaintext && (pc.CertFile != "" || pc.KeyFile != ""):
		return fmt.Errorf("%w: --ext-proc-plaintext and --ext-proc-tls-cert-file/--ext-proc-tls-key-file exclude each other", ErrTLSConfig)
	case (pc.CertFile == "") != (pc.KeyFile == ""):
		return fmt.Errorf("%w: --ext-proc-tls-cert-file and --ext-proc-tls-key-file must be set together", ErrTLSConfig)
	case pc.MaxBodyBytes < 0:
		return fmt.Errorf("%w: negative --ext-proc-max-body-bytes %d", ErrInvalidConfig, pc.MaxBodyBytes)
	}
	if cfg.NATS.URL != "" {
		if err := cfg.NATS.Stream.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if cfg.NATS.ReadyLag < 0 {
			return fmt.Errorf("%w: negative --nats-ready-lag %d", ErrInvalidConfig, cfg.NATS.ReadyLag)
		}
	}
	if cfg.KeepaliveTime <= 0 {
		cfg.KeepaliveTime = DefaultKeepaliveTime
	}
	if cfg.KeepaliveTimeout <= 0 {
		cfg.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if cfg.KeepaliveMinTime <= 0 {
		cfg.KeepaliveMinTime = DefaultKeepaliveMinTime
	}
	if cfg.MaxRecvMsgBytes == 0 {
		cfg.MaxRecvMsgBytes = DefaultMaxRecvMsgBytes
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	return nil
}

// loadTLS returns the gRPC TLS credentials, nil for plaintext.
func loadTLS(certFile, keyFile string) (credentials.TransportCredentials, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case certFile == "" || keyFile == "":
		return nil, fmt.Errorf("%w: --tls-cert-file and --tls-key-file must be set together (got cert %q, key %q)", ErrTLSConfig, certFile, keyFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot load the key pair: %w", ErrTLSConfig, err)
	}
	return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), nil
}

// controlHandler builds the internal listener's handler with its auth.
func (s *Server) controlHandler() (http.Handler, error) {
	snaps := instanceSnapshots{src: s.engine, id: s.instanceID}
	cfg := controlserver.Config{Policies: s.policies, Snapshots: snaps, Prober: s.prober, Logger: s.log}
	if s.cfg.InsecureDisableAuth {
		s.log.Error("CONTROL ENDPOINT AUTH IS DISABLED (--insecure-disable-auth): anyone who can reach the internal listener can rewrite every namespace's cache policy; never run this in a shared cluster",
			"addr", s.cfg.InternalAddr)
	} else {
		reviewer := s.cfg.Reviewer
		if reviewer == nil {
			r, err := auth.NewKubeReviewer(s.cfg.Kubeconfig)
			if err != nil {
				return nil, fmt.Errorf("cannot set up control endpoint auth: %w", err)
			}
			reviewer = r
		}
		mk := func(audience string, rec auth.Recorder) (func(http.Handler) http.Handler, error) {
			a, err := auth.New(auth.Config{
				Reviewer: reviewer, Audience: audience, AllowedIdentity: s.cfg.AllowedControllerSA,
				Recorder: rec, Logger: s.log,
			})
			if err != nil {
				return nil, fmt.Errorf("cannot set up control endpoint auth: %w", err)
			}
			return a.Wrap, nil
		}
		var err error
		if cfg.SnapshotAuth, err = mk(s.cfg.ControllerAudience, s.metrics.SnapshotAuth()); err != nil {
			return nil, err
		}
		if cfg.PolicyAuth, err = mk(s.cfg.PolicyAudience, s.metrics.PolicyAuth()); err != nil {
			return nil, err
		}
		if cfg.ProbeAuth, err = mk(s.cfg.ControllerAudience, s.metrics.ProbeAuth()); err != nil {
			return nil, err
		}
	}
	h, err := controlserver.NewHandler(cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot build the control handler: %w", err)
	}
	return h, nil
}

// publicHandler serves /healthz, /readyz, /metrics and, when enabled,
// /debug/pprof/.
func (s *Server) publicHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !s.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready\n"))
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("/metrics", s.metrics.Handler())
	if s.cfg.EnablePprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// listen binds the three listeners, closing what it bound on error.
func (s *Server) listen() error {
	var bound []net.Listener
	type listener struct {
		name, addr string
		dst        *net.Listener
	}
	all := []listener{
		{"gRPC", s.cfg.GRPCAddr, &s.grpcLis},
		{"HTTP", s.cfg.HTTPAddr, &s.httpLis},
		{"internal", s.cfg.InternalAddr, &s.intLis},
	}
	if s.picker != nil {
		all = append(all, listener{"ext_proc", s.cfg.Picker.Addr, &s.picker.lis})
	}
	for _, l := range all {
		lis, err := net.Listen("tcp", l.addr)
		if err != nil {
			for _, b := range bound {
				_ = b.Close()
			}
			return fmt.Errorf("cannot listen for %s on %s: %w", l.name, l.addr, err)
		}
		bound = append(bound, lis)
		*l.dst = lis
	}
	return nil
}

// GRPCAddr returns the gRPC listener's address (port 0 resolved).
func (s *Server) GRPCAddr() net.Addr { return s.grpcLis.Addr() }

// HTTPAddr returns the public HTTP listener's address.
func (s *Server) HTTPAddr() net.Addr { return s.httpLis.Addr() }

// InternalAddr returns the internal control listener's address.
func (s *Server) InternalAddr() net.Addr { return s.intLis.Addr() }

// PickerAddr returns the endpoint picker's ext_proc listener address, nil
// when the picker is off.
func (s *Server) PickerAddr() net.Addr {
	if s.picker == nil {
		return nil
	}
	return s.picker.lis.Addr()
}

// Picker returns the endpoint picker, nil when it is off.
func (s *Server) Picker() *picker.Picker {
	if s.picker == nil {
		return nil
	}
	return s.picker.pk
}

// PickerTLS reports whether the ext_proc listener serves TLS.
func (s *Server) PickerTLS() bool { return s.picker != nil && s.picker.tls }

// TLS reports whether gRPC serves TLS.
func (s *Server) TLS() bool { return s.tls }

// InstanceID returns the server's random per-start instance id.
func (s *Server) InstanceID() string { return s.instanceID }

// Engine returns the index (for in-process seeding by tests and the demo).
func (s *Server) Engine() *engine.Engine { return s.engine }

// Policies returns the policy store /policy writes.
func (s *Server) Policies() *policy.Store { return s.policies }

// Metrics returns the server's metrics.
func (s *Server) Metrics() *servermetrics.Metrics { return s.metrics }

// Service returns the gRPC service implementation.
func (s *Server) Service() *rpc.Service { return s.service }

// Ready is closed once the server serves (with NATS: and caught up with
// the stream).
func (s *Server) Ready() <-chan struct{} { return s.readyCh }

// Run serves until ctx ends or a listener fails, then drains: /readyz and
// the gRPC health service turn unavailable, server_up drops to 0,
// GracefulStop lets in-flight calls finish for at most DrainTimeout (then
// the server stops hard), and the HTTP listeners shut down. It returns nil
// after a drain caused by ctx, or the listener error. Run may be called
// once.
func (s *Server) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return errors.New("server: Run called twice")
	}
	errCh := make(chan error, 4)
	var wg sync.WaitGroup
	serve := func(name string, f func() error) {
		wg.Go(func() {
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
				errCh <- fmt.Errorf("%s listener failed: %w", name, err)
			}
		})
	}
	serve("gRPC", func() error { return s.grpc.Serve(s.grpcLis) })
	serve("HTTP", func() error { return s.public.Serve(s.httpLis) })
	serve("internal", func() error { return s.internal.Serve(s.intLis) })
	pickCtx, stopPicker := context.WithCancel(context.Background())
	var pickWG sync.WaitGroup
	if s.picker != nil {
		serve("ext_proc", func() error { return s.picker.grpc.Serve(s.picker.lis) })
		s.runPicker(pickCtx, &pickWG)
	}

	sweepCtx, stopSweep := context.WithCancel(context.Background())
	var sweepWG sync.WaitGroup
	sweepWG.Go(func() { s.sweepLoop(sweepCtx) })

	s.metrics.SetUp(true)
	s.log.Info("inferencecache server serving", "instance", s.instanceID, "grpc", s.GRPCAddr().String(), "http", s.HTTPAddr().String(),
		"internal", s.InternalAddr().String(), "tls", s.tls, "max_index_entries", s.cfg.MaxIndexEntries,
		"max_index_bytes", s.cfg.MaxIndexBytes, "engine_block_size", s.cfg.EngineBlockSize, "tokenizer_dir", s.cfg.TokenizerDir,
		"nats", s.cfg.NATS.URL != "", "ext_proc", s.PickerAddr(), "ext_proc_tls", s.PickerTLS())

	// With NATS the server replays the stream first and turns ready once
	// caught up; lookups are answered meanwhile (from a partial index).
	busCtx, stopBus := context.WithCancel(context.Background())
	var busWG sync.WaitGroup
	if s.bus != nil {
		busWG.Go(func() { _ = s.bus.Run(busCtx) })
		busWG.Go(func() {
			select {
			case <-s.bus.CaughtUp():
				s.markReady()
			case <-busCtx.Done():
			}
		})
	} else {
		s.markReady()
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errCh:
		s.log.Error("shutting down after a listener failure", "err", runErr)
	}
	s.drain()
	stopPicker()
	pickWG.Wait()
	stopBus()
	busWG.Wait()
	s.closeBus()
	stopSweep()
	sweepWG.Wait()
	wg.Wait()
	return runErr
}

// markReady turns the server ready (health SERVING, /readyz ok, Ready
// closed), unless the drain already began.
func (s *Server) markReady() {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if s.draining || s.ready.Load() {
		return
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.ready.Store(true)
	close(s.readyCh)
}

// closeBus closes the NATS connection, if any.
func (s *Server) closeBus() {
	if s.busConn != nil {
		s.busConn.Close()
	}
}

// stopGrace bounds the wait for handlers after the hard stop.
const stopGrace = 2 * time.Second

// drain is Run's shutdown sequence.
func (s *Server) drain() {
	start := time.Now()
	s.readyMu.Lock()
	s.draining = true
	s.ready.Store(false)
	s.readyMu.Unlock()
	s.metrics.SetUp(false)
	s.health.Shutdown() // every service NOT_SERVING
	s.service.Drain()   // lookup streams end after their next answer
	if s.picker != nil {
		s.picker.drainHealth()
	}
	s.log.Info("draining", "timeout", s.cfg.DrainTimeout)

	// Both gRPC servers drain together within one budget: ext_proc
	// streams in flight end with their HTTP requests.
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		wg.Go(s.grpc.GracefulStop)
		if s.picker != nil {
			wg.Go(s.picker.grpc.GracefulStop)
		}
		wg.Wait()
		close(done)
	}()
	timer := time.NewTimer(s.cfg.DrainTimeout)
	select {
	case <-done:
		timer.Stop()
	case <-timer.C:
		s.log.Warn("drain timeout: stopping the gRPC server hard", "timeout", s.cfg.DrainTimeout)
		s.grpc.Stop() // closes every connection; handlers see their streams end
		if s.picker != nil {
			s.picker.grpc.Stop()
		}
		// GracefulStop returns once every handler has returned. Ours all
		// end with their stream, but do not let a stuck one hold Run.
		t := time.NewTimer(stopGrace)
		select {
		case <-done:
			t.Stop()
		case <-t.C:
			s.log.Error("gRPC handlers still running after the hard stop; returning anyway", "grace", stopGrace)
		}
	}
	// The HTTP listeners close last so /metrics and /readyz stay up while
	// gRPC drains; give them what is left of the budget (at least 1 s).
	left := max(s.cfg.DrainTimeout-time.Since(start), time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), left)
	defer cancel()
	for _, h := range []*http.Server{s.internal, s.public} {
		if err := h.Shutdown(ctx); err != nil {
			_ = h.Close()
		}
	}
	s.log.Info("drained", "took", time.Since(start).Round(time.Millisecond))
}

// sweepLoop runs the index's TTL sweep every SweepInterval until ctx ends;
// after each sweep it retires the metric series of the models drained for
// the grace period (servermetrics.Metrics.RetireDrainedModels).
func (s *Server) sweepLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			n := s.engine.Sweep(engine.Micros(now))
			if n > 0 {
				s.log.Debug("ttl sweep", "removed", n, "took", time.Since(now).Round(time.Microsecond))
			}
			if n := s.metrics.RetireDrainedModels(); n > 0 {
				s.log.Debug("retired the metric series of drained models", "models", n)
			}
		}
	}
}

// Close releases the listeners of a Server that was never Run.
func (s *Server) Close() error {
	if s.ran.Load() {
		return nil
	}
	s.closeBus()
	var pickErr error
	if s.picker != nil {
		pickErr = s.picker.lis.Close()
	}
	return errors.Join(s.grpcLis.Close(), s.httpLis.Close(), s.intLis.Close(), pickErr)
}

// newInstanceID returns 16 random hex digits.
func newInstanceID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("cannot draw the server instance id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// instanceSnapshots adds the server's instance id to the index's /snapshot.
type instanceSnapshots struct {
	src controlserver.SnapshotSource
	id  string
}

func (s instanceSnapshots) Snapshot() controlapi.CacheSnapshot {
	snap := s.src.Snapshot()
	snap.ServerInstanceID = s.id
	return snap
}
