package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/inferencecache/policy"
)

func pdt(ns, name string, mut ...func(*v1alpha1.PDTopologySpec)) v1alpha1.PDTopology {
	t := v1alpha1.PDTopology{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 3}, Spec: v1alpha1.PDTopologySpec{
		PrefillPools: []v1alpha1.PDPool{{Name: "prefill", MatchLabels: map[string]string{"role": "prefill"}, Replicas: ptr(int32(4)), AcceleratorType: "h100"}},
		DecodePools:  []v1alpha1.PDPool{{Name: "decode", MatchLabels: map[string]string{"role": "decode"}}},
	}}
	for _, m := range mut {
		m(&t.Spec)
	}
	return t
}

func ptmpl(ns, name, body string, slots ...v1alpha1.PromptTemplateSlot) v1alpha1.PromptTemplate {
	return v1alpha1.PromptTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.PromptTemplateSpec{Body: body, Slots: slots}}
}

// TestResolvePD: the version-8 lists are sorted by (namespace, name), carry
// the spec as is, decode on the server's own decoder, and leave out (with
// why) an entry the server would refuse, so the rest still propagates.
func TestResolvePD(t *testing.T) {
	tops := []v1alpha1.PDTopology{
		pdt("team-b", "a", func(s *v1alpha1.PDTopologySpec) { s.Transport = v1alpha1.TransportMooncake }),
		pdt("team-a", "z", func(s *v1alpha1.PDTopologySpec) {
			s.Transport, s.SkipPrefillBelowTokens, s.KVLocality = v1alpha1.TransportNIXL, ptr(int32(0)), v1alpha1.LocalityZone
			s.AcceleratorTypes = []v1alpha1.AcceleratorType{{Name: "h100", Vendor: "nvidia", Model: "H100", MatchLabels: map[string]string{"gpu": "h100"}}}
		}),
		// A pool name with '/' the CRD does not refuse; the server does.
		pdt("team-a", "bad", func(s *v1alpha1.PDTopologySpec) { s.DecodePools[0].Name = "de/code" }),
	}
	tmpls := []v1alpha1.PromptTemplate{
		ptmpl("team-a", "support", "System: {{ system }}\nQ: {{ question }}",
			v1alpha1.PromptTemplateSlot{Name: "system", Type: v1alpha1.SlotStable, Required: true, Description: "the system prompt"},
			v1alpha1.PromptTemplateSlot{Name: "question", Type: v1alpha1.SlotMutable}),
		ptmpl("team-a", "huge", strings.Repeat("x", policy.MaxTemplateBodyBytes+1)),
	}
	res := ResolvePD(tops, tmpls)
	wantTop := policy.PDTopology{
		Namespace: "team-a", Name: "z",
		PrefillPools:     []policy.PDPool{{Name: "prefill", MatchLabels: map[string]string{"role": "prefill"}, Replicas: ptr(int32(4)), AcceleratorType: "h100"}},
		DecodePools:      []policy.PDPool{{Name: "decode", MatchLabels: map[string]string{"role": "decode"}}},
		AcceleratorTypes: []policy.AcceleratorType{{Name: "h100", Vendor: "nvidia", Model: "H100", MatchLabels: map[string]string{"gpu": "h100"}}},
		Transport:        "NIXL", SkipPrefillBelowTokens: ptr(int32(0)), KVLocality: "Zone",
	}
	if len(res.Topologies) != 2 || !reflect.DeepEqual(res.Topologies[0], wantTop) || res.Topologies[1].Namespace != "team-b" || res.Topologies[1].Transport != "Mooncake" {
		g, _ := json.Marshal(res.Topologies)
		t.Fatalf("topologies %s", g)
	}
	if len(res.Templates) != 1 || res.Templates[0].Name != "support" || len(res.Templates[0].Slots) != 2 ||
		res.Templates[0].Slots[0] != (policy.TemplateSlot{Name: "system", Type: "Stable", Required: true, Description: "the system prompt"}) {
		t.Fatalf("templates %+v", res.Templates)
	}
	if got, want := res.Templates[0].TemplateRevision, policy.TemplateRevision(tmpls[0].Spec.Body, TemplateSlots(&tmpls[0].Spec)); got != want || got == "" {
		t.Fatalf("templateRevision %q, want %q", got, want)
	}
	for _, key := range []types.NamespacedName{{Namespace: "team-a", Name: "bad"}, {Namespace: "team-a", Name: "huge"}} {
		if !strings.Contains(res.Invalid[key], "routing server would refuse") {
			t.Errorf("invalid[%s] = %q", key, res.Invalid[key])
		}
	}
	if len(res.Invalid) != 2 {
		t.Errorf("invalid %v", res.Invalid)
	}

	body := BuildBody(nil, nil)
	AddPD(body, res)
	if body.Version != 8 {
		t.Fatalf("version %d with topologies", body.Version)
	}
	raw, _ := json.Marshal(body)
	got, err := policy.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("the server refuses the controller's body: %v", err)
	}
	if len(got.PDTopologies) != 2 || len(got.PromptTemplates) != 1 {
		t.Fatalf("decoded %+v", got)
	}
	AddPD(body, PDResolution{})
	if body.Version != 7 || body.PDTopologies != nil {
		t.Fatalf("without topologies and templates: version %d", body.Version)
	}
}

// TestTemplateRevisionMatchesServer: status.templateRevision and the
// revision the server computes for a pushed template agree.
func TestTemplateRevisionMatchesServer(t *testing.T) {
	spec := ptmpl("ns", "t", "{{ a }}{{ b }}", v1alpha1.PromptTemplateSlot{Name: "a", Type: v1alpha1.SlotStable, Required: true, Description: "d"},
		v1alpha1.PromptTemplateSlot{Name: "b", Type: v1alpha1.SlotMutable}).Spec
	if got, want := TemplateRevision(&spec), policy.TemplateRevision(spec.Body, []policy.TemplateSlot{
		{Name: "a", Type: "Stable", Required: true, Description: "d"}, {Name: "b", Type: "Mutable"}}); got != want {
		t.Fatalf("controller %s, server %s", got, want)
	}
}

func podMeta(ns, name string, lbl map[string]string, deleting bool) metav1.PartialObjectMetadata {
	m := metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl}}
	if deleting {
		m.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	}
	return m
}

// TestPDTopologyStatus: members per pool, and the Ready condition's reasons
// in their order of precedence.
func TestPDTopologyStatus(t *testing.T) {
	top := pdt("ns", "t", func(s *v1alpha1.PDTopologySpec) {
		s.DecodePools = append(s.DecodePools, v1alpha1.PDPool{Name: "unlabelled"})
	})
	pods := []metav1.PartialObjectMetadata{
		podMeta("ns", "p1", map[string]string{"role": "prefill", "x": "y"}, false),
		podMeta("ns", "p2", map[string]string{"role": "prefill"}, true), // terminating
		podMeta("ns", "d1", map[string]string{"role": "decode"}, false),
		podMeta("ns", "o", map[string]string{"other": "x"}, false),
	}
	members := PoolMembers(&top, pods)
	want := []v1alpha1.PDPoolStatus{{Name: "prefill", Side: "Prefill", Members: 1}, {Name: "decode", Side: "Decode", Members: 1}, {Name: "unlabelled", Side: "Decode", Members: 0}}
	if !reflect.DeepEqual(members, want) {
		t.Fatalf("members %+v", members)
	}
	srvA, srvB := serverTarget{Name: "a", Address: "10.0.0.1:8081"}, serverTarget{Name: "b", Address: "10.0.0.2:8081"}
	ok := &pushReport{Results: []pushResult{{server: srvA}, {server: srvB}}}
	fell := &pushReport{Results: []pushResult{{server: srvA}, {server: srvB, refused: &PushError{Server: "http://b", Code: 400, Text: `HTTP 400: unknown field "pdTopologies"`}}}}
	failed := &pushReport{Results: []pushResult{{server: srvA, err: io.ErrUnexpectedEOF}}}
	none := &pushReport{Service: types.NamespacedName{Namespace: "sys", Name: "server"}}
	noPrefill := PoolMembers(&top, pods[2:])
	noDecode := PoolMembers(&top, pods[:1])
	for _, c := range []struct {
		name    string
		members []v1alpha1.PDPoolStatus
		invalid string
		rep     *pushReport
		status  metav1.ConditionStatus
		reason  string
		msg     string
	}{
		{"ready", members, "", ok, metav1.ConditionTrue, "Propagated", "2 of 2 ready servers took the topology; 1 prefill and 1 decode pods"},
		{"invalid", members, "bad pool", ok, metav1.ConditionFalse, "Invalid", "not pushed: bad pool"},
		{"fallback", members, "", fell, metav1.ConditionFalse, "NotPropagated", `server b refused the version-8 policy body (cannot push policy to http://b: HTTP 400: unknown field "pdTopologies")`},
		{"fallback before no prefill", noPrefill, "", fell, metav1.ConditionFalse, "NotPropagated", "server b refused"},
		{"push failed", members, "", failed, metav1.ConditionFalse, "NotPropagated", "no server acknowledged the push: server a"},
		{"no servers", members, "", none, metav1.ConditionFalse, "NotPropagated", "Service sys/server list no ready server"},
		{"no prefill", noPrefill, "", ok, metav1.ConditionFalse, "NoPrefillReplicas", "matches the matchLabels of a prefill pool (prefill)"},
		{"no decode", noDecode, "", ok, metav1.ConditionFalse, "NoDecodeReplicas", "decode pool (decode, unlabelled)"},
	} {
		st := PDTopologyStatus(&top, v1alpha1.PDTopologyStatus{}, c.members, c.invalid, c.rep)
		cond := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
		if st.ObservedGeneration != 3 || cond == nil || cond.Status != c.status || cond.Reason != c.reason || !strings.Contains(cond.Message, c.msg) || cond.ObservedGeneration != 3 {
			t.Errorf("%s: status %+v", c.name, st)
		}
		if !reflect.DeepEqual(st.Pools, c.members) {
			t.Errorf("%s: pools %+v", c.name, st.Pools)
		}
		// A second pass over the same state computes an equal status (no write).
		if again := PDTopologyStatus(&top, st, c.members, c.invalid, c.rep); !reflect.DeepEqual(again, st) {
			t.Errorf("%s: not stable:\n%+v\n%+v", c.name, again, st)
		}
	}
}

// v7Server is a /policy endpoint on 127.0.0.1 that decodes as a version-7
// server does: a body at version 8, or carrying the version-8 lists, is
// refused with HTTP 400. It records the versions it was sent.
type v7Server struct {
	mu       sync.Mutex // guards versions
	versions []int
}

func (s *v7Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var b struct {
		Version      int             `json:"version"`
		PDTopologies json.RawMessage `json:"pdTopologies"`
	}
	raw, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(raw, &b)
	s.mu.Lock()
	s.versions = append(s.versions, b.Version)
	s.mu.Unlock()
	if b.Version > 7 || b.PDTopologies != nil {
		http.Error(w, `policy: unsupported policy snapshot version 8`, http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// TestPushAllFallback: a server refusing the version-8 body with 400 is sent
// the version-7 body once and counts as acknowledged with refused set; a
// refusal of another kind (503) is an error and gets no fallback.
func TestPushAllFallback(t *testing.T) {
	old := &v7Server{}
	hs := httptest.NewServer(old)
	defer hs.Close()
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "busy", http.StatusServiceUnavailable) }))
	defer busy.Close()
	body := BuildBody(nil, nil)
	AddPD(body, ResolvePD([]v1alpha1.PDTopology{pdt("ns", "t")}, nil))
	raw, _ := encodePolicy(body)
	raw7, _ := encodePolicy(policy.WithoutVersion8(body))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := pushAll(ctx, &ServerClient{}, []serverTarget{{Name: "old", URL: hs.URL}, {Name: "busy", URL: busy.URL}}, raw, raw7)
	if res[0].err != nil || res[0].refused == nil || !strings.Contains(res[0].refused.Error(), "HTTP 400: policy: unsupported policy snapshot version 8") {
		t.Fatalf("old server: %+v", res[0])
	}
	if res[1].err == nil || res[1].refused != nil || !strings.Contains(res[1].err.Error(), "HTTP 503") {
		t.Fatalf("busy server: %+v", res[1])
	}
	old.mu.Lock()
	defer old.mu.Unlock()
	if !reflect.DeepEqual(old.versions, []int{8, 7}) {
		t.Fatalf("versions sent %v, want [8 7]", old.versions)
	}
}
