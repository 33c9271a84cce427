package picker_test

import (
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/picker"
	"github.com/inferencecache/inferencecache/policy"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// The P/D switch (pd.go): in a P/D pool the destination is the decode
// endpoint and x-prefiller-host-port names the prefill endpoint (set with
// overwrite), or is removed when the hop is skipped; an aggregated pool
// leaves the header alone.

// pdEnv is a picker over testEndpoints in P/D mode for topology ref, with
// pod-a a prefill replica, pod-b and pod-c decode replicas (pod-c busier).
func pdEnv(t *testing.T, ref string) *env {
	t.Helper()
	env := newEnv(t, func(c *picker.Config) {
		c.PD = &picker.PDConfig{Lookup: c.Lookup.(picker.PDLookuper), Topology: ref}
	})
	b, err := policy.Decode(strings.NewReader(`{"version": 8, "pdTopologies": [{"namespace": "team-a", "name": "pd",
	  "prefillPools": [{"name": "prefill"}], "decodePools": [{"name": "decode"}], "transport": "NIXL", "skipPrefillBelowTokens": 200}]}`))
	if err != nil {
		t.Fatal(err)
	}
	env.store.Apply(b)
	env.place(t, "pod-a", pb.ReplicaRole_REPLICA_ROLE_PREFILL, "prefill", 0, nil)
	env.place(t, "pod-b", pb.ReplicaRole_REPLICA_ROLE_DECODE, "decode", 0, nil)
	env.place(t, "pod-c", pb.ReplicaRole_REPLICA_ROLE_DECODE, "decode", 9, nil)
	return env
}

// place reports replica's role and pool with a load report (running
// requests) and, when toks is set, the chain of toks.
func (env *env) place(t *testing.T, replica string, role pb.ReplicaRole, pool string, running int32, toks []uint32) {
	t.Helper()
	var waiting int32
	u := &pb.CacheStateUpdate{TenantId: tenant, ModelId: model, HashScheme: scheme, ReplicaId: replica, Role: role, PdPool: pool,
		TimestampUs: time.Now().UnixMicro(), Stats: &pb.ReplicaStats{WaitingRequests: &waiting, RunningRequests: &running}}
	if toks != nil {
		sums := fingerprint.AppendChain(nil, toks, blockSize, 0, false)
		var hs [][]byte
		var cs []int32
		for _, h := range sums {
			hs, cs = append(hs, fingerprint.AppendWire(nil, h)), append(cs, blockSize)
		}
		u.Prefixes = []*pb.PrefixEntry{{BlockHashes: hs, BlockTokenCounts: cs}}
	}
	st, err := env.cache.ReportCacheState(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(u); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
}

// prefillHeader reads the answer's prefill header: its value and action
// when set, removed when the mutation removes it.
func prefillHeader(t *testing.T, m *extprocv3.ProcessingResponse) (value string, set, removed bool) {
	t.Helper()
	mut := m.GetRequestHeaders().GetResponse().GetHeaderMutation()
	for _, o := range mut.GetSetHeaders() {
		if strings.EqualFold(o.GetHeader().GetKey(), picker.PrefillHeader) {
			if o.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
				t.Errorf("prefill header append_action %v: a client's header would survive", o.GetAppendAction())
			}
			value, set = string(o.GetHeader().GetRawValue()), true
		}
	}
	for _, h := range mut.GetRemoveHeaders() {
		if strings.EqualFold(h, picker.PrefillHeader) {
			removed = true
		}
	}
	return value, set, removed
}

// pdRequest sends a whole request (a spoofed prefill header among its
// headers) and returns the headers answer; the body is drained.
func (c *client) pdRequest(body []byte, md *corev3.Metadata) *extprocv3.ProcessingResponse {
	c.t.Helper()
	c.send(requestHeaders(false, fullDuplex, md, picker.PrefillHeader, "6.6.6.6:1"))
	c.send(requestBody(body, true))
	m := c.recv()
	for {
		sr := c.recv().GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil || sr.GetEndOfStream() {
			break
		}
	}
	return m
}

func TestPDDisaggregated(t *testing.T) {
	env := pdEnv(t, "team-a/pd")
	body := chatBody(true, strings.Repeat("You are a careful assistant. ", 30), "Summarize our last meeting.")
	c := env.open(t)
	m := c.pdRequest(body, nil)
	if dest := destination(t, m); dest != "10.0.0.2:8000" {
		t.Fatalf("destination %q, want pod-b's decode endpoint alone", dest)
	}
	v, set, removed := prefillHeader(t, m)
	if !set || removed || v != "10.0.0.1:8000" {
		t.Fatalf("prefill header %q (set %v, removed %v), want pod-a's 10.0.0.1:8000", v, set, removed)
	}
	if env.obs.count("pd/disaggregated") != 1 {
		t.Fatalf("picks %v", env.obs.picks)
	}
	c.finishSSE("10.0.0.2:8000", sseEvents(100, 0)...)
	waitFor(t, "the request to end", func() bool { return env.pk.InflightTotal() == 0 })
	if !env.fb.balanced() || env.fb.started["pod-b"] != 1 {
		t.Fatalf("feedback started %v finished %v: the decode endpoint serves", env.fb.started, env.fb.finished)
	}
}

func TestPDPrefillSkipped(t *testing.T) {
	env := pdEnv(t, "pd") // a bare name, in the pool's namespace
	// A short prompt: under 200 uncached tokens on the decode replica.
	m := env.open(t).pdRequest(chatBody(false, "Hi"), nil)
	if dest := destination(t, m); dest != "10.0.0.2:8000" {
		t.Fatalf("destination %q, want pod-b", dest)
	}
	if v, set, removed := prefillHeader(t, m); set || !removed {
		t.Fatalf("prefill header %q set %v removed %v: a skipped hop removes the client's header", v, set, removed)
	}
	// A long prompt whose prefix the decode replica already holds.
	body := chatBody(false, strings.Repeat("Shared context. ", 40), "And then?")
	env.place(t, "pod-c", pb.ReplicaRole_REPLICA_ROLE_DECODE, "decode", 0, tokensOfBody(t, body))
	env.place(t, "pod-b", pb.ReplicaRole_REPLICA_ROLE_DECODE, "decode", 0, nil)
	m = env.open(t).pdRequest(body, nil)
	if dest := destination(t, m); dest != "10.0.0.3:8000" {
		t.Fatalf("destination %q, want pod-c, which caches the prompt", dest)
	}
	if _, set, removed := prefillHeader(t, m); set || !removed {
		t.Fatal("the prefill hop was not skipped for a prompt the decode replica caches")
	}
	if env.obs.count("pd/prefill_skipped") != 2 {
		t.Fatalf("picks %v", env.obs.picks)
	}
}

func TestPDFallsBackToAggregated(t *testing.T) {
	t.Run("unknown topology", func(t *testing.T) {
		env := pdEnv(t, "team-a/nope")
		body := chatBody(false, strings.Repeat("long ", 100))
		m := env.open(t).pdRequest(body, nil)
		if dest := destination(t, m); strings.Count(dest, ",") != 2 {
			t.Errorf("destination %q, want the aggregated pick with fallbacks", dest)
		}
		if _, set, removed := prefillHeader(t, m); set || !removed {
			t.Error("an aggregated pick in a P/D pool keeps the client's prefill header")
		}
		if env.obs.count("pd/disaggregated")+env.obs.count("pd/prefill_skipped") != 0 {
			t.Errorf("picks %v", env.obs.picks)
		}
	})
	t.Run("decode endpoint outside the subset hint", func(t *testing.T) {
		env := pdEnv(t, "team-a/pd")
		md := subsetMD(structpb.NewStringValue("10.0.0.1:8000,10.0.0.3:8000"))
		m := env.open(t).pdRequest(chatBody(false, strings.Repeat("long ", 100)), md)
		if dest := destination(t, m); strings.Contains(dest, "10.0.0.2") {
			t.Errorf("destination %q outside the subset", dest)
		}
		if _, set, _ := prefillHeader(t, m); set {
			t.Error("prefill header set on an aggregated pick")
		}
	})
}

// An aggregated pool (no PD) leaves the header as the client sent it.
func TestAggregatedPoolLeavesPrefillHeader(t *testing.T) {
	env := newEnv(t, nil)
	m := env.open(t).pdRequest(chatBody(false, "hello"), nil)
	if _, set, removed := prefillHeader(t, m); set || removed {
		t.Errorf("an aggregated pool touched %s", picker.PrefillHeader)
	}
}
