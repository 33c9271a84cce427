package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/inferencecache/inferencecache/internal/testbin"
)

// Binaries are the four programs a run starts.
type Binaries struct {
	Server, Subscriber, Engine, NATS string
}

// buildTimeout bounds building the binaries (a cold build of cmd/server on
// a loaded 2-core machine takes minutes).
const buildTimeout = 10 * time.Minute

// Build builds the binaries into dir with the go command (once per run;
// the build cache makes a rebuild cheap), as internal/testbin builds every
// binary a test runs.
func Build(ctx context.Context, dir string) (Binaries, error) {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	const mod = "github.com/inferencecache/inferencecache/"
	b := Binaries{
		Server:     filepath.Join(dir, "server"),
		Subscriber: filepath.Join(dir, "kvevent-subscriber"),
		Engine:     filepath.Join(dir, "kvevent-fake-engine"),
		NATS:       filepath.Join(dir, "nats-server"),
	}
	// The go command names nats-server/v2's binary nats-server.
	if err := testbin.Build(ctx, dir, mod+"cmd/server", mod+"cmd/kvevent-subscriber", mod+"cmd/kvevent-fake-engine", "github.com/nats-io/nats-server/v2"); err != nil {
		return Binaries{}, err
	}
	return b, nil
}

// freePort returns a loopback port nobody listens on right now, drawn
// below Linux's ephemeral range (32768+) so that an outgoing connection
// cannot take it between a kill and the restart on the same port.
func freePort(rng *rand.Rand, taken map[int]bool) (int, error) {
	for range 200 {
		port := 20000 + rng.IntN(12000)
		if taken[port] {
			continue
		}
		l, err := net.Listen("tcp", addr(port))
		if err != nil {
			continue
		}
		_ = l.Close()
		taken[port] = true
		return port, nil
	}
	return 0, errors.New("chaos: no free port found in 20000-31999")
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// Component kinds.
const (
	KindServer     = "server"
	KindSubscriber = "subscriber"
	KindEngine     = "engine"
	KindNATS       = "nats"
)

// kinds in fault-schedule order.
var kinds = []string{KindServer, KindSubscriber, KindEngine, KindNATS}

// component is one restartable process: the same ports and files every
// incarnation.
type component struct {
	name, kind string
	bin        string
	args       func(incarnation int) []string
	logPath    string
	// started is called after every start (from its own goroutine), with a
	// context that ends when this incarnation is killed.
	started func(ctx context.Context, incarnation int)

	// mu guards the fields below.
	mu          sync.Mutex
	cmd         *exec.Cmd
	done        chan struct{} // closed when the current process exited
	incarnation int
	stop        context.CancelFunc // ends the incarnation's context
	exits       int                // exits not caused by a kill (crashes)
	killing     bool
}

// start runs a new incarnation. The process's output is appended to its
// log file.
func (c *component) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		select {
		case <-c.done:
		default:
			return fmt.Errorf("chaos: %s is still running", c.name)
		}
	}
	c.incarnation++
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("cannot open %s: %w", c.logPath, err)
	}
	fmt.Fprintf(logf, "=== %s start #%d at %s\n", c.name, c.incarnation, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.bin, c.args(c.incarnation)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("cannot start %s: %w", c.name, err)
	}
	done := make(chan struct{})
	c.cmd, c.done, c.killing = cmd, done, false
	ctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	go func() {
		err := cmd.Wait()
		logf.Close()
		c.mu.Lock()
		if !c.killing {
			c.exits++
			fmt.Fprintf(os.Stderr, "chaos: %s exited by itself: %v (log %s)\n", c.name, err, c.logPath)
		}
		c.mu.Unlock()
		stop()
		close(done)
	}()
	if c.started != nil {
		go c.started(ctx, c.incarnation)
	}
	return nil
}

// kill sends SIGKILL and waits (bounded) until the process is gone.
func (c *component) kill() error {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.killing = true
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("chaos: %s did not exit within 10 s of SIGKILL", c.name)
	}
}

// running reports whether the current incarnation is alive, and its pid.
func (c *component) running() (pid int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0, false
	}
	select {
	case <-c.done:
		return 0, false
	default:
		return c.cmd.Process.Pid, true
	}
}

// crashes returns how many times the process exited without being killed.
func (c *component) crashes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exits
}

// ensureRunning restarts a component that exited by itself.
func (c *component) ensureRunning() error {
	if _, ok := c.running(); ok {
		return nil
	}
	return c.start()
}

// rssBytes reads VmRSS of pid from /proc.
func rssBytes(pid int) (int64, bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, false
			}
			return kb << 10, true
		}
	}
	return 0, false
}

// tail returns the last n bytes of a file, for failure reports.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-n, 0)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return ""
	}
	return string(buf)
}
