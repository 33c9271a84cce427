package controlapi

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestSnapshotJSONKeys pins the /snapshot JSON shape of contract §4.2: key
// names, omitempty rules, and the always-present memoryUsed and lastEventAt.
func TestSnapshotJSONKeys(t *testing.T) {
	s := CacheSnapshot{
		Replicas: []ReplicaSnapshot{{ReplicaID: "r", LastUpdate: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}},
		Tenants:  []TenantSnapshot{{TenantID: "t", IndexEntries: 3}},
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"replicas":[{"replicaId":"r","cacheMemoryBytes":0,"hitRate":0,"pressure":0,"lastUpdate":"2026-01-02T03:04:05Z","prefixCount":0,"lastEventAt":"0001-01-01T00:00:00Z"}],` +
		`"tenants":[{"tenantId":"t","indexEntries":3,"hitRate":0,"memoryUsed":0}],"totalPrefixes":0,"hotPrefixes":0}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	full := ReplicaSnapshot{ReplicaID: "r", Tenant: "t", StatsReported: true, T2HitTokens: 1, T2QueryTokens: 2}
	b, _ = json.Marshal(full)
	for _, k := range []string{`"tenant":"t"`, `"statsReported":true`, `"t2HitTokens":1`, `"t2QueryTokens":2`} {
		if !strings.Contains(string(b), k) {
			t.Fatalf("%s missing from %s", k, b)
		}
	}
	var back CacheSnapshot
	if err := json.Unmarshal([]byte(want), &back); err != nil || !back.Replicas[0].LastEventAt.IsZero() {
		t.Fatalf("round trip: %v %+v", err, back)
	}
	// serverInstanceId (beyond the contract) is last and omitted when empty.
	s.ServerInstanceID = "abc"
	b, _ = json.Marshal(s)
	if !strings.HasSuffix(string(b), `"hotPrefixes":0,"serverInstanceId":"abc"}`) {
		t.Fatalf("serverInstanceId: %s", b)
	}
}

func TestProbeJSONKeys(t *testing.T) {
	b, _ := json.Marshal(ProbeResponse{Backend: "ns/b", Ingest: StageOK, Routing: StageFailed, T2: StageSkipped,
		Errors: []ProbeError{{Stage: StageRouting, Message: "x"}}})
	want := `{"backend":"ns/b","ingest":"ok","routing":"failed","t2":"skipped","errors":[{"stage":"routing","message":"x"}]}`
	if string(b) != want {
		t.Fatalf("got %s", b)
	}
	b, _ = json.Marshal(ProbeRequest{Backend: "b", Model: "m", HashScheme: "vllm"})
	if string(b) != `{"backend":"b","model":"m","hashScheme":"vllm"}` {
		t.Fatalf("got %s", b)
	}
}

func TestParseT2Endpoint(t *testing.T) {
	ep, err := ParseT2Endpoint("rediss://app:s3cret@cache.ns.svc:6380/2")
	if err != nil || ep != (T2Endpoint{Addr: "cache.ns.svc:6380", User: "app", Password: "s3cret", DB: "2", TLS: true}) {
		t.Fatalf("%+v %v", ep, err)
	}
	if ep, err := ParseT2Endpoint("[::1]:6379"); err != nil || ep.Addr != "[::1]:6379" || ep.TLS {
		t.Fatalf("%+v %v", ep, err)
	}
	for in, want := range map[string]string{
		"redis-without-port":           "want host:port",
		"lm://h:1":                     `scheme "lm"`,
		"redis://:s3cret@h:1/x":        "not a number",
		"redis://u:s3cret@:1":          "want host:port",
		"redis://u:s3cret@h:1/%zz":     "not a URL",
		"redis://user:s3cret@hostonly": "want host:port",
	} {
		_, err := ParseT2Endpoint(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: the error carries the password: %v", in, err)
		}
	}
	if got := RedactT2Endpoint("redis://u:pw@h:1/0"); got != "redis://***@h:1/0" {
		t.Errorf("redacted %q", got)
	}
	if got := RedactT2Endpoint("h:1"); got != "h:1" {
		t.Errorf("redacted %q", got)
	}
}
