package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"time"

	"github.com/inferencecache/inferencecache/kvevents"
	"github.com/inferencecache/inferencecache/loadgen"
	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/picker/request"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/tokenizer/modeldir"
)

// pickerUsage is `loadgen picker -help`'s preamble.
const pickerUsage = `usage:
  loadgen picker [flags]     drive an endpoint picker through real ext_proc streams, as Envoy does

Without -addr, a server runs in this process with its picker on 127.0.0.1
(-endpoints fake endpoints, -tokenizer-dir as its --tokenizer-dir), and
each conversation's first request is reported as held by the replica it
went to (engine feedback), so later turns find their prefix. With -addr,
-metrics-url adds the server's outcome counts, and -cache-addr with
-tokenizer-dir and -endpoints-file turns engine feedback on.

  TOKENIZER_ASSETS=$(bash hack/tokenizer-assets.sh)
  go run ./cmd/loadgen picker -tokenizer-dir $TOKENIZER_ASSETS -model llama3 -duration 10s
  go run ./cmd/loadgen picker -addr 127.0.0.1:9002 -tls-insecure-skip-verify -rate 2000 -metrics-url http://127.0.0.1:8080/metrics

flags:
`

// pickerCmd is `loadgen picker`.
func pickerCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := loadgen.DefaultPickerConfig()
	fs := flag.NewFlagSet("loadgen picker", flag.ContinueOnError)
	var (
		useTLS, skipVerify, plaintext, quiet bool
		tokDir, endpointsFile, cacheAddr     string
		jsonOut, mdOut, cpuProfile           string
		nEndpoints                           int
	)
	fs.StringVar(&cfg.Target, "addr", "", "the picker's ext_proc address (empty: start a server in this process)")
	fs.BoolVar(&useTLS, "tls", false, "dial -addr with TLS (the server's default; implied by -tls-insecure-skip-verify)")
	fs.BoolVar(&skipVerify, "tls-insecure-skip-verify", false, "TLS without verifying the certificate, as gateways dial an endpoint picker")
	fs.BoolVar(&plaintext, "plaintext", false, "in-process server: its ext_proc listener without TLS (--ext-proc-plaintext)")
	fs.StringVar(&cfg.MetricsURL, "metrics-url", "", "the server's /metrics, for the outcome counts (in-process: its own)")
	fs.StringVar(&cacheAddr, "cache-addr", "", "the server's gRPC address, for engine feedback against -addr")
	fs.StringVar(&tokDir, "tokenizer-dir", os.Getenv("TOKENIZER_ASSETS"), "models' tokenizer folder (the server's --tokenizer-dir; default $TOKENIZER_ASSETS)")
	fs.StringVar(&endpointsFile, "endpoints-file", "", "the picker's endpoint file, for the replica of each address (engine feedback against -addr)")
	fs.IntVar(&nEndpoints, "endpoints", 16, "in-process server: fake endpoints in the pool")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "the requests' model: a folder of -tokenizer-dir")
	fs.StringVar(&cfg.Tenant, "tenant", cfg.Tenant, "tenant of the engine feedback (the pool's)")
	fs.IntVar(&cfg.Conversations, "conversations", cfg.Conversations, "conversations at a time")
	fs.IntVar(&cfg.Turns, "turns", cfg.Turns, "requests of each conversation (then a new one starts)")
	fs.IntVar(&cfg.PromptTokens, "prompt-tokens", cfg.PromptTokens, "about how many tokens a conversation's first request holds")
	fs.IntVar(&cfg.TurnTokens, "turn-tokens", cfg.TurnTokens, "about how many tokens each later turn adds")
	fs.BoolVar(&cfg.SSE, "sse", cfg.SSE, "stream responses as server-sent events (usage in the last event) instead of one JSON body")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "open loop: requests per second (0: closed loop, -concurrency streams back to back)")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "streams in flight (closed loop), or their cap (open loop)")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "warm-up, not measured")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured window")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "workload seed")
	fs.StringVar(&jsonOut, "json", "", "write the JSON report to this file")
	fs.StringVar(&mdOut, "md", "", "write the Markdown report to this file (it is always printed)")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write this process's CPU profile (the in-process server included) to this file")
	fs.BoolVar(&quiet, "quiet", false, "no progress lines on stderr")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), pickerUsage)
		fs.PrintDefaults()
	}
	if done, err := parse(fs, args, stderr); done || err != nil {
		return err
	}
	var tok *modeldir.Dir
	if tokDir != "" {
		var err error
		if tok, err = modeldir.New(modeldir.Config{Root: tokDir, Logger: slog.New(slog.DiscardHandler)}); err != nil {
			return err
		}
	}
	if cfg.Target == "" {
		stop, err := inProcessPicker(ctx, &cfg, tokDir, tok, nEndpoints, plaintext, quiet, stderr)
		if err != nil {
			return err
		}
		defer stop()
	} else {
		if useTLS || skipVerify {
			cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: skipVerify} //nolint:gosec // gateways do not verify an endpoint picker
		}
		if cacheAddr != "" {
			if tok == nil || endpointsFile == "" {
				return errors.New("-cache-addr needs -tokenizer-dir and -endpoints-file")
			}
			f, err := endpoints.NewFile(endpointsFile)
			if err != nil {
				return err
			}
			cfg.Replicas = replicasOf(f.Pool())
			cfg.Tenant = f.Pool().Tenant
			conn, err := kvevents.DialServer(cacheAddr, kvevents.TLSFiles{})
			if err != nil {
				return err
			}
			defer conn.Close()
			cfg.CacheConn, cfg.Tokenizer = conn, tok
		}
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return fmt.Errorf("cannot create -cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cannot start the CPU profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if !quiet {
		fmt.Fprintf(stderr, "loadgen picker: %v warm-up, then %v measured against %s\n", cfg.Warmup, cfg.Duration, cfg.Target)
	}
	rep, err := loadgen.RunPicker(ctx, cfg)
	if err != nil {
		return err
	}
	for _, out := range []struct {
		path  string
		write func(io.Writer) error
	}{{jsonOut, rep.WriteJSON}, {mdOut, rep.WriteMarkdown}} {
		if out.path != "" {
			if err := writeFile(out.path, out.write); err != nil {
				return err
			}
		}
	}
	return rep.WriteMarkdown(stdout)
}

func replicasOf(p *endpoints.Pool) map[string]string {
	m := map[string]string{}
	for _, ep := range p.Endpoints {
		m[ep.Address] = ep.ReplicaID
	}
	return m
}

// inProcessPicker starts a server in this process with its picker on
// 127.0.0.1 over n fake endpoints, points cfg at it (ext_proc, /metrics,
// engine feedback) and returns its stop.
func inProcessPicker(ctx context.Context, cfg *loadgen.PickerConfig, tokDir string, tok *modeldir.Dir, n int, plaintext, quiet bool, stderr io.Writer) (func(), error) {
	var eps []endpoints.Endpoint
	for i := range n {
		eps = append(eps, endpoints.Endpoint{ReplicaID: fmt.Sprintf("pod-%02d", i), Address: fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1)})
	}
	pool, err := endpoints.NewPool(cfg.Tenant, cfg.HashScheme, nil, eps)
	if err != nil {
		return nil, err
	}
	sc := server.DefaultConfig()
	sc.GRPCAddr, sc.HTTPAddr, sc.InternalAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	sc.InsecureDisableAuth = true // loopback only
	sc.Logger = slog.New(slog.DiscardHandler)
	sc.TokenizerDir = tokDir
	sc.Picker.Addr, sc.Picker.Source, sc.Picker.Plaintext = "127.0.0.1:0", endpoints.NewFixed(pool), plaintext
	if tok != nil {
		// The picker tokenizes with the same Dir (same files, same code as
		// its --tokenizer-dir) that the engine feedback uses, so reporting
		// a first turn finds it in the prefix cache: the engines' own
		// tokenization is not this machine's work in a deployment.
		sc.Picker.Tokenizer = tok
	}
	srv, err := server.New(sc)
	if err != nil {
		return nil, fmt.Errorf("cannot start the in-process server: %w", err)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- srv.Run(sctx) }()
	stop := func() {
		cancel()
		select {
		case <-served:
		case <-time.After(30 * time.Second):
		}
	}
	select {
	case <-srv.Ready():
	case err := <-served:
		cancel()
		return nil, fmt.Errorf("the in-process server stopped: %w", err)
	case <-time.After(30 * time.Second):
		stop()
		return nil, errors.New("the in-process server was not ready within 30s")
	}
	cfg.Target = srv.PickerAddr().String()
	if srv.PickerTLS() {
		cfg.TLS = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // gateways do not verify an endpoint picker
	}
	if cfg.MetricsURL == "" {
		cfg.MetricsURL = "http://" + srv.HTTPAddr().String() + "/metrics"
	}
	if tok != nil {
		// Load the model's files now, not in the first requests.
		lctx, lcancel := context.WithTimeout(ctx, time.Minute)
		_, err := tok.RequestTokens(lctx, cfg.Model, &request.Request{Kind: request.KindChat,
			Messages: []request.Message{{Role: "user", Raw: []byte(`{"role":"user","content":"Hello."}`)}}, AddGenerationPrompt: true})
		lcancel()
		if err != nil {
			stop()
			return nil, fmt.Errorf("cannot load the tokenizer of %s: %w", cfg.Model, err)
		}
		conn, err := kvevents.DialServer(srv.GRPCAddr().String(), kvevents.TLSFiles{})
		if err != nil {
			stop()
			return nil, err
		}
		cfg.CacheConn, cfg.Tokenizer, cfg.Replicas = conn, tok, replicasOf(pool)
		inner := stop
		stop = func() { _ = conn.Close(); inner() }
	} else if !quiet {
		fmt.Fprintln(stderr, "loadgen picker: no -tokenizer-dir: every chat request falls back (no_tokenizer)")
	}
	return stop, nil
}
