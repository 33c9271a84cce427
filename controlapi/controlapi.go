// Package controlapi holds the JSON wire types of the server's internal
// control endpoints that the controller calls: GET /snapshot and POST /probe.
// (The POST /policy body lives in package policy.) Both sides import these
// types, so the JSON keys and omitempty rules are defined exactly once.
package controlapi

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// CacheSnapshot is the GET /snapshot body: the server's in-memory aggregate.
// The reserved probe tenant is excluded everywhere, and the sum of
// Tenants[].IndexEntries equals TotalPrefixes.
type CacheSnapshot struct {
	// Replicas are keyed by (Tenant, ReplicaID): the union of replicas that
	// reported stats and replicas that hold prefixes, sorted by (tenant, id).
	Replicas []ReplicaSnapshot `json:"replicas"`
	// Tenants are sorted by id; untenanted keys count under the "" tenant.
	Tenants       []TenantSnapshot `json:"tenants"`
	TotalPrefixes int64            `json:"totalPrefixes"`
	// HotPrefixes is always 0; the key is kept for wire compatibility.
	HotPrefixes int64 `json:"hotPrefixes"`
	// ServerInstanceID identifies the server process that produced the
	// snapshot; it is random per start, so a new value means the server
	// restarted with an empty index. Beyond the contract; omitted when
	// empty (a server that predates it).
	ServerInstanceID string `json:"serverInstanceId,omitempty"`
}

// ReplicaSnapshot is one (tenant, replica) row of /snapshot.
type ReplicaSnapshot struct {
	ReplicaID        string    `json:"replicaId"`
	Tenant           string    `json:"tenant,omitempty"`
	CacheMemoryBytes int64     `json:"cacheMemoryBytes"`
	HitRate          float32   `json:"hitRate"`
	Pressure         float32   `json:"pressure"`
	LastUpdate       time.Time `json:"lastUpdate"`
	// PrefixCount is the number of keys the replica holds.
	PrefixCount int64 `json:"prefixCount"`
	// LastEventAt is the newest lastSeen of the replica's entries; the zero
	// time means none. The key is always present (encoding/json's omitempty
	// never omits a time.Time), as the seed system serialized it, so a
	// replica without entries carries "0001-01-01T00:00:00Z".
	LastEventAt   time.Time `json:"lastEventAt,omitempty"`
	StatsReported bool      `json:"statsReported,omitempty"`
	T2HitTokens   int64     `json:"t2HitTokens,omitempty"`
	T2QueryTokens int64     `json:"t2QueryTokens,omitempty"`
	// Load is the replica's live load as load-aware routing sees it
	// (docs/routing.md); absent when the replica never reported load. An
	// inferencecache extension: readers of the upstream shape ignore it.
	Load *ReplicaLoad `json:"load,omitempty"`
}

// ReplicaLoad is a replica's load in /snapshot: its last load report and
// what the server routed there since.
type ReplicaLoad struct {
	// Model is the model of the (tenant, model) the load was reported for
	// (a replica serving several models shows its latest report).
	Model string `json:"model"`
	// WaitingRequests and RunningRequests are the engine's last report.
	WaitingRequests int32 `json:"waitingRequests"`
	RunningRequests int32 `json:"runningRequests"`
	// QueuedPrefillTokens is the engine's own figure, when it exports one.
	QueuedPrefillTokens *int64 `json:"queuedPrefillTokens,omitempty"`
	// RoutedSinceReport counts the requests this server routed to the
	// replica since that report.
	RoutedSinceReport int64 `json:"routedSinceReport"`
	// InFlightRequests is the requests in flight there as load-aware
	// routing sees them: the report's waiting and running, plus what this
	// server routed and its endpoint picker started since, minus what the
	// picker saw end since; at least the picker's own live requests.
	InFlightRequests float64 `json:"inFlightRequests"`
	// EstimatedQueueTokens is the prefill work the server estimates is
	// ahead of a new request there now, in tokens.
	EstimatedQueueTokens float64 `json:"estimatedQueueTokens"`
	// ReportedAt is when the server received the report.
	ReportedAt time.Time `json:"reportedAt"`
	// Fresh is false once the report is older than --load-max-age.
	Fresh bool `json:"fresh"`
}

// TenantSnapshot is one tenant row of /snapshot.
type TenantSnapshot struct {
	TenantID string `json:"tenantId"`
	// IndexEntries counts the tenant's distinct keys
	// (tenant, model, scheme, adapter, hash).
	IndexEntries int64 `json:"indexEntries"`
	// HitRate is the mean hit rate over the tenant's stats-reporting replicas.
	HitRate         float32 `json:"hitRate"`
	HitRateReported bool    `json:"hitRateReported,omitempty"`
	// MemoryUsed is always 0 and always present (not omitempty).
	MemoryUsed int64 `json:"memoryUsed"`
}

// Probe stage outcomes.
const (
	StageOK      = "ok"
	StageFailed  = "failed"
	StageSkipped = "skipped"
)

// Probe stage names.
const (
	StageIngest  = "ingest"
	StageRouting = "routing"
	StageT2      = "t2"
)

// MaxProbeBodyBytes caps a POST /probe body.
const MaxProbeBodyBytes = 4 << 10

// ProbeRequest is the POST /probe body. Backend, Model and HashScheme are
// required; BackendType is the CacheBackend's spec.type (LMCache or empty
// runs the T2 stage when a T2 prober is wired).
//
// T2Endpoint and T2Provider (an inferencecache addition) name the
// backend's remote tier, spec.remoteStorage: its endpoint ("host:port",
// "redis://…", "rediss://…") and provider (empty: Redis). With an
// endpoint, stage t2 is a put/get round trip against it, whatever the
// backend type; without one it is skipped. A server that predates them
// refuses them as unknown fields (HTTP 400), so the controller sends them
// only for a backend that has a remote tier.
type ProbeRequest struct {
	Backend     string `json:"backend"`
	Model       string `json:"model"`
	HashScheme  string `json:"hashScheme"`
	BackendType string `json:"backendType,omitempty"`
	T2Endpoint  string `json:"t2Endpoint,omitempty"`
	T2Provider  string `json:"t2Provider,omitempty"`
}

// ProbeResponse is the POST /probe answer; HTTP 200 even when a stage fails.
type ProbeResponse struct {
	Backend string       `json:"backend"`
	Ingest  string       `json:"ingest"`
	Routing string       `json:"routing"`
	T2      string       `json:"t2"`
	Errors  []ProbeError `json:"errors,omitempty"`
}

// ProbeError is the diagnostic of one failed stage.
type ProbeError struct {
	Stage   string `json:"stage"`
	Message string `json:"message"`
}

// T2Endpoint is a parsed ProbeRequest.T2Endpoint: "host:port",
// "redis://[user:password@]host:port[/db]" or "rediss://…" (TLS).
type T2Endpoint struct {
	Addr           string // host:port
	User, Password string
	DB             string // the database number, empty for the default
	TLS            bool
}

// ParseT2Endpoint parses a remote tier's endpoint, the form the /probe
// body's t2Endpoint and a CacheBackend's spec.remoteStorage.endpoint take.
func ParseT2Endpoint(s string) (T2Endpoint, error) {
	var ep T2Endpoint
	shown := RedactT2Endpoint(s) // errors never carry the password
	if !strings.Contains(s, "://") {
		if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
			return ep, fmt.Errorf("remote tier endpoint %q: want host:port or redis://host:port", shown)
		}
		ep.Addr = s
		return ep, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return ep, fmt.Errorf("remote tier endpoint %q: not a URL", shown)
	}
	switch u.Scheme {
	case "redis":
	case "rediss":
		ep.TLS = true
	default:
		return ep, fmt.Errorf("remote tier endpoint %q: scheme %q, want redis or rediss", shown, u.Scheme)
	}
	if u.Port() == "" || u.Hostname() == "" {
		return ep, fmt.Errorf("remote tier endpoint %q: want host:port", shown)
	}
	ep.Addr = u.Host
	if u.User != nil {
		ep.User = u.User.Username()
		ep.Password, _ = u.User.Password()
	}
	if db := strings.Trim(u.Path, "/"); db != "" {
		if _, err := strconv.Atoi(db); err != nil {
			return ep, fmt.Errorf("remote tier endpoint %q: database %q is not a number", shown, db)
		}
		ep.DB = db
	}
	return ep, nil
}

// RedactT2Endpoint is endpoint with the user information of a URL form
// replaced by "***", for messages and logs.
func RedactT2Endpoint(endpoint string) string {
	i := strings.Index(endpoint, "://")
	if i < 0 {
		return endpoint
	}
	rest := endpoint[i+3:]
	at := strings.LastIndex(rest, "@")
	if at < 0 || strings.ContainsAny(rest[:at], "/?#") {
		return endpoint
	}
	return endpoint[:i+3] + "***@" + rest[at+1:]
}
