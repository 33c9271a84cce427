package main

import (
	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// ctl selects the controller replicas; srvOfCtl the servers in the same
// namespace (the install's), which receive the controller's pushes.
const (
	ctl      scope = `job=~"$job", namespace=~"$namespace"`
	srvOfCtl scope = `job=~"$server_job", namespace=~"$namespace"`
)

// ourWebhooks selects the kube-apiserver's series of this project's
// admission webhooks (mpod, vcachepolicy, ... .inferencecache.io).
const ourWebhooks = `name=~".+\\.inferencecache\\.io"`

const (
	reconciles      = "controller_runtime_reconcile_total"
	reconcileErrors = "controller_runtime_reconcile_errors_total"
	probeResults    = "inferencecache_backend_probe_result_total"
	policyPushes    = "inferencecache_policy_auth_total"
	webhookBuckets  = "controller_runtime_webhook_latency_seconds_bucket"
	admitBuckets    = "apiserver_admission_webhook_admission_duration_seconds_bucket"
)

// webhookLatencyThreshold: the pod webhook's timeoutSeconds is 5, after
// which the apiserver admits the pod uninjected (it fails open).
var webhookLatencyThreshold = []step{{0, "green"}, {1, "yellow"}, {5, "red"}}

func controllerVars() []cog.Builder[dashboard.VariableModel] {
	return []cog.Builder[dashboard.VariableModel]{
		// One job, no "All": controller_runtime_*, workqueue_*, up and
		// leader_election_* come from every controller-runtime operator
		// and every target; the job pins them to this controller.
		queryVar("job", "Controller job", `label_values(controller_runtime_reconcile_total{controller="policy-propagation"}, job)`, false),
		queryVar("namespace", "Namespace", `label_values(controller_runtime_reconcile_total{controller="policy-propagation", job=~"$job"}, namespace)`, true),
		queryVar("server_job", "Server job", `label_values(inferencecache_server_up{namespace=~"$namespace"}, job)`, true),
	}
}

func controllerBoard() board {
	return board{
		UID:   "inferencecache-controller",
		Title: "inferencecache / Controller",
		Desc:  "The operator: reconciles per controller, policy propagation to every server pod, CacheBackend health and the admission webhooks.",
		Vars:  controllerVars(),
		Rows: []row{
			{"Overview", []panel{
				{Title: "Controller replicas up", Unit: "none", Stat: true, Steps: oneIsGood,
					Desc:    "Controller pods Prometheus scrapes successfully. InferencecacheControllerDown fires when none is for 5 minutes.",
					Queries: []query{{sumBy("", ctl.of("up")), ""}}},
				{Title: "Leader", Unit: "none", Stat: true, Steps: oneIsGood,
					Desc:    "1 while a replica holds the leader Lease (only the leader reconciles). 0 with replicas up is InferencecacheControllerNoLeader.",
					Queries: []query{{maxBy("", ctl.of("leader_election_master_status")), ""}}},
				{Title: "Reconciles/s", Unit: "ops", Stat: true,
					Desc:    "Reconciles per second over every controller.",
					Queries: []query{{sumBy("", rate(ctl.of(reconciles))), ""}}},
				{Title: "Reconcile errors/s", Unit: "ops", Stat: true, Steps: []step{{0, "green"}, {1e-9, "yellow"}},
					Desc:    "Reconciles that returned an error (retried with backoff). A transient one is normal; a steady rate on policy-propagation is InferencecachePolicyPushFailing.",
					Queries: []query{{sumBy("", rate(ctl.of(reconcileErrors))), ""}}},
				{Title: "Policy pushes accepted/s", Unit: "ops", Stat: true,
					Desc:    "/policy requests the servers accepted (result=\"ok\"), over every server pod.",
					Queries: []query{{sumBy("", rate(srvOfCtl.of(policyPushes, `result="ok"`))), ""}}},
				{Title: "Probe failures", Unit: "none", Stat: true, Steps: zeroIsGood,
					Desc:    "Failed functional probe stages in the dashboard's time range (FunctionalProbeOK=False; ServerProbeFail).",
					Queries: []query{{sumBy("", "increase("+ctl.of(probeResults, `result="failed"`)+"[$__range])"), ""}}},
			}},
			{"Reconciles", []panel{
				{Title: "Reconciles/s by controller and result", Unit: "ops", Stack: true,
					Desc:    "policy-propagation, cache-snapshot, cachebackend, prompttemplate; result success, requeue, requeue_after or error.",
					Queries: []query{{sumBy("controller, result", rate(ctl.of(reconciles))), "{{controller}} {{result}}"}}},
				{Title: "Reconcile errors/s by controller", Unit: "ops", Steps: zeroIsGood,
					Desc:    "Errors returned by each controller's reconciles.",
					Queries: []query{{sumBy("controller", rate(ctl.of(reconcileErrors))), "{{controller}}"}}},
				{Title: "Reconcile duration by controller", Unit: "s",
					Desc: "How long one reconcile takes (a policy push waits for every server pod to answer).",
					Queries: []query{
						{quantile("0.5", "controller", ctl.of("controller_runtime_reconcile_time_seconds_bucket")), "{{controller}} p50"},
						{quantile("0.99", "controller", ctl.of("controller_runtime_reconcile_time_seconds_bucket")), "{{controller}} p99"},
					}},
				{Title: "Work queue depth", Unit: "short", W: 6,
					Desc:    "Items waiting in each controller's work queue.",
					Queries: []query{{maxBy("name", ctl.of("workqueue_depth")), "{{name}}"}}},
				{Title: "Work queue wait", Unit: "s", W: 6,
					Desc:    "How long an item waits in the queue before a worker takes it (p99).",
					Queries: []query{{quantile("0.99", "name", ctl.of("workqueue_queue_duration_seconds_bucket")), "{{name}}"}}},
			}},
			{"Policy propagation", []panel{
				{Title: "Policy pushes (controller)", Unit: "ops",
					Desc: "The policy-propagation controller's reconciles by result: each one pushes the resolved CachePolicy and CacheTenant snapshot to every server pod, and errors when one of them did not take it.",
					Queries: []query{
						{sumBy("result", rate(ctl.of(reconciles, `controller="policy-propagation"`))), "{{result}}"},
						{sumBy("", rate(ctl.of(reconcileErrors, `controller="policy-propagation"`))), "errors"},
					}},
				{Title: "Policy pushes accepted per server pod", Unit: "ops",
					Desc:    "/policy requests each server pod accepted. Every pod should show the push rate (one per --push-interval, 30 s by default); a pod at 0 while others are not is not getting policy (see the CachePolicy status' per-server propagation).",
					Queries: []query{{sumBy("pod", rate(srvOfCtl.of(policyPushes, `result="ok"`))), "{{pod}}"}}},
				{Title: "Policy pushes refused per server pod", Unit: "ops", Steps: zeroIsGood,
					Desc:    "/policy requests a server pod refused, by result: unauth (token or audience rejected), forbidden (not the controller's ServiceAccount: InferencecachePolicyPushForbidden), error (TokenReview failed).",
					Queries: []query{{sumBy("pod, result", rate(srvOfCtl.of(policyPushes, `result!="ok"`))), "{{pod}} {{result}}"}}},
				{Title: "Snapshot polls per server pod", Unit: "ops",
					Desc:    "/snapshot requests of the cache-snapshot poller (the CacheIndex status), by server pod and auth result.",
					Queries: []query{{sumBy("pod, result", rate(srvOfCtl.of("inferencecache_snapshot_auth_total"))), "{{pod}} {{result}}"}}},
			}},
			{"CacheBackends", []panel{
				{Title: "Functional probe failures by backend and stage", Unit: "short", Steps: zeroIsGood,
					Desc:    "Failed /probe stages (ingest, routing, t2) per rate window: what sets a CacheBackend's FunctionalProbeOK condition to False.",
					Queries: []query{{sumBy("backend, stage", increase(ctl.of(probeResults, `result="failed"`))), "{{backend}} {{stage}}"}}},
				{Title: "Probe outcomes", Unit: "ops", Stack: true,
					Desc:    "Per-stage probe outcomes per second: ok, failed, skipped (three per answered /probe call).",
					Queries: []query{{sumBy("result", rate(ctl.of(probeResults))), "{{result}}"}}},
				{Title: "Tier-2 hit rate by backend", Unit: "percentunit", Max: ratioMax(),
					Desc:    "Query-weighted tier-2 reload hit rate. 0 while the tier is queried (next panel) is the T2Degraded condition and InferencecacheT2Degraded.",
					Queries: []query{{maxBy("backend", ctl.of("inferencecache_backend_t2_hit_rate")), "{{backend}}"}}},
				{Title: "Tier-2 query tokens/s by backend", Unit: "short",
					Desc:    "Tier-2 query tokens per second: tells an actively queried backend from an idle one.",
					Queries: []query{{sumBy("backend", rate(ctl.of("inferencecache_backend_t2_query_tokens_total"))), "{{backend}}"}}},
				{Title: "Server restart cascades", Unit: "short",
					Desc:    "Restart-cascade decisions after a cache-server pod was replaced (engines rolled to reconnect), per rate window; at most one per backend every ~30 s.",
					Queries: []query{{sumBy("backend", increase(ctl.of("inferencecache_backend_server_restart_cascades_total"))), "{{backend}}"}}},
				{Title: "CacheBackend reconciles", Unit: "ops",
					Desc: "The cachebackend controller's reconciles by result and its errors: provisioning failures (Ready, Progressing, Degraded) surface here first.",
					Queries: []query{
						{sumBy("result", rate(ctl.of(reconciles, `controller="cachebackend"`))), "{{result}}"},
						{sumBy("", rate(ctl.of(reconcileErrors, `controller="cachebackend"`))), "errors"},
					}},
			}},
			{"Admission webhooks", []panel{
				{Title: "Webhook latency (controller)", Unit: "s", Steps: webhookLatencyThreshold,
					Desc: "Time the controller's webhook server takes per admission request, by webhook path. The pod webhook times out after 5 s and then fails open.",
					Queries: []query{
						{quantile("0.5", "webhook", ctl.of(webhookBuckets)), "{{webhook}} p50"},
						{quantile("0.99", "webhook", ctl.of(webhookBuckets)), "{{webhook}} p99"},
					}},
				{Title: "Webhook requests/s (controller)", Unit: "reqps", Stack: true,
					Desc:    "Admission requests per webhook path and HTTP code. An admission webhook answers 200 even for a denial or a handler error, so failures show on the apiserver's side (next panels).",
					Queries: []query{{sumBy("webhook, code", rate(ctl.of("controller_runtime_webhook_requests_total"))), "{{webhook}} {{code}}"}}},
				{Title: "Admission latency seen by the kube-apiserver", Unit: "s", Steps: webhookLatencyThreshold,
					Desc:    "The kube-apiserver's p99 per webhook, network and TLS included (needs the apiserver scraped, as kube-prometheus-stack does).",
					Queries: []query{{quantile("0.99", "name, type", admitBuckets+"{"+ourWebhooks+"}"), "{{name}} ({{type}})"}}},
				{Title: "Webhook rejections and fail-opens (kube-apiserver)", Unit: "reqps", Steps: zeroIsGood,
					Desc: "Requests the apiserver rejected because of a webhook, by error type (calling_webhook_error, apiserver_internal_error: InferencecacheWebhookUnreachable), and pods admitted uninjected because the pod webhook failed open.",
					Queries: []query{
						{sumBy("name, error_type", rate(`apiserver_admission_webhook_rejection_count{`+ourWebhooks+`}`)), "{{name}} rejected: {{error_type}}"},
						{sumBy("name", rate(`apiserver_admission_webhook_fail_open_count{`+ourWebhooks+`}`)), "{{name}} failed open"},
					}},
			}},
		},
	}
}
