// Package controlserver serves the server's internal control endpoints, the
// ones the controller calls on the :8081 listener:
//
//	POST|PUT /policy    replace-on-write policy push (policy.Decode, Store.Apply) -> 204;
//	                    schema v8: CachePolicies, CacheTenant quotas, PDTopologies, PromptTemplates
//	GET      /snapshot  the index aggregate as JSON, zstd/gzip/identity         -> 200
//	POST     /probe     functional self-test through a Prober                  -> 200
//
// Each endpoint sits behind its own auth middleware (package
// controlserver/auth in production; nil disables it, the insecure dev mode).
// The middleware runs before the method check, so an unauthenticated caller
// learns nothing, not even the allowed methods. Decode failures are 400 with
// a plain-text message naming the problem; a wrong method is 405 with Allow.
package controlserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/internal/ratelog"
	"github.com/inferencecache/inferencecache/policy"
)

// SnapshotSource produces the GET /snapshot body. It is called once per
// request, concurrently.
type SnapshotSource interface {
	Snapshot() controlapi.CacheSnapshot
}

// Prober runs the functional self-test for a validated request (backend,
// model and hashScheme are non-empty). Per-stage failures belong in the
// response; the HTTP status is 200 regardless. ctx ends when the client goes
// away or after ProbeTimeout.
type Prober interface {
	Probe(ctx context.Context, req controlapi.ProbeRequest) controlapi.ProbeResponse
}

// Config wires the handler.
type Config struct {
	// Policies receives /policy pushes. Required.
	Policies *policy.Store
	// Snapshots serves /snapshot. Required.
	Snapshots SnapshotSource
	// Prober serves /probe: validated request in, stage results out. Required.
	Prober Prober
	// SnapshotAuth, PolicyAuth and ProbeAuth wrap their endpoint (e.g.
	// auth.Authenticator.Wrap); nil means no auth (insecure mode, logged at
	// WARN by NewHandler).
	SnapshotAuth, PolicyAuth, ProbeAuth func(http.Handler) http.Handler
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// ProbeTimeout bounds one Prober.Probe call through the ctx it receives.
const ProbeTimeout = 10 * time.Second

// Allow header values.
const (
	allowPolicy   = "POST, PUT"
	allowSnapshot = "GET"
	allowProbe    = "POST"
)

// ErrInvalidConfig is wrapped by NewHandler's errors.
var ErrInvalidConfig = errors.New("controlserver: invalid config")

type handler struct {
	policies  *policy.Store
	snapshots SnapshotSource
	prober    Prober
	log       *slog.Logger
	// One limiter per log call site a request can trigger (the zero value:
	// one line per 10 s, the next counting those held back). An applied
	// policy push gets a burst of 30 and one line a second, more than the
	// controller's pushes ever need.
	pushRejectedLog, snapshotClampedLog, snapshotEncodeLog, snapshotWriteLog ratelog.Limiter
	probeRejectedLog, probeServedLog, probeEncodeLog                         ratelog.Limiter
	pushAppliedLog                                                           ratelog.Limiter
}

// NewHandler returns the handler for /policy, /snapshot and /probe; any other
// path is 404.
func NewHandler(cfg Config) (http.Handler, error) {
	switch {
	case cfg.Policies == nil:
		return nil, fmt.Errorf("%w: nil Policies", ErrInvalidConfig)
	case cfg.Snapshots == nil:
		return nil, fmt.Errorf("%w: nil Snapshots", ErrInvalidConfig)
	case cfg.Prober == nil:
		return nil, fmt.Errorf("%w: nil Prober", ErrInvalidConfig)
	}
	h := &handler{policies: cfg.Policies, snapshots: cfg.Snapshots, prober: cfg.Prober, log: cfg.Logger,
		pushAppliedLog: ratelog.Limiter{Burst: 30, Every: time.Second}}
	if h.log == nil {
		h.log = slog.Default()
	}
	mux := http.NewServeMux()
	for _, e := range []struct {
		path string
		auth func(http.Handler) http.Handler
		h    http.HandlerFunc
	}{
		{"/policy", cfg.PolicyAuth, h.servePolicy},
		{"/snapshot", cfg.SnapshotAuth, h.serveSnapshot},
		{"/probe", cfg.ProbeAuth, h.serveProbe},
	} {
		var eh http.Handler = e.h
		if e.auth == nil {
			h.log.Warn("control endpoint has no auth (insecure mode)", "path", e.path)
		} else {
			eh = e.auth(eh)
		}
		mux.Handle(e.path, eh)
	}
	return mux, nil
}

// methodNotAllowed answers 405 with the Allow header.
func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	http.Error(w, "method not allowed; allowed: "+allow, http.StatusMethodNotAllowed)
}

func (h *handler) servePolicy(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost && r.Method != http.MethodPut {
		methodNotAllowed(w, allowPolicy)
		return
	}
	body, err := policy.Decode(http.MaxBytesReader(w, r.Body, policy.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			err = policy.ErrTooLarge
		}
		h.pushRejectedLog.Warn(r.Context(), h.log, "policy push rejected", "err", err, "remote", r.RemoteAddr)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	snap := h.policies.Apply(body)
	h.pushAppliedLog.Info(r.Context(), h.log, "policy snapshot applied", "version", body.Version, "policies", len(body.Policies),
		"tenants", len(body.Tenants), "pdTopologies", snap.Topologies(), "promptTemplates", snap.Templates(),
		"generation", snap.Generation())
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		methodNotAllowed(w, allowSnapshot)
		return
	}
	snap := h.snapshots.Snapshot()
	if n := sanitizeSnapshot(&snap); n > 0 {
		h.snapshotClampedLog.Warn(r.Context(), h.log, "cache snapshot has values JSON cannot carry; clamped them", "values", n)
	}
	data, err := json.Marshal(snap)
	if err != nil {
		// sanitizeSnapshot leaves nothing encoding/json refuses.
		h.snapshotEncodeLog.Error(r.Context(), h.log, "cannot encode the cache snapshot", "err", err)
		http.Error(w, "cannot encode the cache snapshot", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Add("Vary", "Accept-Encoding")
	if err := writeEncoded(w, negotiateEncoding(r.Header.Values("Accept-Encoding")), data); err != nil {
		// Headers are out; the client sees a truncated body.
		h.snapshotWriteLog.Warn(r.Context(), h.log, "cannot write the cache snapshot", "err", err, "remote", r.RemoteAddr)
	}
}

func (h *handler) serveProbe(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, allowProbe)
		return
	}
	req, err := decodeProbe(http.MaxBytesReader(w, r.Body, controlapi.MaxProbeBodyBytes))
	if err != nil {
		h.probeRejectedLog.Warn(r.Context(), h.log, "probe request rejected", "err", err, "remote", r.RemoteAddr)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), ProbeTimeout)
	defer cancel()
	resp := h.prober.Probe(ctx, req)
	h.probeServedLog.Debug(r.Context(), h.log, "probe served", "backend", req.Backend, "model", req.Model, "hashScheme", req.HashScheme,
		"ingest", resp.Ingest, "routing", resp.Routing, "t2", resp.T2)
	data, err := json.Marshal(resp)
	if err != nil {
		h.probeEncodeLog.Error(r.Context(), h.log, "cannot encode the probe response", "err", err)
		http.Error(w, "cannot encode the probe response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data)
}

// probeFields are the exact (case-sensitive) JSON keys of a ProbeRequest.
var probeFields = map[string]bool{"backend": true, "model": true, "hashScheme": true, "backendType": true,
	"t2Endpoint": true, "t2Provider": true}

// decodeProbe reads and validates a /probe body: one JSON object, no unknown
// (or differently cased) fields, nothing after it, backend, model and
// hashScheme non-empty.
func decodeProbe(r io.Reader) (controlapi.ProbeRequest, error) {
	var req controlapi.ProbeRequest
	raw, err := io.ReadAll(io.LimitReader(r, controlapi.MaxProbeBodyBytes+1))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge) || len(raw) > controlapi.MaxProbeBodyBytes:
		return req, fmt.Errorf("probe: body exceeds %d bytes", controlapi.MaxProbeBodyBytes)
	case err != nil:
		return req, fmt.Errorf("probe: cannot read body: %w", err)
	case len(bytes.Trim(raw, " \t\r\n")) == 0:
		return req, errors.New("probe: empty body")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("probe: invalid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return req, errors.New("probe: trailing data after the JSON object")
	}
	// encoding/json matches keys case-insensitively; the contract's are
	// case-sensitive.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return req, fmt.Errorf("probe: invalid JSON: %w", err)
	}
	for k := range keys {
		if !probeFields[k] {
			return req, fmt.Errorf("probe: unknown field %q (field names are case-sensitive)", k)
		}
	}
	for _, f := range []struct{ name, v string }{
		{"backend", req.Backend}, {"model", req.Model}, {"hashScheme", req.HashScheme},
	} {
		if f.v == "" {
			return req, fmt.Errorf("probe: missing required field %q", f.name)
		}
	}
	return req, nil
}
