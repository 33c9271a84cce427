// Package rulestest checks operator/config/prometheus/prometheusrule.yaml
// with Prometheus's own rule and PromQL parsers, and that every metric the
// rules name is one the server or the controller registers. It is a module
// of its own so the prometheus/prometheus dependency stays out of the main
// module.
package rulestest

import (
	"context"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	admissionmetrics "k8s.io/apiserver/pkg/admission/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/inferencecache/bus/bustest"
	"github.com/inferencecache/inferencecache/operator/internal/controller"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

const rulesFile = "../prometheusrule.yaml"

// scrapeGenerated are series Prometheus makes itself, not any exposition.
var scrapeGenerated = []string{"up", "scrape_duration_seconds", "scrape_samples_scraped"}

// loadRules reads the PrometheusRule and parses its groups as a Prometheus
// rule file.
func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var cr struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Spec       map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &cr); err != nil {
		t.Fatal(err)
	}
	if cr.APIVersion != "monitoring.coreos.com/v1" || cr.Kind != "PrometheusRule" {
		t.Fatalf("%s is %s %s, want a monitoring.coreos.com/v1 PrometheusRule", rulesFile, cr.APIVersion, cr.Kind)
	}
	groups, err := yaml.Marshal(cr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	rgs, errs := rulefmt.Parse(groups, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, e := range errs {
		t.Errorf("rulefmt: %v", e)
	}
	if rgs == nil || len(rgs.Groups) == 0 {
		t.Fatalf("no rule groups in %s", rulesFile)
	}
	return rgs
}

// TestRulesParse: the groups are a valid rule file; every rule is an alert
// with a severity, a summary and a description, and the alerts metrics.md
// names are there.
func TestRulesParse(t *testing.T) {
	rgs := loadRules(t)
	seen := map[string]bool{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a recording rule %q; the file holds alerts only", g.Name, r.Record)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			seen[r.Alert] = true
			if sev := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, sev) {
				t.Errorf("%s: severity %q", r.Alert, sev)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs a summary and a description", r.Alert)
			}
			if time.Duration(r.For) > time.Hour {
				t.Errorf("%s: for %s is longer than any outage worth paging about", r.Alert, time.Duration(r.For))
			}
		}
	}
	for _, want := range []string{"ServerProbeFail", "InferencecacheT2Degraded", "InferencecachePolicyPushFailing", "InferencecacheServerDown",
		"InferencecacheControllerDown", "InferencecacheControllerNoLeader", "InferencecacheWebhookUnreachable"} {
		if !seen[want] {
			t.Errorf("no alert %s", want)
		}
	}
}

// ruleMetrics lists the metric names each alert's expression selects.
func ruleMetrics(t *testing.T, rgs *rulefmt.RuleGroups) map[string][]string {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	out := map[string][]string{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			expr, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", r.Alert, err)
				continue
			}
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				vs, ok := n.(*parser.VectorSelector)
				if !ok {
					return nil
				}
				name := vs.Name
				if name == "" {
					t.Errorf("%s: selector %s names no metric", r.Alert, vs)
					return nil
				}
				out[name] = append(out[name], r.Alert)
				return nil
			})
		}
	}
	return out
}

// descName reads the fully-qualified name out of a Desc's String form,
// which is the only place client_golang exposes it.
var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// registered lists the metric names a collector describes, with the
// series names a histogram or summary adds.
func registered(t *testing.T, names map[string]bool, c prometheus.Collector) {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		m := descName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		names[m[1]] = true
	}
}

// apiserverAdmissionMetrics records one webhook rejection and one fail-open
// through k8s.io/apiserver's admission metrics, as a kube-apiserver does,
// and returns every series name and the label values it exposed.
func apiserverAdmissionMetrics(t *testing.T) map[string]map[string][]string {
	t.Helper()
	ctx := context.Background()
	admissionmetrics.Metrics.ObserveWebhookRejection(ctx, "vcachepolicy.inferencecache.io", "validating", "CREATE",
		admissionmetrics.WebhookRejectionCallingWebhookError, 0)
	admissionmetrics.Metrics.ObserveWebhookRejection(ctx, "vcachepolicy.inferencecache.io", "validating", "CREATE",
		admissionmetrics.WebhookRejectionAPIServerInternalError, 0)
	admissionmetrics.Metrics.ObserveWebhookFailOpen(ctx, "mpod.inferencecache.io", "admit")
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]string{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "apiserver_admission_webhook_") {
			continue
		}
		lv := map[string][]string{}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				lv[l.GetName()] = append(lv[l.GetName()], l.GetValue())
			}
		}
		out[mf.GetName()] = lv
	}
	return out
}

// TestWebhookAlertsMatchApiserverLabels: the label values the webhook alerts
// select are the ones the kube-apiserver writes.
func TestWebhookAlertsMatchApiserverLabels(t *testing.T) {
	got := apiserverAdmissionMetrics(t)
	rej := got["apiserver_admission_webhook_rejection_count"]
	for _, want := range []string{"calling_webhook_error", "apiserver_internal_error"} {
		if !slices.Contains(rej["error_type"], want) {
			t.Errorf("apiserver_admission_webhook_rejection_count error_type values %v lack %q", rej["error_type"], want)
		}
	}
	if open := got["apiserver_admission_webhook_fail_open_count"]; !slices.Contains(open["name"], "mpod.inferencecache.io") {
		t.Errorf("apiserver_admission_webhook_fail_open_count has no name label: %v", open)
	}
	raw, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `error_type=~"calling_webhook_error|apiserver_internal_error"`) {
		t.Error("InferencecacheWebhookUnreachable does not select both error types")
	}
}

// TestRulesNameExposedMetrics starts a real server (with a tokenizer folder
// and NATS, so every optional collector registers) and builds the
// controller's metrics as its binary does, then checks each metric the rules
// select is one of them.
func TestRulesNameExposedMetrics(t *testing.T) {
	names := map[string]bool{}

	ns := bustest.Start(t)
	srv := servertest.Start(t, func(c *server.Config) {
		c.TokenizerDir = t.TempDir()
		c.NATS.URL = ns.URL()
		c.NATS.Stream.Name = "RULESTEST"
	})
	registered(t, names, srv.Metrics().Registry())

	// The controller binary: controller-runtime's registry (reconcile,
	// workqueue, leader election, webhook series) plus the backend vectors
	// Setup registers there.
	registered(t, names, ctrlmetrics.Registry.(prometheus.Collector))
	registered(t, names, controller.NewBackendMetrics().HitRate)
	registered(t, names, controller.NewBackendMetrics().QueryTokens)
	for _, c := range controller.CacheBackendCollectors() {
		registered(t, names, c)
	}

	// The kube-apiserver's admission-webhook counters the webhook alerts
	// read, from the apiserver library that defines them.
	for n := range apiserverAdmissionMetrics(t) {
		names[n] = true
	}

	for _, n := range scrapeGenerated {
		names[n] = true
	}
	if !names["inferencecache_server_up"] || !names["inferencecache_bus_connected"] || !names["controller_runtime_reconcile_errors_total"] {
		t.Fatalf("the registries look incomplete: %d names", len(names))
	}

	used := ruleMetrics(t, loadRules(t))
	var missing []string
	for name, alerts := range used {
		base := name
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suf); ok && names[b] {
				base = b
			}
		}
		if !names[base] {
			missing = append(missing, name+" (in "+strings.Join(alerts, ", ")+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("the rules select %s, which neither binary registers", m)
	}
	if len(used) < 10 {
		t.Errorf("the rules select only %d metrics", len(used))
	}
}
