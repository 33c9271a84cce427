package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The scale-out overlay: default/ with three servers consuming NATS and
// soft anti-affinity; default/'s server PodDisruptionBudget keeps two of
// them up. Nothing else changes.
func TestConfigScaleoutOverlay(t *testing.T) {
	objs := render(t, "../../config/scaleout")
	base := render(t, "../../config/default")
	if len(objs) != len(base) {
		t.Fatalf("%d objects, want default's %d", len(objs), len(base))
	}
	srv := find(objs, "Deployment", "inferencecache-server")
	if srv == nil {
		t.Fatal("no server Deployment")
	}
	if n, _, _ := unstructured.NestedFieldNoCopy(srv.Object, "spec", "replicas"); fmt.Sprint(n) != "3" {
		t.Errorf("server replicas %v, want 3", n)
	}
	ctrs, _, _ := unstructured.NestedSlice(srv.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(ctrs[0].(map[string]any), "args")
	if !slices.Contains(args, "--nats-url=nats://nats.nats.svc.cluster.local:4222") {
		t.Errorf("server args %q lack --nats-url", args)
	}
	if !slices.Contains(args, "--allowed-controller-sa=system:serviceaccount:inferencecache-system:inferencecache-controller") {
		t.Errorf("the overlay lost the base args: %q", args)
	}
	// The injected sidecars publish to the same NATS: every server then
	// builds the same index (the controller passes its --nats-url on).
	var serverNATS string
	for _, a := range args {
		if strings.HasPrefix(a, "--nats-url=") {
			serverNATS = a
		}
	}
	ctl := podSpec(t, find(objs, "Deployment", "inferencecache-controller")).Containers[0].Args
	if !slices.Contains(ctl, serverNATS) {
		t.Errorf("controller args %q lack the servers' %s: the sidecars would report to one server over gRPC", ctl, serverNATS)
	}
	if base := podSpec(t, find(base, "Deployment", "inferencecache-controller")).Containers[0].Args; slices.ContainsFunc(base, func(a string) bool { return strings.HasPrefix(a, "--nats-url") }) {
		t.Errorf("default/ controller passes a NATS URL: %q", base)
	}
	terms, _, _ := unstructured.NestedSlice(srv.Object, "spec", "template", "spec", "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution")
	if len(terms) != 1 {
		t.Errorf("anti-affinity terms %v", terms)
	}
	pdb := find(objs, "PodDisruptionBudget", "inferencecache-server")
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget")
	}
	if v, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "maxUnavailable"); fmt.Sprint(v) != "1" {
		t.Errorf("PDB maxUnavailable %v", v)
	}
	sel, _, _ := unstructured.NestedStringMap(pdb.Object, "spec", "selector", "matchLabels")
	if sel["app.kubernetes.io/name"] != "inferencecache-server" || pdb.GetNamespace() != "inferencecache-system" {
		t.Errorf("PDB selector %v namespace %q", sel, pdb.GetNamespace())
	}
}

// The overlay's server Deployment and PDB pass the apiserver's validation
// (dry run; the other objects are default/'s, applied by
// TestConfigDefaultAppliesToAPIServer).
func TestConfigScaleoutAppliesToAPIServer(t *testing.T) {
	ctx := needEnv(t)
	objs := render(t, "../../config/scaleout")
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "inferencecache-system"}}
	if err := k8s.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	dryRunApply(t, ctx, []*unstructured.Unstructured{
		find(objs, "Deployment", "inferencecache-server"),
		find(objs, "PodDisruptionBudget", "inferencecache-server"),
	})
}
