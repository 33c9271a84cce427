package doctor

// Code documents one finding code. Codes are stable: a code never changes
// meaning and is never reused, so CI jobs and runbooks may grep for them.
// IC1xx are the server's data plane (gRPC and the :8081 control endpoints),
// IC2xx the cluster (API, CRDs, custom resources, engine pods).
type Code struct {
	ID    string
	Title string // short check name, shown in every output format
	// Meaning says what a non-OK finding with this code tells; Fix what to
	// do about it.
	Meaning, Fix string
}

// Finding codes.
const (
	CodeGRPCHealth       = "IC100"
	CodeGRPCUnreachable  = "IC101"
	CodeSnapshot         = "IC110"
	CodeControlDown      = "IC111"
	CodeTokenRejected    = "IC112"
	CodeWrongIdentity    = "IC113"
	CodeReviewFailed     = "IC114"
	CodeTokenFile        = "IC115"
	CodeControlStatus    = "IC116"
	CodeNoAuth           = "IC119"
	CodePolicyEndpoint   = "IC120"
	CodeProbeEndpoint    = "IC130"
	CodeClusterAPI       = "IC200"
	CodeCRDs             = "IC201"
	CodeForbidden        = "IC202"
	CodeStaleCondition   = "IC203"
	CodeBackendReady     = "IC210"
	CodeBackendCondition = "IC211"
	CodeBackendStale     = "IC212"
	CodeEnginePods       = "IC220"
	CodeEmptySelector    = "IC221"
	CodeParticipation    = "IC230"
	CodeInjection        = "IC231"
	CodeOrphanPod        = "IC240"
	CodeTenantQuota      = "IC250"
	CodeTenantNotReady   = "IC251"
	CodePolicyCoverage   = "IC260"
	CodePolicyAccepted   = "IC261"
	CodePolicyPropagated = "IC262"
	CodeCacheIndex       = "IC270"
	CodeCacheIndexDrift  = "IC271"
	CodeControllerDeploy = "IC280"
	CodeLeaderLease      = "IC281"
	CodeWebhookCABundle  = "IC282"
	CodeWebhookEndpoints = "IC283"
)

// allCodes is every code the doctor emits, in code order. README.md lists the
// same table (a test keeps them in step).
var allCodes = []Code{
	{CodeGRPCHealth, "grpc-health",
		"The server's grpc.health.v1 Check (service \"\") did not answer SERVING: it is starting (index not ready, NATS replay), draining after SIGTERM, or the address is not an inferencecache server.",
		"Wait for /readyz on the public port; check the server logs for a drain or a failed start; make sure --grpc-addr names the server's gRPC port (default :9090)."},
	{CodeGRPCUnreachable, "grpc-reachable",
		"The gRPC port could not be reached within the timeout (connection refused, DNS, TLS mismatch or a NetworkPolicy).",
		"Check --grpc-addr, the server Service and pods, and whether the server runs with TLS (--grpc-tls, --grpc-ca-file)."},
	{CodeSnapshot, "snapshot",
		"GET /snapshot did not return a decodable index snapshot; the controller cannot project CacheIndex, tenant entries or index participation.",
		"Read the message: a decode error points at a server/controller version skew; other failures have their own code (IC111-IC116)."},
	{CodeControlDown, "control-reachable",
		"The control port (:8081) did not answer: wrong --control-url, server down, or a NetworkPolicy that only admits the controller.",
		"Check --control-url; run the doctor from the controller's namespace (kubectl exec into the controller pod) or port-forward :8081."},
	{CodeTokenRejected, "control-token",
		"The control endpoint answered 401: the bearer token is missing, expired or minted for the wrong audience (/snapshot and /probe need inferencecache.io/controller, /policy needs inferencecache.io/policy).",
		"Mint tokens with the right audience: kubectl create token inferencecache-controller -n inferencecache-system --audience inferencecache.io/controller (and --audience inferencecache.io/policy for --policy-token-path)."},
	{CodeWrongIdentity, "control-identity",
		"The control endpoint answered 403: the token is valid but belongs to another ServiceAccount than the server's --allowed-controller-sa.",
		"Use a token of the controller's ServiceAccount, or fix --allowed-controller-sa on the server to name it."},
	{CodeReviewFailed, "control-tokenreview",
		"The control endpoint answered 503: the server could not run its TokenReview against the kube-apiserver and fails closed.",
		"Check that the server's ServiceAccount may create tokenreviews (ClusterRole system:auth-delegator) and that the apiserver is reachable from the server pod."},
	{CodeTokenFile, "token-file",
		"A token file given by --controller-token-path or --policy-token-path cannot be read or is empty, so the endpoints behind it were not called.",
		"Point the flag at a readable token file, or pass an empty path to send no token (only for a server run with --insecure-disable-auth)."},
	{CodeControlStatus, "control-status",
		"The control endpoint answered an unexpected HTTP status.",
		"Compare the server and doctor versions; read the server logs for the request."},
	{CodeNoAuth, "control-auth",
		"GET /snapshot succeeded without any token: the server runs with --insecure-disable-auth, so anyone who reaches :8081 can read the index and push policy.",
		"Drop --insecure-disable-auth and set --allowed-controller-sa outside development."},
	{CodePolicyEndpoint, "policy-endpoint",
		"Reachability of /policy with the policy-audience token (checked read-only with GET, which must answer 405 after auth passed).",
		"See the accompanying IC111-IC116 finding."},
	{CodeProbeEndpoint, "probe-endpoint",
		"Reachability of /probe with the controller-audience token (checked read-only with GET, which must answer 405 after auth passed).",
		"See the accompanying IC111-IC116 finding."},
	{CodeClusterAPI, "cluster-api",
		"The kube-apiserver could not be reached or no client configuration was found (kubeconfig or in-cluster).",
		"Pass --kubeconfig/--context, or run inside the cluster; --skip-cluster runs the data-plane checks alone."},
	{CodeCRDs, "crds",
		"An inferencecache.io CRD is not installed, so the operator cannot serve that kind.",
		"Install the CRDs: kubectl apply -k operator/config/crd."},
	{CodeForbidden, "rbac",
		"The doctor's identity may not list a resource, so the checks that need it were skipped.",
		"Run with an identity that may get/list the inferencecache.io kinds and pods (e.g. the view ClusterRole plus the CRDs' aggregate roles)."},
	{CodeStaleCondition, "stale-condition",
		"A status condition's observedGeneration (or, when the condition carries none, status.observedGeneration) is older than metadata.generation: it judged an earlier spec, so the doctor reports it as stale instead of taking it as the object's state.",
		"Wait for the controller to reconcile the latest spec (seconds); if it persists, check the controller is running and leader-elected (IC280, IC281) and its logs for reconcile errors on the object."},
	{CodeBackendReady, "backend-ready",
		"A CacheBackend's Ready condition is False or Unknown (FAIL), or absent because the controller has not reconciled it yet (WARN).",
		"kubectl describe cachebackend NAME -n NS for the reason and Events; check the controller is running."},
	{CodeBackendCondition, "backend-condition",
		"A CacheBackend reports a problem condition: Degraded or T2Degraded True, or FunctionalProbeOK, EngineKernelsHealthy or EngineCompatibility False.",
		"Read the condition's reason and message (kubectl describe cachebackend)."},
	{CodeBackendStale, "backend-status-stale",
		"A CacheBackend's status.observedGeneration is behind metadata.generation: the controller has not acted on the latest spec, so its conditions (listed) are stale and not judged.",
		"Check the controller is running and leader-elected, and its logs for reconcile errors on the backend."},
	{CodeEnginePods, "engine-pods",
		"The backend claims no pod: none in its namespace carries every label of spec.engineSelector.matchLabels (or an earlier backend by name claims them), nor, with allowCrossNamespace, one in a namespace that consents (inferencecache.io/allow-claims-from), so no engine is wired to the backend.",
		"Fix the selector or the engine pods' labels (kubectl get pods -n NS -l k=v); for pods of another namespace, annotate that Namespace with inferencecache.io/allow-claims-from naming the backend's namespace."},
	{CodeEmptySelector, "engine-selector",
		"The CacheBackend has no engineSelector.matchLabels; an empty selector claims no pod.",
		"Set spec.engineSelector.matchLabels to the engine pods' labels."},
	{CodeParticipation, "index-participation",
		"Engine pods the backend claims are missing from the server's index (/snapshot replicas; with --config-only, status.indexParticipation holds no prefix): the KV events of those pods do not reach the server. The message lists the missing pods.",
		"Check the engines publish KV events and the kvevent-subscriber forwards them to the server (its logs and metrics); the replica id must be the pod name and the tenant its namespace."},
	{CodeInjection, "engine-injection",
		"Engine pods the backend claims were admitted without its injection (no inferencecache.io/injected-by annotation, or one naming another backend): the pod webhook was unreachable and failed open, refused to inject (unknown engine, no engine container), or the pods predate the backend. They run without the kvevent-subscriber wiring.",
		"Check the webhook (IC282, IC283) and the pods' admission warnings, then restart the pods' workload (kubectl rollout restart) so they are admitted again."},
	{CodeOrphanPod, "orphan-pod",
		"A pod is annotated inferencecache.io/injected-by with a CacheBackend that no longer exists: it still runs the injected cache wiring.",
		"Restart the pod's workload (kubectl rollout restart) so it is admitted again without the stale injection, or recreate the backend."},
	{CodeTenantQuota, "tenant-quota",
		"A CacheTenant holds at least 90% of spec.quota.maxIndexEntries (WARN) or more than it, or QuotaExceeded is True (FAIL): ingest evicts the tenant's oldest prefixes.",
		"Raise spec.quota.maxIndexEntries or reduce the tenant's working set."},
	{CodeTenantNotReady, "tenant-ready",
		"A CacheTenant's Ready condition is False: another CacheTenant claims the same spec.tenantID, or the tenant is not the effective owner.",
		"Give each tenant id one CacheTenant (kubectl get cachetenants -A)."},
	{CodePolicyCoverage, "policy-coverage",
		"A namespace has CacheBackends or CacheTenants but no CachePolicy, so routing there runs on the server's defaults.",
		"Create a CachePolicy in the namespace (even an empty spec makes the defaults explicit)."},
	{CodePolicyAccepted, "policy-accepted",
		"A CachePolicy's Accepted condition is False (FAIL: invalid, or conflicted with another policy in the namespace) or absent (WARN: not reconciled yet).",
		"kubectl describe cachepolicy NAME -n NS; keep one CachePolicy per namespace and fix invalid fields."},
	{CodePolicyPropagated, "policy-propagated",
		"An accepted CachePolicy's Propagated condition is False: not every routing server acknowledged its generation.",
		"Read status.propagation for the failing server; check the server pods and the controller's policy token."},
	{CodeCacheIndex, "cacheindex",
		"The CacheIndex cluster-default is missing or has no status: the controller's /snapshot poll never succeeded (controller not running, or it cannot reach or authenticate to the server's :8081).",
		"Check the controller pod and its logs for snapshot errors; its --server-address and --controller-token-path must match the server."},
	{CodeCacheIndexDrift, "cacheindex-drift",
		"The CacheIndex the controller projected disagrees with the live /snapshot on which replicas report stats or which tenants hold entries, and has not changed for longer than a working poll allows: the controller's /snapshot poll is failing, or it polls another server than --control-url (CacheIndex names the one it reads). Assumes every server holds the same index (one server, or scale-out over NATS).",
		"Check the controller's logs for snapshot errors and its --server-address against the server the doctor reads; InferencecacheSnapshotPollFailing alerts on the same."},
	{CodeControllerDeploy, "controller-deployment",
		"The controller Deployment is missing, scaled to 0, or has fewer available replicas than desired: with none available no policy is pushed, status goes stale and the webhooks are down.",
		"kubectl -n NS describe deploy NAME and its pods (image pull, crash loop, scheduling); --controller-namespace and --controller-deployment name it."},
	{CodeLeaderLease, "leader-lease",
		"The controller's leader Lease is missing, held by nobody, or not renewed within twice its lease duration: no replica runs the controllers (propagation, snapshot poll, backend reconcile), while the webhooks may still answer.",
		"kubectl -n NS get lease NAME -o yaml; check the replicas' logs for leader-election errors (RBAC on coordination.k8s.io leases, apiserver reachability); --leader-election-id names it."},
	{CodeWebhookCABundle, "webhook-cabundle",
		"A webhook configuration is missing, or a webhook's clientConfig.caBundle is empty, holds no parsable PEM certificate, holds an expired one, or does not verify the certificate the webhook Service serves: the apiserver cannot call the webhook (validating: inferencecache.io writes are refused; pod injection: pods start uninjected).",
		"The controller writes the caBundles at start-up (--webhook-self-signed); restart it, or with cert-manager check the CA injector. --validating-webhook-config and --mutating-webhook-config name the configurations."},
	{CodeWebhookEndpoints, "webhook-endpoints",
		"The Service a webhook configuration calls is missing or its EndpointSlices list no ready endpoint: the apiserver cannot reach the webhook (validating: inferencecache.io writes are refused; pod injection: pods start uninjected).",
		"Check the controller pods are Ready (their readiness is the webhook server's) and that the Service's selector and targetPort match them: kubectl -n NS get endpointslices -l kubernetes.io/service-name=SERVICE."},
}

// codeIndex maps a code to its documentation.
var codeIndex = func() map[string]Code {
	m := make(map[string]Code, len(allCodes))
	for _, c := range allCodes {
		m[c.ID] = c
	}
	return m
}()

// Codes returns the documentation of every code, in code order.
func Codes() []Code { return append([]Code(nil), allCodes...) }

// LookupCode returns the documentation of id.
func LookupCode(id string) (Code, bool) {
	c, ok := codeIndex[id]
	return c, ok
}
