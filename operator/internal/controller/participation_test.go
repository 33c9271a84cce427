package controller

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/operator/claim"
)

func backend(ns, name string, sel map[string]string) v1alpha1.CacheBackend {
	b := v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if sel != nil {
		b.Spec.EngineSelector = &v1alpha1.EngineSelector{MatchLabels: sel}
	}
	return b
}

func TestAttributeReplicas(t *testing.T) {
	backends := []v1alpha1.CacheBackend{
		backend("a", "zz", map[string]string{"app": "llama"}),
		backend("a", "bb", map[string]string{"app": "llama"}),
		backend("a", "empty", map[string]string{}),
		backend("b", "annotated", nil),
	}
	pods := map[types.NamespacedName]PodMeta{
		{Namespace: "a", Name: "p1"}: {Labels: map[string]string{"app": "llama", "x": "y"}},
		{Namespace: "a", Name: "p2"}: {Labels: map[string]string{"app": "llama"}, Annotations: map[string]string{InjectedByAnnotation: "b/annotated"}},
		{Namespace: "a", Name: "p3"}: {Labels: map[string]string{"app": "llama"}, Annotations: map[string]string{InjectedByAnnotation: "b/gone"}},
		{Namespace: "a", Name: "p4"}: {Labels: map[string]string{"app": "other"}},
		// opted out of injection: no backend claims it
		{Namespace: "a", Name: "p5"}: {Labels: map[string]string{"app": "llama"}, Annotations: map[string]string{"inferencecache.io/inject": "false"}},
	}
	snap := &controlapi.CacheSnapshot{Replicas: []controlapi.ReplicaSnapshot{
		{Tenant: "a", ReplicaID: "p1"}, {Tenant: "a", ReplicaID: "p2"}, {Tenant: "a", ReplicaID: "p3"},
		{Tenant: "a", ReplicaID: "p4"}, {Tenant: "a", ReplicaID: "no-pod"}, {Tenant: "", ReplicaID: "p1"}, {Tenant: "a", ReplicaID: "p5"},
	}}
	got := AttributeReplicas(snap, backends, pods, nil)
	ids := func(key string) (out []string) {
		for _, r := range got[key] {
			out = append(out, r.ReplicaID)
		}
		return out
	}
	if g := ids("a/bb"); len(g) != 2 || g[0] != "p1" || g[1] != "p3" {
		t.Fatalf("a/bb (first by name; stale annotation falls back to the selector) = %v", g)
	}
	if g := ids("b/annotated"); len(g) != 1 || g[0] != "p2" {
		t.Fatalf("b/annotated = %v", g)
	}
	if len(got["a/zz"]) != 0 || len(got["a/empty"]) != 0 || len(got) != 2 {
		t.Fatalf("unexpected owners %v", got)
	}
}

// TestAttributeReplicasCrossNamespace: a backend with allowCrossNamespace
// is credited with another namespace's replicas only when that namespace
// consents to it.
func TestAttributeReplicasCrossNamespace(t *testing.T) {
	shared := backend("home", "shared", map[string]string{"app": "llama"})
	shared.Spec.AllowCrossNamespace = true
	pods := map[types.NamespacedName]PodMeta{
		{Namespace: "yes", Name: "p"}: {Labels: map[string]string{"app": "llama"}},
		{Namespace: "no", Name: "p"}:  {Labels: map[string]string{"app": "llama"}},
	}
	snap := &controlapi.CacheSnapshot{Replicas: []controlapi.ReplicaSnapshot{{Tenant: "yes", ReplicaID: "p"}, {Tenant: "no", ReplicaID: "p"}}}
	got := AttributeReplicas(snap, []v1alpha1.CacheBackend{shared}, pods, map[string]map[string]string{
		"yes": {claim.AllowClaimsFromAnnotation: "home"},
		"no":  {claim.AllowClaimsFromAnnotation: "elsewhere"},
	})
	if g := got["home/shared"]; len(g) != 1 || g[0].Tenant != "yes" {
		t.Fatalf("home/shared = %v, want the consenting namespace's replica only", g)
	}
}

// The ranks of a data-parallel engine report replicas <pod>-dp<r>; they are
// attributed through their pod.
func TestAttributeReplicasDataParallel(t *testing.T) {
	pods := map[types.NamespacedName]PodMeta{
		{Namespace: "a", Name: "eng"}:     {Labels: map[string]string{"app": "llama"}},
		{Namespace: "a", Name: "eng-dp9"}: {Labels: map[string]string{"app": "other"}}, // a pod really named so wins
	}
	snap := &controlapi.CacheSnapshot{Replicas: []controlapi.ReplicaSnapshot{
		{Tenant: "a", ReplicaID: "eng-dp0"}, {Tenant: "a", ReplicaID: "eng-dp1"}, {Tenant: "a", ReplicaID: "eng-dp9"},
		{Tenant: "a", ReplicaID: "eng-dpx"}, {Tenant: "a", ReplicaID: "eng-dp"},
	}}
	got := AttributeReplicas(snap, []v1alpha1.CacheBackend{backend("a", "b", map[string]string{"app": "llama"})}, pods, nil)
	var ids []string
	for _, r := range got["a/b"] {
		ids = append(ids, r.ReplicaID)
	}
	if len(ids) != 2 || ids[0] != "eng-dp0" || ids[1] != "eng-dp1" {
		t.Fatalf("a/b = %v, want eng-dp0, eng-dp1", ids)
	}
}

func TestParticipation(t *testing.T) {
	t1 := time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC)
	t2 := t1.Add(time.Minute)
	p, hits, queries := Participation([]*controlapi.ReplicaSnapshot{
		{PrefixCount: 3, LastEventAt: t1, T2HitTokens: 30, T2QueryTokens: 100},
		{PrefixCount: 4, LastEventAt: t2, T2HitTokens: 20, T2QueryTokens: 100},
		{PrefixCount: 0},
	})
	if p.PrefixCount != 7 || !p.LastEventAt.Time.Equal(t2) || *p.T2HitRate != "0.25" || p.HitRate != nil || hits != 50 || queries != 200 {
		t.Fatalf("participation %+v %d %d", p, hits, queries)
	}
	p, _, _ = Participation([]*controlapi.ReplicaSnapshot{{T2HitTokens: 500, T2QueryTokens: 100}})
	if *p.T2HitRate != "1" {
		t.Fatalf("not clamped: %v", *p.T2HitRate)
	}
	p, _, _ = Participation(nil)
	if p.PrefixCount != 0 || p.LastEventAt != nil || p.T2HitRate != nil {
		t.Fatalf("empty %+v", p)
	}
}

// TestBackendMetricsDeltas drives writeBackends through fake clients: the
// counter adds only positive deltas, and series are pruned with the replicas.
func TestBackendMetricsDeltas(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	b := backend("ns", "cb", map[string]string{"app": "llama"})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vllm-0", Labels: map[string]string{"app": "llama"}}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(&b, pod).WithStatusSubresource(&v1alpha1.CacheBackend{}).Build()
	m := NewBackendMetrics()
	r := &SnapshotPoller{Backends: c, Pods: c, Writer: c, Metrics: m}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	poll := func(queries, hits int64, present bool) {
		t.Helper()
		snap := &controlapi.CacheSnapshot{}
		if present {
			snap.Replicas = []controlapi.ReplicaSnapshot{{Tenant: "ns", ReplicaID: "vllm-0", PrefixCount: 2, T2QueryTokens: queries, T2HitTokens: hits}}
		}
		var out passOutcome
		r.writeBackends(ctx, snap, &out)
		if _, err := out.result(time.Second); err != nil {
			t.Fatal(err)
		}
	}
	poll(100, 0, true)
	if v := testutil.ToFloat64(m.QueryTokens.WithLabelValues("ns/cb")); v != 100 {
		t.Fatalf("counter %v", v)
	}
	if v := testutil.ToFloat64(m.HitRate.WithLabelValues("ns/cb")); v != 0 {
		t.Fatalf("hit rate %v", v)
	}
	poll(40, 10, true) // engine restart: the cumulative dropped
	poll(90, 45, true)
	if v := testutil.ToFloat64(m.QueryTokens.WithLabelValues("ns/cb")); v != 150 {
		t.Fatalf("counter %v, want 100 + 50 (the drop is clamped)", v)
	}
	if v := testutil.ToFloat64(m.HitRate.WithLabelValues("ns/cb")); v != 0.5 {
		t.Fatalf("hit rate %v", v)
	}
	var got v1alpha1.CacheBackend
	if err := c.Get(ctx, client.ObjectKeyFromObject(&b), &got); err != nil {
		t.Fatal(err)
	}
	if ip := got.Status.IndexParticipation; ip == nil || ip.PrefixCount != 2 || ip.T2HitRate == nil || *ip.T2HitRate != "0.5" {
		t.Fatalf("status %+v", got.Status.IndexParticipation)
	}
	poll(0, 0, false) // the replicas left the snapshot
	if n := testutil.CollectAndCount(m.QueryTokens) + testutil.CollectAndCount(m.HitRate); n != 0 {
		t.Fatalf("%d stale series", n)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(&b), &got); err != nil {
		t.Fatal(err)
	}
	if ip := got.Status.IndexParticipation; ip == nil || ip.PrefixCount != 0 || ip.T2HitRate != nil {
		t.Fatalf("status after drain %+v", ip)
	}
}
