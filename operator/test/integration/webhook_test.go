package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

func ptr[T any](v T) *T { return &v }

func policyObj(ns, name string, mut func(*v1alpha1.CachePolicySpec)) *v1alpha1.CachePolicy {
	cp := &v1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if mut != nil {
		mut(&cp.Spec)
	}
	return cp
}

func tenantObj(ns, name, id string, quota *int64) *v1alpha1.CacheTenant {
	t := &v1alpha1.CacheTenant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.CacheTenantSpec{TenantID: id}}
	if quota != nil {
		t.Spec.Quota = &v1alpha1.CacheTenantQuota{MaxIndexEntries: quota}
	}
	return t
}

func backendObj(ns, name string, typ v1alpha1.CacheBackendType, endpoint string) *v1alpha1.CacheBackend {
	return &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.CacheBackendSpec{Type: typ, Endpoint: endpoint}}
}

// update re-reads obj, applies mut and updates it, retrying on conflicts
// (the controllers write status concurrently).
func update[T client.Object](ctx context.Context, obj T, mut func(T)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		mut(obj)
		return k8s.Update(ctx, obj)
	})
}

// wantOK fails the test when err is not nil.
func wantOK(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: unexpected error: %v", what, err)
	}
}

// wantDenied fails the test unless err is an admission denial (422 Invalid
// or 403 Forbidden) whose message contains every fragment.
func wantDenied(t *testing.T, what string, err error, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: admitted, want denied", what)
	}
	if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) && !apierrors.IsBadRequest(err) {
		t.Fatalf("%s: error %v is not a denial", what, err)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Fatalf("%s: message %q lacks %q", what, err.Error(), f)
		}
	}
}

// unlegacy removes the legacy label and waits until the webhooks see the
// namespace again.
func unlegacy(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	var ns corev1.Namespace
	wantOK(t, "get namespace", k8s.Get(ctx, client.ObjectKey{Name: name}, &ns))
	delete(ns.Labels, legacyLabel)
	wantOK(t, "unlabel namespace", k8s.Update(ctx, &ns))
	probe := backendObj(name, "webhook-probe", v1alpha1.BackendExternal, "")
	eventually(t, 20*time.Second, func() error {
		err := k8s.Create(ctx, probe, client.DryRunAll)
		if err == nil {
			return fmt.Errorf("webhooks not active in %s yet", name)
		}
		return nil
	})
}

func TestCachePolicyWebhook(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "wh-policy", false)

	wantOK(t, "first policy", k8s.Create(ctx, policyObj(ns, "main", nil)))
	err := k8s.Create(ctx, policyObj(ns, "second", nil))
	wantDenied(t, "second policy in a namespace", err, "metadata.name: Forbidden", `already has CachePolicy "main"`, `edit "main"`)

	other := namespace(t, ctx, "wh-policy-2", false)
	err = k8s.Create(ctx, policyObj(other, "p", func(s *v1alpha1.CachePolicySpec) { s.EvictionTTL = &metav1.Duration{} }))
	wantDenied(t, "zero evictionTTL", err, "spec.evictionTTL", "must be a positive duration")
	err = k8s.Create(ctx, policyObj(other, "p", func(s *v1alpha1.CachePolicySpec) { s.EvictionTTL = &metav1.Duration{Duration: -time.Minute} }))
	wantDenied(t, "negative evictionTTL", err, "spec.evictionTTL", "-1m0s")
	err = k8s.Create(ctx, policyObj(other, "p", func(s *v1alpha1.CachePolicySpec) {
		s.Strategy = &v1alpha1.CachePolicyStrategy{RequireChain: ptr(true), EnableChainMatching: ptr(false)}
	}))
	wantDenied(t, "requireChain without chain matching (CEL)", err, "spec.strategy.requireChain", "needs enableChainMatching: true")
	for _, bad := range []string{"abc", "-1", "01", "0.1234567", "123456789"} {
		err = k8s.Create(ctx, policyObj(other, "p", func(s *v1alpha1.CachePolicySpec) { s.RoutingFloorScore = ptr(bad) }))
		wantDenied(t, "routingFloorScore "+bad, err, "spec.routingFloorScore")
	}
	err = k8s.Create(ctx, policyObj(other, "p", func(s *v1alpha1.CachePolicySpec) { s.Eviction = "MRU" }))
	wantDenied(t, "eviction enum", err, "spec.eviction", "Unsupported value")

	// Defaults are materialized by the apiserver.
	p := policyObj(other, "p", func(s *v1alpha1.CachePolicySpec) { s.RoutingFloorScore = ptr("12345678.5") })
	wantOK(t, "valid policy", k8s.Create(ctx, p))
	s := p.Spec
	if s.Eviction != "LRU" || *s.MinimumMatchedTokens != 64 || *s.RoutingFloorScore != "12345678.5" || s.AffinityRouting != "Enabled" ||
		s.Strategy == nil || !*s.Strategy.EnableChainMatching || *s.Strategy.RequireChain || !*s.Strategy.EnableTenantHot {
		t.Fatalf("defaults not applied: %+v", s)
	}
	// UPDATE: introducing a violation is refused, editing otherwise is fine
	// (the one-per-namespace rule does not apply to UPDATE).
	wantDenied(t, "update to zero TTL", update(ctx, p, func(p *v1alpha1.CachePolicy) { p.Spec.EvictionTTL = &metav1.Duration{} }), "spec.evictionTTL")
	wantOK(t, "ordinary update", update(ctx, p, func(p *v1alpha1.CachePolicy) { p.Spec.MinimumPrefixTokens = ptr(int32(16)) }))
	wantOK(t, "delete", k8s.Delete(ctx, p))
}

func TestCachePolicyWebhookLegacy(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "wh-policy-legacy", true)
	// Admitted before the rules existed: two policies, one with a zero TTL.
	bad := policyObj(ns, "b-zero-ttl", func(s *v1alpha1.CachePolicySpec) { s.EvictionTTL = &metav1.Duration{} })
	wantOK(t, "legacy zero-TTL policy", k8s.Create(ctx, bad))
	dup := policyObj(ns, "c-second", nil)
	wantOK(t, "legacy second policy", k8s.Create(ctx, dup))
	unlegacy(t, ctx, ns)

	wantOK(t, "unrelated edit of a legacy violation", update(ctx, bad, func(p *v1alpha1.CachePolicy) { p.Spec.MinimumPrefixTokens = ptr(int32(8)) }))
	// The legacy value may stay, but a changed one must be valid.
	wantDenied(t, "legacy violation rewritten to another bad value",
		update(ctx, bad, func(p *v1alpha1.CachePolicy) { p.Spec.EvictionTTL = &metav1.Duration{Duration: -time.Second} }), "spec.evictionTTL", "-1s")
	wantOK(t, "legacy violation fixed", update(ctx, bad, func(p *v1alpha1.CachePolicy) { p.Spec.EvictionTTL = &metav1.Duration{Duration: time.Minute} }))
	wantOK(t, "edit of a legacy duplicate", update(ctx, dup, func(p *v1alpha1.CachePolicy) { p.Spec.Eviction = "LFU" }))
	wantDenied(t, "newly introduced zero TTL", update(ctx, dup, func(p *v1alpha1.CachePolicy) { p.Spec.EvictionTTL = &metav1.Duration{} }), "spec.evictionTTL")
	// CREATE names the existing policy with the smallest name.
	err := k8s.Create(ctx, policyObj(ns, "a-third", nil))
	wantDenied(t, "third policy", err, `already has CachePolicy "b-zero-ttl"`)
}

func TestCacheTenantWebhook(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "wh-tenant", false)
	other := namespace(t, ctx, "wh-tenant-2", false)

	err := k8s.Create(ctx, tenantObj(ns, "probe", "inferencecache.io/probe", nil))
	wantDenied(t, "reserved tenant id", err, "spec.tenantID", "reserved for the server's functional self-test")
	wantDenied(t, "empty tenant id", k8s.Create(ctx, tenantObj(ns, "empty", "", nil)), "spec.tenantID")

	a := tenantObj(ns, "a", "acme", ptr(int64(10)))
	wantOK(t, "tenant a", k8s.Create(ctx, a))
	err = k8s.Create(ctx, tenantObj(ns, "b", "acme", nil))
	wantDenied(t, "same-namespace duplicate", err, "spec.tenantID: Duplicate value", `CacheTenant "a"`)
	wantOK(t, "same id in another namespace", k8s.Create(ctx, tenantObj(other, "a", "acme", nil)))

	b := tenantObj(ns, "b", "globex", nil)
	wantOK(t, "tenant b", k8s.Create(ctx, b))
	wantDenied(t, "update onto a sibling's id", update(ctx, b, func(b *v1alpha1.CacheTenant) { b.Spec.TenantID = "acme" }),
		"Duplicate value", `CacheTenant "a"`)
	wantDenied(t, "update to the reserved id", update(ctx, b, func(b *v1alpha1.CacheTenant) { b.Spec.TenantID = "inferencecache.io/probe" }), "reserved")
	wantOK(t, "quota edit", update(ctx, b, func(b *v1alpha1.CacheTenant) {
		b.Spec.Quota = &v1alpha1.CacheTenantQuota{MaxIndexEntries: ptr(int64(5))}
	}))
	wantDenied(t, "negative quota (schema)", update(ctx, b, func(b *v1alpha1.CacheTenant) { b.Spec.Quota.MaxIndexEntries = ptr(int64(-1)) }),
		"maxIndexEntries")

	// crypto must be the empty object.
	c := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheTenant",
		"metadata": map[string]any{"namespace": ns, "name": "crypto"},
		"spec":     map[string]any{"tenantID": "crypto", "crypto": map[string]any{"keyRef": "x"}},
	}}
	wantDenied(t, "non-empty crypto", k8s.Create(ctx, c), "spec.crypto")
	c.Object["spec"].(map[string]any)["crypto"] = map[string]any{}
	wantOK(t, "empty crypto", k8s.Create(ctx, c))
}

func TestCacheTenantWebhookLegacy(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "wh-tenant-legacy", true)
	probe := tenantObj(ns, "probe", "inferencecache.io/probe", nil)
	wantOK(t, "legacy reserved id", k8s.Create(ctx, probe))
	d1 := tenantObj(ns, "d1", "dup", nil)
	d2 := tenantObj(ns, "d2", "dup", nil)
	wantOK(t, "legacy duplicate 1", k8s.Create(ctx, d1))
	wantOK(t, "legacy duplicate 2", k8s.Create(ctx, d2))
	unlegacy(t, ctx, ns)

	wantOK(t, "unrelated edit keeps the reserved id", update(ctx, probe, func(t *v1alpha1.CacheTenant) {
		t.Spec.Quota = &v1alpha1.CacheTenantQuota{MaxIndexEntries: ptr(int64(1))}
	}))
	wantOK(t, "edit of a legacy duplicate without changing tenantID", update(ctx, d2, func(t *v1alpha1.CacheTenant) {
		t.Spec.Quota = &v1alpha1.CacheTenantQuota{MaxIndexEntries: ptr(int64(3))}
	}))
	wantDenied(t, "create with the reserved id", k8s.Create(ctx, tenantObj(ns, "probe2", "inferencecache.io/probe", nil)), "reserved")
}

func TestCacheBackendWebhook(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "wh-backend", false)
	denied := map[string][]string{
		"":                         {"spec.endpoint: Required value", "type External needs"},
		"lmcache":                  {"spec.endpoint: Invalid value", "with a port"},
		"lmcache:0":                {"from 1 to 65535"},
		"::1:8200":                 {"IPv6 address must be in brackets"},
		"http://lmcache:8200":      {`scheme "http://" is not supported`},
		"lm://lmcache:8200/x":      {"path, query or fragment"},
		"[lmcache]:8200":           {"only for IPv6"},
		"lm://lmcache.svc:99999":   {"from 1 to 65535"},
		"lm://:8200":               {"host is empty"},
		"lmcache.cache.svc:8200?a": {"path, query or fragment"},
	}
	i := 0
	for ep, frags := range denied {
		i++
		err := k8s.Create(ctx, backendObj(ns, fmt.Sprintf("bad-%d", i), v1alpha1.BackendExternal, ep))
		wantDenied(t, "External endpoint "+ep, err, frags...)
	}
	for i, ep := range []string{"lmcache.cache.svc:8200", "lm://lmcache.cache.svc:8200", "[::1]:8200", "lm://[fd00::7]:1", "10.0.0.7:65535"} {
		wantOK(t, "External endpoint "+ep, k8s.Create(ctx, backendObj(ns, fmt.Sprintf("good-%d", i), v1alpha1.BackendExternal, ep)))
	}
	err := k8s.Create(ctx, backendObj(ns, "managed", v1alpha1.BackendLMCache, "lmcache:8200"))
	wantDenied(t, "endpoint on a managed type", err, "spec.endpoint: Forbidden", "only be set when type is External")
	err = k8s.Create(ctx, backendObj(ns, "defaulted", "", "lmcache:8200"))
	wantDenied(t, "endpoint on the default type", err, "type LMCache backends")
	m := backendObj(ns, "managed", "", "")
	wantOK(t, "managed backend", k8s.Create(ctx, m))
	if m.Spec.Type != v1alpha1.BackendLMCache || *m.Spec.Replicas != 1 || m.Spec.Resources.Requests.Memory().String() != "4Gi" {
		t.Fatalf("defaults not applied: %+v", m.Spec)
	}
	wantDenied(t, "update adding an endpoint to a managed backend",
		update(ctx, m, func(m *v1alpha1.CacheBackend) { m.Spec.Endpoint = "lmcache:8200" }), "Forbidden")
}

func TestCacheBackendWebhookLegacy(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "wh-backend-legacy", true)
	b := backendObj(ns, "ext", v1alpha1.BackendExternal, "")
	wantOK(t, "legacy External without endpoint", k8s.Create(ctx, b))
	bad := backendObj(ns, "ext-bad", v1alpha1.BackendExternal, "http://lmcache:8200")
	wantOK(t, "legacy External with a bad endpoint", k8s.Create(ctx, bad))
	unlegacy(t, ctx, ns)
	wantOK(t, "unrelated edit", update(ctx, b, func(b *v1alpha1.CacheBackend) { b.Spec.Replicas = ptr(int32(2)) }))
	wantDenied(t, "newly invalid endpoint", update(ctx, b, func(b *v1alpha1.CacheBackend) { b.Spec.Endpoint = "no-port" }), "with a port")
	// A legacy bad endpoint may be kept, not replaced by another bad one.
	wantOK(t, "edit keeping the legacy endpoint", update(ctx, bad, func(b *v1alpha1.CacheBackend) { b.Spec.Replicas = ptr(int32(3)) }))
	wantDenied(t, "legacy endpoint replaced by another bad one",
		update(ctx, bad, func(b *v1alpha1.CacheBackend) { b.Spec.Endpoint = "grpc://lmcache:8200" }), `scheme "grpc://"`)
}

func TestCacheIndexAndOthersSchema(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "wh-schema", false)
	ci := &v1alpha1.CacheIndex{ObjectMeta: metav1.ObjectMeta{Name: "schema-probe"}}
	wantOK(t, "CacheIndex with no spec", k8s.Create(ctx, ci, client.DryRunAll))
	pt := &v1alpha1.PromptTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pt"},
		Spec: v1alpha1.PromptTemplateSpec{Body: "x", Slots: []v1alpha1.PromptTemplateSlot{{Name: "a", Type: "Sometimes"}}}}
	wantDenied(t, "slot type enum", k8s.Create(ctx, pt), "spec.slots[0].type")
	pt.Spec.Slots[0].Type = v1alpha1.SlotStable
	pt.Spec.Body = ""
	wantDenied(t, "empty body", k8s.Create(ctx, pt), "spec.body")
	pd := &v1alpha1.PDTopology{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pd"},
		Spec: v1alpha1.PDTopologySpec{PrefillPools: []v1alpha1.PDPool{{Name: "p", Replicas: ptr(int32(-1))}}}}
	wantDenied(t, "negative pool replicas", k8s.Create(ctx, pd), "replicas")
	hc := backendObj(ns, "hc", v1alpha1.BackendSGLangHiCache, "")
	hc.Spec.HiCache = &v1alpha1.HiCacheSpec{SizeGB: ptr(int32(4)), Ratio: "2"}
	wantDenied(t, "hiCache sizeGB and ratio", k8s.Create(ctx, hc), "set exactly one of sizeGB and ratio")
	hc.Spec.HiCache.SizeGB = nil
	for _, zero := range []string{"0", "0.0", "00", "01.5"} {
		hc.Spec.HiCache.Ratio = zero
		wantDenied(t, "hiCache ratio "+zero, k8s.Create(ctx, hc, client.DryRunAll), "spec.hiCache.ratio")
	}
	for _, ok := range []string{"2", "0.5", "1.25", "10"} {
		hc.Spec.HiCache.Ratio = ok
		wantOK(t, "hiCache ratio "+ok, k8s.Create(ctx, hc.DeepCopy(), client.DryRunAll))
	}
}

// TestDurationsDecode: a duration field the Go types could not decode (no
// unit, not a number) is refused by the schema itself, where no webhook is
// called. Stored, such an object would fail every typed list of its kind,
// and with it the controller's informer for all of them.
func TestDurationsDecode(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "wh-durations", true) // legacy: the webhooks do not run
	objs := map[string]*unstructured.Unstructured{
		"CachePolicy evictionTTL": {Object: map[string]any{
			"apiVersion": "inferencecache.io/v1alpha1", "kind": "CachePolicy",
			"metadata": map[string]any{"namespace": ns, "name": "p"},
			"spec":     map[string]any{},
		}},
		"CacheBackend firstEventTimeout": {Object: map[string]any{
			"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
			"metadata": map[string]any{"namespace": ns, "name": "b"},
			"spec":     map[string]any{},
		}},
	}
	set := func(u *unstructured.Unstructured, v string) {
		if u.GetKind() == "CachePolicy" {
			u.Object["spec"] = map[string]any{"evictionTTL": v}
		} else {
			u.Object["spec"] = map[string]any{"integration": map[string]any{"firstEventTimeout": v}}
		}
	}
	for what, u := range objs {
		for _, bad := range []string{"15", "15 m", "m", "1d", "abc", ""} {
			set(u, bad)
			err := k8s.Create(ctx, u.DeepCopy())
			if err == nil {
				_ = k8s.Delete(ctx, u.DeepCopy())
			}
			wantDenied(t, what+" "+bad, err, "should match")
		}
		for _, good := range []string{"15m", "1h30m", "90s", "1.5h", "500ms", "0s", "-1m0s", "0", "1µs", "2us", "+3ns"} {
			set(u, good)
			c := u.DeepCopy()
			wantOK(t, what+" "+good, k8s.Create(ctx, c, client.DryRunAll))
		}
	}
}

// TestCacheBackendWebhookEngineOverrides: engineOverrides.env may not read a
// Secret or a ConfigMap (the pod webhook would hand it to engine pods whose
// owners never granted it); values and the pod's own fields are fine.
func TestCacheBackendWebhookEngineOverrides(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "wh-overrides", false)
	withEnv := func(name string, env ...corev1.EnvVar) *v1alpha1.CacheBackend {
		b := backendObj(ns, name, v1alpha1.BackendExternal, "lmcache.cache.svc:8200")
		b.Spec.Integration = &v1alpha1.CacheBackendIntegration{EngineOverrides: &v1alpha1.EngineOverrides{Env: env}}
		return b
	}
	secret := corev1.EnvVar{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "hf"}, Key: "token"}}}
	cm := corev1.EnvVar{Name: "CFG", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "k"}}}
	wantDenied(t, "env from a Secret", k8s.Create(ctx, withEnv("secret", secret)),
		"spec.integration.engineOverrides.env[0].valueFrom", "Secret")
	wantDenied(t, "env from a ConfigMap", k8s.Create(ctx, withEnv("cm", corev1.EnvVar{Name: "A", Value: "1"}, cm)),
		"spec.integration.engineOverrides.env[1].valueFrom", "ConfigMap")
	ok := withEnv("ok", corev1.EnvVar{Name: "A", Value: "1"},
		corev1.EnvVar{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}})
	wantOK(t, "plain value and field ref", k8s.Create(ctx, ok))
	wantDenied(t, "update adding a Secret ref", update(ctx, ok, func(b *v1alpha1.CacheBackend) {
		b.Spec.Integration.EngineOverrides.Env = append(b.Spec.Integration.EngineOverrides.Env, secret)
	}), "Secret")
}

// TestCacheBackendWebhookAllowLists: with --allowed-backend-images and
// --allowed-service-accounts (the suite's testBackendPolicy), the webhook
// refuses a CacheBackend asking to run another image or ServiceAccount.
func TestCacheBackendWebhookAllowLists(t *testing.T) {
	ctx := needEnv(t)
	ns := namespace(t, ctx, "wh-allow", false)
	mk := func(name, image, sa string) *v1alpha1.CacheBackend {
		b := backendObj(ns, name, v1alpha1.BackendLMCache, "")
		if image != "" {
			b.Spec.BackendConfig = map[string]string{"image": image}
		}
		if sa != "" {
			b.Spec.Template = &v1alpha1.BackendPodOverride{ServiceAccountName: sa}
		}
		return b
	}
	wantDenied(t, "image outside the allowed prefixes", k8s.Create(ctx, mk("img", "docker.io/evil/miner:1", "")),
		`spec.backendConfig[image]: Forbidden`, "docker.io/evil/miner:1", "--allowed-backend-images")
	wantDenied(t, "look-alike of an allowed prefix", k8s.Create(ctx, mk("img2", "lmcache/vllm-openai-evil:1", "")), "not allowed")
	wantDenied(t, "ServiceAccount not allowed", k8s.Create(ctx, mk("sa", "", "cluster-admin-sa")),
		"spec.template.serviceAccountName: Forbidden", "--allowed-service-accounts")
	wantDenied(t, "namespaced entry of another namespace", k8s.Create(ctx, mk("sa2", "", "other")), "Forbidden")
	ok := mk("ok", "registry.example/approved/lmcache:1", "cache-runner")
	wantOK(t, "allowed image and ServiceAccount", k8s.Create(ctx, ok))
	wantOK(t, "namespace-scoped ServiceAccount entry", k8s.Create(ctx, mk("ok2", "lmcache/vllm-openai:v0.3.15", "special")))
	wantOK(t, "defaults (no image, no ServiceAccount)", k8s.Create(ctx, mk("ok3", "", "")))
	wantDenied(t, "update to a refused image", update(ctx, ok, func(b *v1alpha1.CacheBackend) {
		b.Spec.BackendConfig["image"] = "quay.io/x/y:1"
	}), "not allowed")
}
