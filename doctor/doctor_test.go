package doctor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/inferencecache/inferencecache/doctor"
	"github.com/inferencecache/inferencecache/server/servertest"
)

// budget is the bound on a whole doctor run against a local server
// (and envtest).
const budget = 5 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestCodesDocumented keeps the code table, its order and README.md in step.
func TestCodesDocumented(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	valid := regexp.MustCompile(`^IC[12][0-9]{2}$`)
	var ids []string
	for _, c := range doctor.Codes() {
		if !valid.MatchString(c.ID) || c.Title == "" || c.Meaning == "" || c.Fix == "" {
			t.Errorf("code %+v: want IC1xx/IC2xx with a title, meaning and fix", c)
		}
		row := "| " + c.ID + " | `" + c.Title + "` |"
		if !bytes.Contains(readme, []byte(row)) {
			t.Errorf("README.md has no row starting %q", row)
		}
		ids = append(ids, c.ID)
	}
	if !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != len(ids) {
		t.Errorf("codes not sorted or not unique: %v", ids)
	}
	for _, m := range regexp.MustCompile(`\| (IC[0-9]{3}) \|`).FindAllSubmatch(readme, -1) {
		if _, ok := doctor.LookupCode(string(m[1])); !ok {
			t.Errorf("README.md documents %s, which the doctor does not have", m[1])
		}
	}
}

func TestSeverityText(t *testing.T) {
	for _, s := range []doctor.Severity{doctor.OK, doctor.Info, doctor.Warn, doctor.Fail} {
		b, _ := s.MarshalText()
		var got doctor.Severity
		if err := got.UnmarshalText(b); err != nil || got != s {
			t.Errorf("%v round-trips to %v, %v", s, got, err)
		}
	}
	var s doctor.Severity
	if err := s.UnmarshalText([]byte("ok")); err == nil {
		t.Error("lower-case severity accepted")
	}
}

// closedAddr returns a 127.0.0.1 address nothing listens on.
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// codesAt lists "CODE:SEVERITY" of every finding, for failure messages.
func codesAt(r *doctor.Report) []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, f.Code+":"+f.Severity.String()+" "+f.Object+" "+f.Message)
	}
	return out
}

func wantFinding(t *testing.T, r *doctor.Report, code string, sev doctor.Severity) {
	t.Helper()
	if !r.Has(code, sev) {
		t.Errorf("no %s %s finding in\n%s", code, sev, strings.Join(codesAt(r), "\n"))
	}
}

func wantExit(t *testing.T, r *doctor.Report, code int) {
	t.Helper()
	if r.ExitCode != code {
		t.Errorf("exit code %d, want %d; findings:\n%s", r.ExitCode, code, strings.Join(codesAt(r), "\n"))
	}
	if r.Duration > budget {
		t.Errorf("doctor took %v, budget %v", r.Duration, budget)
	}
}

// TestDataPlaneInsecureServer runs the data-plane checks against a real
// in-process server with its control auth off: everything is reachable, and
// the open control port is a WARN.
func TestDataPlaneInsecureServer(t *testing.T) {
	srv := servertest.Start(t, nil)
	r := doctor.Run(ctxT(t), doctor.Options{
		GRPCAddr:   srv.GRPCAddr().String(),
		ControlURL: "http://" + srv.InternalAddr().String(),
	})
	for _, code := range []string{doctor.CodeGRPCHealth, doctor.CodeSnapshot, doctor.CodePolicyEndpoint, doctor.CodeProbeEndpoint} {
		wantFinding(t, r, code, doctor.OK)
	}
	wantFinding(t, r, doctor.CodeNoAuth, doctor.Warn)
	wantExit(t, r, doctor.ExitWarn)
}

// TestDataPlaneWrongPort points --control-url at the public HTTP port, where
// the control paths are 404.
func TestDataPlaneWrongPort(t *testing.T) {
	srv := servertest.Start(t, nil)
	r := doctor.Run(ctxT(t), doctor.Options{ControlURL: "http://" + srv.HTTPAddr().String()})
	wantFinding(t, r, doctor.CodeControlStatus, doctor.Fail)
	wantExit(t, r, doctor.ExitFail)
}

// TestDataPlaneUnreachable points the doctor at closed ports.
func TestDataPlaneUnreachable(t *testing.T) {
	r := doctor.Run(ctxT(t), doctor.Options{
		GRPCAddr:   closedAddr(t),
		ControlURL: "http://" + closedAddr(t),
	})
	wantFinding(t, r, doctor.CodeGRPCUnreachable, doctor.Fail)
	wantFinding(t, r, doctor.CodeControlDown, doctor.Fail)
	if r.Has(doctor.CodeNoAuth, doctor.Warn) || r.Has(doctor.CodeNoAuth, doctor.OK) {
		t.Error("IC119 judged on an unreachable port")
	}
	wantExit(t, r, doctor.ExitFail)
}

// grpcServer serves a bare gRPC server on 127.0.0.1, with a health service
// at status st unless st is nil.
func grpcServer(t *testing.T, st *healthpb.HealthCheckResponse_ServingStatus) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	if st != nil {
		h := health.NewServer()
		h.SetServingStatus("", *st)
		healthpb.RegisterHealthServer(g, h)
	}
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return l.Addr().String()
}

// TestGRPCHealthOutcomes: a server that does not serve (starting or
// draining) and a gRPC server without the health service both FAIL IC100;
// an HTTP/1 port fails to speak gRPC (IC101).
func TestGRPCHealthOutcomes(t *testing.T) {
	notServing := healthpb.HealthCheckResponse_NOT_SERVING
	srv := servertest.Start(t, nil)
	for _, c := range []struct {
		name, addr, code string
	}{
		{"not serving", grpcServer(t, &notServing), doctor.CodeGRPCHealth},
		{"no health service", grpcServer(t, nil), doctor.CodeGRPCHealth},
		{"http/1 port", srv.HTTPAddr().String(), doctor.CodeGRPCUnreachable},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := doctor.Run(ctxT(t), doctor.Options{GRPCAddr: c.addr})
			wantFinding(t, r, c.code, doctor.Fail)
			wantExit(t, r, doctor.ExitFail)
		})
	}
}

func TestTokenFiles(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := doctor.Run(ctxT(t), doctor.Options{
		ControllerTokenPath: filepath.Join(dir, "missing"),
		PolicyTokenPath:     empty,
	})
	if n := len(r.Findings); n != 2 || !r.Has(doctor.CodeTokenFile, doctor.Fail) {
		t.Fatalf("findings %v, want two IC115 FAIL", codesAt(r))
	}
	wantExit(t, r, doctor.ExitFail)
}

// TestConfigOnlyMakesNoCalls: --config-only must not touch the data plane,
// so closed ports and missing token files produce no finding at all.
func TestConfigOnlyMakesNoCalls(t *testing.T) {
	r := doctor.Run(ctxT(t), doctor.Options{
		GRPCAddr: closedAddr(t), ControlURL: "http://" + closedAddr(t), ConfigOnly: true,
		ControllerTokenPath: filepath.Join(t.TempDir(), "missing"),
	})
	if len(r.Findings) != 0 {
		t.Fatalf("config-only findings %v, want none", codesAt(r))
	}
	wantExit(t, r, doctor.ExitOK)
}

// TestOutputs renders one report in every format; JSON must parse back.
func TestOutputs(t *testing.T) {
	srv := servertest.Start(t, nil)
	r := doctor.Run(ctxT(t), doctor.Options{
		GRPCAddr:   srv.GRPCAddr().String(),
		ControlURL: "http://" + closedAddr(t),
	})
	var buf bytes.Buffer
	if err := doctor.Write(&buf, r, doctor.FormatJSON); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Findings []doctor.Finding `json:"findings"`
		Summary  doctor.Summary   `json:"summary"`
		Worst    doctor.Severity  `json:"worst"`
		ExitCode int              `json:"exitCode"`
		Duration *float64         `json:"durationSeconds"`
	}
	dec := json.NewDecoder(&buf)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("JSON output does not parse: %v", err)
	}
	if !slices.Equal(got.Findings, r.Findings) || got.Summary != r.Summary || got.Worst != doctor.Fail ||
		got.ExitCode != doctor.ExitFail || got.Duration == nil {
		t.Errorf("JSON round trip: %+v, want %+v", got, r)
	}
	for _, f := range got.Findings {
		if (f.Fix != "") != (f.Severity >= doctor.Warn) {
			t.Errorf("finding %+v: fix must be set exactly on WARN and FAIL", f)
		}
	}

	buf.Reset()
	if err := doctor.Write(&buf, r, doctor.FormatHuman); err != nil {
		t.Fatal(err)
	}
	human := buf.String()
	for _, want := range []string{"Data plane\n", "[OK]   IC100 grpc-health", "[FAIL] IC111 control-reachable", "fix: ", "exit 2\n"} {
		if !strings.Contains(human, want) {
			t.Errorf("human output lacks %q:\n%s", want, human)
		}
	}

	buf.Reset()
	if err := doctor.Write(&buf, r, doctor.FormatTable); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != len(r.Findings)+1 || !strings.HasPrefix(lines[0], "SEVERITY") {
		t.Errorf("table output:\n%s", buf.String())
	}
	if err := doctor.Write(&buf, r, "yaml"); err == nil {
		t.Error("unknown format accepted")
	}
}

// hangingAddr accepts connections on 127.0.0.1 and never answers.
func hangingAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c) // held open, never read
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestTimeoutBoundsRun: a peer that accepts and never answers costs at most
// the timeout, and is a FAIL, not a hang.
func TestTimeoutBoundsRun(t *testing.T) {
	addr := hangingAddr(t)
	const timeout = 500 * time.Millisecond
	r := doctor.Run(ctxT(t), doctor.Options{GRPCAddr: addr, ControlURL: "http://" + addr, Timeout: timeout})
	wantFinding(t, r, doctor.CodeGRPCUnreachable, doctor.Fail)
	wantFinding(t, r, doctor.CodeControlDown, doctor.Fail)
	wantExit(t, r, doctor.ExitFail)
	if r.Duration > timeout+time.Second {
		t.Errorf("run took %v with a %v timeout", r.Duration, timeout)
	}
}
