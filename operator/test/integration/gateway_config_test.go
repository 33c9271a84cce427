package integration

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// The gateway overlay (docs/gateway.md): default/ plus the picker's
// listener, an InferencePool whose endpointPickerRef reaches it, an
// HTTPRoute to the pool, read-only RBAC in the pool's namespace and a
// NetworkPolicy for the gateway. Checked as the API types read it.
func TestConfigGatewayOverlay(t *testing.T) {
	objs := render(t, "../../config/gateway")
	pool := find(objs, "InferencePool", "llama-pool")
	if pool == nil {
		t.Fatal("no InferencePool")
	}
	raw, _ := json.Marshal(pool.Object)
	var ip giev1.InferencePool
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ip); err != nil {
		t.Fatalf("the InferencePool does not decode as %s: %v", giev1.GroupVersion, err)
	}
	ref := ip.Spec.EndpointPickerRef
	if ref.Port == nil || ref.Port.Number != 9002 || ref.FailureMode != giev1.EndpointPickerFailClose {
		t.Fatalf("endpointPickerRef %+v", ref)
	}
	svc := find(objs, "Service", string(ref.Name))
	if svc == nil || svc.GetNamespace() != ip.Namespace {
		t.Fatalf("endpointPickerRef %q names no Service in %s", ref.Name, ip.Namespace)
	}
	if ext, _, _ := unstructured.NestedString(svc.Object, "spec", "externalName"); ext != "inferencecache-server.inferencecache-system.svc.cluster.local" {
		t.Fatalf("picker Service points at %q", ext)
	}
	server := find(objs, "Service", "inferencecache-server")
	ports, _, _ := unstructured.NestedSlice(server.Object, "spec", "ports")
	found := false
	for _, p := range ports {
		m := p.(map[string]any)
		found = found || (fmt.Sprint(m["port"]) == "9002" && m["appProtocol"] == "http2")
	}
	if !found {
		t.Fatalf("the server Service has no :9002 http2 port: %v", ports)
	}
	dep := find(objs, "Deployment", "inferencecache-server")
	ctrs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(ctrs[0].(map[string]any), "args")
	if !slices.Contains(args, "--inference-pool="+ip.Namespace+"/"+ip.Name) {
		t.Fatalf("server args %q do not name the pool", args)
	}
	cports, _, _ := unstructured.NestedSlice(ctrs[0].(map[string]any), "ports")
	if !strings.Contains(fmt.Sprint(cports), "9002") || !strings.Contains(fmt.Sprint(cports), "ext-proc") {
		t.Fatalf("container ports %v lack ext-proc 9002", cports)
	}
	role := find(objs, "Role", "inferencecache-picker")
	if role == nil || role.GetNamespace() != ip.Namespace {
		t.Fatal("no Role in the pool's namespace")
	}
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	if got := fmt.Sprint(rules); !strings.Contains(got, "inferencepools") || !strings.Contains(got, "pods") || strings.Contains(got, "create") {
		t.Fatalf("role rules %s: want get/list/watch on pods and inferencepools only", got)
	}
	route := find(objs, "HTTPRoute", "llama")
	refs, _, _ := unstructured.NestedSlice(route.Object, "spec", "rules")
	if !strings.Contains(fmt.Sprint(refs), "InferencePool") {
		t.Fatalf("route rules %v do not reach the pool", refs)
	}
	if np := find(objs, "NetworkPolicy", "inferencecache-server-ext-proc"); np == nil || !strings.Contains(fmt.Sprint(np.Object), "9002") {
		t.Fatal("no NetworkPolicy for :9002")
	}
}
