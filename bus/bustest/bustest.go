// Package bustest runs a real NATS server with JetStream in the test
// process, on 127.0.0.1 and a temporary store directory, for the tests of
// the bus and of everything built on it.
package bustest

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is one in-process NATS server. Stop and Start restart it on the
// same port and store directory, so clients reconnect and the stream
// survives.
type Server struct {
	t    testing.TB
	opts server.Options
	srv  *server.Server
}

// Start runs a NATS server with JetStream storing under t.TempDir() and
// stops it when the test ends.
func Start(t testing.TB) *Server { t.Helper(); return StartWith(t, nil) }

// StartWith is Start with mutate applied to the server options first.
func StartWith(t testing.TB, mutate func(*server.Options)) *Server {
	t.Helper()
	port := freePort(t)
	s := &Server{t: t, opts: server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
		// Large enough for a 4096-entry update with room to spare.
		MaxPayload: 8 << 20,
	}}
	if mutate != nil {
		mutate(&s.opts)
	}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// URL is the client URL.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.opts.Port) }

// Stop shuts the server down (clients see the connection drop).
func (s *Server) Stop() {
	if s.srv == nil {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.srv = nil
}

// RestartWith starts the server (again) on the same port with mutate
// applied to its options first, for this start and the later ones: a fresh
// StoreDir is a NATS that lost its store, JetStream false one without it.
func (s *Server) RestartWith(mutate func(*server.Options)) {
	s.t.Helper()
	mutate(&s.opts)
	s.Restart()
}

// Restart starts the server (again) on the same port and store.
func (s *Server) Restart() {
	s.t.Helper()
	if s.srv != nil {
		s.t.Fatal("bustest: Restart while running")
	}
	opts := s.opts // the server keeps a pointer to its options
	srv, err := server.NewServer(&opts)
	if err != nil {
		s.t.Fatalf("bustest: cannot create the NATS server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		s.t.Fatal("bustest: the NATS server did not become ready within 10 s")
	}
	s.srv = srv
}

// freePort returns a port on 127.0.0.1 that was free a moment ago (the
// server needs a fixed one to come back on after Stop).
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("bustest: cannot find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
