package controlserver

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/controlserver/auth"
	"github.com/inferencecache/inferencecache/controlserver/internal/kubetest"
)

// resultCounter is a per-endpoint auth Recorder (the server backs these with
// inferencecache_{snapshot,policy,probe}_auth_total).
type resultCounter struct {
	mu sync.Mutex // guards n
	n  map[string]int
}

func (c *resultCounter) Record(r string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[r]++
}

func (c *resultCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := map[string]int{}
	for k, v := range c.n {
		m[k] = v
	}
	return m
}

// TestEndpointsWithRealAuth wires the three endpoints the way the server
// does — one auth.Authenticator per endpoint, controller audience on
// /snapshot and /probe, policy audience on /policy — against a real
// kube-apiserver, then stops the apiserver to show /policy failing closed.
func TestEndpointsWithRealAuth(t *testing.T) {
	kube := kubetest.Start(t)
	const (
		ns            = "inferencecache-system"
		controller    = "inferencecache-controller"
		intruder      = "intruder"
		controllerAud = "inferencecache.io/controller"
		policyAud     = "inferencecache.io/policy"
	)
	kube.CreateServiceAccount(t, ns, controller)
	kube.CreateServiceAccount(t, ns, intruder)
	reviewer, err := auth.NewReviewerForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	counters := map[string]*resultCounter{"snapshot": {}, "policy": {}, "probe": {}}
	newAuth := func(audience, endpoint string) func(http.Handler) http.Handler {
		a, err := auth.New(auth.Config{
			Reviewer: reviewer, Audience: audience, AllowedIdentity: auth.ServiceAccountPrefix + ns + ":" + controller,
			Recorder: counters[endpoint], ReviewTimeout: 5 * time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		return a.Wrap
	}
	e := newEnv(t, func(c *Config) {
		c.SnapshotAuth = newAuth(controllerAud, "snapshot")
		c.PolicyAuth = newAuth(policyAud, "policy")
		c.ProbeAuth = newAuth(controllerAud, "probe")
	})

	ctrlTok := kube.Token(t, ns, controller, controllerAud)
	polTok := kube.Token(t, ns, controller, policyAud)
	intruderPolTok := kube.Token(t, ns, intruder, policyAud)
	defaultTok := kube.Token(t, ns, controller)
	probeBody := `{"backend":"ns/cb","model":"functional-self-test","hashScheme":"vllm"}`

	type call struct {
		name, method, path, body, token string
		code                            int
	}
	run := func(t *testing.T, cases []call) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				var hdr []string
				if c.token != "" {
					hdr = []string{"Authorization", "Bearer " + c.token}
				}
				r := e.do(t, c.method, c.path, strings.NewReader(c.body), hdr...)
				if r.code != c.code {
					t.Fatalf("status %d, want %d (body %q)", r.code, c.code, r.body)
				}
			})
		}
	}
	run(t, []call{
		{"snapshot: controller token", http.MethodGet, "/snapshot", "", ctrlTok, http.StatusOK},
		{"snapshot: policy token", http.MethodGet, "/snapshot", "", polTok, http.StatusUnauthorized},
		{"snapshot: default-audience token", http.MethodGet, "/snapshot", "", defaultTok, http.StatusUnauthorized},
		{"snapshot: no token", http.MethodGet, "/snapshot", "", "", http.StatusUnauthorized},
		{"probe: controller token", http.MethodPost, "/probe", probeBody, ctrlTok, http.StatusOK},
		{"probe: policy token", http.MethodPost, "/probe", probeBody, polTok, http.StatusUnauthorized},
		{"probe: controller token, wrong method", http.MethodGet, "/probe", "", ctrlTok, http.StatusMethodNotAllowed},
		{"policy: policy token", http.MethodPost, "/policy", v7Body, polTok, http.StatusNoContent},
		{"policy: controller token cannot push", http.MethodPost, "/policy", v7Body, ctrlTok, http.StatusUnauthorized},
		{"policy: other SA", http.MethodPost, "/policy", v7Body, intruderPolTok, http.StatusForbidden},
		{"policy: tampered", http.MethodPost, "/policy", v7Body, kubetest.Tamper(polTok), http.StatusUnauthorized},
		{"policy: bad body with a good token", http.MethodPut, "/policy", `{"version": 2}`, polTok, http.StatusBadRequest},
	})
	if t.Failed() {
		t.FailNow()
	}
	if g := e.store.Load().Generation(); g != 1 {
		t.Errorf("store generation %d, want 1 (only the authorized push applied)", g)
	}
	wantCounts := map[string]map[string]int{
		"snapshot": {auth.ResultOK: 1, auth.ResultUnauth: 3},
		"probe":    {auth.ResultOK: 2, auth.ResultUnauth: 1},
		"policy":   {auth.ResultOK: 2, auth.ResultUnauth: 2, auth.ResultForbidden: 1},
	}
	for ep, want := range wantCounts {
		if got := counters[ep].snapshot(); !mapsEqual(got, want) {
			t.Errorf("%s auth results %v, want %v", ep, got, want)
		}
	}

	freshPolTok := kube.Token(t, ns, controller, policyAud)
	kube.StopAPIServer(t)
	run(t, []call{
		{"apiserver down: uncached policy token fails closed", http.MethodPost, "/policy", v7Body, freshPolTok, http.StatusServiceUnavailable},
		{"apiserver down: cached controller token still reads", http.MethodGet, "/snapshot", "", ctrlTok, http.StatusOK},
	})
	if got := counters["policy"].snapshot()[auth.ResultError]; got != 1 {
		t.Errorf("policy error results %d, want 1", got)
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
