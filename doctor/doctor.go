// Package doctor is the pre-flight diagnostic of an inferencecache
// installation (cmd/inferencecache doctor). It runs read-only checks and
// reports each outcome as a Finding with a stable code (IC1xx: the server's
// data plane, IC2xx: the cluster; see Codes and README.md) and a Severity.
//
// Read-only means: the data plane is only asked (gRPC health, GET /snapshot,
// and GET on /policy and /probe, which answer 405 once the token passed the
// endpoint's auth, so reachability and the token are proven without pushing a
// policy or running a probe); the cluster is only read (list and get); a
// webhook endpoint is only handshaken with (TLS, to verify its certificate
// against the caBundle), never sent a request.
//
// Run never fails: every problem, including an unreachable apiserver or a
// timeout, is a finding. Report.ExitCode maps the worst severity to 0 (OK or
// INFO), 1 (WARN) or 2 (FAIL) for CI gating.
package doctor

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/controlapi"
)

// Severity grades a finding; the order is OK < INFO < WARN < FAIL.
type Severity int

const (
	OK Severity = iota
	Info
	Warn
	Fail
)

var severityNames = [...]string{"OK", "INFO", "WARN", "FAIL"}

func (s Severity) String() string {
	if s < OK || s > Fail {
		return fmt.Sprintf("Severity(%d)", int(s))
	}
	return severityNames[s]
}

// MarshalText writes the severity's name ("OK", "INFO", "WARN", "FAIL").
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses a severity name.
func (s *Severity) UnmarshalText(b []byte) error {
	i := slices.Index(severityNames[:], string(b))
	if i < 0 {
		return fmt.Errorf("doctor: unknown severity %q", b)
	}
	*s = Severity(i)
	return nil
}

// Exit codes of Report.ExitCode; ExitUsage is the command's for a usage or
// internal error.
const (
	ExitOK    = 0
	ExitWarn  = 1
	ExitFail  = 2
	ExitUsage = 3
)

// Finding is the outcome of one check on one object.
type Finding struct {
	Code     string   `json:"code"`
	Severity Severity `json:"severity"`
	// Check is the code's short name (Code.Title).
	Check string `json:"check"`
	// Object is what was checked: an address, an endpoint or
	// "<kind> <namespace>/<name>"; empty for cluster-wide findings.
	Object  string `json:"object,omitempty"`
	Message string `json:"message"`
	// Fix is the code's remedy; set on WARN and FAIL findings only.
	Fix string `json:"fix,omitempty"`
}

// Report is the result of Run.
type Report struct {
	// Findings are sorted by code, then object.
	Findings []Finding `json:"findings"`
	Summary  Summary   `json:"summary"`
	// Worst is the highest severity among the findings (OK when none).
	Worst    Severity `json:"worst"`
	ExitCode int      `json:"exitCode"`
	// Duration is how long Run took.
	Duration time.Duration `json:"-"`
}

// Summary counts findings per severity.
type Summary struct {
	OK   int `json:"ok"`
	Info int `json:"info"`
	Warn int `json:"warn"`
	Fail int `json:"fail"`
}

// MarshalJSON adds durationSeconds to the report.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	return json.Marshal(struct {
		plain
		DurationSeconds float64 `json:"durationSeconds"`
	}{plain(r), r.Duration.Seconds()})
}

// Has reports whether the report holds a finding with code at severity sev.
func (r *Report) Has(code string, sev Severity) bool {
	return slices.ContainsFunc(r.Findings, func(f Finding) bool { return f.Code == code && f.Severity == sev })
}

// DefaultTimeout bounds a whole Run when Options.Timeout is zero.
const DefaultTimeout = 4 * time.Second

// Options configure Run. The zero value checks nothing.
type Options struct {
	// GRPCAddr is the server's gRPC address (host:port); empty skips the
	// gRPC health check.
	GRPCAddr string
	// GRPCTLS, when non-nil, dials GRPCAddr with TLS.
	GRPCTLS *tls.Config
	// ControlURL is the server's internal control address, e.g.
	// http://inferencecache-server.inferencecache-system.svc:8081; empty
	// skips the control endpoint checks.
	ControlURL string
	// ControllerTokenPath and PolicyTokenPath are files holding the bearer
	// tokens of audience inferencecache.io/controller (for /snapshot and
	// /probe) and inferencecache.io/policy (for /policy); empty sends none.
	ControllerTokenPath, PolicyTokenPath string
	// HTTPClient calls the control endpoints; nil means a fresh client.
	HTTPClient *http.Client

	// Cluster reads the cluster; nil skips the cluster checks unless
	// ClusterErr is set.
	Cluster client.Reader
	// ClusterErr is why no Cluster could be built (reported as IC200).
	ClusterErr error
	// ClusterHost names the apiserver in messages.
	ClusterHost string
	// Namespace limits the namespaced checks to one namespace; empty means
	// all namespaces.
	Namespace string

	// Controller names the controller's Deployment, leader Lease and
	// webhook configurations for the controller checks (IC280-IC283), which
	// run whatever Namespace says; nil skips them (DefaultController has the
	// shipped names).
	Controller *ControllerRefs
	// Dial connects to a webhook endpoint for the serving-certificate check
	// (IC282); nil uses a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DriftGrace is how long the CacheIndex may disagree with the live
	// /snapshot before IC271 is a WARN; zero means DefaultDriftGrace.
	DriftGrace time.Duration

	// ConfigOnly skips every data-plane call (gRPC and HTTP) and the token
	// files those calls would use; the cluster is still checked.
	ConfigOnly bool
	// Timeout bounds the whole Run; zero means DefaultTimeout.
	Timeout time.Duration
}

// ControllerRefs names the controller's objects. An empty field skips the
// check of that object.
type ControllerRefs struct {
	// Namespace is the controller's namespace (the Deployment's, the
	// Lease's).
	Namespace string
	// Deployment is the controller Deployment (IC280).
	Deployment string
	// LeaderLease is the leader election Lease, the controller's
	// --leader-election-id (IC281).
	LeaderLease string
	// ValidatingWebhook and MutatingWebhook are the webhook configurations
	// (IC282); the Services their webhooks call are checked too (IC283).
	ValidatingWebhook, MutatingWebhook string
}

// DefaultController returns the names operator/config/default deploys.
func DefaultController() ControllerRefs {
	return ControllerRefs{
		Namespace:         "inferencecache-system",
		Deployment:        "inferencecache-controller",
		LeaderLease:       "inferencecache-controller.inferencecache.io",
		ValidatingWebhook: "inferencecache-validating-webhook",
		MutatingWebhook:   "inferencecache-mutating-webhook",
	}
}

// DefaultDriftGrace is four of the controller's default snapshot intervals
// (30 s): a working poller has projected the live /snapshot by then.
const DefaultDriftGrace = 2 * time.Minute

// Run performs the checks Options enable and returns the report. The data
// plane and the cluster are checked concurrently, both bounded by
// Options.Timeout (and ctx).
func Run(ctx context.Context, o Options) *Report {
	start := time.Now()
	timeout := cmp.Or(o.Timeout, DefaultTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var (
		wg         sync.WaitGroup
		dp, cl     findings
		snap       *controlapi.CacheSnapshot
		clusterObj *clusterState
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		snap = checkDataPlane(ctx, &o, &dp)
	}()
	go func() {
		defer wg.Done()
		clusterObj = fetchCluster(ctx, &o, &cl)
	}()
	wg.Wait()
	if clusterObj != nil {
		clusterObj.evaluate(snap, &cl)
	}

	r := &Report{Findings: append(dp.list, cl.list...)}
	slices.SortStableFunc(r.Findings, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.Code, b.Code), cmp.Compare(a.Object, b.Object))
	})
	for _, f := range r.Findings {
		r.Worst = max(r.Worst, f.Severity)
		switch f.Severity {
		case OK:
			r.Summary.OK++
		case Info:
			r.Summary.Info++
		case Warn:
			r.Summary.Warn++
		case Fail:
			r.Summary.Fail++
		}
	}
	switch r.Worst {
	case Warn:
		r.ExitCode = ExitWarn
	case Fail:
		r.ExitCode = ExitFail
	}
	r.Duration = time.Since(start)
	return r
}

// findings collects one goroutine's findings; it is not safe for concurrent
// use (each check set owns one).
type findings struct{ list []Finding }

func (fs *findings) add(code string, sev Severity, object, format string, args ...any) {
	// Checks pass the Code* constants of the table; an unknown code
	// would still be reported, under its bare code and without a fix.
	c, ok := codeIndex[code]
	if !ok {
		c.Title = code
	}
	f := Finding{Code: code, Severity: sev, Check: c.Title, Object: object, Message: fmt.Sprintf(format, args...)}
	if sev >= Warn {
		f.Fix = c.Fix
	}
	fs.list = append(fs.list, f)
}

// oneLine flattens an error message for a one-line finding.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
