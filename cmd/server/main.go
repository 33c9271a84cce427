// Command server is the inferencecache cache server: gRPC on :9090, the
// public HTTP listener (/healthz, /readyz, /metrics) on :8080 and the
// internal control listener (/policy, /snapshot, /probe) on :8081. The
// wiring lives in package server; this file only maps flags and signals.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/picker"
	"github.com/inferencecache/inferencecache/rpc"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/tokenizer/modeldir"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

// run parses args, builds the server and serves until ctx ends. started,
// when non-nil, receives the server once it serves (tests).
func run(ctx context.Context, args []string, stderr io.Writer, started func(*server.Server)) error {
	cfg := server.DefaultConfig()
	var logFormat, logLevel, metricsModels, natsFilters string
	var natsMaxTTL time.Duration
	var mem memoryLimit
	var epf endpointFlags
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.GRPCAddr, "grpc-bind-address", cfg.GRPCAddr, "gRPC listen address")
	fs.StringVar(&cfg.HTTPAddr, "http-bind-address", cfg.HTTPAddr, "public HTTP listen address (/healthz, /readyz, /metrics)")
	fs.StringVar(&cfg.InternalAddr, "snapshot-bind-address", cfg.InternalAddr, "internal control listen address (/policy, /snapshot, /probe)")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert-file", "", "gRPC TLS certificate (PEM); set together with --tls-key-file")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key-file", "", "gRPC TLS private key (PEM); set together with --tls-cert-file")
	fs.Int64Var(&cfg.MaxIndexEntries, "max-index-entries", cfg.MaxIndexEntries, "cap on replica x prefix entries (0 = unbounded)")
	fs.Int64Var(&cfg.MaxIndexBytes, "max-index-bytes", 0, "cap on the index's accounted memory in bytes (0 = none)")
	fs.Int64Var(&mem.limit, "memory-limit", 0, "the container's memory limit in bytes (the manifests pass limits.memory through the downward API); derives --max-index-bytes and the Go runtime's soft memory limit (GOMEMLIMIT) unless those are set (0 = derive nothing)")
	fs.Float64Var(&mem.indexFraction, "memory-limit-index-fraction", defaultIndexFraction, "share of --memory-limit that --max-index-bytes defaults to")
	fs.Float64Var(&mem.gcFraction, "memory-limit-gc-fraction", defaultGCFraction, "share of --memory-limit that the Go runtime's soft memory limit defaults to when GOMEMLIMIT is unset")
	fs.IntVar(&cfg.EngineBlockSize, "engine-block-size", cfg.EngineBlockSize, "engine KV block size in tokens, for fingerprinting token_ids")
	fs.StringVar(&cfg.TokenizerDir, "tokenizer-dir", "", "folder of the models' tokenizers for prompt_text: model M's tokenizer.json and tokenizer_config.json are read from DIR/M/ on first use (empty: prompt_text fails open to NO_HINT)")
	fs.DurationVar(&cfg.TokenizerRetryAfter, "tokenizer-retry-after", modeldir.DefaultRetryAfter, "how long a model whose tokenizer failed to load fails open before the next load attempt")
	fs.DurationVar(&cfg.SweepInterval, "sweep-interval", cfg.SweepInterval, "TTL sweep period")
	fs.BoolVar(&cfg.Load.Enabled, "load-aware-routing", cfg.Load.Enabled, "rank by estimated time to first token when replicas report load (false: the contract's ranking exactly)")
	fs.Float64Var(&cfg.Load.Bound, "load-bound", cfg.Load.Bound, "bounded-load factor c: a replica with more requests in flight than max(c x mean + 2 x sqrt(mean), --load-min-queue) is overloaded")
	fs.IntVar(&cfg.Load.MinQueue, "load-min-queue", cfg.Load.MinQueue, "requests in flight at which load starts to matter (load-awareness turns off again below half of it)")
	fs.Float64Var(&cfg.Load.PrefillWeight, "load-prefill-weight", cfg.Load.PrefillWeight, "queued prefill tokens one uncached prompt token is worth when ranking by load (>= 1)")
	fs.Float64Var(&cfg.Load.MinMatch, "load-min-match", cfg.Load.MinMatch, "share of the prompt a cached prefix must cover to count when ranking by load (0..1; 0.5: follow a prefix only when it is at least the part still to compute)")
	fs.DurationVar(&cfg.Load.MaxAge, "load-max-age", cfg.Load.MaxAge, "a replica's load report older than this is ignored")
	fs.Int64Var(&cfg.Load.ExpectedBytes, "load-expected-bytes", cfg.Load.ExpectedBytes, "memory of the routing-time (expected) entries a followed lookup leaves on its replica until KV events confirm them, counted in --max-index-bytes and at most an eighth of it (negative: none)")
	fs.DurationVar(&cfg.Load.ExpectedTTL, "load-expected-ttl", cfg.Load.ExpectedTTL, "least time an unconfirmed routing-time entry lives")
	fs.Float64Var(&cfg.Load.ExpectedCredit, "load-expected-credit", cfg.Load.ExpectedCredit, "what an expected (routed, not yet stored) token counts for against a stored one (0..1)")
	fs.Float64Var(&cfg.Load.EvictionShare, "load-eviction-share", cfg.Load.EvictionShare, "part of --load-prefill-weight that prices evicting other prefixes, so a replica with room in its cache is a cheaper place for new blocks ([0, 1); 0: every replica weighs the same)")
	fs.BoolVar(&cfg.EnablePprof, "enable-pprof", false, "serve /debug/pprof/ on the public HTTP listener and sample mutex and block contention for it")
	fs.StringVar(&cfg.AllowedControllerSA, "allowed-controller-sa", "", "the only identity accepted on the control endpoints (system:serviceaccount:<ns>:<name>)")
	fs.StringVar(&cfg.ControllerAudience, "controller-audience", cfg.ControllerAudience, "token audience for /snapshot and /probe")
	fs.StringVar(&cfg.PolicyAudience, "policy-audience", cfg.PolicyAudience, "token audience for /policy")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig for TokenReviews (empty: in-cluster config)")
	fs.BoolVar(&cfg.InsecureDisableAuth, "insecure-disable-auth", false, "DEVELOPMENT ONLY: serve the control endpoints without auth")
	fs.DurationVar(&cfg.KeepaliveTime, "grpc-keepalive-time", cfg.KeepaliveTime, "ping an idle client connection after this long")
	fs.DurationVar(&cfg.KeepaliveTimeout, "grpc-keepalive-timeout", cfg.KeepaliveTimeout, "close a connection whose ping is not answered within this")
	fs.DurationVar(&cfg.KeepaliveMinTime, "grpc-keepalive-min-time", cfg.KeepaliveMinTime, "reject clients that ping more often than this")
	fs.IntVar(&cfg.MaxRecvMsgBytes, "grpc-max-recv-msg-bytes", cfg.MaxRecvMsgBytes, "largest gRPC request message accepted")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "bound on the graceful drain after SIGTERM")
	fs.StringVar(&metricsModels, "metrics-models", "", "comma-separated models that always get their own lookup metric series; other models get them only while the index holds keys for them and they are among the --metrics-max-models busiest (the rest share model=\"__other__\")")
	fs.IntVar(&cfg.MetricsMaxModels, "metrics-max-models", cfg.MetricsMaxModels, "how many of the models the index holds keep their own metric series, the most looked up first (the rest share model=\"__other__\"; --metrics-models come on top)")
	fs.IntVar(&cfg.MetricsMaxScrapes, "metrics-max-scrapes", cfg.MetricsMaxScrapes, "/metrics scrapes gathered at once; more are answered 503")
	fs.DurationVar(&cfg.MetricsScrapeTimeout, "metrics-scrape-timeout", cfg.MetricsScrapeTimeout, "a /metrics scrape taking longer is answered 503")
	fs.DurationVar(&cfg.MetricsModelGrace, "metrics-model-grace", cfg.MetricsModelGrace, "how long a model drained to 0 index keys keeps its own metric series")
	fs.DurationVar(&cfg.MaxClockSkew, "max-clock-skew", rpc.DefaultMaxClockSkew, "producer timestamps later than now plus this are clamped to it (counted in inferencecache_producer_timestamps_clamped_total)")
	fs.StringVar(&cfg.NATS.URL, "nats-url", "", "also consume producer reports from this NATS JetStream server (e.g. nats://nats:4222); the server replays the stream at start and is ready once caught up (docs/scaleout.md)")
	fs.StringVar(&cfg.NATS.Stream.Name, "nats-stream", bus.DefaultStream, "JetStream stream name (and subject prefix)")
	fs.StringVar(&natsFilters, "nats-filter-subjects", "", "comma-separated subjects this server consumes (a shard, e.g. INFERENCECACHE.<tenant>.*); empty: the whole stream")
	fs.IntVar(&cfg.NATS.ReadyLag, "nats-ready-lag", bus.DefaultReadyLag, "ready once the stream lag is at most this many messages")
	fs.DurationVar(&natsMaxTTL, "nats-max-ttl", bus.DefaultMaxTTL, "when the server has to create the stream: the longest tenant TTL (retention = this + 5m, the default refresh interval)")
	fs.Int64Var(&cfg.NATS.Stream.MaxBytes, "nats-stream-max-bytes", bus.DefaultMaxBytes, "when the server has to create the stream: its byte bound (the oldest reports are discarded first beyond it, docs/scaleout.md); the subscribers' --nats-stream-max-bytes sets it on an existing stream")
	fs.StringVar(&cfg.Picker.Addr, "ext-proc-bind-address", cfg.Picker.Addr, "endpoint picker (Envoy ext_proc, docs/gateway.md) listen address; on only with --inference-pool or --endpoints-file; \"\" turns it off")
	fs.StringVar(&cfg.Picker.CertFile, "ext-proc-tls-cert-file", "", "endpoint picker TLS certificate (PEM); set together with --ext-proc-tls-key-file (default: a self-signed certificate made at start)")
	fs.StringVar(&cfg.Picker.KeyFile, "ext-proc-tls-key-file", "", "endpoint picker TLS private key (PEM); set together with --ext-proc-tls-cert-file")
	fs.BoolVar(&cfg.Picker.Plaintext, "ext-proc-plaintext", false, "serve the endpoint picker without TLS")
	fs.StringVar(&epf.inferencePool, "inference-pool", "", "NAMESPACE/NAME of the InferencePool (inference.networking.k8s.io/v1) whose Ready pods the endpoint picker chooses from")
	fs.StringVar(&epf.endpointsFile, "endpoints-file", "", "static endpoint file the endpoint picker chooses from (reloaded when it changes)")
	fs.IntVar(&cfg.Picker.MaxBodyBytes, "ext-proc-max-body-bytes", picker.DefaultMaxBodyBytes, "largest request body the endpoint picker buffers; a larger one is answered 413")
	fs.IntVar(&cfg.MaxObserverStreams, "max-observer-streams", rpc.DefaultMaxStreams, "StreamCacheEvents streams, and StreamMetrics streams, open at once at most (one more is refused with RESOURCE_EXHAUSTED)")
	fs.IntVar(&cfg.EventStreamBuffer, "event-stream-buffer", rpc.DefaultEventBuffer, "events buffered per StreamCacheEvents subscriber; one that falls this far behind is ended with RESOURCE_EXHAUSTED")
	fs.BoolVar(&cfg.Picker.PD, "ext-proc-pd", false, "the pool serves disaggregated prefill/decode (docs/pd.md): the endpoint picker sends the decode endpoint as the destination and the prefill endpoint in x-prefiller-host-port")
	fs.StringVar(&cfg.Picker.PDTopology, "ext-proc-pd-topology", "", "with --ext-proc-pd, the pool's PDTopology as namespace/name (default: the pool namespace's only PDTopology)")
	fs.IntVar(&cfg.Picker.MaxFallbacks, "ext-proc-max-fallbacks", picker.DefaultMaxFallbacks, "endpoints listed after the primary in x-gateway-destination-endpoint, for the gateway's retries (negative: none)")
	fs.StringVar(&logFormat, "log-format", "json", "log format: json or text")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	epf.kubeconfig = cfg.Kubeconfig
	src, err := newEndpointSource(epf)
	if err != nil {
		return err
	}
	cfg.Picker.NewSource = src
	fs.Visit(func(f *flag.Flag) { mem.indexSet = mem.indexSet || f.Name == "max-index-bytes" })
	mem.gcSet = os.Getenv("GOMEMLIMIT") != "" // the runtime reads "" as unset too
	derived, err := mem.derive()
	if err != nil {
		return err
	}
	if derived.indexBytes > 0 {
		cfg.MaxIndexBytes = derived.indexBytes
	}
	for _, f := range strings.Split(natsFilters, ",") {
		if f = strings.TrimSpace(f); f != "" {
			cfg.NATS.Filters = append(cfg.NATS.Filters, f)
		}
	}
	cfg.NATS.Stream.MaxAge = bus.Retention(natsMaxTTL, bus.DefaultRefresh)
	for _, m := range strings.Split(metricsModels, ",") {
		if m = strings.TrimSpace(m); m != "" {
			cfg.MetricsModels = append(cfg.MetricsModels, m)
		}
	}
	if cfg.EnablePprof {
		// The mutex and block profiles are empty unless sampled: one in 10
		// contended lock events, and about one blocking event per 100 µs.
		runtime.SetMutexProfileFraction(10)
		runtime.SetBlockProfileRate(100_000)
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("cannot parse --log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch logFormat {
	case "json":
		cfg.Logger = slog.New(slog.NewJSONHandler(stderr, opts))
	case "text":
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, opts))
	default:
		return fmt.Errorf("--log-format must be json or text, got %q", logFormat)
	}

	if derived.gcBytes > 0 {
		debug.SetMemoryLimit(derived.gcBytes)
	}
	if mem.limit > 0 {
		cfg.Logger.Info("memory limit", "memory_limit", mem.limit, "max_index_bytes", cfg.MaxIndexBytes,
			"index_derived", derived.indexBytes > 0, "gomemlimit", debug.SetMemoryLimit(-1), "gomemlimit_derived", derived.gcBytes > 0)
	}

	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	if started != nil {
		go func() {
			select {
			case <-srv.Ready():
				started(srv)
			case <-ctx.Done():
			}
		}()
	}
	return srv.Run(ctx)
}
