package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	admissionmetrics "k8s.io/apiserver/pkg/admission/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/inferencecache/inferencecache/bus/bustest"
	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/controlserver/auth"
	"github.com/inferencecache/inferencecache/kvevents"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	"github.com/inferencecache/inferencecache/operator/manager"
	"github.com/inferencecache/inferencecache/picker/endpoints"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

// targetLabels are the labels Prometheus attaches to every series of a
// target found through a ServiceMonitor or PodMonitor.
var targetLabels = []string{"job", "instance", "namespace", "pod", "service", "endpoint", "container"}

// A metricInfo is what the real components show of one metric: its label
// names, and the label values an exposition carried or the registration
// fixed.
type metricInfo struct {
	sources []string
	labels  map[string]bool
	values  map[string]map[string]bool
	// unchecked: the component that shows this metric's values did not
	// run (no envtest binaries outside CI), so its values are not checked.
	unchecked bool
}

// catalog is every metric the dashboards may read, by name.
type catalog map[string]*metricInfo

func (c catalog) info(name, source string) *metricInfo {
	mi := c[name]
	if mi == nil {
		mi = &metricInfo{labels: map[string]bool{}, values: map[string]map[string]bool{}}
		c[name] = mi
	}
	if !slices.Contains(mi.sources, source) {
		mi.sources = append(mi.sources, source)
	}
	return mi
}

func (mi *metricInfo) value(label, v string) {
	mi.labels[label] = true
	if mi.values[label] == nil {
		mi.values[label] = map[string]bool{}
	}
	mi.values[label][v] = true
}

// descParts reads a Desc's String form, the only place client_golang
// shows a registered metric's name and labels: Desc{fqName: "...", help:
// "...", constLabels: {k="v",...}, variableLabels: {a,b}}.
var (
	descName     = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)
	descLabels   = regexp.MustCompile(`constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)
	descConstant = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)
)

// describe adds every metric c describes: the metrics a component
// registers, whether or not it has series yet.
func (c catalog) describe(t *testing.T, source string, coll prometheus.Collector) {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() {
		coll.Describe(ch)
		close(ch)
	}()
	n := 0
	for d := range ch {
		s := d.String()
		name, lab := descName.FindStringSubmatch(s), descLabels.FindStringSubmatch(s)
		if name == nil || lab == nil {
			t.Fatalf("%s: cannot read %s", source, s)
		}
		mi := c.info(name[1], source)
		for _, kv := range descConstant.FindAllStringSubmatch(lab[1], -1) {
			mi.value(kv[1], kv[2])
		}
		for _, l := range strings.Split(lab[2], ",") {
			if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
				mi.labels[l] = true
			}
		}
		n++
	}
	if n == 0 {
		t.Fatalf("%s describes no metric", source)
	}
}

// gather adds the series of a real exposition: label names and values.
func (c catalog) gather(source string, fams map[string]*dto.MetricFamily) {
	for name, f := range fams {
		mi := c.info(name, source)
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				mi.value(l.GetName(), l.GetValue())
			}
		}
	}
}

// declare adds label values a package fixes in code but no exposition in
// this test shows (they need a kube-apiserver's TokenReview, or a probe
// answer), named by the constants the writers use.
func (c catalog) declare(name, label, source string, values ...string) {
	mi := c.info(name, source)
	for _, v := range values {
		mi.value(label, v)
	}
}

// lookup finds the metric a selector names: a histogram's _bucket, _sum
// and _count series belong to the registered name.
func (c catalog) lookup(name string) (*metricInfo, bool) {
	if mi, ok := c[name]; ok {
		return mi, false
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok && c[base] != nil {
			return c[base], suf == "_bucket"
		}
	}
	return nil, false
}

func (c catalog) hasLabel(name, label string) bool {
	if slices.Contains(targetLabels, label) {
		return true
	}
	mi, bucket := c.lookup(name)
	return mi != nil && (mi.labels[label] || bucket && label == "le")
}

// parseExposition parses a /metrics body with Prometheus's text parser.
func parseExposition(t *testing.T, body string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("cannot parse the exposition: %v", err)
	}
	return fams
}

// serverTraffic reports a chain for model m from two replicas (with load
// stats) and looks it up, so the lookup series of a hinted answer, the model's index series and the replica load gauges exist.
func serverTraffic(t *testing.T, srv *server.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := pb.NewInferenceCacheClient(servertest.Conn(t, srv))
	var hashes [][]byte
	var counts []int32
	for i := range 4 {
		hashes = append(hashes, binary.BigEndian.AppendUint64(nil, 0xdada<<32|uint64(i)))
		counts = append(counts, 16)
	}
	st, err := cli.ReportCacheState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"r1", "r2"} {
		u := &pb.CacheStateUpdate{TenantId: "team", ModelId: "m", HashScheme: "vllm", ReplicaId: r,
			TimestampUs: time.Now().UnixMicro(),
			Prefixes:    []*pb.PrefixEntry{{BlockHashes: hashes, BlockTokenCounts: counts}},
			Stats:       &pb.ReplicaStats{ReplicaId: r, WaitingRequests: proto.Int32(2), RunningRequests: proto.Int32(3)}}
		if err := st.Send(u); err != nil {
			t.Fatal(err)
		}
	}
	if ack, err := st.CloseAndRecv(); err != nil || !ack.GetAccepted() {
		t.Fatalf("ReportCacheState: %v, %v", ack, err)
	}
	resp, err := cli.LookupRoute(ctx, &pb.LookupRouteRequest{TenantId: "team", ModelId: "m", HashScheme: "vllm",
		BlockHashes: hashes, BlockTokenCounts: counts})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetReplicaScores()) == 0 {
		t.Fatalf("lookup of the reported chain answered no hint: %v", resp)
	}
	if _, err := cli.LookupRoute(ctx, &pb.LookupRouteRequest{TenantId: "team", ModelId: "nobody-serves-this", HashScheme: "vllm",
		BlockHashes: hashes, BlockTokenCounts: counts}); err != nil {
		t.Fatal(err)
	}
}

// startServer runs a real server with every optional collector on: a
// tokenizer folder, NATS (in process), the endpoint picker on an
// endpoints file, as cmd/server wires them.
func startServer(t *testing.T) *server.Server {
	t.Helper()
	ns := bustest.Start(t)
	epFile := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(epFile, []byte("tenant: team\nendpoints:\n- replicaId: r1\n  address: 10.1.0.1:8000\n- replicaId: r2\n  address: 10.1.0.2:8000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return servertest.Start(t, func(c *server.Config) {
		c.TokenizerDir = t.TempDir()
		c.NATS.URL = ns.URL()
		c.NATS.Stream.Name = "DASHGEN"
		c.Picker.NewSource = func(obs endpoints.Observer, log *slog.Logger) (endpoints.Source, error) {
			return endpoints.NewFile(epFile, endpoints.WithObserver(obs), endpoints.WithLogger(log))
		}
	})
}

// apiserverAdmission records a webhook call, a rejection and a fail-open
// through k8s.io/apiserver's admission metrics, as a kube-apiserver calling
// this project's webhooks does, and returns those series.
func apiserverAdmission(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	ctx := context.Background()
	attr := admission.NewAttributesRecord(nil, nil, schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, "team", "p",
		schema.GroupVersionResource{Version: "v1", Resource: "pods"}, "", admission.Create, nil, false, nil)
	admissionmetrics.Metrics.ObserveWebhook(ctx, "mpod.inferencecache.io", 3*time.Millisecond, false, attr, "admit", 200)
	admissionmetrics.Metrics.ObserveWebhookRejection(ctx, "vcachepolicy.inferencecache.io", "validating", "CREATE",
		admissionmetrics.WebhookRejectionCallingWebhookError, 0)
	admissionmetrics.Metrics.ObserveWebhookFailOpen(ctx, "mpod.inferencecache.io", "admit")
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "apiserver_admission_") {
			out[mf.GetName()] = mf
		}
	}
	return out
}

// controllerExposition runs the real controller (operator/manager, as
// cmd/controller does: leader election, every reconciler) against envtest
// and the real server, and scrapes its /metrics once the reconcilers have
// started. Without envtest binaries it skips (CI must have them).
func controllerExposition(t *testing.T, srv *server.Server) map[string]*dto.MetricFamily {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KUBEBUILDER_ASSETS is not set; CI must run `bash hack/envtest-assets.sh` first")
		}
		t.Log("KUBEBUILDER_ASSETS not set: the controller's label values are not checked against its exposition (export KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh))")
		return nil
	}
	ctrl.SetLogger(logr.Discard())
	env := &envtest.Environment{CRDDirectoryPaths: []string{"../../crd/bases"}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("envtest stop: %v", err)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("not-checked"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- manager.Run(ctx, cfg, manager.Options{
			Namespace: "default", ServerAddress: "http://" + srv.InternalAddr().String(),
			PolicyTokenPath: token, ControllerTokenPath: token,
			PushInterval: time.Second, SnapshotInterval: time.Second,
			MetricsAddr: metricsAddr, ProbeAddr: "0",
			LeaderElect: true, LeaderElectionID: "dashgen-test",
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("manager.Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("manager.Run did not return within 30 s of its context ending")
		}
	})

	// The reconcilers start once the replica leads; their series exist
	// from then on.
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var fams map[string]*dto.MetricFamily
		resp, err := client.Get("http://" + metricsAddr + "/metrics")
		if err == nil {
			body, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				fams = parseExposition(t, string(body))
			}
		}
		if started(fams, "policy-propagation", "cache-snapshot", "cachebackend") {
			return fams
		}
		select {
		case err := <-done:
			t.Fatalf("manager.Run returned before its reconcilers started: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the controller's reconcilers did not start within 2 minutes (last scrape error %v)", err)
		}
	}
}

// started: the exposition has reconcile series of every controller named.
func started(fams map[string]*dto.MetricFamily, controllers ...string) bool {
	seen := map[string]bool{}
	for _, m := range fams["controller_runtime_reconcile_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "controller" {
				seen[l.GetValue()] = true
			}
		}
	}
	for _, c := range controllers {
		if !seen[c] {
			return false
		}
	}
	return true
}

// realCatalog starts the components and lists what they expose.
func realCatalog(t *testing.T) catalog {
	t.Helper()
	c := catalog{}

	srv := startServer(t)
	c.describe(t, "server", srv.Metrics().Registry())
	serverTraffic(t, srv)
	c.gather("server", servertest.Scrape(t, srv))
	// The control endpoints count by result only with TokenReview auth on,
	// which needs a kube-apiserver's authenticator; the values are the
	// auth package's.
	for _, n := range []string{"inferencecache_policy_auth_total", "inferencecache_snapshot_auth_total", "inferencecache_probe_auth_total"} {
		c.declare(n, "result", "controlserver/auth", auth.ResultOK, auth.ResultUnauth, auth.ResultForbidden, auth.ResultError)
	}

	// The controller binary: controller-runtime's registry (reconciles,
	// work queues, leader election, webhooks) with the backend vectors.
	c.describe(t, "controller", ctrlmetrics.Registry.(prometheus.Collector))
	bm := controller.NewBackendMetrics()
	c.describe(t, "controller", bm.HitRate)
	c.describe(t, "controller", bm.QueryTokens)
	for _, coll := range controller.CacheBackendCollectors() {
		c.describe(t, "controller", coll)
	}
	// Probe outcomes need a CacheBackend whose /probe answers; the values
	// are the ones the reconciler records (controlapi's).
	c.declare("inferencecache_backend_probe_result_total", "result", "controlapi", controlapi.StageOK, controlapi.StageFailed, controlapi.StageSkipped)
	if fams := controllerExposition(t, srv); fams != nil {
		c.gather("controller", fams)
	} else {
		for _, mi := range c {
			mi.unchecked = mi.unchecked || slices.Contains(mi.sources, "controller")
		}
	}

	// The kvevent-subscriber sidecar: its metric set, as
	// cmd/kvevent-subscriber registers it.
	reg := prometheus.NewRegistry()
	kvevents.NewMetrics(reg)
	c.describe(t, "subscriber", reg)

	// The kube-apiserver's admission webhook series.
	c.gather("kube-apiserver", apiserverAdmission(t))

	// up is Prometheus's own, one per target.
	c.info("up", "prometheus")

	for _, must := range []string{"inferencecache_server_up", "inferencecache_picker_picks_total", "inferencecache_bus_connected",
		"inferencecache_tokenizations_total", "controller_runtime_reconcile_total", "inferencecache_subscriber_resyncs_total",
		"apiserver_admission_webhook_admission_duration_seconds"} {
		if c[must] == nil {
			t.Fatalf("the components do not register %s: the catalog is incomplete", must)
		}
	}
	return c
}

// TestDashboardsReadRealMetrics: every metric a dashboard query or
// variable selects is registered by a real component (the server with
// the picker, NATS and a tokenizer folder; the controller; the
// kvevent-subscriber; the kube-apiserver's admission metrics), every
// label it matches, groups by or names in a legend is one of that
// metric's labels (or a label Prometheus adds to a target), and every
// label value it matches literally is one a real exposition carried (or
// the writing package fixes).
func TestDashboardsReadRealMetrics(t *testing.T) {
	c := realCatalog(t)
	used := map[string]bool{}
	var problems []string
	fail := func(q pquery, format string, args ...any) {
		problems = append(problems, q.Where+": "+fmt.Sprintf(format, args...))
	}
	for _, q := range dashboardQueries(t) {
		expr, err := parse(q)
		if err != nil {
			fail(q, "%v", err)
			continue
		}
		parser.Inspect(expr, func(n parser.Node, path []parser.Node) error {
			switch n := n.(type) {
			case *parser.VectorSelector:
				used[n.Name] = true
				checkSelector(c, n, func(format string, args ...any) { fail(q, format, args...) })
			case *parser.AggregateExpr:
				for _, l := range n.Grouping {
					for _, name := range selectorNames(n.Expr) {
						if !c.hasLabel(name, l) {
							fail(q, "groups by %s, which %s does not have", l, name)
						}
					}
				}
			}
			return nil
		})
		if q.VarLabel != "" {
			for _, name := range selectorNames(expr) {
				if !c.hasLabel(name, q.VarLabel) {
					fail(q, "label_values of %s, which %s does not have", q.VarLabel, name)
				}
			}
		}
		out, all := outLabels(c, expr)
		for _, m := range legendRef.FindAllStringSubmatch(q.Legend, -1) {
			if !all && !out[m[1]] {
				fail(q, "legend {{%s}}, but the query's series only carry %v", m[1], keys(out))
			}
		}
	}
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p)
	}
	if len(used) < 60 {
		t.Errorf("the dashboards read only %d metrics", len(used))
	}
	t.Logf("the dashboards read %d metrics", len(used))
}

var legendRef = regexp.MustCompile(`\{\{ *(\w+) *\}\}`)

// literalAlternation is a regex matcher value that is a list of literal
// values: a|b|c.
var literalAlternation = regexp.MustCompile(`^[\w-]+(\|[\w-]+)*$`)

func checkSelector(c catalog, vs *parser.VectorSelector, fail func(string, ...any)) {
	mi, _ := c.lookup(vs.Name)
	if mi == nil {
		fail("selects %s, which no component registers", vs.Name)
		return
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == model.MetricNameLabel {
			continue
		}
		if !c.hasLabel(vs.Name, m.Name) {
			fail("matches %s on %s, which it does not have", vs.Name, m.Name)
			continue
		}
		if slices.Contains(targetLabels, m.Name) || strings.HasPrefix(m.Value, "value-of-") {
			continue // a dashboard variable or a target's label
		}
		seen := mi.values[m.Name]
		if len(seen) == 0 && mi.unchecked {
			continue
		}
		if len(seen) == 0 {
			fail("matches %s{%s} by value, but no exposition here shows values of %s: generate traffic that does", vs.Name, m, m.Name)
			continue
		}
		var want []string
		switch {
		case m.Type == labels.MatchEqual || m.Type == labels.MatchNotEqual:
			want = []string{m.Value}
		case literalAlternation.MatchString(m.Value):
			want = strings.Split(m.Value, "|")
		default: // a pattern: some value it matches must exist
			matched := false
			for v := range seen {
				matched = matched || m.Matches(v)
			}
			if !matched {
				fail("matcher %s matches none of %s's %s values %v", m, vs.Name, m.Name, keys(seen))
			}
		}
		for _, v := range want {
			if !seen[v] {
				fail("matches %s=%q, which is none of the values %v", m.Name, v, keys(seen))
			}
		}
	}
}

// selectorNames lists the metrics an expression selects.
func selectorNames(e parser.Node) []string {
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs.Name)
		}
		return nil
	})
	return out
}

// outLabels is the label names the series of e carry (all: e keeps every
// label of what it selects, which may be any).
func outLabels(c catalog, e parser.Expr) (set map[string]bool, all bool) {
	switch e := e.(type) {
	case *parser.ParenExpr:
		return outLabels(c, e.Expr)
	case *parser.NumberLiteral:
		return map[string]bool{}, false
	case *parser.AggregateExpr:
		if e.Without {
			return nil, true
		}
		set := map[string]bool{}
		for _, l := range e.Grouping {
			set[l] = true
		}
		return set, false
	case *parser.Call:
		if e.Func.Name == "histogram_quantile" {
			s, all := outLabels(c, e.Args[1])
			delete(s, "le")
			return s, all
		}
		for _, a := range e.Args {
			if t := a.Type(); t == parser.ValueTypeVector || t == parser.ValueTypeMatrix {
				return outLabels(c, a)
			}
		}
		return map[string]bool{}, false
	case *parser.MatrixSelector:
		return outLabels(c, e.VectorSelector)
	case *parser.VectorSelector:
		set := map[string]bool{}
		if mi, _ := c.lookup(e.Name); mi != nil {
			for l := range mi.labels {
				set[l] = true
			}
		}
		for _, l := range targetLabels {
			set[l] = true
		}
		return set, false
	case *parser.BinaryExpr:
		if e.LHS.Type() == parser.ValueTypeScalar {
			return outLabels(c, e.RHS)
		}
		set, all := outLabels(c, e.LHS)
		if vm := e.VectorMatching; vm != nil && e.RHS.Type() == parser.ValueTypeVector && !e.Op.IsSetOperator() {
			if vm.On {
				set, all = map[string]bool{}, false
				for _, l := range vm.MatchingLabels {
					set[l] = true
				}
			} else {
				for _, l := range vm.MatchingLabels {
					delete(set, l)
				}
			}
		}
		return set, all
	}
	return nil, true
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
