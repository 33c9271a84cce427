// Package validation holds the field rules of the inferencecache.io kinds
// that the CRD schema cannot express. The admission webhooks enforce them at
// write time, and the propagation controller applies the same CachePolicy
// rules again to objects that reached etcd another way (created before the
// webhook existed, or with the webhook bypassed) so that a policy it cannot
// honor is reported Invalid instead of half applied.
//
// Every function is pure: no I/O, safe for concurrent use.
package validation

import (
	"fmt"
	"math"
	"net"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/prompttemplate"
)

var floorScoreRE = regexp.MustCompile(v1alpha1.RoutingFloorScorePattern)

// ParseRoutingFloorScore parses spec.routingFloorScore. It accepts exactly
// what the CRD pattern admits and returns a finite, non-negative float32.
func ParseRoutingFloorScore(s string) (float32, error) {
	if !floorScoreRE.MatchString(s) {
		return 0, fmt.Errorf("%q is not a decimal of the form 0, 5 or 0.25 (at most 8 integer and 6 fractional digits)", s)
	}
	v, err := strconv.ParseFloat(s, 32)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, fmt.Errorf("%q is not a finite non-negative number", s)
	}
	return float32(v), nil
}

// CachePolicySpec returns every field of spec that the server cannot honor.
// The first error of a field is enough; each message says how to fix it.
func CachePolicySpec(spec *v1alpha1.CachePolicySpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch spec.Eviction {
	case "", v1alpha1.EvictionLRU, v1alpha1.EvictionLFU:
	default:
		errs = append(errs, field.NotSupported(p.Child("eviction"), spec.Eviction,
			[]string{string(v1alpha1.EvictionLRU), string(v1alpha1.EvictionLFU)}))
	}
	if ttl := spec.EvictionTTL; ttl != nil && ttl.Duration <= 0 {
		errs = append(errs, field.Invalid(p.Child("evictionTTL"), ttl.Duration.String(),
			fmt.Sprintf("must be a positive duration such as 15m or 1h; remove the field to use the server default (%s)", policy.DefaultTTL)))
	}
	for _, f := range []struct {
		name string
		v    *int32
	}{
		{"minimumPrefixTokens", spec.MinimumPrefixTokens},
		{"minimumMatchedTokens", spec.MinimumMatchedTokens},
		{"lookupTimeoutMs", spec.LookupTimeoutMs},
	} {
		if f.v != nil && *f.v < 0 {
			errs = append(errs, field.Invalid(p.Child(f.name), *f.v, "must be 0 or greater (0 disables it)"))
		}
	}
	if s := spec.RoutingFloorScore; s != nil {
		if _, err := ParseRoutingFloorScore(*s); err != nil {
			errs = append(errs, field.Invalid(p.Child("routingFloorScore"), *s,
				`must be a non-negative decimal string such as "0.1", "5" or "0" ("0" disables the floor)`))
		}
	}
	if st := spec.Strategy; st != nil && st.RequireChain != nil && *st.RequireChain &&
		st.EnableChainMatching != nil && !*st.EnableChainMatching {
		errs = append(errs, field.Invalid(p.Child("strategy", "requireChain"), true,
			"requireChain: true needs enableChainMatching: true, otherwise every request would be refused; set enableChainMatching: true or requireChain: false"))
	}
	switch spec.AffinityRouting {
	case "", v1alpha1.AffinityRoutingEnabled, v1alpha1.AffinityRoutingDisabled:
	default:
		errs = append(errs, field.NotSupported(p.Child("affinityRouting"), spec.AffinityRouting,
			[]string{string(v1alpha1.AffinityRoutingEnabled), string(v1alpha1.AffinityRoutingDisabled)}))
	}
	return errs
}

// TenantID returns an error when id is the reserved probe tenant.
func TenantID(id string, p *field.Path) *field.Error {
	if id == policy.ReservedTenantID {
		return field.Forbidden(p, fmt.Sprintf("%q is reserved for the server's functional self-test; choose another tenant id", id))
	}
	return nil
}

// CacheBackendEndpoint checks spec.endpoint against spec.type: required for
// External, refused for every other type, and of the form host:port or
// lm://host:port with a numeric port and IPv6 literals in brackets.
func CacheBackendEndpoint(spec *v1alpha1.CacheBackendSpec, p *field.Path) field.ErrorList {
	ep := p.Child("endpoint")
	typ := spec.Type
	if typ == "" {
		typ = v1alpha1.BackendLMCache
	}
	if typ != v1alpha1.BackendExternal {
		if spec.Endpoint != "" {
			return field.ErrorList{field.Forbidden(ep, fmt.Sprintf(
				"endpoint may only be set when type is External; type %s backends are provisioned by the controller, which publishes their address in status.endpoint (remove spec.endpoint, or set type: External)", typ))}
		}
		return nil
	}
	if spec.Endpoint == "" {
		return field.ErrorList{field.Required(ep, "type External needs the backend's address as host:port or lm://host:port, e.g. lmcache.cache.svc:8200")}
	}
	if err := Endpoint(spec.Endpoint); err != nil {
		return field.ErrorList{field.Invalid(ep, spec.Endpoint, err.Error())}
	}
	return nil
}

// CacheBackendRemoteStorage checks spec.remoteStorage.endpoint parses as a
// remote tier's address (controlapi.ParseT2Endpoint, what the server's
// /probe dials).
func CacheBackendRemoteStorage(spec *v1alpha1.CacheBackendSpec, p *field.Path) field.ErrorList {
	rs := spec.RemoteStorage
	if rs == nil {
		return nil
	}
	if _, err := controlapi.ParseT2Endpoint(rs.Endpoint); err != nil {
		return field.ErrorList{field.Invalid(p.Child("remoteStorage", "endpoint"), controlapi.RedactT2Endpoint(rs.Endpoint), err.Error())}
	}
	return nil
}

// Endpoint validates an External backend address: host:port or
// lm://host:port, no other scheme, no path, query or fragment, a port in
// 1..65535, and an IPv6 literal only in brackets ([::1]:8200).
func Endpoint(s string) error {
	rest := s
	if scheme, after, ok := strings.Cut(s, "://"); ok {
		if scheme != "lm" {
			return fmt.Errorf("scheme %q is not supported; write host:port or lm://host:port", scheme+"://")
		}
		rest = after
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		return fmt.Errorf("must not carry a path, query or fragment (found %q); write host:port or lm://host:port", rest[i:])
	}
	if strings.Count(rest, ":") > 1 && !strings.HasPrefix(rest, "[") {
		return fmt.Errorf("an IPv6 address must be in brackets, e.g. [%s]:8200", strings.TrimSuffix(rest, ":"))
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return fmt.Errorf("must be host:port or lm://host:port with a port, e.g. lmcache.cache.svc:8200 (%v)", err)
	}
	if host == "" {
		return fmt.Errorf("the host is empty; write host:port, e.g. lmcache.cache.svc:%s", port)
	}
	if strings.HasPrefix(rest, "[") {
		if ip := net.ParseIP(host); ip == nil || ip.To4() != nil {
			return fmt.Errorf("brackets are only for IPv6 literals; %q is not one", host)
		}
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q must be a number from 1 to 65535", port)
	}
	return nil
}

// CacheBackendEngineOverrides refuses spec.integration.engineOverrides.env
// entries whose valueFrom reads a Secret or a ConfigMap. The pod webhook
// copies these variables into every engine pod the backend claims (with
// allowCrossNamespace, pods of other namespaces too), and the kubelet
// resolves them in the pod's namespace: whoever may write a CacheBackend
// would read those objects through the engines without being granted them.
// Plain values and references to the pod's own fields or resources are
// fine.
func CacheBackendEngineOverrides(spec *v1alpha1.CacheBackendSpec, p *field.Path) field.ErrorList {
	in := spec.Integration
	if in == nil || in.EngineOverrides == nil {
		return nil
	}
	var errs field.ErrorList
	for i, e := range in.EngineOverrides.Env {
		if kind := EnvReference(e); kind != "" {
			errs = append(errs, field.Forbidden(p.Child("integration", "engineOverrides", "env").Index(i).Child("valueFrom"), fmt.Sprintf(
				"variable %s reads a %s; engineOverrides are injected into every engine pod the backend claims, so they may not read Secrets or ConfigMaps: set the variable on the engine's own pod template, or use a plain value",
				e.Name, kind)))
		}
	}
	return errs
}

// EnvReference names what an environment variable reads that a CacheBackend
// may not hand to engine pods: "Secret" or "ConfigMap"; "" for anything
// else (a value, a field or resource of the pod).
func EnvReference(e corev1.EnvVar) string {
	switch f := e.ValueFrom; {
	case f == nil:
		return ""
	case f.SecretKeyRef != nil:
		return "Secret"
	case f.ConfigMapKeyRef != nil:
		return "ConfigMap"
	}
	return ""
}

// BackendPolicy is what the cluster's administrator lets a CacheBackend ask
// the controller to run: the image of its managed cache server
// (spec.backendConfig.image) and the ServiceAccount of that server's pods
// (spec.template.serviceAccountName). Anyone who may write a CacheBackend in
// a namespace can otherwise run any image under any ServiceAccount of that
// namespace. An empty list allows anything. The zero value allows anything.
type BackendPolicy struct {
	// ImagePrefixes are the allowed image prefixes, e.g.
	// "ghcr.io/acme/" or "lmcache/vllm-openai:". A prefix that does not end
	// in '/', ':' or '@' only matches at a boundary: "lmcache/vllm-openai"
	// allows "lmcache/vllm-openai:v1" but not "lmcache/vllm-openai-evil".
	ImagePrefixes []string
	// ServiceAccounts are the allowed ServiceAccount names: "name" allows
	// that name in any namespace, "namespace/name" in one namespace. An
	// unset serviceAccountName (the namespace's default) is always allowed.
	ServiceAccounts []string
}

// ImageAllowed reports whether image matches an allowed prefix (any image
// when there are none).
func (p BackendPolicy) ImageAllowed(image string) bool {
	if len(p.ImagePrefixes) == 0 {
		return true
	}
	for _, pre := range p.ImagePrefixes {
		if pre == "" || !strings.HasPrefix(image, pre) {
			continue
		}
		if image == pre || strings.ContainsAny(pre[len(pre)-1:], "/:@") || strings.ContainsAny(image[len(pre):len(pre)+1], "/:@") {
			return true
		}
	}
	return false
}

// ServiceAccountAllowed reports whether the ServiceAccount sa of namespace
// ns may run the managed server (always for an empty sa).
func (p BackendPolicy) ServiceAccountAllowed(ns, sa string) bool {
	if sa == "" || len(p.ServiceAccounts) == 0 {
		return true
	}
	for _, a := range p.ServiceAccounts {
		if a == sa || a == ns+"/"+sa {
			return true
		}
	}
	return false
}

// CacheBackend returns the fields of a CacheBackend of namespace ns that
// p does not allow: spec.backendConfig.image and
// spec.template.serviceAccountName.
func (p BackendPolicy) CacheBackend(ns string, spec *v1alpha1.CacheBackendSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if img := spec.BackendConfig[BackendConfigImage]; img != "" && !p.ImageAllowed(img) {
		errs = append(errs, field.Forbidden(path.Child("backendConfig").Key(BackendConfigImage), fmt.Sprintf(
			"image %q is not allowed for cache servers here; allowed prefixes (controller flag --allowed-backend-images): %s; remove the key to run the controller's default image",
			img, strings.Join(p.ImagePrefixes, ", "))))
	}
	if t := spec.Template; t != nil && !p.ServiceAccountAllowed(ns, t.ServiceAccountName) {
		errs = append(errs, field.Forbidden(path.Child("template", "serviceAccountName"), fmt.Sprintf(
			"ServiceAccount %q is not allowed for cache servers here; allowed (controller flag --allowed-service-accounts): %s; remove it to run as the namespace's default",
			t.ServiceAccountName, strings.Join(p.ServiceAccounts, ", "))))
	}
	return errs
}

// BackendConfigImage is the spec.backendConfig key of the managed cache
// server's image.
const BackendConfigImage = "image"

// PDTopologySpec checks that every pool's acceleratorType (when set) names
// an entry of spec.acceleratorTypes. An empty acceleratorType is allowed: the
// pool is not tied to an accelerator class.
func PDTopologySpec(spec *v1alpha1.PDTopologySpec, p *field.Path) field.ErrorList {
	names := make([]string, 0, len(spec.AcceleratorTypes))
	known := make(map[string]bool, len(spec.AcceleratorTypes))
	for _, a := range spec.AcceleratorTypes {
		names = append(names, a.Name)
		known[a.Name] = true
	}
	var errs field.ErrorList
	check := func(pools []v1alpha1.PDPool, child string) {
		for i, pool := range pools {
			if pool.AcceleratorType == "" || known[pool.AcceleratorType] {
				continue
			}
			fp := p.Child(child).Index(i).Child("acceleratorType")
			if len(names) == 0 {
				errs = append(errs, field.Invalid(fp, pool.AcceleratorType, fmt.Sprintf(
					"pool %q names accelerator type %q but spec.acceleratorTypes is empty; add an entry named %q there, or remove acceleratorType",
					pool.Name, pool.AcceleratorType, pool.AcceleratorType)))
				continue
			}
			e := field.NotSupported(fp, pool.AcceleratorType, names)
			e.Detail = fmt.Sprintf("pool %q must name an entry of spec.acceleratorTypes (%s); add %q there or pick one of them",
				pool.Name, strings.Join(names, ", "), pool.AcceleratorType)
			errs = append(errs, e)
		}
	}
	check(spec.PrefillPools, "prefillPools")
	check(spec.DecodePools, "decodePools")
	return errs
}

// PromptTemplateSpec checks a template body against its slot declarations
// (prompttemplate.Check): the body compiles, names only declared slots and
// uses every one it declares. A problem with the body is reported on
// spec.body with the offending name as its value; one with a declaration on
// that slot's name or type.
func PromptTemplateSpec(spec *v1alpha1.PromptTemplateSpec, p *field.Path) field.ErrorList {
	slots := make([]policy.TemplateSlot, len(spec.Slots))
	for i, s := range spec.Slots {
		slots[i] = policy.TemplateSlot{Name: s.Name, Type: string(s.Type), Required: s.Required}
	}
	var errs field.ErrorList
	for _, pr := range prompttemplate.Check(spec.Body, slots) {
		fp := p.Child("body")
		if pr.Slot >= 0 {
			fp = p.Child("slots").Index(pr.Slot).Child(pr.Attr)
		}
		errs = append(errs, field.Invalid(fp, pr.Value, pr.Detail))
	}
	return errs
}

// Introduced returns the errors of now that are not already among before,
// comparing (type, field, bad value). An UPDATE is refused only for what it
// newly breaks: an object admitted under older, looser rules can still be
// edited elsewhere, and may keep its bad value, but a bad field the update
// changes must be changed to a valid value (as the apiserver ratchets CRD
// schema validation). Errors that carry no value (Required, Forbidden)
// match on type and field alone.
func Introduced(now, before field.ErrorList) field.ErrorList {
	type key struct {
		t     field.ErrorType
		f     string
		value string
	}
	keyOf := func(e *field.Error) key { return key{e.Type, e.Field, fmt.Sprint(e.BadValue)} }
	old := make(map[key]bool, len(before))
	for _, e := range before {
		old[keyOf(e)] = true
	}
	var out field.ErrorList
	for _, e := range now {
		if !old[keyOf(e)] {
			out = append(out, e)
		}
	}
	return out
}
