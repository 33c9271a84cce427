package claim

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

func backend(ns, name string, sel map[string]string) v1alpha1.CacheBackend {
	b := v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if sel != nil {
		b.Spec.EngineSelector = &v1alpha1.EngineSelector{MatchLabels: sel}
	}
	return b
}

func TestSelects(t *testing.T) {
	f := func(sel *v1alpha1.EngineSelector, labels map[string]string, want bool) {
		t.Helper()
		if got := Selects(sel, labels); got != want {
			t.Errorf("Selects(%v, %v) = %t, want %t", sel, labels, got, want)
		}
	}
	pod := map[string]string{"app": "vllm", "tier": "a"}
	f(nil, pod, false)
	f(&v1alpha1.EngineSelector{}, pod, false)
	f(&v1alpha1.EngineSelector{MatchLabels: map[string]string{}}, pod, false)
	f(&v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "vllm"}}, pod, true)
	f(&v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "vllm", "tier": "b"}}, pod, false)
	f(&v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": ""}}, map[string]string{}, false)
	f(&v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": ""}}, map[string]string{"app": ""}, true)
}

func TestClaimant(t *testing.T) {
	all := []v1alpha1.CacheBackend{
		backend("ns", "zeta", map[string]string{"app": "vllm"}),
		backend("other", "alpha", map[string]string{"app": "vllm"}),
		backend("ns", "beta", map[string]string{"app": "vllm", "tier": "a"}),
		backend("ns", "aaa-empty", map[string]string{}),
		backend("ns", "aab-nil", nil),
	}
	f := func(ns string, labels map[string]string, want string) {
		t.Helper()
		got := ""
		if c := Claimant(all, ns, labels, nil); c != nil {
			got = c.Namespace + "/" + c.Name
		}
		if got != want {
			t.Errorf("Claimant(%s, %v) = %q, want %q", ns, labels, got, want)
		}
	}
	f("ns", map[string]string{"app": "vllm", "tier": "a"}, "ns/beta")
	f("ns", map[string]string{"app": "vllm"}, "ns/zeta")
	f("ns", map[string]string{"app": "sglang"}, "")
	f("other", map[string]string{"app": "vllm", "tier": "a"}, "other/alpha")
	f("third", map[string]string{"app": "vllm"}, "")
	if all[0].Name != "zeta" {
		t.Errorf("Claimant reordered its input")
	}
	if p := (Pod{Namespace: "ns", Labels: map[string]string{"app": "vllm", "tier": "a"}}); !Claims(&all[2], all, p) || Claims(&all[0], all, p) {
		t.Errorf("Claims disagrees with Claimant")
	}
}

func TestOwner(t *testing.T) {
	cross := func(b v1alpha1.CacheBackend) v1alpha1.CacheBackend { b.Spec.AllowCrossNamespace = true; return b }
	all := []v1alpha1.CacheBackend{
		cross(backend("z-home", "a", map[string]string{"app": "vllm"})),
		cross(backend("home", "shared", map[string]string{"app": "vllm"})),
		cross(backend("home", "empty", map[string]string{})),
		backend("home", "private", map[string]string{"app": "sglang"}),
		backend("local", "mine", map[string]string{"app": "vllm", "tier": "a"}),
	}
	f := func(ns string, labels map[string]string, want string) {
		t.Helper()
		got := ""
		consent := map[string]string{AllowClaimsFromAnnotation: "home, z-home"}
		if o := Owner(all, Pod{Namespace: ns, NamespaceAnnotations: consent, Labels: labels}); o != nil {
			got = o.Namespace + "/" + o.Name
		}
		if got != want {
			t.Errorf("Owner(%s, %v) = %q, want %q", ns, labels, got, want)
		}
	}
	f("local", map[string]string{"app": "vllm", "tier": "a"}, "local/mine") // a local claim wins
	f("local", map[string]string{"app": "vllm"}, "home/shared")             // first (namespace, name) that allows it
	f("home", map[string]string{"app": "vllm"}, "home/shared")
	f("z-home", map[string]string{"app": "vllm"}, "z-home/a")
	f("local", map[string]string{"app": "sglang"}, "") // private does not reach out
	f("other", map[string]string{}, "")
	local := Pod{Namespace: "local", NamespaceAnnotations: map[string]string{AllowClaimsFromAnnotation: "z-home,home"}, Labels: map[string]string{"app": "vllm"}}
	if !Claims(&all[1], all, local) || Claims(&all[0], all, local) {
		t.Error("Claims disagrees with Owner")
	}
	// Consent decides which cross-namespace backends are candidates at all.
	local.NamespaceAnnotations = map[string]string{AllowClaimsFromAnnotation: "z-home"}
	if o := Owner(all, local); o == nil || o.Namespace != "z-home" {
		t.Errorf("Owner with consent for z-home only = %v", o)
	}
	local.NamespaceAnnotations = nil
	if o := Owner(all, local); o != nil {
		t.Errorf("Owner without consent = %s/%s, want none", o.Namespace, o.Name)
	}
}

func TestConsents(t *testing.T) {
	f := func(value, from string, want bool) {
		t.Helper()
		if got := Consents(map[string]string{AllowClaimsFromAnnotation: value}, from); got != want {
			t.Errorf("Consents(%q, %q) = %t, want %t", value, from, got, want)
		}
	}
	f("a", "a", true)
	f("a,b", "b", true)
	f(" a , b ", "b", true)
	f("ab", "a", false)
	f("*", "a", false) // no wildcard
	f("", "", false)
	f("a,,", "", false)
	if Consents(nil, "a") {
		t.Error("Consents(nil) = true")
	}
}

// TestOptedOut: a pod with inferencecache.io/inject "false", as a label or
// an annotation, is claimed by no backend under any of the rules.
func TestOptedOut(t *testing.T) {
	cross := backend("home", "shared", map[string]string{"app": "vllm"})
	cross.Spec.AllowCrossNamespace = true
	all := []v1alpha1.CacheBackend{backend("ns", "lmc", map[string]string{"app": "vllm"}), cross}
	f := func(labels, annotations map[string]string, claimed bool) {
		t.Helper()
		if got := Claimant(all, "ns", labels, annotations) != nil; got != claimed {
			t.Errorf("Claimant(%v, %v) claims %t, want %t", labels, annotations, got, claimed)
		}
		if got := Owner(all, Pod{Namespace: "other", NamespaceAnnotations: map[string]string{AllowClaimsFromAnnotation: "home"}, Labels: labels, Annotations: annotations}) != nil; got != claimed {
			t.Errorf("Owner(other, %v, %v) claims %t, want %t", labels, annotations, got, claimed)
		}
		if got := Claims(&all[0], all, Pod{Namespace: "ns", Labels: labels, Annotations: annotations}); got != claimed {
			t.Errorf("Claims(%v, %v) = %t, want %t", labels, annotations, got, claimed)
		}
		if got := OptedOut(labels, annotations); got == claimed {
			t.Errorf("OptedOut(%v, %v) = %t", labels, annotations, got)
		}
	}
	f(map[string]string{"app": "vllm"}, nil, true)
	f(map[string]string{"app": "vllm", InjectKey: "true"}, map[string]string{InjectKey: "yes"}, true)
	f(map[string]string{"app": "vllm", InjectKey: "false"}, nil, false)
	f(map[string]string{"app": "vllm"}, map[string]string{InjectKey: "false"}, false)
}
