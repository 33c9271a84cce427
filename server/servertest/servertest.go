// Package servertest runs a real cache server (package server) in process
// for tests and benchmarks: every listener on 127.0.0.1 with a port the
// kernel picks, control endpoint auth off, logs discarded. Start waits until
// the server serves and registers a cleanup that drains it, so a test never
// leaks a server or waits without a bound.
//
//	srv := servertest.Start(t, func(c *server.Config) { c.MaxIndexEntries = 0 })
//	conn := servertest.Conn(t, srv)
//
// Tests that need to stop the server themselves (drain tests) use Run, which
// also exposes Run's result.
package servertest

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferencecache/inferencecache/server"
)

// Bounds of the waits Start and Run make.
const (
	// ReadyTimeout bounds the wait for Server.Ready.
	ReadyTimeout = 10 * time.Second
	// StopTimeout bounds the wait for Run to return after its context is
	// cancelled; it exceeds DrainTimeout so a drain that runs its full
	// course still fits.
	StopTimeout = 15 * time.Second
	// DrainTimeout is the config's drain bound unless mutate changes it.
	DrainTimeout = 5 * time.Second
)

// Config returns the configuration Start and Run use before mutate:
// server.DefaultConfig with the gRPC, public HTTP and internal listeners on
// 127.0.0.1:0 (the endpoint picker's too, which is on only with an endpoint
// source), InsecureDisableAuth, DrainTimeout and a discarding logger.
func Config() server.Config {
	cfg := server.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.InternalAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.Picker.Addr = "127.0.0.1:0" // on only when a test gives it an endpoint source
	cfg.InsecureDisableAuth = true
	cfg.DrainTimeout = DrainTimeout
	cfg.Logger = slog.New(slog.DiscardHandler)
	return cfg
}

// Running is a server started by Run. Its methods are safe for concurrent
// use.
type Running struct {
	*server.Server

	cancel context.CancelFunc
	// done is closed when Run has returned; err is written before that and
	// read only after it.
	done chan struct{}
	err  error
}

// Stop cancels Run's context, which starts the drain; it does not wait (see
// Done). Calling it more than once is harmless.
func (r *Running) Stop() { r.cancel() }

// Done is closed once Run has returned.
func (r *Running) Done() <-chan struct{} { return r.done }

// Err is Run's result. It is valid only after Done is closed.
func (r *Running) Err() error { return r.err }

// Run builds a server from Config with mutate applied (when non-nil), runs
// it and waits at most ReadyTimeout until it serves; the test fails at once
// when New fails or the server does not become ready. A cleanup stops the
// server and fails the test when Run does not return within StopTimeout or
// returns an error (a listener failed).
func Run(t testing.TB, mutate func(*server.Config)) *Running {
	t.Helper()
	cfg := Config()
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatalf("servertest: server.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{Server: srv, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = srv.Run(ctx)
		close(r.done)
	}()
	t.Cleanup(func() {
		cancel()
		timer := time.NewTimer(StopTimeout)
		defer timer.Stop()
		select {
		case <-r.done:
			if r.err != nil {
				t.Errorf("servertest: server.Run: %v", r.err)
			}
		case <-timer.C:
			t.Errorf("servertest: server.Run did not return within %v of its context ending", StopTimeout)
		}
	})
	timer := time.NewTimer(ReadyTimeout)
	defer timer.Stop()
	select {
	case <-srv.Ready():
	case <-r.done:
		t.Fatalf("servertest: server.Run returned before the server was ready: %v", r.err)
	case <-timer.C:
		t.Fatalf("servertest: server not ready within %v", ReadyTimeout)
	}
	return r
}

// Start is Run for tests that let the cleanup stop the server: it returns
// the ready server.
func Start(t testing.TB, mutate func(*server.Config)) *server.Server {
	t.Helper()
	return Run(t, mutate).Server
}

// Conn returns a plaintext gRPC client connection to srv's gRPC listener,
// closed by a test cleanup (before the server's own cleanup stops it, as
// cleanups run last-in first-out). It fails the test for a TLS server.
func Conn(t testing.TB, srv *server.Server) *grpc.ClientConn {
	t.Helper()
	if srv.TLS() {
		t.Fatal("servertest: Conn dials plaintext; the server serves TLS")
	}
	conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("servertest: cannot create a client for %s: %v", srv.GRPCAddr(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// PickerConn returns a client connection to srv's endpoint picker
// (ext_proc), closed when the test ends. Like a gateway, it does not
// verify the picker's certificate when the listener serves TLS.
func PickerConn(t testing.TB, srv *server.Server) *grpc.ClientConn {
	t.Helper()
	if srv.PickerAddr() == nil {
		t.Fatal("servertest: the endpoint picker is off (no endpoint source)")
	}
	creds := insecure.NewCredentials()
	if srv.PickerTLS() {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // as gateways dial pickers
	}
	conn, err := grpc.NewClient(srv.PickerAddr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatalf("servertest: cannot create a client for %s: %v", srv.PickerAddr(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// PushPolicy POSTs body to srv's /policy (auth is off in Config) and fails
// the test unless the server answers 204.
func PushPolicy(t testing.TB, srv *server.Server, body string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+srv.InternalAddr().String()+"/policy", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("servertest: POST /policy: %v", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("servertest: POST /policy answered %d: %s", resp.StatusCode, msg)
	}
}
