package validation

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

func TestEndpoint(t *testing.T) {
	f := func(in, wantErr string) {
		t.Helper()
		err := Endpoint(in)
		switch {
		case wantErr == "" && err != nil:
			t.Errorf("Endpoint(%q) = %v, want ok", in, err)
		case wantErr != "" && err == nil:
			t.Errorf("Endpoint(%q) = ok, want error containing %q", in, wantErr)
		case wantErr != "" && !strings.Contains(err.Error(), wantErr):
			t.Errorf("Endpoint(%q) = %v, want error containing %q", in, err, wantErr)
		}
	}
	f("lmcache.cache.svc:8200", "")
	f("lm://lmcache.cache.svc:8200", "")
	f("10.0.0.7:65535", "")
	f("[::1]:8200", "")
	f("lm://[fd00::7]:1", "")
	f("lmcache", "with a port")
	f("lmcache:", "must be a number")
	f("lmcache:0", "from 1 to 65535")
	f("lmcache:65536", "from 1 to 65535")
	f("lmcache:http", "must be a number")
	f(":8200", "host is empty")
	f("::1:8200", "IPv6 address must be in brackets")
	f("fd00::7", "IPv6 address must be in brackets")
	f("[10.0.0.1]:8200", "only for IPv6")
	f("http://lmcache:8200", `scheme "http://" is not supported`)
	f("grpc://lmcache:8200", "not supported")
	f("lmcache:8200/path", "path, query or fragment")
	f("lm://lmcache:8200?x=1", "path, query or fragment")
	f("lmcache:8200#frag", "path, query or fragment")
}

func FuzzEndpoint(f *testing.F) {
	for _, s := range []string{"a:1", "lm://a:1", "[::1]:2", "::1:2", "http://a:1", "a", "a:1/b", "[a]:1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if Endpoint(s) != nil {
			return
		}
		// Whatever is accepted is lm:// plus host:port with a port in range.
		rest := strings.TrimPrefix(s, "lm://")
		if strings.Contains(rest, "://") || strings.ContainsAny(rest, "/?#") {
			t.Fatalf("accepted %q with a scheme or path", s)
		}
	})
}

func TestParseRoutingFloorScore(t *testing.T) {
	ok := map[string]float32{"0": 0, "0.1": 0.1, "5": 5, "12345678.123456": 12345678.123456, "10.5": 10.5}
	for in, want := range ok {
		got, err := ParseRoutingFloorScore(in)
		if err != nil || got != want {
			t.Errorf("ParseRoutingFloorScore(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "01", "1.", ".5", "1e3", "NaN", "Inf", "+1", "123456789", "0.1234567", "0x10", " 1"} {
		if _, err := ParseRoutingFloorScore(in); err == nil {
			t.Errorf("ParseRoutingFloorScore(%q) accepted", in)
		}
	}
}

func TestCachePolicySpec(t *testing.T) {
	i32 := func(v int32) *int32 { return &v }
	str := func(v string) *string { return &v }
	b := func(v bool) *bool { return &v }
	dur := func(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
	f := func(spec v1alpha1.CachePolicySpec, wantFields ...string) {
		t.Helper()
		errs := CachePolicySpec(&spec, field.NewPath("spec"))
		var got []string
		for _, e := range errs {
			got = append(got, e.Field)
		}
		if strings.Join(got, ",") != strings.Join(wantFields, ",") {
			t.Errorf("errors on %v, want %v (%v)", got, wantFields, errs)
		}
	}
	f(v1alpha1.CachePolicySpec{})
	f(v1alpha1.CachePolicySpec{Eviction: "LFU", EvictionTTL: dur(time.Minute), RoutingFloorScore: str("0"), AffinityRouting: "Disabled"})
	f(v1alpha1.CachePolicySpec{EvictionTTL: dur(0)}, "spec.evictionTTL")
	f(v1alpha1.CachePolicySpec{EvictionTTL: dur(-time.Second)}, "spec.evictionTTL")
	f(v1alpha1.CachePolicySpec{Eviction: "lfu"}, "spec.eviction")
	f(v1alpha1.CachePolicySpec{RoutingFloorScore: str("abc")}, "spec.routingFloorScore")
	f(v1alpha1.CachePolicySpec{MinimumPrefixTokens: i32(-1), LookupTimeoutMs: i32(-2)}, "spec.minimumPrefixTokens", "spec.lookupTimeoutMs")
	f(v1alpha1.CachePolicySpec{Strategy: &v1alpha1.CachePolicyStrategy{RequireChain: b(true), EnableChainMatching: b(false)}}, "spec.strategy.requireChain")
	f(v1alpha1.CachePolicySpec{Strategy: &v1alpha1.CachePolicyStrategy{RequireChain: b(true)}})
	f(v1alpha1.CachePolicySpec{AffinityRouting: "On"}, "spec.affinityRouting")
}

func TestCacheBackendEndpoint(t *testing.T) {
	f := func(typ v1alpha1.CacheBackendType, ep string, want field.ErrorType) {
		t.Helper()
		errs := CacheBackendEndpoint(&v1alpha1.CacheBackendSpec{Type: typ, Endpoint: ep}, field.NewPath("spec"))
		switch {
		case want == "" && len(errs) != 0:
			t.Errorf("type %q endpoint %q: %v, want ok", typ, ep, errs)
		case want != "" && (len(errs) != 1 || errs[0].Type != want || errs[0].Field != "spec.endpoint"):
			t.Errorf("type %q endpoint %q: %v, want one %s on spec.endpoint", typ, ep, errs, want)
		}
	}
	f("External", "a:1", "")
	f("External", "", field.ErrorTypeRequired)
	f("External", "a", field.ErrorTypeInvalid)
	f("LMCache", "", "")
	f("", "", "")
	f("LMCache", "a:1", field.ErrorTypeForbidden)
	f("", "a:1", field.ErrorTypeForbidden)
	f("Mooncake", "a:1", field.ErrorTypeForbidden)
}

func TestIntroduced(t *testing.T) {
	p := field.NewPath("spec")
	a := field.Invalid(p.Child("a"), 1, "x")
	aAgain := field.Invalid(p.Child("a"), 1, "x") // the violation kept as it was
	a2 := field.Invalid(p.Child("a"), 2, "y")     // same field and type, a new bad value
	b := field.Invalid(p.Child("b"), 1, "x")      // a new field
	req := field.Required(p.Child("c"), "needed") // no value: kept while still missing
	got := Introduced(field.ErrorList{aAgain, b, req}, field.ErrorList{a, field.Required(p.Child("c"), "needed")})
	if len(got) != 1 || got[0] != b {
		t.Fatalf("Introduced = %v, want only spec.b", got)
	}
	// Changing a bad value to another bad value introduces a violation: an
	// UPDATE may keep what was admitted under older rules, not rewrite it.
	got = Introduced(field.ErrorList{a2}, field.ErrorList{a})
	if len(got) != 1 || got[0] != a2 {
		t.Fatalf("Introduced = %v, want spec.a with the new value", got)
	}
	if got := Introduced(nil, field.ErrorList{a}); len(got) != 0 {
		t.Fatalf("Introduced(nil) = %v", got)
	}
}

// TestCachePolicyUpdateRatchets: an UPDATE keeps a legacy bad evictionTTL
// only while it is unchanged.
func TestCachePolicyUpdateRatchets(t *testing.T) {
	p := field.NewPath("spec")
	ttl := func(d time.Duration) *v1alpha1.CachePolicySpec {
		return &v1alpha1.CachePolicySpec{EvictionTTL: &metav1.Duration{Duration: d}}
	}
	legacy := CachePolicySpec(ttl(0), p)
	if got := Introduced(CachePolicySpec(ttl(0), p), legacy); len(got) != 0 {
		t.Fatalf("unchanged legacy TTL refused: %v", got)
	}
	if got := Introduced(CachePolicySpec(ttl(-time.Hour), p), legacy); len(got) != 1 || got[0].Field != "spec.evictionTTL" {
		t.Fatalf("a different non-positive TTL admitted: %v", got)
	}
}

func TestTenantID(t *testing.T) {
	if TenantID("team-a", field.NewPath("x")) != nil {
		t.Fatal("team-a refused")
	}
	if e := TenantID("inferencecache.io/probe", field.NewPath("spec", "tenantID")); e == nil || !strings.Contains(e.Error(), "reserved") {
		t.Fatalf("reserved id: %v", e)
	}
}

func TestPDTopologySpec(t *testing.T) {
	acc := []v1alpha1.AcceleratorType{{Name: "h100"}, {Name: "a10"}}
	pool := func(name, typ string) v1alpha1.PDPool { return v1alpha1.PDPool{Name: name, AcceleratorType: typ} }
	f := func(spec v1alpha1.PDTopologySpec, want ...string) {
		t.Helper()
		errs := PDTopologySpec(&spec, field.NewPath("spec"))
		var got []string
		for _, e := range errs {
			got = append(got, e.Field)
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%+v: fields %v, want %v (%v)", spec, got, want, errs)
		}
	}
	f(v1alpha1.PDTopologySpec{})
	f(v1alpha1.PDTopologySpec{AcceleratorTypes: acc, PrefillPools: []v1alpha1.PDPool{pool("p", "h100"), pool("q", "")}, DecodePools: []v1alpha1.PDPool{pool("d", "a10")}})
	f(v1alpha1.PDTopologySpec{AcceleratorTypes: acc, PrefillPools: []v1alpha1.PDPool{pool("p", "h100"), pool("q", "b200")}, DecodePools: []v1alpha1.PDPool{pool("d", "mi300")}},
		"spec.prefillPools[1].acceleratorType", "spec.decodePools[0].acceleratorType")
	f(v1alpha1.PDTopologySpec{DecodePools: []v1alpha1.PDPool{pool("d", "h100")}}, "spec.decodePools[0].acceleratorType")

	errs := PDTopologySpec(&v1alpha1.PDTopologySpec{AcceleratorTypes: acc, PrefillPools: []v1alpha1.PDPool{pool("p", "b200")}}, field.NewPath("spec"))
	if len(errs) != 1 || errs[0].Type != field.ErrorTypeNotSupported || !strings.Contains(errs[0].Error(), `"b200"`) || !strings.Contains(errs[0].Error(), "h100, a10") {
		t.Errorf("message: %v", errs)
	}
}

func TestBackendPolicyImage(t *testing.T) {
	p := BackendPolicy{ImagePrefixes: []string{"ghcr.io/acme/", "lmcache/vllm-openai", "docker.io/lib:"}}
	f := func(image string, want bool) {
		t.Helper()
		if got := p.ImageAllowed(image); got != want {
			t.Errorf("ImageAllowed(%q) = %t, want %t", image, got, want)
		}
	}
	f("ghcr.io/acme/cache:1", true)
	f("ghcr.io/acme-evil/cache:1", false)
	f("lmcache/vllm-openai", true)
	f("lmcache/vllm-openai:v0.3.15", true)
	f("lmcache/vllm-openai@sha256:00", true)
	f("lmcache/vllm-openai-evil:1", false) // a prefix without a separator ends at a boundary
	f("docker.io/lib:x", true)
	f("evil.io/ghcr.io/acme/x", false)
	f("", false)
	if !(BackendPolicy{}).ImageAllowed("anything:at-all") {
		t.Error("the zero policy refuses an image")
	}
}

func TestBackendPolicyServiceAccount(t *testing.T) {
	p := BackendPolicy{ServiceAccounts: []string{"cache-runner", "team-a/special"}}
	f := func(ns, sa string, want bool) {
		t.Helper()
		if got := p.ServiceAccountAllowed(ns, sa); got != want {
			t.Errorf("ServiceAccountAllowed(%q, %q) = %t, want %t", ns, sa, got, want)
		}
	}
	f("x", "cache-runner", true)
	f("team-a", "special", true)
	f("team-b", "special", false)
	f("x", "admin", false)
	f("x", "", true) // the namespace's default
	if !(BackendPolicy{}).ServiceAccountAllowed("x", "admin") {
		t.Error("the zero policy refuses a ServiceAccount")
	}
	spec := &v1alpha1.CacheBackendSpec{BackendConfig: map[string]string{"image": "evil:1"}, Template: &v1alpha1.BackendPodOverride{ServiceAccountName: "admin"}}
	errs := BackendPolicy{ImagePrefixes: []string{"ok/"}, ServiceAccounts: []string{"runner"}}.CacheBackend("ns", spec, field.NewPath("spec"))
	if len(errs) != 2 || errs[0].Field != "spec.backendConfig[image]" || errs[1].Field != "spec.template.serviceAccountName" ||
		!strings.Contains(errs[0].Error(), "--allowed-backend-images") || !strings.Contains(errs[1].Error(), "--allowed-service-accounts") {
		t.Errorf("errors %v", errs)
	}
}

func TestCacheBackendEngineOverrides(t *testing.T) {
	env := []corev1.EnvVar{
		{Name: "A", Value: "1"},
		{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "k"}}},
		{Name: "F", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "R", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory"}}},
		{Name: "C", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{Key: "k"}}},
	}
	spec := &v1alpha1.CacheBackendSpec{Integration: &v1alpha1.CacheBackendIntegration{EngineOverrides: &v1alpha1.EngineOverrides{Env: env}}}
	errs := CacheBackendEngineOverrides(spec, field.NewPath("spec"))
	if len(errs) != 2 || errs[0].Field != "spec.integration.engineOverrides.env[1].valueFrom" || errs[1].Field != "spec.integration.engineOverrides.env[4].valueFrom" ||
		!strings.Contains(errs[0].Error(), "Secret") || !strings.Contains(errs[1].Error(), "ConfigMap") {
		t.Errorf("errors %v", errs)
	}
	if CacheBackendEngineOverrides(&v1alpha1.CacheBackendSpec{}, field.NewPath("spec")) != nil {
		t.Error("no overrides refused")
	}
}

func TestPromptTemplateSpec(t *testing.T) {
	slot := func(name string, typ v1alpha1.SlotType) v1alpha1.PromptTemplateSlot {
		return v1alpha1.PromptTemplateSlot{Name: name, Type: typ}
	}
	check := func(spec v1alpha1.PromptTemplateSpec) field.ErrorList {
		return PromptTemplateSpec(&spec, field.NewPath("spec"))
	}
	fields := func(errs field.ErrorList) string {
		var got []string
		for _, e := range errs {
			got = append(got, e.Field+"="+fmt.Sprint(e.BadValue))
		}
		return strings.Join(got, ",")
	}
	for _, c := range []struct {
		spec v1alpha1.PromptTemplateSpec
		want string
	}{
		{v1alpha1.PromptTemplateSpec{Body: "{{ a }} {{ b }}", Slots: []v1alpha1.PromptTemplateSlot{slot("a", v1alpha1.SlotStable), slot("b", v1alpha1.SlotMutable)}}, ""},
		{v1alpha1.PromptTemplateSpec{Body: "no slots at all"}, ""},
		{v1alpha1.PromptTemplateSpec{Body: "{{ a }} {{ c }}", Slots: []v1alpha1.PromptTemplateSlot{slot("a", v1alpha1.SlotStable), slot("b", v1alpha1.SlotMutable)}},
			"spec.body=c,spec.slots[1].name=b"},
		{v1alpha1.PromptTemplateSpec{Body: "{{ a }}", Slots: []v1alpha1.PromptTemplateSlot{slot("a", v1alpha1.SlotStable), slot("a", v1alpha1.SlotMutable)}},
			"spec.slots[1].name=a"},
		{v1alpha1.PromptTemplateSpec{Body: "{{ a }}", Slots: []v1alpha1.PromptTemplateSlot{slot("a", "Sometimes")}}, "spec.slots[0].type=Sometimes"},
	} {
		if got := fields(check(c.spec)); got != c.want {
			t.Errorf("%+v: %q, want %q", c.spec, got, c.want)
		}
	}
	if errs := check(v1alpha1.PromptTemplateSpec{Body: "{% if a %}"}); len(errs) != 1 || errs[0].Field != "spec.body" {
		t.Errorf("a body that does not compile: %v", errs)
	}

	// UPDATE ratchets: a legacy template reading an undeclared slot stays
	// editable, but a second undeclared name is refused.
	legacy := v1alpha1.PromptTemplateSpec{Body: "{{ a }} {{ x }}", Slots: []v1alpha1.PromptTemplateSlot{slot("a", v1alpha1.SlotStable)}}
	edited := *legacy.DeepCopy()
	edited.Slots[0].Description = "notes"
	if errs := Introduced(check(edited), check(legacy)); len(errs) != 0 {
		t.Errorf("description edit of a legacy template refused: %v", errs)
	}
	edited.Body = "{{ a }} {{ x }} {{ y }}"
	if got := fields(Introduced(check(edited), check(legacy))); got != "spec.body=y" {
		t.Errorf("new undeclared name: %q", got)
	}
}
