package controlserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/policy"
)

// fakeSnapshots returns a fixed snapshot.
type fakeSnapshots struct {
	mu   sync.Mutex // guards snap
	snap controlapi.CacheSnapshot
}

func (f *fakeSnapshots) Snapshot() controlapi.CacheSnapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

// fakeProber echoes the backend and records the last request.
type fakeProber struct {
	calls atomic.Int64 // Probe calls; added by request goroutines, read by the test
	mu    sync.Mutex   // guards last and hadDeadline
	last  controlapi.ProbeRequest
	// hadDeadline records whether the last ctx carried a deadline.
	hadDeadline bool
}

func (f *fakeProber) Probe(ctx context.Context, req controlapi.ProbeRequest) controlapi.ProbeResponse {
	f.calls.Add(1)
	_, dl := ctx.Deadline()
	f.mu.Lock()
	f.last, f.hadDeadline = req, dl
	f.mu.Unlock()
	return controlapi.ProbeResponse{
		Backend: req.Backend, Ingest: controlapi.StageOK, Routing: controlapi.StageFailed, T2: controlapi.StageSkipped,
		Errors: []controlapi.ProbeError{{Stage: controlapi.StageRouting, Message: "no PREFIX_MATCH for " + req.Model}},
	}
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var sampleSnapshot = controlapi.CacheSnapshot{
	Replicas: []controlapi.ReplicaSnapshot{
		{ReplicaID: "pod-a", Tenant: "team-a", CacheMemoryBytes: 1 << 30, HitRate: 0.5, Pressure: 0.25,
			LastUpdate: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), PrefixCount: 3,
			LastEventAt: time.Date(2026, 11, 30, 12, 0, 1, 0, time.UTC), StatsReported: true, T2HitTokens: 7, T2QueryTokens: 9},
		{ReplicaID: "pod-b", LastUpdate: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), PrefixCount: 1},
	},
	Tenants: []controlapi.TenantSnapshot{
		{TenantID: "", IndexEntries: 1},
		{TenantID: "team-a", IndexEntries: 3, HitRate: 0.5, HitRateReported: true},
	},
	TotalPrefixes: 4,
}

type env struct {
	store  *policy.Store
	snaps  *fakeSnapshots
	prober *fakeProber
	logs   *syncBuffer
	srv    *httptest.Server
	client *http.Client
}

// newEnv serves NewHandler on 127.0.0.1 with mod applied to the Config.
func newEnv(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	e := &env{
		store:  policy.NewStore(),
		snaps:  &fakeSnapshots{snap: sampleSnapshot},
		prober: &fakeProber{},
		logs:   &syncBuffer{},
	}
	cfg := Config{
		Policies: e.store, Snapshots: e.snaps, Prober: e.prober,
		Logger: slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	h, err := NewHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(h) // listens on 127.0.0.1
	t.Cleanup(e.srv.Close)
	// DisableCompression: the test sets Accept-Encoding itself and wants the
	// raw encoded body.
	e.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableCompression: true}}
	t.Cleanup(e.client.CloseIdleConnections)
	return e
}

type response struct {
	code   int
	header http.Header
	body   []byte
}

func (e *env) do(t *testing.T, method, path string, body io.Reader, header ...string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, e.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, b}
}

func TestNewHandlerValidation(t *testing.T) {
	store, snaps, prober := policy.NewStore(), &fakeSnapshots{}, &fakeProber{}
	for name, cfg := range map[string]Config{
		"nil Policies":  {Snapshots: snaps, Prober: prober},
		"nil Snapshots": {Policies: store, Prober: prober},
		"nil Prober":    {Policies: store, Snapshots: snaps},
	} {
		if h, err := NewHandler(cfg); !errors.Is(err, ErrInvalidConfig) || h != nil {
			t.Errorf("%s: NewHandler = %v, %v", name, h, err)
		}
	}
	e := newEnv(t, nil)
	for _, p := range []string{"/policy", "/snapshot", "/probe"} {
		if !strings.Contains(e.logs.String(), "insecure mode)\" path="+p) {
			t.Errorf("no insecure-mode WARN for %s:\n%s", p, e.logs)
		}
	}
}

const v7Body = `{"version": 7, "policies": [{"namespace": "team-a", "minimumPrefixTokens": 32, "eviction": "lfu"},
	{"namespace": "team-b", "lookupTimeoutMs": 25}], "tenants": [{"tenantID": "team-a", "maxIndexEntries": 10}]}`

func TestPolicy(t *testing.T) {
	e := newEnv(t, nil)

	t.Run("POST applies", func(t *testing.T) {
		r := e.do(t, http.MethodPost, "/policy", strings.NewReader(v7Body), "Content-Type", "application/json")
		if r.code != http.StatusNoContent || len(r.body) != 0 {
			t.Fatalf("status %d body %q", r.code, r.body)
		}
		snap := e.store.Load()
		if snap.Generation() != 1 || snap.Tenant("team-a").MinimumPrefixTokens != 32 || !snap.Tenant("team-a").HasQuota {
			t.Fatalf("not applied: gen %d team-a %+v", snap.Generation(), *snap.Tenant("team-a"))
		}
		logs := e.logs.String()
		for _, s := range []string{"level=INFO", "policy snapshot applied", "version=7", "policies=2", "tenants=1", "generation=1"} {
			if !strings.Contains(logs, s) {
				t.Errorf("log lacks %q:\n%s", s, logs)
			}
		}
	})
	t.Run("PUT applies, replace-on-write", func(t *testing.T) {
		r := e.do(t, http.MethodPut, "/policy", strings.NewReader(`{"version": 3, "policies": [{"namespace": "team-b"}]}`))
		if r.code != http.StatusNoContent {
			t.Fatalf("status %d body %q", r.code, r.body)
		}
		snap := e.store.Load()
		if snap.Generation() != 2 || *snap.Tenant("team-a") != policy.Defaults || !snap.Tenant("team-b").HasPolicy {
			t.Fatalf("gen %d team-a %+v", snap.Generation(), *snap.Tenant("team-a"))
		}
	})

	t.Run("version 8 applies topologies and templates", func(t *testing.T) {
		r := e.do(t, http.MethodPost, "/policy", strings.NewReader(`{"version": 8, "policies": [{"namespace": "team-b"}],
		  "pdTopologies": [{"namespace": "team-b", "name": "pd", "prefillPools": [{"name": "p"}], "decodePools": [{"name": "d"}], "transport": "NIXL"}],
		  "promptTemplates": [{"namespace": "team-b", "name": "t", "body": "{{ s }}", "slots": [{"name": "s", "type": "Stable"}]}]}`))
		if r.code != http.StatusNoContent {
			t.Fatalf("status %d body %q", r.code, r.body)
		}
		snap := e.store.Load()
		if top := snap.Topology("", "team-b"); top == nil || top.Transport != policy.TransportNIXL || snap.Template("team-b/t", "") == nil || !snap.Tenant("team-b").HasPolicy {
			t.Fatalf("topology %+v, template %+v", top, snap.Template("team-b/t", ""))
		}
		// Replace-on-write: the next push without them drops them.
		if r := e.do(t, http.MethodPost, "/policy", strings.NewReader(`{"version": 7, "policies": [{"namespace": "team-b"}]}`)); r.code != http.StatusNoContent {
			t.Fatalf("status %d", r.code)
		}
		if snap := e.store.Load(); snap.Topologies() != 0 || snap.Templates() != 0 {
			t.Error("a push without topologies and templates kept them")
		}
	})

	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
		t.Run("405 "+m, func(t *testing.T) {
			r := e.do(t, m, "/policy", nil)
			if r.code != http.StatusMethodNotAllowed || r.header.Get("Allow") != "POST, PUT" {
				t.Fatalf("status %d Allow %q", r.code, r.header.Get("Allow"))
			}
		})
	}

	huge := `{"version": 7, "policies": []}` + strings.Repeat(" ", policy.MaxBodyBytes)
	bad := []struct {
		name, body, want string
	}{
		{"version 2", `{"version": 2, "policies": []}`, "unsupported policy snapshot version 2"},
		{"version 9", `{"version": 9, "policies": []}`, "unsupported policy snapshot version 9"},
		{"missing version", `{"policies": []}`, "unsupported policy snapshot version 0"},
		{"unknown field", `{"version": 7, "policies": [], "bogus": true}`, `unknown field "bogus"`},
		{"unknown nested field", `{"version": 7, "policies": [{"namespace": "a", "ttl": 1}]}`, `unknown field "ttl"`},
		{"bad JSON", `{"version": 7,`, "invalid JSON"},
		{"wrong type", `{"version": "7"}`, "invalid JSON"},
		{"trailing", `{"version": 7} {}`, "trailing data"},
		{"empty", ``, "empty body"},
		{"too large", huge, "exceeds 1 MiB"},
		{"invalid topology", `{"version": 8, "pdTopologies": [{"namespace": "a", "name": "t", "transport": "rdma"}]}`, `transport "rdma"`},
		{"v8 list at version 7", `{"version": 7, "promptTemplates": [{"namespace": "a", "name": "t", "body": "x"}]}`, "need version 8"},
	}
	for _, c := range bad {
		t.Run("400 "+c.name, func(t *testing.T) {
			before := e.store.Load()
			r := e.do(t, http.MethodPost, "/policy", strings.NewReader(c.body))
			if r.code != http.StatusBadRequest {
				t.Fatalf("status %d body %q", r.code, r.body)
			}
			if !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") {
				t.Errorf("Content-Type %q", r.header.Get("Content-Type"))
			}
			if !strings.Contains(string(r.body), c.want) {
				t.Errorf("body %q does not name the problem (%q)", r.body, c.want)
			}
			if e.store.Load() != before {
				t.Error("a rejected push changed the store")
			}
		})
	}
	t.Run("exactly 1 MiB is accepted", func(t *testing.T) {
		b := `{"version": 7, "policies": [{"namespace": "edge"}]}`
		b += strings.Repeat(" ", policy.MaxBodyBytes-len(b))
		if r := e.do(t, http.MethodPost, "/policy", strings.NewReader(b)); r.code != http.StatusNoContent {
			t.Fatalf("status %d body %q", r.code, r.body)
		}
		if !e.store.Load().Tenant("edge").HasPolicy {
			t.Error("not applied")
		}
	})
	if !strings.Contains(e.logs.String(), "policy push rejected") {
		t.Error("rejections are not logged")
	}
}

// readAll decodes a body according to its Content-Encoding.
func decodeBody(t *testing.T, r response) []byte {
	t.Helper()
	switch ce := r.header.Get("Content-Encoding"); ce {
	case "":
		return r.body
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		return b
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		b, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		return b
	default:
		t.Fatalf("unexpected Content-Encoding %q", ce)
		return nil
	}
}

func TestSnapshot(t *testing.T) {
	e := newEnv(t, nil)
	want, err := json.Marshal(sampleSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		accept []string
		coding string
	}{
		{nil, ""},
		{[]string{"identity"}, ""},
		{[]string{"br"}, ""},
		{[]string{"gzip;q=0"}, ""},
		{[]string{"gzip"}, "gzip"},
		{[]string{"x-gzip"}, "gzip"},
		{[]string{"zstd"}, "zstd"},
		{[]string{"gzip, deflate, br, zstd"}, "zstd"},
		{[]string{"gzip", "zstd"}, "zstd"},
		{[]string{"zstd;q=0, gzip"}, "gzip"},
		{[]string{"gzip;q=0.5, zstd;q=0.4"}, "gzip"},
		{[]string{"*"}, "zstd"},
		{[]string{"*;q=0.1, zstd;q=0"}, "gzip"},
		{[]string{"GZIP;Q=1"}, "gzip"},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%q", c.accept), func(t *testing.T) {
			var hdr []string
			for _, a := range c.accept {
				hdr = append(hdr, "Accept-Encoding", a)
			}
			r := e.do(t, http.MethodGet, "/snapshot", nil, hdr...)
			if r.code != http.StatusOK {
				t.Fatalf("status %d body %q", r.code, r.body)
			}
			if got := r.header.Get("Content-Encoding"); got != c.coding {
				t.Fatalf("Content-Encoding %q, want %q", got, c.coding)
			}
			if r.header.Get("Content-Type") != "application/json" || !strings.Contains(strings.Join(r.header.Values("Vary"), ","), "Accept-Encoding") {
				t.Errorf("headers %v", r.header)
			}
			got := decodeBody(t, r)
			if !bytes.Equal(got, want) {
				t.Fatalf("body %s, want %s", got, want)
			}
			var back controlapi.CacheSnapshot
			if err := json.Unmarshal(got, &back); err != nil || !reflect.DeepEqual(back, sampleSnapshot) {
				t.Fatalf("round trip: %v\n%+v", err, back)
			}
			if c.coding == "" && r.header.Get("Content-Length") != fmt.Sprint(len(want)) {
				t.Errorf("identity Content-Length %q", r.header.Get("Content-Length"))
			}
		})
	}
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodHead, http.MethodDelete} {
		t.Run("405 "+m, func(t *testing.T) {
			r := e.do(t, m, "/snapshot", nil)
			if r.code != http.StatusMethodNotAllowed || r.header.Get("Allow") != "GET" {
				t.Fatalf("status %d Allow %q", r.code, r.header.Get("Allow"))
			}
		})
	}
	t.Run("large snapshot, concurrent, pooled encoders", func(t *testing.T) {
		big := controlapi.CacheSnapshot{}
		for i := range 5000 {
			big.Replicas = append(big.Replicas, controlapi.ReplicaSnapshot{ReplicaID: fmt.Sprintf("pod-%05d", i), Tenant: "t", PrefixCount: int64(i)})
		}
		e.snaps.mu.Lock()
		e.snaps.snap = big
		e.snaps.mu.Unlock()
		defer func() {
			e.snaps.mu.Lock()
			e.snaps.snap = sampleSnapshot
			e.snaps.mu.Unlock()
		}()
		wantBig, _ := json.Marshal(big)
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Go(func() {
				coding := []string{"zstd", "gzip", "identity"}[g%3]
				for range 5 {
					r := e.do(t, http.MethodGet, "/snapshot", nil, "Accept-Encoding", coding)
					if got := decodeBody(t, r); !bytes.Equal(got, wantBig) {
						t.Errorf("%s: body differs (%d vs %d bytes)", coding, len(got), len(wantBig))
						return
					}
					if coding != "identity" && len(r.body) >= len(wantBig)/4 {
						t.Errorf("%s: %d bytes for %d of JSON: not compressed?", coding, len(r.body), len(wantBig))
					}
				}
			})
		}
		wg.Wait()
	})
	t.Run("values JSON cannot carry are clamped, never a 500", func(t *testing.T) {
		bad := controlapi.CacheSnapshot{
			Replicas: []controlapi.ReplicaSnapshot{
				{ReplicaID: "future", LastUpdate: time.UnixMicro(math.MaxInt64).UTC(), LastEventAt: time.UnixMicro(math.MaxInt64).UTC(),
					HitRate: float32(math.Inf(1)), PrefixCount: 1},
				{ReplicaID: "past", LastUpdate: time.UnixMicro(math.MinInt64).UTC(), Pressure: float32(math.NaN())},
				{ReplicaID: "fine", LastUpdate: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)},
			},
			Tenants: []controlapi.TenantSnapshot{{TenantID: "t", HitRate: float32(math.NaN())}},
		}
		source := controlapi.CacheSnapshot{
			Replicas: slices.Clone(bad.Replicas),
			Tenants:  slices.Clone(bad.Tenants),
		}
		e.snaps.mu.Lock()
		e.snaps.snap = source
		e.snaps.mu.Unlock()
		defer func() {
			e.snaps.mu.Lock()
			e.snaps.snap = sampleSnapshot
			e.snaps.mu.Unlock()
		}()
		r := e.do(t, http.MethodGet, "/snapshot", nil)
		if r.code != http.StatusOK {
			t.Fatalf("status %d body %q", r.code, r.body)
		}
		var got controlapi.CacheSnapshot
		if err := json.Unmarshal(r.body, &got); err != nil {
			t.Fatal(err)
		}
		maxT := time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
		minT := time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)
		if f := got.Replicas[0]; !f.LastUpdate.Equal(maxT) || !f.LastEventAt.Equal(maxT) || f.HitRate != 0 || f.PrefixCount != 1 {
			t.Errorf("future row %+v", f)
		}
		if p := got.Replicas[1]; !p.LastUpdate.Equal(minT) || p.Pressure != 0 {
			t.Errorf("past row %+v", p)
		}
		if f := got.Replicas[2]; !f.LastUpdate.Equal(bad.Replicas[2].LastUpdate) {
			t.Errorf("fine row changed: %+v", f)
		}
		if got.Tenants[0].HitRate != 0 {
			t.Errorf("tenant row %+v", got.Tenants[0])
		}
		// The source's slices are not written.
		if !reflect.DeepEqual(source.Replicas[0], bad.Replicas[0]) || !math.IsNaN(float64(source.Tenants[0].HitRate)) {
			t.Error("sanitizing wrote through to the source's slices")
		}
		if !strings.Contains(e.logs.String(), "values=6") {
			t.Errorf("no warning naming the 6 clamped values: %s", e.logs.String())
		}
	})
}

func TestNegotiateEncoding(t *testing.T) {
	for in, want := range map[string]string{
		"":                         "identity",
		"identity":                 "identity",
		"deflate, br":              "identity",
		"gzip":                     "gzip",
		"zstd":                     "zstd",
		"gzip;q=1, zstd;q=1":       "zstd",
		"gzip;q=1, zstd;q=0.999":   "gzip",
		"zstd;q=bogus, gzip":       "gzip",
		"zstd;q=2":                 "identity",
		"zstd;q=-1":                "identity",
		"zstd; q=0.3 ; foo=bar":    "zstd",
		"*;q=0":                    "identity",
		"*;q=0, gzip":              "gzip",
		" , ,gzip":                 "gzip",
		"zstd;q=0, zstd;q=0.5":     "zstd", // the most favourable repeat counts
		"x-gzip;q=0.2, zstd;q=0.1": "gzip",
	} {
		if got := negotiateEncoding([]string{in}); got != want {
			t.Errorf("negotiateEncoding(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestProbe(t *testing.T) {
	e := newEnv(t, nil)
	t.Run("200 passthrough", func(t *testing.T) {
		body := `{"backend": "ns/cb", "model": "functional-self-test", "hashScheme": "vllm", "backendType": "LMCache"}`
		r := e.do(t, http.MethodPost, "/probe", strings.NewReader(body))
		if r.code != http.StatusOK || r.header.Get("Content-Type") != "application/json" {
			t.Fatalf("status %d type %q body %q", r.code, r.header.Get("Content-Type"), r.body)
		}
		var got controlapi.ProbeResponse
		if err := json.Unmarshal(r.body, &got); err != nil {
			t.Fatal(err)
		}
		want := (&fakeProber{}).Probe(context.Background(), controlapi.ProbeRequest{Backend: "ns/cb", Model: "functional-self-test"})
		if !reflect.DeepEqual(got, want) {
			t.Errorf("response %+v, want %+v", got, want)
		}
		e.prober.mu.Lock()
		last, dl := e.prober.last, e.prober.hadDeadline
		e.prober.mu.Unlock()
		if last != (controlapi.ProbeRequest{Backend: "ns/cb", Model: "functional-self-test", HashScheme: "vllm", BackendType: "LMCache"}) {
			t.Errorf("prober got %+v", last)
		}
		if !dl {
			t.Error("the prober's ctx has no deadline")
		}
	})
	t.Run("200 without the optional backendType", func(t *testing.T) {
		r := e.do(t, http.MethodPost, "/probe", strings.NewReader(`{"backend":"b","model":"m","hashScheme":"sglang"}`+"\n"))
		if r.code != http.StatusOK {
			t.Fatalf("status %d body %q", r.code, r.body)
		}
	})
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		t.Run("405 "+m, func(t *testing.T) {
			r := e.do(t, m, "/probe", nil)
			if r.code != http.StatusMethodNotAllowed || r.header.Get("Allow") != "POST" {
				t.Fatalf("status %d Allow %q", r.code, r.header.Get("Allow"))
			}
		})
	}
	pad := strings.Repeat(" ", controlapi.MaxProbeBodyBytes)
	bad := []struct{ name, body, want string }{
		{"unknown field", `{"backend":"b","model":"m","hashScheme":"h","tenant":"x"}`, `unknown field "tenant"`},
		{"case-variant field", `{"Backend":"b","model":"m","hashScheme":"h"}`, `unknown field "Backend"`},
		{"case-variant duplicate", `{"backend":"b","model":"m","hashScheme":"h","MODEL":"x"}`, `unknown field "MODEL"`},
		{"trailing JSON", `{"backend":"b","model":"m","hashScheme":"h"} {}`, "trailing data"},
		{"trailing garbage", `{"backend":"b","model":"m","hashScheme":"h"}x`, "trailing data"},
		{"missing backend", `{"model":"m","hashScheme":"h"}`, `missing required field "backend"`},
		{"missing model", `{"backend":"b","hashScheme":"h"}`, `missing required field "model"`},
		{"missing hashScheme", `{"backend":"b","model":"m"}`, `missing required field "hashScheme"`},
		{"empty backend", `{"backend":"","model":"m","hashScheme":"h"}`, `missing required field "backend"`},
		{"null model", `{"backend":"b","model":null,"hashScheme":"h"}`, `missing required field "model"`},
		{"null body", `null`, `missing required field "backend"`},
		{"array", `[]`, "invalid JSON"},
		{"wrong type", `{"backend":1,"model":"m","hashScheme":"h"}`, "invalid JSON"},
		{"bad JSON", `{"backend":`, "invalid JSON"},
		{"empty", ``, "empty body"},
		{"too large", `{"backend":"b","model":"m","hashScheme":"h"}` + pad, "body exceeds 4096 bytes"},
	}
	for _, c := range bad {
		t.Run("400 "+c.name, func(t *testing.T) {
			before := e.prober.calls.Load()
			r := e.do(t, http.MethodPost, "/probe", strings.NewReader(c.body))
			if r.code != http.StatusBadRequest {
				t.Fatalf("status %d body %q", r.code, r.body)
			}
			if !strings.Contains(string(r.body), c.want) {
				t.Errorf("body %q does not contain %q", r.body, c.want)
			}
			if e.prober.calls.Load() != before {
				t.Error("the prober ran for a rejected request")
			}
		})
	}
	t.Run("exactly 4 KiB is accepted", func(t *testing.T) {
		b := `{"backend":"b","model":"m","hashScheme":"h"}`
		b += strings.Repeat(" ", controlapi.MaxProbeBodyBytes-len(b))
		if r := e.do(t, http.MethodPost, "/probe", strings.NewReader(b)); r.code != http.StatusOK {
			t.Fatalf("status %d body %q", r.code, r.body)
		}
	})
}

// fakeAuth admits only "Authorization: Bearer <name>" and counts calls.
func fakeAuth(name string, calls *atomic.Int64) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			if r.Header.Get("Authorization") != "Bearer "+name {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func TestAuthWiring(t *testing.T) {
	var snapCalls, polCalls, probeCalls atomic.Int64 // middleware invocations per endpoint; added by request goroutines
	e := newEnv(t, func(c *Config) {
		c.SnapshotAuth = fakeAuth("snapshot", &snapCalls)
		c.PolicyAuth = fakeAuth("policy", &polCalls)
		c.ProbeAuth = fakeAuth("probe", &probeCalls)
	})
	if strings.Contains(e.logs.String(), "insecure mode") {
		t.Error("insecure-mode WARN with auth configured")
	}
	probeBody := `{"backend":"b","model":"m","hashScheme":"h"}`
	cases := []struct {
		name, method, path, body, token string
		code                            int
	}{
		{"snapshot ok", http.MethodGet, "/snapshot", "", "snapshot", http.StatusOK},
		{"snapshot with policy token", http.MethodGet, "/snapshot", "", "policy", http.StatusUnauthorized},
		{"snapshot no token", http.MethodGet, "/snapshot", "", "", http.StatusUnauthorized},
		{"policy ok", http.MethodPost, "/policy", v7Body, "policy", http.StatusNoContent},
		{"policy with snapshot token", http.MethodPost, "/policy", v7Body, "snapshot", http.StatusUnauthorized},
		{"probe ok", http.MethodPost, "/probe", probeBody, "probe", http.StatusOK},
		{"probe with policy token", http.MethodPost, "/probe", probeBody, "policy", http.StatusUnauthorized},
		// Auth runs before the method check.
		{"wrong method, no token", http.MethodGet, "/policy", "", "", http.StatusUnauthorized},
		{"wrong method, token", http.MethodGet, "/policy", "", "policy", http.StatusMethodNotAllowed},
		{"bad body, no token", http.MethodPost, "/probe", "{", "", http.StatusUnauthorized},
		{"unknown path", http.MethodGet, "/metrics", "", "snapshot", http.StatusNotFound},
		{"sub path", http.MethodGet, "/snapshot/x", "", "snapshot", http.StatusNotFound},
	}
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
	if snapCalls.Load() != 3 || polCalls.Load() != 4 || probeCalls.Load() != 3 {
		t.Errorf("middleware calls: snapshot %d policy %d probe %d", snapCalls.Load(), polCalls.Load(), probeCalls.Load())
	}
}
