// Package bustest runs a real NATS server with JetStream for the tests of
// the bus and of everything built on it: the nats-server binary the
// project's go.mod pins (built once per test process by internal/testbin,
// with the flags of every other test binary), as a child process on
// 127.0.0.1 with a temporary store directory.
//
// A process and not the server package in the test binary: linked in, the
// NATS server was compiled again with -race for every test run (and linked
// into each test binary), though the race detector only ever watched its
// code and not ours; as a process it is the same server the chaos suite and
// a deployment run, and it is built once without -race for all of them.
//
// A package that starts a server runs its tests through Main:
//
//	func TestMain(m *testing.M) { os.Exit(bustest.Main(m)) }
package bustest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/internal/testbin"
)

// Options are the server settings a test may change.
type Options struct {
	// JetStream enables JetStream (default true); false is a NATS without it.
	JetStream bool
	// StoreDir is JetStream's store directory (default: under t.TempDir());
	// a fresh one on restart is a NATS that lost its store.
	StoreDir string
	// MaxPayload is the largest message in bytes (default 8 MiB: a
	// 4096-entry update with room to spare).
	MaxPayload int
}

// Server is one NATS server process. Stop and Restart restart it on the
// same port and store directory, so clients reconnect and the stream
// survives.
type Server struct {
	t    testing.TB
	port int
	dir  string // config and log files
	opts Options
	// runs counts starts, naming each start's log file.
	runs int
	cmd  *exec.Cmd
	// exited is closed when cmd has been waited for.
	exited chan struct{}
}

// Start runs a NATS server with JetStream storing under t.TempDir() and
// stops it when the test ends.
func Start(t testing.TB) *Server { t.Helper(); return StartWith(t, nil) }

// StartWith is Start with mutate applied to the server options first.
func StartWith(t testing.TB, mutate func(*Options)) *Server {
	t.Helper()
	s := &Server{t: t, port: freePort(t), dir: t.TempDir(), opts: Options{
		JetStream:  true,
		StoreDir:   t.TempDir(),
		MaxPayload: 8 << 20,
	}}
	if mutate != nil {
		mutate(&s.opts)
	}
	t.Cleanup(s.Stop)
	s.Restart()
	return s
}

// URL is the client URL.
func (s *Server) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

// stopTimeout bounds a graceful shutdown before the process is killed.
const stopTimeout = 10 * time.Second

// Stop shuts the server down gracefully, as SIGTERM does in a pod (clients
// see the connection drop; JetStream flushes its store).
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
		s.t.Errorf("bustest: the NATS server did not stop within %v of SIGTERM; killed (log %s)", stopTimeout, s.logPath())
	}
	s.cmd = nil
}

// RestartWith starts the server (again) on the same port with mutate
// applied to its options first, for this start and the later ones: a fresh
// StoreDir is a NATS that lost its store, JetStream false one without it.
func (s *Server) RestartWith(mutate func(*Options)) {
	s.t.Helper()
	mutate(&s.opts)
	s.Restart()
}

// readyTimeout bounds a start, the binary's build excluded.
const readyTimeout = 10 * time.Second

// Restart starts the server (again) on the same port and store.
func (s *Server) Restart() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatal("bustest: Restart while running")
	}
	bin, err := binary()
	if err != nil {
		s.t.Fatalf("bustest: %v", err)
	}
	s.runs++
	conf := filepath.Join(s.dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(s.config()), 0o600); err != nil {
		s.t.Fatalf("bustest: %v", err)
	}
	logf, err := os.Create(s.logPath())
	if err != nil {
		s.t.Fatalf("bustest: %v", err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("bustest: cannot start the NATS server: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	if err := s.waitReady(exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		log, _ := os.ReadFile(s.logPath())
		s.t.Fatalf("bustest: %v; its log:\n%s", err, log)
	}
	s.cmd, s.exited = cmd, exited
}

// config is the server's configuration file for the current options.
func (s *Server) config() string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: \"127.0.0.1:%d\"\nmax_payload: %d\n", s.port, s.opts.MaxPayload)
	if s.opts.JetStream {
		fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n}\n", s.opts.StoreDir)
	}
	return b.String()
}

func (s *Server) logPath() string {
	return filepath.Join(s.dir, fmt.Sprintf("nats-%d.log", s.runs))
}

// waitReady returns once the server greets a client with its INFO line:
// it listens for clients only after JetStream is up.
func (s *Server) waitReady(exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-exited:
			return errors.New("the NATS server exited at start")
		default:
		}
		if greets(fmt.Sprintf("127.0.0.1:%d", s.port), time.Until(deadline)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the NATS server did not greet a client within %v", readyTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// greets reports whether a NATS server at addr answers a connection with
// its INFO line within limit.
func greets(addr string, limit time.Duration) bool {
	if limit <= 0 {
		return false
	}
	c, err := net.DialTimeout("tcp", addr, limit)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "INFO ")
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

// buildTimeout bounds the binary's build (a cold one compiles the server).
const buildTimeout = 10 * time.Minute

// The binary, built once per test process into binDir (Main's).
var (
	binDir   string
	build    sync.Once
	bin      string
	buildErr error
)

// Main runs the package's tests (call it from TestMain) and removes the
// NATS binary afterwards.
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "bustest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bustest:", err)
		return 1
	}
	binDir = dir
	defer os.RemoveAll(dir)
	return m.Run()
}

// binary builds the nats-server binary (once) and returns its path.
func binary() (string, error) {
	if binDir == "" {
		return "", errors.New("the package's TestMain must run its tests through bustest.Main")
	}
	build.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		// The go command names nats-server/v2's binary nats-server.
		buildErr = testbin.Build(ctx, binDir, "github.com/nats-io/nats-server/v2")
		bin = filepath.Join(binDir, "nats-server")
	})
	return bin, buildErr
}
