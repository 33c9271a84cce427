package doctor_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/inferencecache/inferencecache/controlserver/auth"
	"github.com/inferencecache/inferencecache/doctor"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

const (
	systemNS      = "inferencecache-system"
	controllerSA  = "inferencecache-controller"
	controllerAud = "inferencecache.io/controller"
	policyAud     = "inferencecache.io/policy"
)

// install is a real kube-apiserver with the CRDs, a real server with
// TokenReview auth against it, and token files of the controller's
// ServiceAccount.
type install struct {
	env        *envtest.Environment
	cfg        *rest.Config
	c          client.Client
	cs         kubernetes.Interface
	kubeconfig string
	srv        *server.Server
	conn       pb.InferenceCacheClient
	// Token files.
	ctrlTok, polTok, intruderPolTok string
	// pki signs the webhook's serving certificate, served at webhookAddr
	// (127.0.0.1) for the EndpointSlice address webhookEndpoint.
	pki         pki
	webhookAddr string
}

func startInstall(t *testing.T) *install {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("KUBEBUILDER_ASSETS is not set (run: export KUBEBUILDER_ASSETS=$(bash hack/envtest-assets.sh))")
		}
		t.Skip("KUBEBUILDER_ASSETS is not set; skipping the envtest test")
	}
	logf.SetLogger(logr.Discard())
	env := &envtest.Environment{
		CRDDirectoryPaths:        []string{filepath.Join("..", "operator", "config", "crd", "bases")},
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStopTimeout:  30 * time.Second,
		ControlPlaneStartTimeout: 120 * time.Second,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest start: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("envtest stop: %v", err)
		}
	})
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, v1alpha1.AddToScheme, appsv1.AddToScheme,
		coordinationv1.AddToScheme, admissionv1.AddToScheme, discoveryv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	in := &install{env: env, cfg: cfg}
	if in.c, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	if in.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	in.kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(in.kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}

	ctx := ctxT(t)
	in.namespace(t, systemNS)
	for _, sa := range []string{controllerSA, "intruder"} {
		if err := in.c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: sa}}); err != nil {
			t.Fatal(err)
		}
	}
	in.controllerInstall(t)
	in.ctrlTok = in.tokenFile(t, dir, controllerSA, controllerAud)
	in.polTok = in.tokenFile(t, dir, controllerSA, policyAud)
	in.intruderPolTok = in.tokenFile(t, dir, "intruder", policyAud)

	reviewer, err := auth.NewReviewerForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	in.srv = servertest.Start(t, func(c *server.Config) {
		c.InsecureDisableAuth = false
		c.AllowedControllerSA = auth.ServiceAccountPrefix + systemNS + ":" + controllerSA
		c.Reviewer = reviewer
	})
	in.conn = pb.NewInferenceCacheClient(servertest.Conn(t, in.srv))
	return in
}

func (in *install) tokenFile(t *testing.T, dir, sa, aud string) string {
	t.Helper()
	exp := int64(3600)
	var auds []string // none: the apiserver's default audience
	if aud != "" {
		auds = []string{aud}
	}
	tr, err := in.cs.CoreV1().ServiceAccounts(systemNS).CreateToken(ctxT(t), sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: auds, ExpirationSeconds: &exp},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest %s %s: %v", sa, aud, err)
	}
	path := filepath.Join(dir, sa+"-"+strings.ReplaceAll(aud, "/", "_"))
	if err := os.WriteFile(path, []byte(tr.Status.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// options are the doctor's options for a full check of one namespace.
func (in *install) options(t *testing.T, ns string) doctor.Options {
	t.Helper()
	cfg, _, err := doctor.ClusterConfig(in.kubeconfig, "")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := doctor.NewClusterClient(cfg, doctor.DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	return doctor.Options{
		GRPCAddr:            in.srv.GRPCAddr().String(),
		ControlURL:          "http://" + in.srv.InternalAddr().String(),
		ControllerTokenPath: in.ctrlTok,
		PolicyTokenPath:     in.polTok,
		Cluster:             cl,
		ClusterHost:         cfg.Host,
		Namespace:           ns,
		Controller:          &ctl,
		Dial:                in.dial,
	}
}

func (in *install) namespace(t *testing.T, ns string) {
	t.Helper()
	if err := in.c.Create(ctxT(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// create creates obj and, when setStatus is non-nil, writes its status
// through the status subresource after setStatus fills it in.
func (in *install) create(t *testing.T, obj client.Object, setStatus func()) {
	t.Helper()
	ctx := ctxT(t)
	if ns := obj.GetNamespace(); ns != "" {
		in.namespace(t, ns)
	}
	if err := in.c.Create(ctx, obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	if setStatus != nil {
		setStatus()
		if err := in.c.Status().Update(ctx, obj); err != nil {
			t.Fatalf("status %T %s: %v", obj, obj.GetName(), err)
		}
	}
}

func cond(typ string, st metav1.ConditionStatus, reason string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: "set by the test", LastTransitionTime: metav1.Now()}
}

func backend(ns, name string, sel map[string]string) *v1alpha1.CacheBackend {
	b := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if sel != nil {
		b.Spec.EngineSelector = &v1alpha1.EngineSelector{MatchLabels: sel}
	}
	return b
}

func readyBackend(in *install, t *testing.T, ns, name string, sel map[string]string) {
	b := backend(ns, name, sel)
	in.create(t, b, func() {
		b.Status.ObservedGeneration = b.Generation
		b.Status.Conditions = []metav1.Condition{
			cond(v1alpha1.BackendConditionReady, metav1.ConditionTrue, "Available"),
			cond(v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionTrue, "ProbePassed"),
			cond(v1alpha1.BackendConditionDegraded, metav1.ConditionFalse, "AsExpected"),
		}
	})
}

func acceptedPolicy(in *install, t *testing.T, ns string) {
	p := &v1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
	in.create(t, p, func() {
		p.Status.ObservedGeneration = p.Generation
		p.Status.Conditions = []metav1.Condition{cond(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted)}
	})
}

func tenant(in *install, t *testing.T, ns, id string, quota, entries *int64, conds ...metav1.Condition) {
	ct := &v1alpha1.CacheTenant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id}, Spec: v1alpha1.CacheTenantSpec{TenantID: id}}
	if quota != nil {
		ct.Spec.Quota = &v1alpha1.CacheTenantQuota{MaxIndexEntries: quota}
	}
	in.create(t, ct, func() {
		ct.Status.ObservedGeneration = ct.Generation
		ct.Status.IndexEntries = entries
		if !slices.ContainsFunc(conds, func(c metav1.Condition) bool { return c.Type == v1alpha1.ConditionReady }) {
			conds = append(conds, cond(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonObserved))
		}
		ct.Status.Conditions = conds
	})
}

func pod(in *install, t *testing.T, ns, name string, labels map[string]string, injectedBy string) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "engine:test"}}},
	}
	if injectedBy != "" {
		p.Annotations = map[string]string{doctor.InjectedByAnnotation: injectedBy}
	}
	in.create(t, p, nil)
}

// index reports n distinct prefixes for replica (a pod name) of tenant (its
// namespace) to the server over gRPC.
func (in *install) index(t *testing.T, tenant, replica string, n int) {
	t.Helper()
	st, err := in.conn.ReportCacheState(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	u := &pb.CacheStateUpdate{TenantId: tenant, ModelId: "llama", HashScheme: "vllm", ReplicaId: replica}
	for i := range n {
		h := binary.BigEndian.AppendUint64(nil, uint64(i)|1<<63) // keys are per tenant anyway
		u.Prefixes = append(u.Prefixes, &pb.PrefixEntry{PrefixHash: h, TokenCount: 64})
	}
	if err := st.Send(u); err != nil {
		t.Fatal(err)
	}
	if ack, err := st.CloseAndRecv(); err != nil || !ack.GetAccepted() {
		t.Fatalf("ReportCacheState ack %v, %v", ack, err)
	}
}

// stats reports stats (no prefixes) for replica of tenant, so the replica
// shows in /snapshot as a stats-reporting one.
func (in *install) stats(t *testing.T, tenant, replica string) {
	t.Helper()
	st, err := in.conn.ReportCacheState(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	u := &pb.CacheStateUpdate{TenantId: tenant, ModelId: "llama", ReplicaId: replica,
		Stats: &pb.ReplicaStats{ReplicaId: replica, CacheMemoryBytes: 1 << 30, HitRate: 0.5}}
	if err := st.Send(u); err != nil {
		t.Fatal(err)
	}
	if ack, err := st.CloseAndRecv(); err != nil || !ack.GetAccepted() {
		t.Fatalf("ReportCacheState ack %v, %v", ack, err)
	}
}

// findingAt returns the finding with code about object, nil if none (the
// first when several).
func findingAt(r *doctor.Report, code, object string) *doctor.Finding {
	for i := range r.Findings {
		if r.Findings[i].Code == code && r.Findings[i].Object == object {
			return &r.Findings[i]
		}
	}
	return nil
}

// logSample logs the human output under -v (the README's sample).
func logSample(t *testing.T, r *doctor.Report) {
	if testing.Verbose() {
		var b strings.Builder
		_ = doctor.Write(&b, r, doctor.FormatHuman)
		t.Logf("sample output:\n%s", b.String())
	}
}

func ptr[T any](v T) *T { return &v }

// noProblems fails unless every finding is OK or INFO.
func noProblems(t *testing.T, r *doctor.Report) {
	t.Helper()
	for _, f := range r.Findings {
		if f.Severity >= doctor.Warn {
			t.Errorf("unexpected %s %s %s: %s", f.Severity, f.Code, f.Object, f.Message)
		}
	}
}

// TestInstallation runs the doctor against envtest and a real server with
// TokenReview auth, one namespace per scenario, then removes a CRD.
func TestInstallation(t *testing.T) {
	in := startInstall(t)
	engine := map[string]string{"app": "engine"}

	// The controller's projection of the snapshot.
	ci := &v1alpha1.CacheIndex{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.CacheIndexName}}
	in.create(t, ci, func() {
		ci.Status.ObservedServer = "http://" + in.srv.InternalAddr().String()
		ci.Status.LastUpdated = ptr(metav1.Now())
		ci.Status.Prefixes.Summary.Total = 4
	})

	// healthy: accepted policy, ready backend whose pod is in the index,
	// tenant well within its quota.
	acceptedPolicy(in, t, "healthy")
	readyBackend(in, t, "healthy", "cb", engine)
	pod(in, t, "healthy", "engine-0", engine, "healthy/cb")
	tenant(in, t, "healthy", "healthy", ptr(int64(1000)), ptr(int64(4)))
	in.index(t, "healthy", "engine-0", 4)
	in.project(t, 0)

	t.Run("healthy", func(t *testing.T) {
		start := time.Now() // client construction included
		r := doctor.Run(ctxT(t), in.options(t, "healthy"))
		if elapsed := time.Since(start); elapsed > budget {
			t.Errorf("doctor took %v, budget %v", elapsed, budget)
		}
		for _, code := range []string{
			doctor.CodeGRPCHealth, doctor.CodeSnapshot, doctor.CodePolicyEndpoint, doctor.CodeProbeEndpoint,
			doctor.CodeNoAuth, doctor.CodeTokenFile, doctor.CodeClusterAPI, doctor.CodeCRDs, doctor.CodeBackendReady,
			doctor.CodeEnginePods, doctor.CodeParticipation, doctor.CodeTenantQuota, doctor.CodePolicyCoverage,
			doctor.CodePolicyAccepted, doctor.CodeCacheIndex, doctor.CodeInjection, doctor.CodeCacheIndexDrift,
			doctor.CodeControllerDeploy, doctor.CodeLeaderLease, doctor.CodeWebhookCABundle, doctor.CodeWebhookEndpoints,
		} {
			wantFinding(t, r, code, doctor.OK)
		}
		for _, obj := range []string{"validatingwebhookconfiguration " + ctl.ValidatingWebhook, "mutatingwebhookconfiguration " + ctl.MutatingWebhook} {
			if f := findingAt(r, doctor.CodeWebhookCABundle, obj); f == nil || !strings.Contains(f.Message, "verifies the serving certificate") {
				t.Errorf("%s: the caBundle was not verified against the served certificate: %+v", obj, f)
			}
		}
		noProblems(t, r)
		wantExit(t, r, doctor.ExitOK)
		logSample(t, r)
	})

	t.Run("config-only uses status", func(t *testing.T) {
		o := in.options(t, "healthy")
		o.ConfigOnly = true
		r := doctor.Run(ctxT(t), o)
		// No status.indexParticipation was written: not reported yet.
		wantFinding(t, r, doctor.CodeParticipation, doctor.Info)
		if r.Has(doctor.CodeGRPCHealth, doctor.OK) || r.Has(doctor.CodeSnapshot, doctor.OK) {
			t.Error("config-only made a data-plane call")
		}
		noProblems(t, r)
		wantExit(t, r, doctor.ExitOK)
	})

	// broken: a not-ready, degraded backend whose selector matches nothing,
	// one without a selector, one never reconciled; and no policy.
	b := backend("broken", "cb", map[string]string{"app": "missing"})
	in.create(t, b, func() {
		b.Status.ObservedGeneration = b.Generation
		b.Status.Conditions = []metav1.Condition{
			cond(v1alpha1.BackendConditionReady, metav1.ConditionFalse, "EndpointUnavailable"),
			cond(v1alpha1.BackendConditionDegraded, metav1.ConditionTrue, "NoKVEvents"),
		}
	})
	in.create(t, backend("broken", "noselector", nil), nil)
	stale := backend("broken", "stale", engine)
	in.create(t, stale, func() { // Ready, but about generation 0
		stale.Status.Conditions = []metav1.Condition{cond(v1alpha1.BackendConditionReady, metav1.ConditionTrue, "Available")}
	})
	pod(in, t, "broken", "engine-0", engine, "")

	t.Run("broken backend, missing policy", func(t *testing.T) {
		r := doctor.Run(ctxT(t), in.options(t, "broken"))
		wantFinding(t, r, doctor.CodeBackendReady, doctor.Fail)
		wantFinding(t, r, doctor.CodeBackendReady, doctor.Warn) // never reconciled
		wantFinding(t, r, doctor.CodeBackendCondition, doctor.Warn)
		wantFinding(t, r, doctor.CodeEnginePods, doctor.Warn)
		wantFinding(t, r, doctor.CodeEmptySelector, doctor.Warn)
		wantFinding(t, r, doctor.CodeBackendStale, doctor.Warn)
		wantFinding(t, r, doctor.CodeEnginePods, doctor.OK) // stale matches engine-0
		wantFinding(t, r, doctor.CodePolicyCoverage, doctor.Warn)
		wantExit(t, r, doctor.ExitFail)
	})

	// unindexed: a ready backend with a matched pod that never reported.
	acceptedPolicy(in, t, "unindexed")
	readyBackend(in, t, "unindexed", "cb", engine)
	pod(in, t, "unindexed", "engine-0", engine, "unindexed/cb")
	t.Run("matched pods not in the index", func(t *testing.T) {
		r := doctor.Run(ctxT(t), in.options(t, "unindexed"))
		wantFinding(t, r, doctor.CodeParticipation, doctor.Warn)
		wantExit(t, r, doctor.ExitWarn)
	})

	// claimed: two backends select the same engine pod; the controller's claim
	// rule gives it to the first by name, so only that one counts it.
	acceptedPolicy(in, t, "claimed")
	readyBackend(in, t, "claimed", "a-first", engine)
	readyBackend(in, t, "claimed", "b-second", engine)
	pod(in, t, "claimed", "engine-0", engine, "")
	t.Run("a pod two backends select counts for the first by name", func(t *testing.T) {
		r := doctor.Run(ctxT(t), in.options(t, "claimed"))
		sev := map[string]doctor.Severity{}
		for _, f := range r.Findings {
			if f.Code == doctor.CodeEnginePods {
				sev[f.Object] = f.Severity
			}
		}
		if sev["cachebackend claimed/a-first"] != doctor.OK || sev["cachebackend claimed/b-second"] != doctor.Warn {
			t.Errorf("engine-pod findings %v, want a-first OK and b-second WARN", sev)
		}
	})

	// optout: the only pod the selector matches opted out of injection, so
	// the controller's claim rule gives it to no backend.
	acceptedPolicy(in, t, "optout")
	readyBackend(in, t, "optout", "cb", engine)
	pod(in, t, "optout", "engine-0", map[string]string{"app": "engine", "inferencecache.io/inject": "false"}, "")
	t.Run("an opted-out pod is claimed by no backend", func(t *testing.T) {
		r := doctor.Run(ctxT(t), in.options(t, "optout"))
		wantFinding(t, r, doctor.CodeEnginePods, doctor.Warn)
		if r.Has(doctor.CodeEnginePods, doctor.OK) {
			t.Error("the opted-out pod was counted")
		}
	})

	// cross: a backend with allowCrossNamespace claims the engine pods of a
	// namespace that consents (inferencecache.io/allow-claims-from names the
	// backend's namespace), as the pod webhook does (claim.Owner), and not
	// those of one that does not. Judged by a run over all namespaces.
	crossEngine := map[string]string{"app": "cross-engine"}
	acceptedPolicy(in, t, "cross-home")
	cross := backend("cross-home", "cb", crossEngine)
	cross.Spec.AllowCrossNamespace = true
	in.create(t, cross, func() {
		cross.Status.ObservedGeneration = cross.Generation
		cross.Status.Conditions = []metav1.Condition{cond(v1alpha1.BackendConditionReady, metav1.ConditionTrue, "Available")}
	})
	for ns, consent := range map[string]string{"cross-ok": "cache-a, cross-home", "cross-refuses": "cache-a"} {
		if err := in.c.Create(ctxT(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Annotations: map[string]string{"inferencecache.io/allow-claims-from": consent}}}); err != nil {
			t.Fatal(err)
		}
	}
	pod(in, t, "cross-ok", "engine-0", crossEngine, "cross-home/cb")
	pod(in, t, "cross-refuses", "engine-0", crossEngine, "")
	in.index(t, "cross-ok", "engine-0", 2) // the sidecar's tenant is the pod's namespace
	t.Run("a cross-namespace claim needs the pod namespace's consent", func(t *testing.T) {
		r := doctor.Run(ctxT(t), in.options(t, ""))
		obj := "cachebackend cross-home/cb"
		if f := findingAt(r, doctor.CodeEnginePods, obj); f == nil || f.Severity != doctor.OK || !strings.Contains(f.Message, "1 engine pod ") {
			t.Errorf("IC220 %+v, want OK with the one pod of cross-ok", f)
		}
		if f := findingAt(r, doctor.CodeInjection, obj); f == nil || f.Severity != doctor.OK {
			t.Errorf("IC231 %+v, want OK", f)
		}
		if f := findingAt(r, doctor.CodeParticipation, obj); f == nil || f.Severity != doctor.OK {
			t.Errorf("IC230 %+v, want OK (cross-ok/engine-0 is in the index under tenant cross-ok)", f)
		}
		// Scoped to the backend's namespace, the doctor cannot see the
		// pods it claims elsewhere, and says so.
		r = doctor.Run(ctxT(t), in.options(t, "cross-home"))
		if f := findingAt(r, doctor.CodeEnginePods, obj); f == nil || f.Severity != doctor.Warn || !strings.Contains(f.Message, "allowCrossNamespace") {
			t.Errorf("-n cross-home: IC220 %+v, want a WARN saying other namespaces were not checked", f)
		}
	})

	// policies: a conflicted policy, one never reconciled, and an accepted
	// one whose push failed.
	for _, p := range []struct {
		name  string
		conds []metav1.Condition
	}{
		{"conflicted", []metav1.Condition{cond(v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonConflicted)}},
		{"fresh", nil},
		{"unpushed", []metav1.Condition{
			cond(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted),
			cond(v1alpha1.ConditionPropagated, metav1.ConditionFalse, v1alpha1.ReasonPushFailed),
		}},
	} {
		cp := &v1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "policies", Name: p.name}}
		in.create(t, cp, func() { cp.Status.ObservedGeneration, cp.Status.Conditions = cp.Generation, p.conds })
	}
	t.Run("policy conditions", func(t *testing.T) {
		o := in.options(t, "policies")
		o.ConfigOnly = true
		r := doctor.Run(ctxT(t), o)
		wantFinding(t, r, doctor.CodePolicyAccepted, doctor.Fail)
		wantFinding(t, r, doctor.CodePolicyAccepted, doctor.Warn)
		wantFinding(t, r, doctor.CodePolicyPropagated, doctor.Warn)
		wantExit(t, r, doctor.ExitFail)
	})

	// quota: one tenant over its quota, one at 90 %, by the live snapshot
	// (the server enforces no quota it was not pushed) and by status.
	acceptedPolicy(in, t, "quota")
	tenant(in, t, "quota", "quota-over", ptr(int64(10)), ptr(int64(12)),
		cond(v1alpha1.ConditionQuotaExceeded, metav1.ConditionTrue, v1alpha1.ReasonOverEntryBudget))
	tenant(in, t, "quota", "quota-near", ptr(int64(10)), ptr(int64(9)))
	tenant(in, t, "quota", "quota-dup", nil, nil, cond(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonDuplicateTenantID))
	in.index(t, "quota-over", "r1", 12)
	in.index(t, "quota-near", "r1", 9)
	in.project(t, 0)
	for _, configOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("quota config-only=%v", configOnly), func(t *testing.T) {
			o := in.options(t, "quota")
			o.ConfigOnly = configOnly
			r := doctor.Run(ctxT(t), o)
			wantFinding(t, r, doctor.CodeTenantQuota, doctor.Fail)
			wantFinding(t, r, doctor.CodeTenantQuota, doctor.Warn)
			wantFinding(t, r, doctor.CodeTenantNotReady, doctor.Warn)
			wantExit(t, r, doctor.ExitFail)
		})
	}

	// orphan: a pod injected by a backend that is gone, one with a malformed
	// annotation, and one injected by an existing backend of another
	// namespace.
	acceptedPolicy(in, t, "orphan")
	pod(in, t, "orphan", "stale", nil, "orphan/gone")
	pod(in, t, "orphan", "elsewhere", nil, "healthy/cb")
	pod(in, t, "orphan", "malformed", nil, "no-slash")
	t.Run("orphaned pod", func(t *testing.T) {
		r := doctor.Run(ctxT(t), in.options(t, "orphan"))
		var orphans []string
		for _, f := range r.Findings {
			if f.Code == doctor.CodeOrphanPod {
				orphans = append(orphans, f.Object)
			}
		}
		if want := []string{"pod orphan/malformed", "pod orphan/stale"}; !slices.Equal(orphans, want) {
			t.Errorf("orphans %q, want %q", orphans, want)
		}
		wantExit(t, r, doctor.ExitWarn)
	})
	// partial: two engine pods claimed and injected, only one in the index.
	acceptedPolicy(in, t, "partial")
	readyBackend(in, t, "partial", "cb", engine)
	pod(in, t, "partial", "engine-0", engine, "partial/cb")
	pod(in, t, "partial", "engine-1", engine, "partial/cb")
	in.index(t, "partial", "engine-0", 3)
	in.project(t, 0)
	t.Run("some matched pods not in the index", func(t *testing.T) {
		r := doctor.Run(ctxT(t), in.options(t, "partial"))
		f := findingAt(r, doctor.CodeParticipation, "cachebackend partial/cb")
		if f == nil || f.Severity != doctor.Warn || !strings.Contains(f.Message, "engine-1") || strings.Contains(f.Message, "engine-0") {
			t.Errorf("IC230 %+v, want a WARN naming engine-1 only", f)
		}
		wantExit(t, r, doctor.ExitWarn)
	})

	// uninjected: both pods report to the index, but one was admitted
	// without injection and one carries another backend's.
	acceptedPolicy(in, t, "uninjected")
	readyBackend(in, t, "uninjected", "cb", engine)
	pod(in, t, "uninjected", "engine-0", engine, "")
	pod(in, t, "uninjected", "engine-1", engine, "uninjected/earlier")
	pod(in, t, "uninjected", "engine-2", engine, "uninjected/cb")
	for _, p := range []string{"engine-0", "engine-1", "engine-2"} {
		in.index(t, "uninjected", p, 2)
	}
	in.project(t, 0)
	t.Run("matched pods admitted uninjected", func(t *testing.T) {
		r := doctor.Run(ctxT(t), in.options(t, "uninjected"))
		f := findingAt(r, doctor.CodeInjection, "cachebackend uninjected/cb")
		if f == nil || f.Severity != doctor.Warn || !strings.Contains(f.Message, "engine-0") ||
			!strings.Contains(f.Message, "engine-1") || strings.Contains(f.Message, "engine-2") {
			t.Errorf("IC231 %+v, want a WARN naming engine-0 and engine-1", f)
		}
		wantFinding(t, r, doctor.CodeParticipation, doctor.OK)
		wantExit(t, r, doctor.ExitWarn)
	})

	// stale: verdicts written for generation 1, then the specs changed.
	acceptedPolicy(in, t, "stale")
	readyBackend(in, t, "stale", "cb", engine)
	pod(in, t, "stale", "engine-0", engine, "stale/cb")
	sb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "stale", Name: "cb"}}
	in.update(t, sb, false, func() { sb.Spec.BackendConfig = map[string]string{"model": "llama-2"} })
	sp := &v1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "stale", Name: "invalid"}}
	in.create(t, sp, func() {
		sp.Status.ObservedGeneration = sp.Generation
		c := cond(v1alpha1.ConditionAccepted, metav1.ConditionFalse, "Invalid")
		c.ObservedGeneration = sp.Generation
		sp.Status.Conditions = []metav1.Condition{c}
	})
	in.update(t, sp, false, func() { sp.Spec.MinimumPrefixTokens = ptr(int32(64)) })
	tenant(in, t, "stale", "stale-t", ptr(int64(10)), ptr(int64(12)),
		cond(v1alpha1.ConditionQuotaExceeded, metav1.ConditionTrue, v1alpha1.ReasonOverEntryBudget))
	st := &v1alpha1.CacheTenant{ObjectMeta: metav1.ObjectMeta{Namespace: "stale", Name: "stale-t"}}
	in.update(t, st, false, func() { st.Spec.Quota.MaxIndexEntries = ptr(int64(100)) })
	t.Run("stale conditions are not taken as the state", func(t *testing.T) {
		o := in.options(t, "stale")
		o.ConfigOnly = true // the tenant's entries from its status
		r := doctor.Run(ctxT(t), o)
		if f := findingAt(r, doctor.CodeBackendReady, "cachebackend stale/cb"); f != nil {
			t.Errorf("a Ready condition about generation 1 judged on generation 2: %+v", f)
		}
		if f := findingAt(r, doctor.CodeBackendStale, "cachebackend stale/cb"); f == nil || !strings.Contains(f.Message, "Ready=True") {
			t.Errorf("IC212 %+v, want the stale Ready listed", f)
		}
		if f := findingAt(r, doctor.CodePolicyAccepted, "cachepolicy stale/invalid"); f != nil {
			t.Errorf("an Accepted=False about generation 1 judged on generation 2: %+v", f)
		}
		if f := findingAt(r, doctor.CodeStaleCondition, "cachepolicy stale/invalid"); f == nil || f.Severity != doctor.Warn || !strings.Contains(f.Message, "Accepted=False") {
			t.Errorf("IC203 on the policy %+v, want a WARN naming Accepted=False", f)
		}
		if f := findingAt(r, doctor.CodeStaleCondition, "cachetenant stale/stale-t"); f == nil || !strings.Contains(f.Message, "QuotaExceeded=True") {
			t.Errorf("IC203 on the tenant %+v, want a WARN naming QuotaExceeded=True", f)
		}
		if f := findingAt(r, doctor.CodeTenantQuota, "cachetenant stale/stale-t"); f == nil || f.Severity != doctor.OK {
			t.Errorf("IC250 %+v, want OK: 12 of 100 entries, the QuotaExceeded verdict is stale", f)
		}
		wantExit(t, r, doctor.ExitWarn)
	})

	t.Run("all namespaces", func(t *testing.T) {
		r := doctor.Run(ctxT(t), in.options(t, ""))
		wantFinding(t, r, doctor.CodeOrphanPod, doctor.Warn)
		wantFinding(t, r, doctor.CodeBackendReady, doctor.Fail)
		for _, f := range r.Findings {
			if f.Code == doctor.CodeOrphanPod && f.Object == "pod orphan/elsewhere" {
				t.Errorf("unexpected orphan %s: %s", f.Object, f.Message)
			}
		}
		wantExit(t, r, doctor.ExitFail)
		logSample(t, r)
	})

	t.Run("cacheindex drift", func(t *testing.T) {
		// The projection stopped 10 minutes ago; a tenant and a replica
		// appeared since.
		in.project(t, 10*time.Minute)
		in.stats(t, "drift", "engine-0")
		defer in.project(t, 0)
		r := doctor.Run(ctxT(t), in.options(t, "healthy"))
		f := findingAt(r, doctor.CodeCacheIndexDrift, "cacheindex "+v1alpha1.CacheIndexName)
		if f == nil || f.Severity != doctor.Warn || !strings.Contains(f.Message, `"drift"`) || !strings.Contains(f.Message, "engine-0") {
			t.Fatalf("IC271 %+v, want a WARN naming tenant drift and replica engine-0", f)
		}
		wantExit(t, r, doctor.ExitWarn)

		// The same disagreement right after a projection is in flux.
		in.project(t, 0)
		in.stats(t, "drift2", "engine-0")
		r = doctor.Run(ctxT(t), in.options(t, "healthy"))
		if f := findingAt(r, doctor.CodeCacheIndexDrift, "cacheindex "+v1alpha1.CacheIndexName); f == nil || f.Severity != doctor.Info {
			t.Errorf("IC271 %+v, want INFO within the grace period", f)
		}
		noProblems(t, r)
	})

	t.Run("controller", func(t *testing.T) {
		run := func(t *testing.T, refs *doctor.ControllerRefs) *doctor.Report {
			o := in.options(t, "healthy")
			o.ConfigOnly = true
			if refs != nil {
				o.Controller = refs
			}
			return doctor.Run(ctxT(t), o)
		}
		deploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: ctl.Deployment}}
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: ctl.LeaderLease}}
		vwc := &admissionv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: ctl.ValidatingWebhook}}
		mwc := &admissionv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: ctl.MutatingWebhook}}
		slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: webhookService + "-x1"}}

		for _, c := range []struct {
			name   string
			obj    client.Object
			status bool
			change func()
			undo   func()
			code   string
			sev    doctor.Severity
			want   string
		}{
			{"one replica available", deploy, true, func() { deploy.Status.AvailableReplicas = 1 }, func() { deploy.Status.AvailableReplicas = 2 },
				doctor.CodeControllerDeploy, doctor.Warn, "1 of 2"},
			{"no replica available", deploy, true, func() { deploy.Status.AvailableReplicas = 0 }, func() { deploy.Status.AvailableReplicas = 2 },
				doctor.CodeControllerDeploy, doctor.Fail, "0 of 2"},
			{"lease not renewed", lease, false, func() {
				lease.Spec.LeaseDurationSeconds = ptr(int32(15))
				lease.Spec.RenewTime = ptr(metav1.NewMicroTime(time.Now().Add(-10 * time.Minute)))
			}, func() {
				lease.Spec.LeaseDurationSeconds = ptr(int32(3600))
				lease.Spec.RenewTime = ptr(metav1.NewMicroTime(time.Now()))
			}, doctor.CodeLeaderLease, doctor.Fail, "renewed"},
			{"lease released", lease, false, func() { lease.Spec.HolderIdentity = ptr("") },
				func() { lease.Spec.HolderIdentity = ptr("inferencecache-controller-6f7d9c-abcde_3b1f") },
				doctor.CodeLeaderLease, doctor.Fail, "no holder"},
			{"caBundle of another CA", vwc, false, func() { vwc.Webhooks[1].ClientConfig.CABundle = newPKI(t, "x").caPEM },
				func() { vwc.Webhooks[1].ClientConfig.CABundle = in.pki.caPEM }, doctor.CodeWebhookCABundle, doctor.Fail, "vcachetenant.inferencecache.io"},
			{"empty caBundle", mwc, false, func() { mwc.Webhooks[0].ClientConfig.CABundle = nil },
				func() { mwc.Webhooks[0].ClientConfig.CABundle = in.pki.caPEM }, doctor.CodeWebhookCABundle, doctor.Fail, "empty"},
			{"caBundle not PEM", mwc, false, func() { mwc.Webhooks[0].ClientConfig.CABundle = []byte("not a certificate") },
				func() { mwc.Webhooks[0].ClientConfig.CABundle = in.pki.caPEM }, doctor.CodeWebhookCABundle, doctor.Fail, "PEM"},
			{"no ready webhook endpoint", slice, false, func() { slice.Endpoints[0].Conditions.Ready = ptr(false) },
				func() { slice.Endpoints[0].Conditions.Ready = ptr(true) }, doctor.CodeWebhookEndpoints, doctor.Fail, "no ready endpoint"},
			{"webhook endpoint unreachable from here", slice, false, func() { slice.Endpoints[0].Addresses = []string{"10.0.0.11"} },
				func() { slice.Endpoints[0].Addresses = []string{"10.0.0.10"} }, doctor.CodeWebhookCABundle, doctor.Info, "not verified"},
		} {
			t.Run(c.name, func(t *testing.T) {
				in.update(t, c.obj, c.status, c.change)
				defer in.update(t, c.obj, c.status, c.undo)
				r := run(t, nil)
				if !slices.ContainsFunc(r.Findings, func(f doctor.Finding) bool {
					return f.Code == c.code && f.Severity == c.sev && strings.Contains(f.Message, c.want)
				}) {
					t.Errorf("no %s %s finding saying %q in\n%s", c.code, c.sev, c.want, strings.Join(codesAt(r), "\n"))
				}
			})
		}

		t.Run("objects missing", func(t *testing.T) {
			r := run(t, &doctor.ControllerRefs{Namespace: systemNS, Deployment: "nope", LeaderLease: "nope",
				ValidatingWebhook: "nope-v", MutatingWebhook: "nope-m"})
			wantFinding(t, r, doctor.CodeControllerDeploy, doctor.Fail)
			wantFinding(t, r, doctor.CodeLeaderLease, doctor.Warn)
			wantFinding(t, r, doctor.CodeWebhookCABundle, doctor.Warn)
			wantExit(t, r, doctor.ExitFail)
		})
		t.Run("restored", func(t *testing.T) {
			r := run(t, nil)
			for _, code := range []string{doctor.CodeControllerDeploy, doctor.CodeLeaderLease, doctor.CodeWebhookCABundle, doctor.CodeWebhookEndpoints} {
				wantFinding(t, r, code, doctor.OK)
			}
			noProblems(t, r)
		})
	})

	t.Run("unreachable server", func(t *testing.T) {
		o := in.options(t, "healthy")
		o.GRPCAddr, o.ControlURL = closedAddr(t), "http://"+closedAddr(t)
		r := doctor.Run(ctxT(t), o)
		wantFinding(t, r, doctor.CodeGRPCUnreachable, doctor.Fail)
		wantFinding(t, r, doctor.CodeControlDown, doctor.Fail)
		wantFinding(t, r, doctor.CodeBackendReady, doctor.OK) // the cluster is still checked
		wantExit(t, r, doctor.ExitFail)
	})

	t.Run("wrong tokens", func(t *testing.T) {
		o := in.options(t, "healthy")
		o.ControllerTokenPath = in.polTok     // wrong audience for /snapshot and /probe
		o.PolicyTokenPath = in.intruderPolTok // right audience, wrong ServiceAccount
		r := doctor.Run(ctxT(t), o)
		wantFinding(t, r, doctor.CodeTokenRejected, doctor.Fail)
		wantFinding(t, r, doctor.CodeWrongIdentity, doctor.Fail)
		if r.Has(doctor.CodeSnapshot, doctor.OK) || r.Has(doctor.CodePolicyEndpoint, doctor.OK) {
			t.Error("endpoint reported reachable with a rejected token")
		}
		wantExit(t, r, doctor.ExitFail)
	})

	t.Run("no cacheindex", func(t *testing.T) {
		if err := in.c.Delete(ctxT(t), ci); err != nil {
			t.Fatal(err)
		}
		o := in.options(t, "healthy")
		o.ConfigOnly = true
		r := doctor.Run(ctxT(t), o)
		wantFinding(t, r, doctor.CodeCacheIndex, doctor.Warn)
		wantExit(t, r, doctor.ExitWarn)
	})

	t.Run("forbidden", func(t *testing.T) {
		// A ServiceAccount without RBAC grants may discover but not list.
		tok, err := os.ReadFile(in.tokenFile(t, t.TempDir(), "intruder", ""))
		if err != nil {
			t.Fatal(err)
		}
		cfg := rest.AnonymousClientConfig(in.cfg)
		cfg.BearerToken = strings.TrimSpace(string(tok))
		cl, err := doctor.NewClusterClient(cfg, doctor.DefaultTimeout)
		if err != nil {
			t.Fatal(err)
		}
		r := doctor.Run(ctxT(t), doctor.Options{Cluster: cl, ClusterHost: cfg.Host, Namespace: "healthy", Controller: &ctl})
		wantFinding(t, r, doctor.CodeForbidden, doctor.Warn)
		if r.Has(doctor.CodeCRDs, doctor.OK) || r.Has(doctor.CodeBackendReady, doctor.OK) {
			t.Errorf("unverified checks reported OK:\n%s", strings.Join(codesAt(r), "\n"))
		}
		wantExit(t, r, doctor.ExitWarn)
	})

	t.Run("missing CRD", func(t *testing.T) {
		crd := &unstructured.Unstructured{} // untyped: no apiextensions dependency
		crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
		crd.SetName("pdtopologies.inferencecache.io")
		if err := in.c.Delete(ctxT(t), crd); err != nil {
			t.Fatal(err)
		}
		// The apiserver drops the kind from discovery shortly after the
		// delete; each Run builds a fresh client, so retry for a bounded time.
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		for {
			o := in.options(t, "healthy")
			o.ConfigOnly = true
			r := doctor.Run(ctx, o)
			if r.Has(doctor.CodeCRDs, doctor.Fail) {
				wantExit(t, r, doctor.ExitFail)
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("no IC201 FAIL after deleting a CRD:\n%s", strings.Join(codesAt(r), "\n"))
			case <-time.After(200 * time.Millisecond):
			}
		}
	})

	// Last: with the apiserver gone, the server cannot review a token it
	// has not cached and fails closed (503), and the cluster is a FAIL.
	t.Run("apiserver down", func(t *testing.T) {
		dir := t.TempDir()
		o := in.options(t, "healthy")
		o.ControllerTokenPath = in.tokenFile(t, dir, controllerSA, controllerAud)
		o.PolicyTokenPath = ""
		if err := in.env.ControlPlane.APIServer.Stop(); err != nil {
			t.Fatalf("stop kube-apiserver: %v", err)
		}
		r := doctor.Run(ctxT(t), o)
		wantFinding(t, r, doctor.CodeReviewFailed, doctor.Fail)
		wantFinding(t, r, doctor.CodeClusterAPI, doctor.Fail)
		wantFinding(t, r, doctor.CodeGRPCHealth, doctor.OK)
		wantExit(t, r, doctor.ExitFail)
	})
}

// TestClusterUnreachable: a kubeconfig naming a closed port is one IC200
// FAIL, within the budget, and the data plane is still checked.
func TestClusterUnreachable(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://%s", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, closedAddr(t))
	if err := os.WriteFile(kc, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := doctor.ClusterConfig(kc, "")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := doctor.NewClusterClient(cfg, doctor.DefaultTimeout)
	if err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, nil)
	r := doctor.Run(ctxT(t), doctor.Options{GRPCAddr: srv.GRPCAddr().String(), Cluster: cl, ClusterHost: cfg.Host})
	wantFinding(t, r, doctor.CodeClusterAPI, doctor.Fail)
	wantFinding(t, r, doctor.CodeGRPCHealth, doctor.OK)
	if n := strings.Count(fmt.Sprint(codesAt(r)), doctor.CodeClusterAPI); n != 1 {
		t.Errorf("%d IC200 findings, want 1", n)
	}
	wantExit(t, r, doctor.ExitFail)

	_, _, err = doctor.ClusterConfig(filepath.Join(dir, "missing"), "")
	if err == nil {
		t.Error("a missing kubeconfig file loaded")
	}
	r = doctor.Run(ctxT(t), doctor.Options{ClusterErr: err})
	wantFinding(t, r, doctor.CodeClusterAPI, doctor.Fail)
}
