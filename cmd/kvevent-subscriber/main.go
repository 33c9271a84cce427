// Command kvevent-subscriber runs beside an inference engine (a sidecar in
// the engine pod): it follows the engine's ZMQ KV-event stream, keeps the
// replica's positional index and reports it to the inferencecache server
// over gRPC, or with --nats-url to a NATS JetStream stream every server
// consumes (docs/scaleout.md). See kvevents/README.md.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/inferencecache/inferencecache/bus"
	"github.com/inferencecache/inferencecache/kvevents"
)

// defaultServerTTL is the server's default entry TTL (contract §3.2): a
// refresh interval at or above it cannot keep held blocks fresh.
const defaultServerTTL = 30 * time.Minute

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kvevent-subscriber:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	var (
		cfg          kvevents.Config
		loras        string
		serverAddr   string
		tlsFiles     kvevents.TLSFiles
		metricsAdr   string
		logLevel     string
		refresh      time.Duration
		heartbeat    time.Duration
		natsURL      string
		natsStream   bus.StreamConfig
		natsMaxTTL   time.Duration
		natsMaxPnd   int
		dp           kvevents.DataParallel
		endpointMode string
	)
	fs := flag.NewFlagSet("kvevent-subscriber", flag.ContinueOnError)
	fs.StringVar(&cfg.ReplicaID, "replica-id", "", "replica id reported to the server (the pod name)")
	fs.StringVar(&cfg.TenantID, "tenant-id", "", "tenant id (the pod namespace)")
	fs.StringVar(&cfg.ModelID, "model-id", "", "model id")
	fs.StringVar(&cfg.HashScheme, "hash-scheme", "vllm", "engine hash scheme: vllm or sglang")
	fs.StringVar(&cfg.Endpoint, "engine-endpoint", kvevents.DefaultEndpoint, "engine ZMQ PUB endpoint (with --engine-endpoint-mode=bind: the loopback address this subscriber binds)")
	fs.StringVar(&endpointMode, "engine-endpoint-mode", string(kvevents.EndpointConnect), `which side binds --engine-endpoint: "connect" (the engine binds, e.g. tcp://*:5557, and the subscriber connects) or "bind" (the subscriber binds a tcp://127.0.0.1:PORT address and the engine's PUB, given that same address, connects to it: the live events stay inside the pod)`)
	fs.StringVar(&cfg.ReplayEndpoint, "engine-replay-endpoint", "", "engine ZMQ replay ROUTER endpoint (empty: gaps reset the replica)")
	fs.StringVar(&cfg.Topic, "topic", kvevents.DefaultTopic, "ZMQ topic to subscribe to")
	fs.StringVar(&cfg.MetricsURL, "engine-metrics-url", "", "engine Prometheus /metrics URL (empty: no stats)")
	fs.DurationVar(&cfg.StatsInterval, "stats-interval", kvevents.DefaultStatsInterval, "how often engine stats and load are scraped and reported (one stats-only update per interval)")
	fs.StringVar(&cfg.QueuedTokensMetric, "engine-queued-tokens-metric", "", "engine gauge of queued prefill tokens, if it exports one (empty: the server estimates from waiting requests)")
	fs.Int64Var(&cfg.CacheSizeBytes, "engine-cache-size-bytes", 0, "engine KV cache size in bytes (scales the usage gauge)")
	fs.IntVar(&cfg.BlockSize, "block-size", 16, "engine block size in tokens, for events that carry none")
	fs.BoolVar(&cfg.L2, "ignore-block-removed", false, "an offload tier (L2) keeps evicted blocks: re-report them at T2 instead of evicting")
	fs.StringVar(&loras, "lora-adapter-names", "", `LoRA id to adapter name map, e.g. "1=a,2=b"`)
	var role string
	fs.StringVar(&role, "role", "", "the replica's role in disaggregated serving: prefill, decode or both (empty: not reported; docs/pd.md)")
	fs.StringVar(&cfg.Placement.Pool, "pd-pool", "", "the PDTopology pool the replica belongs to (empty: any pool of its role)")
	fs.StringVar(&cfg.Placement.Node, "node-name", "", "the Kubernetes node the replica runs on (downward API spec.nodeName), for KV locality")
	fs.StringVar(&cfg.Placement.Zone, "zone", "", "the replica's zone (topology.kubernetes.io/zone), for KV locality")
	fs.StringVar(&serverAddr, "server-address", "127.0.0.1:9090", "inferencecache gRPC server address")
	fs.BoolVar(&tlsFiles.Enable, "tls", false, "use TLS to the server (implied by any --tls-* file)")
	fs.StringVar(&tlsFiles.CAFile, "tls-ca-file", "", "CA bundle verifying the server")
	fs.StringVar(&tlsFiles.CertFile, "tls-cert-file", "", "client certificate (mTLS)")
	fs.StringVar(&tlsFiles.KeyFile, "tls-key-file", "", "client key (mTLS)")
	fs.StringVar(&tlsFiles.ServerName, "tls-server-name", "", "server name to verify (default: from the address)")
	fs.DurationVar(&refresh, "refresh-interval", kvevents.DefaultRefreshInterval,
		"re-report every block the engine still holds this often, so prefix-cache hits (which publish no event) do not age out of the server's index; 0 disables")
	fs.StringVar(&cfg.StateFile, "state-file", "", "keep the positional index and the engine sequence in this file (written atomically every --state-interval and on SIGTERM; put it on an emptyDir so a restarted sidecar continues where it stopped); empty: none")
	fs.DurationVar(&cfg.StateInterval, "state-interval", kvevents.DefaultStateInterval, "how often a changed positional index is written to --state-file")
	fs.DurationVar(&heartbeat, "server-heartbeat-interval", kvevents.DefaultHeartbeat,
		"send a REPLICA_UPDATED heartbeat after this long without a call to the server, so an idle replica notices a server restart; 0 disables")
	fs.StringVar(&natsURL, "nats-url", "", "publish to this NATS JetStream server (e.g. nats://nats:4222) instead of --server-address; every server consumes the stream (docs/scaleout.md)")
	fs.StringVar(&natsStream.Name, "nats-stream", bus.DefaultStream, "JetStream stream name (and subject prefix)")
	fs.DurationVar(&natsMaxTTL, "nats-max-ttl", bus.DefaultMaxTTL, "the longest entry TTL of any tenant; the stream keeps messages for it plus --refresh-interval")
	fs.DurationVar(&natsStream.MaxAge, "nats-stream-max-age", 0, "stream retention; 0: --nats-max-ttl + --refresh-interval (the window a restarted server replays)")
	fs.Int64Var(&natsStream.MaxBytes, "nats-stream-max-bytes", bus.DefaultMaxBytes, "the stream's byte bound: beyond it the oldest reports are discarded first, which shortens the window a restarted server replays (docs/scaleout.md)")
	fs.IntVar(&natsStream.Replicas, "nats-stream-replicas", 1, "stream replicas in a NATS cluster (1 to 5)")
	fs.IntVar(&natsMaxPnd, "nats-max-pending", bus.DefaultMaxPending, "publishes awaiting their JetStream ack at most")
	fs.IntVar(&dp.Size, "data-parallel-size", 1, "data-parallel ranks of the engine (its --data-parallel-size): rank r publishes on the engine endpoints' port + r, is reported as <replica-id>-dp<r> and its stats are its rank's series of --engine-metrics-url; 1: one replica, named --replica-id")
	fs.IntVar(&dp.Rank, "data-parallel-rank", -1, "with --data-parallel-size > 1, follow only this rank (one subscriber process per rank); -1: every rank, from this process")
	fs.StringVar(&dp.RankLabel, "engine-rank-label", "", `label of the engine metrics that holds the data-parallel rank (default: "engine" for vllm, "dp_rank" for sglang)`)
	fs.StringVar(&metricsAdr, "metrics-bind-address", ":9091", "address of the subscriber's own /metrics (empty: off)")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("cannot parse --log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if cfg.ReplicaID == "" || cfg.ModelID == "" {
		return errors.New("--replica-id and --model-id are required")
	}
	if cfg.HashScheme == "" {
		return errors.New("--hash-scheme must not be empty (the server drops prefixes without one)")
	}
	var err error
	if cfg.RefreshInterval, err = optionalInterval("--refresh-interval", "the refresh", refresh); err != nil {
		return err
	}
	if cfg.Heartbeat, err = optionalInterval("--server-heartbeat-interval", "the heartbeat", heartbeat); err != nil {
		return err
	}
	if cfg.StateInterval <= 0 {
		return errors.New("--state-interval must be positive")
	}
	if cfg.LoRAAdapters, err = kvevents.ParseLoRAAdapters(loras); err != nil {
		return err
	}
	if cfg.Placement.Role, err = kvevents.ParseRole(role); err != nil {
		return err
	}
	if cfg.EndpointMode, err = kvevents.ParseEndpointMode(endpointMode); err != nil {
		return fmt.Errorf("cannot parse --engine-endpoint-mode: %w", err)
	}
	if err := dp.Validate(); err != nil {
		return err
	}
	if dp.Size <= 1 {
		dp.Size, dp.Rank = 1, -1
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registerer = reg
	cfg.Logger = log

	// One subscriber per rank followed (one without data parallelism);
	// each has its own sink: a Sink's calls come from one forwarder.
	var (
		newSink func(replicaID string, log *slog.Logger) (kvevents.Sink, error)
		target  = serverAddr
	)
	if natsURL != "" {
		if natsStream.MaxAge == 0 {
			natsStream.MaxAge = bus.Retention(natsMaxTTL, max(refresh, 0))
		}
		if err := natsStream.Validate(); err != nil {
			return err
		}
		nc, err := bus.Connect(natsURL, "kvevent-subscriber "+cfg.ReplicaID, log)
		if err != nil {
			return err
		}
		defer nc.Close()
		process := producerID()
		newSink = func(replicaID string, log *slog.Logger) (kvevents.Sink, error) {
			// A publisher per rank: its losses are its rank's to resync.
			pub, err := bus.NewPublisher(nc, bus.PublisherConfig{Stream: natsStream, Producer: replicaID + "/" + process, MaxPending: natsMaxPnd, Logger: log})
			if err != nil {
				return nil, err
			}
			return kvevents.NewNATSSink(pub, natsStream.Name), nil
		}
		target = natsURL
	} else {
		conn, err := kvevents.DialServer(serverAddr, tlsFiles)
		if err != nil {
			return err
		}
		defer conn.Close()
		newSink = func(_ string, log *slog.Logger) (kvevents.Sink, error) { return kvevents.NewGRPCSink(conn, log), nil }
	}
	type rankSub struct {
		sub  *kvevents.Subscriber
		sink kvevents.Sink
		log  *slog.Logger
	}
	var subs []rankSub
	for _, rank := range dp.Ranks() {
		rc, err := dp.Config(cfg, rank)
		if err != nil {
			return err
		}
		rlog := log
		if dp.Size > 1 {
			// The ranks' metrics share the registry, told apart by rank.
			rc.Registerer = prometheus.WrapRegistererWith(prometheus.Labels{"dp_rank": strconv.Itoa(rank)}, reg)
			rlog = log.With("replica", rc.ReplicaID, "dp_rank", rank)
			rc.Logger = rlog
		}
		sink, err := newSink(rc.ReplicaID, rlog)
		if err != nil {
			return err
		}
		sub, err := kvevents.New(rc, sink)
		if err != nil {
			return err
		}
		subs = append(subs, rankSub{sub: sub, sink: sink, log: rlog})
	}

	var metricsSrv *http.Server
	if metricsAdr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
		// Listen before anything else starts: a taken port is a clear exit,
		// not a subscriber silently running without its /metrics.
		ln, err := net.Listen("tcp", metricsAdr)
		if err != nil {
			return fmt.Errorf("cannot listen for /metrics on %s: %w", metricsAdr, err)
		}
		metricsSrv = &http.Server{Addr: metricsAdr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := metricsSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics listener failed", "addr", metricsAdr, "err", err)
			}
		}()
	}

	if refresh >= defaultServerTTL {
		log.Warn("--refresh-interval is not below the server's default TTL: held blocks still age out between refreshes",
			"refresh_interval", refresh, "default_ttl", defaultServerTTL)
	}
	log.Info("kvevent-subscriber starting", "replica", cfg.ReplicaID, "model", cfg.ModelID, "engine_endpoint", cfg.Endpoint, "engine_endpoint_mode", cfg.EndpointMode,
		"tenant", cfg.TenantID, "scheme", cfg.HashScheme, "server", target, "l2", cfg.L2,
		"refresh_interval", refresh, "state_file", cfg.StateFile, "heartbeat", heartbeat,
		"data_parallel_size", dp.Size, "ranks", dp.Ranks())
	// Each Run returns after ctx is done and a bounded flush.
	errs := make([]error, len(subs))
	var wg sync.WaitGroup
	for i, rs := range subs {
		wg.Go(func() {
			errs[i] = rs.sub.Run(ctx)
			if ns, ok := rs.sink.(*kvevents.NATSSink); ok {
				fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := ns.Flush(fctx); err != nil {
					rs.log.Warn("NATS publishes still unacknowledged at exit", "err", err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	runErr := errors.Join(errs...)
	if metricsSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = metricsSrv.Shutdown(sctx)
		cancel()
	}
	log.Info("kvevent-subscriber stopped", "err", runErr)
	return runErr
}

// optionalInterval maps an interval flag where 0 disables the feature onto
// the config's convention (negative = disabled); a negative flag is an
// error.
func optionalInterval(flag, what string, d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("%s must not be negative (0 disables %s)", flag, what)
	case d == 0:
		return -1, nil
	}
	return d, nil
}

// producerID is a random id per process, for the NATS producer header.
func producerID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
