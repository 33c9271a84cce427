package rulestest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
)

// evalInterval is how often the test evaluates each rule: the Prometheus
// operator's default evaluation interval.
const evalInterval = 30 * time.Second

// at is one expectation of a scenario: after the evaluation at minute Min
// (from the start of the series) the rule is in State; Labels, when set, must
// be among the labels of one of its active alerts.
type at struct {
	Min    float64
	State  rules.AlertState
	Labels map[string]string
}

// scenario is one case of one alert: Series in promqltest's load notation
// (one sample a minute from time 0; `_` is a missing sample, `0+5x20` 21
// samples rising by 5, `1x20` 21 samples of 1) and the states the rule must
// be in while it is evaluated every evalInterval over them, as Prometheus
// does. Every rule needs a scenario that reaches firing and one that stays
// inactive; a rule with `for:` also one that shows it pending before the
// duration is up.
type scenario struct {
	Alert  string
	Name   string
	Series string
	Want   []at
}

var (
	inactive = rules.StateInactive
	pending  = rules.StatePending
	firing   = rules.StateFiring
)

// scenarios covers every alert of prometheusrule.yaml.
var scenarios = []scenario{
	// Server group.
	{"InferencecacheServerDown", "no server target at all", ``,
		[]at{{0, pending, nil}, {4.5, pending, nil}, {5, firing, nil}}},
	{"InferencecacheServerDown", "every server reports up 0", `
		inferencecache_server_up{job="inferencecache-server-metrics", namespace="ics", pod="s-0"} 0x20`,
		[]at{{4, pending, nil}, {6, firing, nil}}},
	{"InferencecacheServerDown", "one of two servers serves", `
		inferencecache_server_up{job="inferencecache-server-metrics", namespace="ics", pod="s-0"} 0x20
		inferencecache_server_up{job="inferencecache-server-metrics", namespace="ics", pod="s-1"} 1x20`,
		[]at{{0, inactive, nil}, {10, inactive, nil}}},
	{"InferencecacheServerDown", "up 0 for less than 5 minutes, then serving again", `
		inferencecache_server_up{job="inferencecache-server-metrics", namespace="ics", pod="s-0"} 0 0 0 1x20`,
		[]at{{2, pending, nil}, {4, inactive, nil}, {10, inactive, nil}}},

	{"InferencecacheServerScrapeFailing", "one server pod cannot be scraped", `
		up{job="inferencecache-server-metrics", namespace="ics", pod="s-0"} 1x30
		up{job="inferencecache-server-metrics", namespace="ics", pod="s-1"} 0x30`,
		[]at{{9, pending, map[string]string{"pod": "s-1"}}, {10, firing, map[string]string{"pod": "s-1"}}}},
	{"InferencecacheServerScrapeFailing", "every server pod scraped", `
		up{job="inferencecache-server-metrics", namespace="ics", pod="s-0"} 1x30
		up{job="inferencecache-controller-metrics", namespace="ics", pod="c-0"} 0x30`,
		[]at{{0, inactive, nil}, {20, inactive, nil}}},

	{"InferencecacheLookupLatencyHigh", "p99 at 25 ms", `
		inferencecache_lookup_route_latency_seconds_bucket{model="m", le="0.001"} 0x30
		inferencecache_lookup_route_latency_seconds_bucket{model="m", le="0.01"} 0x30
		inferencecache_lookup_route_latency_seconds_bucket{model="m", le="0.025"} 0+100x30
		inferencecache_lookup_route_latency_seconds_bucket{model="m", le="+Inf"} 0+100x30`,
		[]at{{10, pending, nil}, {11.5, firing, nil}}},
	{"InferencecacheLookupLatencyHigh", "p99 under 1 ms", `
		inferencecache_lookup_route_latency_seconds_bucket{model="m", le="0.001"} 0+100x30
		inferencecache_lookup_route_latency_seconds_bucket{model="m", le="0.01"} 0+100x30
		inferencecache_lookup_route_latency_seconds_bucket{model="m", le="0.025"} 0+100x30
		inferencecache_lookup_route_latency_seconds_bucket{model="m", le="+Inf"} 0+100x30`,
		[]at{{5, inactive, nil}, {20, inactive, nil}}},

	{"InferencecacheIndexAtCapacity", "evicting at the cap", `
		inferencecache_index_evictions_total{namespace="ics", algorithm="lru", reason="cap"} 0+10x60`,
		[]at{{29, pending, nil}, {31.5, firing, map[string]string{"namespace": "ics"}}}},
	{"InferencecacheIndexAtCapacity", "only TTL evictions", `
		inferencecache_index_evictions_total{namespace="ics", algorithm="lru", reason="cap"} 7x60
		inferencecache_index_evictions_total{namespace="ics", algorithm="lru", reason="ttl"} 0+10x60`,
		[]at{{10, inactive, nil}, {45, inactive, nil}}},

	{"InferencecacheRecoveredPanics", "one panic", `
		inferencecache_recovered_panics_total{namespace="ics", listener="grpc"} 0 0 1x20`,
		[]at{{1, inactive, nil}, {2, firing, map[string]string{"listener": "grpc"}}, {15, inactive, nil}}},
	{"InferencecacheRecoveredPanics", "no panic", `
		inferencecache_recovered_panics_total{namespace="ics", listener="grpc"} 0x20`,
		[]at{{10, inactive, nil}}},

	{"InferencecachePolicyPushForbidden", "an intruder pushes", `
		inferencecache_policy_auth_total{namespace="ics", result="ok"} 0+2x20
		inferencecache_policy_auth_total{namespace="ics", result="forbidden"} 0 0 0 1x20`,
		[]at{{2, inactive, nil}, {3, firing, nil}, {12, inactive, nil}}},
	{"InferencecachePolicyPushForbidden", "only the controller pushes", `
		inferencecache_policy_auth_total{namespace="ics", result="ok"} 0+2x20`,
		[]at{{10, inactive, nil}}},

	// The auth counters have no series for a result until it happens once:
	// a controller whose token never passed has no result="ok" series.
	{"InferencecachePolicyAuthFailing", "unauth from the start, no ok series", `
		inferencecache_policy_auth_total{namespace="ics", result="unauth"} 0+2x30`,
		[]at{{9, pending, nil}, {11, firing, map[string]string{"result": "unauth"}}}},
	{"InferencecachePolicyAuthFailing", "ok stopped, unauth since", `
		inferencecache_policy_auth_total{namespace="ics", result="ok"} 0+2x10 20x30
		inferencecache_policy_auth_total{namespace="ics", result="unauth"} 0x10 0+2x30`,
		[]at{{15, inactive, nil}, {25, pending, nil}, {31, firing, nil}}},
	{"InferencecachePolicyAuthFailing", "some unauth, pushes still pass", `
		inferencecache_policy_auth_total{namespace="ics", result="ok"} 0+2x30
		inferencecache_policy_auth_total{namespace="ics", result="unauth"} 0+1x30`,
		[]at{{5, inactive, nil}, {25, inactive, nil}}},
	{"InferencecacheSnapshotAuthFailing", "TokenReview errors, no ok series", `
		inferencecache_snapshot_auth_total{namespace="ics", result="error"} 0+2x30`,
		[]at{{9, pending, nil}, {11, firing, map[string]string{"result": "error"}}}},
	{"InferencecacheSnapshotAuthFailing", "polls pass", `
		inferencecache_snapshot_auth_total{namespace="ics", result="ok"} 0+2x30
		inferencecache_snapshot_auth_total{namespace="ics", result="error"} 0+1x30`,
		[]at{{25, inactive, nil}}},
	{"InferencecacheProbeAuthFailing", "wrong audience, no ok series", `
		inferencecache_probe_auth_total{namespace="ics", result="unauth"} 0+2x30`,
		[]at{{9, pending, nil}, {11, firing, nil}}},
	{"InferencecacheProbeAuthFailing", "probes pass", `
		inferencecache_probe_auth_total{namespace="ics", result="ok"} 0+2x30`,
		[]at{{25, inactive, nil}}},

	{"InferencecacheBusDisconnected", "lost NATS", `
		inferencecache_bus_connected{namespace="ics", pod="s-0"} 1 1 0x20`,
		[]at{{6, pending, nil}, {7.5, firing, map[string]string{"pod": "s-0"}}}},
	{"InferencecacheBusDisconnected", "connected", `
		inferencecache_bus_connected{namespace="ics", pod="s-0"} 1x20`,
		[]at{{10, inactive, nil}}},
	{"InferencecacheBusStale", "behind the stream", `
		inferencecache_bus_consumer_stale_seconds{namespace="ics", pod="s-0"} 0+60x30`,
		[]at{{9, pending, nil}, {11, firing, nil}}},
	{"InferencecacheBusStale", "current", `
		inferencecache_bus_consumer_stale_seconds{namespace="ics", pod="s-0"} 0x30`,
		[]at{{20, inactive, nil}}},

	// Controller group.
	{"InferencecacheControllerDown", "no controller target", `
		up{job="inferencecache-server-metrics", namespace="ics", pod="s-0"} 1x20`,
		[]at{{4, pending, nil}, {5, firing, nil}}},
	{"InferencecacheControllerDown", "controller replicas cannot be scraped", `
		up{job="inferencecache-controller-metrics", namespace="ics", pod="c-0"} 0x20
		up{job="inferencecache-controller-metrics", namespace="ics", pod="c-1"} 0x20`,
		[]at{{4, pending, nil}, {6, firing, nil}}},
	{"InferencecacheControllerDown", "one replica up", `
		up{job="inferencecache-controller-metrics", namespace="ics", pod="c-0"} 0x20
		up{job="inferencecache-controller-metrics", namespace="ics", pod="c-1"} 1x20`,
		[]at{{0, inactive, nil}, {15, inactive, nil}}},

	{"InferencecacheControllerNoLeader", "leader lost its lease", `
		up{job="inferencecache-controller-metrics", namespace="ics", pod="c-0"} 1x20
		leader_election_master_status{job="inferencecache-controller-metrics", namespace="ics", pod="c-0", name="inferencecache-controller.inferencecache.io"} 1 1 0x20`,
		[]at{{6, pending, nil}, {7.5, firing, map[string]string{"namespace": "ics"}}}},
	// A standby that never led exports no leader_election_master_status
	// series; after the leader's pod is gone nothing reports 1.
	{"InferencecacheControllerNoLeader", "only standbys left, none acquires", `
		up{job="inferencecache-controller-metrics", namespace="ics", pod="c-0"} 1x20
		up{job="inferencecache-controller-metrics", namespace="ics", pod="c-1"} 1 1 _x20
		leader_election_master_status{job="inferencecache-controller-metrics", namespace="ics", pod="c-1", name="inferencecache-controller.inferencecache.io"} 1 1 _x20`,
		[]at{{7, pending, nil}, {14, firing, nil}}},
	{"InferencecacheControllerNoLeader", "a leader and a standby", `
		up{job="inferencecache-controller-metrics", namespace="ics", pod="c-0"} 1x20
		up{job="inferencecache-controller-metrics", namespace="ics", pod="c-1"} 1x20
		leader_election_master_status{job="inferencecache-controller-metrics", namespace="ics", pod="c-1", name="inferencecache-controller.inferencecache.io"} 1x20`,
		[]at{{0, inactive, nil}, {15, inactive, nil}}},

	{"ServerProbeFail", "ingest stage fails", `
		inferencecache_backend_probe_result_total{namespace="ics", backend="team-a/cb", stage="ingest", result="failed"} 0+2x30
		inferencecache_backend_probe_result_total{namespace="ics", backend="team-a/cb", stage="ingest", result="ok"} 5x30`,
		[]at{{9, pending, nil}, {11.5, firing, map[string]string{"backend": "team-a/cb", "stage": "ingest"}}}},
	{"ServerProbeFail", "probes pass", `
		inferencecache_backend_probe_result_total{namespace="ics", backend="team-a/cb", stage="ingest", result="failed"} 3x30
		inferencecache_backend_probe_result_total{namespace="ics", backend="team-a/cb", stage="ingest", result="ok"} 0+2x30`,
		[]at{{25, inactive, nil}}},

	{"InferencecacheT2Degraded", "queried, no hits", `
		inferencecache_backend_t2_hit_rate{namespace="ics", backend="team-a/cb"} 0x40
		inferencecache_backend_t2_query_tokens_total{namespace="ics", backend="team-a/cb"} 0+120000x40`,
		[]at{{4, inactive, nil}, {14, pending, nil}, {20.5, firing, map[string]string{"backend": "team-a/cb"}}}},
	{"InferencecacheT2Degraded", "hit rate 0 but idle", `
		inferencecache_backend_t2_hit_rate{namespace="ics", backend="team-a/cb"} 0x40
		inferencecache_backend_t2_query_tokens_total{namespace="ics", backend="team-a/cb"} 0+600x40`,
		[]at{{30, inactive, nil}}},
	{"InferencecacheT2Degraded", "queried, hitting", `
		inferencecache_backend_t2_hit_rate{namespace="ics", backend="team-a/cb"} 0.4x40
		inferencecache_backend_t2_query_tokens_total{namespace="ics", backend="team-a/cb"} 0+120000x40`,
		[]at{{30, inactive, nil}}},

	{"InferencecacheServerRestartCascades", "five cascades in an hour", `
		inferencecache_backend_server_restart_cascades_total{namespace="ics", backend="team-a/cb", reason="server-replaced", pod="c-0"} 0+1x10`,
		[]at{{3, inactive, nil}, {5, firing, map[string]string{"backend": "team-a/cb"}}}},
	{"InferencecacheServerRestartCascades", "two cascades", `
		inferencecache_backend_server_restart_cascades_total{namespace="ics", backend="team-a/cb", reason="server-replaced", pod="c-0"} 0 1 2x30`,
		[]at{{20, inactive, nil}}},

	// controller-runtime initializes every result of reconcile_total to 0 at
	// start, and a pass that returns RequeueAfter (every successful pass of
	// both controllers) counts as result="requeue_after", never "success".
	{"InferencecachePolicyPushFailing", "every pass fails", `
		controller_runtime_reconcile_errors_total{namespace="ics", controller="policy-propagation", pod="c-0"} 0+2x40
		controller_runtime_reconcile_total{namespace="ics", controller="policy-propagation", pod="c-0", result="error"} 0+2x40
		controller_runtime_reconcile_total{namespace="ics", controller="policy-propagation", pod="c-0", result="success"} 0x40
		controller_runtime_reconcile_total{namespace="ics", controller="policy-propagation", pod="c-0", result="requeue_after"} 3x40`,
		[]at{{14, pending, nil}, {16.5, firing, map[string]string{"namespace": "ics"}}}},
	{"InferencecachePolicyPushFailing", "some passes fail, most succeed", `
		controller_runtime_reconcile_errors_total{namespace="ics", controller="policy-propagation", pod="c-0"} 0+1x40
		controller_runtime_reconcile_total{namespace="ics", controller="policy-propagation", pod="c-0", result="error"} 0+1x40
		controller_runtime_reconcile_total{namespace="ics", controller="policy-propagation", pod="c-0", result="success"} 0x40
		controller_runtime_reconcile_total{namespace="ics", controller="policy-propagation", pod="c-0", result="requeue_after"} 0+2x40`,
		[]at{{5, inactive, nil}, {30, inactive, nil}}},
	{"InferencecacheSnapshotPollFailing", "every poll fails", `
		controller_runtime_reconcile_errors_total{namespace="ics", controller="cache-snapshot", pod="c-0"} 0+2x40
		controller_runtime_reconcile_total{namespace="ics", controller="cache-snapshot", pod="c-0", result="error"} 0+2x40
		controller_runtime_reconcile_total{namespace="ics", controller="cache-snapshot", pod="c-0", result="success"} 0x40
		controller_runtime_reconcile_total{namespace="ics", controller="cache-snapshot", pod="c-0", result="requeue_after"} 3x40`,
		[]at{{14, pending, nil}, {16.5, firing, nil}}},
	{"InferencecacheSnapshotPollFailing", "some polls fail, most succeed", `
		controller_runtime_reconcile_errors_total{namespace="ics", controller="cache-snapshot", pod="c-0"} 0+1x40
		controller_runtime_reconcile_total{namespace="ics", controller="cache-snapshot", pod="c-0", result="error"} 0+1x40
		controller_runtime_reconcile_total{namespace="ics", controller="cache-snapshot", pod="c-0", result="success"} 0x40
		controller_runtime_reconcile_total{namespace="ics", controller="cache-snapshot", pod="c-0", result="requeue_after"} 0+2x40`,
		[]at{{5, inactive, nil}, {30, inactive, nil}}},

	// Webhooks, from the kube-apiserver's admission metrics (the controller's
	// own controller_runtime_webhook_requests_total answers 200 whatever the
	// handler decided; see TestWebhookRequestCodeIsAlways200).
	{"InferencecacheWebhookUnreachable", "apiserver cannot call the CachePolicy webhook", `
		apiserver_admission_webhook_rejection_count{job="apiserver", name="vcachepolicy.inferencecache.io", type="validating", operation="CREATE", error_type="calling_webhook_error", rejection_code="0"} 0+1x20
		apiserver_admission_webhook_rejection_count{job="apiserver", name="vcachepolicy.inferencecache.io", type="validating", operation="CREATE", error_type="no_error", rejection_code="422"} 0+1x20`,
		[]at{{0.5, inactive, nil}, {5.5, pending, map[string]string{"name": "vcachepolicy.inferencecache.io"}}, {6.5, firing, nil}}},
	{"InferencecacheWebhookUnreachable", "webhook refuses invalid objects only", `
		apiserver_admission_webhook_rejection_count{job="apiserver", name="vcachepolicy.inferencecache.io", type="validating", operation="CREATE", error_type="no_error", rejection_code="422"} 0+1x20
		apiserver_admission_webhook_rejection_count{job="apiserver", name="vother.example.com", type="validating", operation="CREATE", error_type="calling_webhook_error", rejection_code="0"} 0+1x20`,
		[]at{{15, inactive, nil}}},
	{"InferencecachePodInjectionFailingOpen", "pods admitted uninjected", `
		apiserver_admission_webhook_fail_open_count{job="apiserver", name="mpod.inferencecache.io", type="admit"} 0 0+1x20`,
		[]at{{6.5, pending, nil}, {7.5, firing, map[string]string{"name": "mpod.inferencecache.io"}}}},
	{"InferencecachePodInjectionFailingOpen", "injection answers", `
		apiserver_admission_webhook_fail_open_count{job="apiserver", name="mpod.inferencecache.io", type="admit"} 2x20
		apiserver_admission_webhook_fail_open_count{job="apiserver", name="mother.example.com", type="admit"} 0+1x20`,
		[]at{{15, inactive, nil}}},
}

// alertRules parses every alert of the file into a Prometheus alerting rule
// factory (a rule keeps state, so each scenario gets a fresh one).
func alertRules(t *testing.T) map[string]func() *rules.AlertingRule {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	out := map[string]func() *rules.AlertingRule{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			expr, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Fatalf("%s: %v", r.Alert, err)
			}
			out[r.Alert] = func() *rules.AlertingRule {
				return rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), time.Duration(r.KeepFiringFor),
					labels.FromMap(r.Labels), labels.FromMap(r.Annotations), labels.EmptyLabels(), "", true,
					slog.New(slog.DiscardHandler))
			}
		}
	}
	return out
}

// TestAlertScenarios evaluates every alert over synthetic series with
// Prometheus's own engine and rule state machine (pending for `for:`, then
// firing), and checks that every rule is covered: a firing scenario, an
// inactive one, and, with a `for:`, a pending one.
func TestAlertScenarios(t *testing.T) {
	factories := alertRules(t)
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, promqltest.DefaultMaxSamplesPerQuery)
	start := time.Unix(0, 0).UTC()

	seen := map[string]map[rules.AlertState]bool{}
	for _, sc := range scenarios {
		t.Run(sc.Alert+"/"+sc.Name, func(t *testing.T) {
			mk, ok := factories[sc.Alert]
			if !ok {
				t.Fatalf("no alert %s in %s", sc.Alert, rulesFile)
			}
			rule := mk()
			storage := promqltest.LoadedStorage(t, loadCommand(sc.Series))
			query := rules.EngineQueryFunc(engine, storage)
			want := slices.Clone(sc.Want)
			slices.SortFunc(want, func(a, b at) int { return int(a.Min*60 - b.Min*60) })
			end := time.Duration(want[len(want)-1].Min * float64(time.Minute))
			next := 0
			for ts := time.Duration(0); ts <= end; ts += evalInterval {
				if _, err := rule.Eval(context.Background(), 0, start.Add(ts), query, nil, 0); err != nil {
					t.Fatalf("eval at %v: %v", ts, err)
				}
				for next < len(want) && time.Duration(want[next].Min*float64(time.Minute)) == ts {
					checkState(t, rule, want[next])
					if seen[sc.Alert] == nil {
						seen[sc.Alert] = map[rules.AlertState]bool{}
					}
					seen[sc.Alert][want[next].State] = true
					next++
				}
			}
			if next != len(want) {
				t.Fatalf("expectation at minute %v is not on the %v evaluation grid", want[next].Min, evalInterval)
			}
		})
	}

	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			need := []rules.AlertState{firing, inactive}
			if r.For > 0 {
				need = append(need, pending)
			}
			for _, st := range need {
				if !seen[r.Alert][st] {
					t.Errorf("%s: no scenario shows it %s", r.Alert, st)
				}
			}
		}
	}
}

func checkState(t *testing.T, rule *rules.AlertingRule, w at) {
	t.Helper()
	active := rule.ActiveAlerts()
	got := rules.StateInactive
	for _, a := range active {
		got = max(got, a.State)
	}
	if got != w.State {
		t.Errorf("minute %v: %s, want %s; active: %s", w.Min, got, w.State, describe(active))
		return
	}
	if w.Labels != nil && !slices.ContainsFunc(active, func(a *rules.Alert) bool {
		m := a.Labels.Map()
		for k, v := range w.Labels {
			if m[k] != v {
				return false
			}
		}
		return true
	}) {
		t.Errorf("minute %v: no active alert with labels %v; active: %s", w.Min, w.Labels, describe(active))
	}
	for _, a := range active {
		a.Annotations.Range(func(l labels.Label) {
			if strings.Contains(l.Value, "error expanding template") || strings.Contains(l.Value, "<no value>") {
				t.Errorf("minute %v: annotation %s renders as %q", w.Min, l.Name, l.Value)
			}
		})
	}
}

func describe(alerts []*rules.Alert) string {
	if len(alerts) == 0 {
		return "none"
	}
	var parts []string
	for _, a := range alerts {
		parts = append(parts, fmt.Sprintf("%s %v=%g", a.State, a.Labels.Map(), a.Value))
	}
	return strings.Join(parts, "; ")
}

// loadCommand turns a scenario's series, one a line, into a promqltest load
// command at one sample a minute.
func loadCommand(series string) string {
	var b strings.Builder
	b.WriteString("load 1m\n")
	for line := range strings.SplitSeq(series, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			b.WriteString("  " + line + "\n")
		}
	}
	return b.String()
}
