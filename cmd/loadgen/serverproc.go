package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Bounds of a server child process's life.
const (
	serverStartTimeout = 30 * time.Second
	serverStopTimeout  = 30 * time.Second
	httpTimeout        = 2 * time.Minute // a CPU profile request lasts its window
)

// serverProc is a server binary running as a child process on ephemeral
// 127.0.0.1 ports, with pprof on and the control endpoints open (local
// measurement only).
type serverProc struct {
	bin                string
	cmd                *exec.Cmd
	grpcAddr, httpAddr string
	exited             chan struct{} // closed when the process has exited and its log was read
	waitErr            error         // valid after exited is closed

	// mu guards tail, the last lines of the server's log (for errors).
	mu   sync.Mutex
	tail []string
}

// startServerProc starts bin and waits (bounded) for its "serving" log line,
// which names its bound addresses. The server's log goes to logw when it is
// not nil.
func startServerProc(bin string, logw io.Writer) (*serverProc, error) {
	p := &serverProc{bin: bin, exited: make(chan struct{})}
	p.cmd = exec.Command(bin,
		"--grpc-bind-address", "127.0.0.1:0", "--http-bind-address", "127.0.0.1:0",
		"--snapshot-bind-address", "127.0.0.1:0", "--insecure-disable-auth", "--enable-pprof",
		"--log-format", "json", "--drain-timeout", "5s")
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("cannot start %s: %w", bin, err)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start %s: %w", bin, err)
	}
	addrs := make(chan [2]string, 1)
	go func() {
		// Wait closes the pipe, so it may only run once the log was read to
		// the end: reaping first would lose the last lines, the ones that
		// say why a server exited.
		p.readLog(stderr, logw, addrs)
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	timer := time.NewTimer(serverStartTimeout)
	defer timer.Stop()
	select {
	case a := <-addrs:
		p.grpcAddr, p.httpAddr = a[0], a[1]
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("%s exited before serving (%v): %s", bin, p.waitErr, p.logTail())
	case <-timer.C:
		_ = p.stop()
		return nil, fmt.Errorf("%s did not serve within %v: %s", bin, serverStartTimeout, p.logTail())
	}
}

// readLog copies the server's JSON log, keeps its tail, and sends the
// addresses of the first line that names both the gRPC and HTTP listeners.
// It returns at the end of the log, when the process has exited; past a line
// too long to scan it discards the rest, so the server never blocks on a
// full pipe.
func (p *serverProc) readLog(r io.Reader, logw io.Writer, addrs chan<- [2]string) {
	defer func() { _, _ = io.Copy(io.Discard, r) }()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		line := sc.Text()
		if logw != nil {
			fmt.Fprintln(logw, line)
		}
		p.mu.Lock()
		if p.tail = append(p.tail, line); len(p.tail) > 20 {
			p.tail = p.tail[1:]
		}
		p.mu.Unlock()
		if sent {
			continue
		}
		var rec struct{ GRPC, HTTP string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.GRPC != "" && rec.HTTP != "" {
			addrs <- [2]string{rec.GRPC, rec.HTTP}
			sent = true
		}
	}
}

func (p *serverProc) logTail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

// stop sends SIGTERM and waits for the drain, killing the process after
// serverStopTimeout.
func (p *serverProc) stop() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("cannot stop %s: %w", p.bin, err)
	}
	timer := time.NewTimer(serverStopTimeout)
	defer timer.Stop()
	select {
	case <-p.exited:
		return nil
	case <-timer.C:
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within %v; killed", p.bin, serverStopTimeout)
	}
}

// get fetches http://<http addr><path> into w.
func (p *serverProc) get(ctx context.Context, path string, w io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, httpTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.httpAddr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cannot get %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("cannot get %s: %s: %s", path, resp.Status, body)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("cannot read %s: %w", path, err)
	}
	return nil
}

// cpuSeconds reads the server's process_cpu_seconds_total.
func (p *serverProc) cpuSeconds(ctx context.Context) (float64, error) {
	var buf strings.Builder
	if err := p.get(ctx, "/metrics", &buf); err != nil {
		return 0, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(buf.String()))
	if err != nil {
		return 0, fmt.Errorf("cannot parse /metrics: %w", err)
	}
	fam := fams["process_cpu_seconds_total"]
	if fam == nil || len(fam.GetMetric()) == 0 {
		return 0, errors.New("the server exports no process_cpu_seconds_total")
	}
	return fam.GetMetric()[0].GetCounter().GetValue(), nil
}

// cpuMeter reads the server's CPU seconds when the measured window opens
// and closes (it is a loadgen.Config.OnWindow).
type cpuMeter struct {
	p   *serverProc
	ctx context.Context

	// mu guards the fields below, written by OnWindow's goroutine and read
	// after Run returns.
	mu         sync.Mutex
	start, end float64
	err        error
}

func (m *cpuMeter) onWindow(open bool) {
	v, err := m.p.cpuSeconds(m.ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.err = errors.Join(m.err, err)
	if open {
		m.start = v
	} else {
		m.end = v
	}
}

func (m *cpuMeter) seconds() (float64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.end - m.start, m.err
}
