package controller

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/inferencecache/inferencecache/controlapi"
	"github.com/inferencecache/inferencecache/operator/api/v1alpha1"
)

// ProbeModel is the model id of every controller /probe request.
const ProbeModel = "functional-self-test"

// maxProbeResponseBytes caps a /probe answer the controller decodes.
const maxProbeResponseBytes = 64 << 10

// Probe POSTs req to the server's /probe with the controller-audience
// token. Any status but 200 is an error; a 200 carries per-stage results
// (a failed stage is not an error here).
func (c *ServerClient) Probe(ctx context.Context, req controlapi.ProbeRequest) (controlapi.ProbeResponse, error) {
	var resp controlapi.ProbeResponse
	raw, err := json.Marshal(req)
	if err != nil {
		return resp, fmt.Errorf("cannot encode /probe request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url("/probe"), bytes.NewReader(raw))
	if err != nil {
		return resp, fmt.Errorf("cannot build /probe request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	if err := authorize(hreq, c.ControllerTokenPath); err != nil {
		return resp, err
	}
	hresp, err := c.http().Do(hreq)
	if err != nil {
		return resp, fmt.Errorf("cannot probe %s: %w", c.BaseURL, err)
	}
	defer drain(hresp.Body)
	if hresp.StatusCode != http.StatusOK {
		return resp, fmt.Errorf("cannot probe %s: %s", c.BaseURL, statusText(hresp))
	}
	if err := json.NewDecoder(io.LimitReader(hresp.Body, maxProbeResponseBytes)).Decode(&resp); err != nil {
		return resp, fmt.Errorf("cannot decode /probe answer from %s: %w", c.BaseURL, err)
	}
	if err := checkProbeAnswer(resp); err != nil {
		return resp, fmt.Errorf("malformed /probe answer from %s: %w", c.BaseURL, err)
	}
	return resp, nil
}

// checkProbeAnswer refuses an answer whose stage results are not each ok,
// failed or skipped (contract §4.3): probeVerdict would read one as a pass,
// and the stage results become metric label values.
func checkProbeAnswer(resp controlapi.ProbeResponse) error {
	for _, st := range [...]struct{ stage, result string }{
		{controlapi.StageIngest, resp.Ingest}, {controlapi.StageRouting, resp.Routing}, {controlapi.StageT2, resp.T2},
	} {
		switch st.result {
		case controlapi.StageOK, controlapi.StageFailed, controlapi.StageSkipped:
		default:
			return fmt.Errorf("stage %s has result %q, want ok, failed or skipped", st.stage, st.result)
		}
	}
	return nil
}

// probeRequest is the /probe body for b (contract §4.3, controller side).
func probeRequest(b *v1alpha1.CacheBackend) controlapi.ProbeRequest {
	scheme := "vllm"
	if in := b.Spec.Integration; in != nil && in.Engine != "" {
		scheme = strings.ToLower(in.Engine)
	}
	typ := b.Spec.Type
	if typ == "" {
		typ = v1alpha1.BackendLMCache
	}
	req := controlapi.ProbeRequest{Backend: b.Namespace + "/" + b.Name, Model: ProbeModel, HashScheme: scheme, BackendType: string(typ)}
	// Only a backend with a remote tier sends the t2 keys: a server that
	// predates them refuses the body (docs/wire.md).
	if rs := b.Spec.RemoteStorage; rs != nil && rs.Endpoint != "" {
		req.T2Endpoint = rs.Endpoint
		req.T2Provider = string(cmp.Or(rs.Provider, v1alpha1.RemoteStorageRedis))
	}
	return req
}

// probeVerdict turns a /probe answer into FunctionalProbeOK's status,
// reason and message: the first failed stage decides.
func probeVerdict(resp controlapi.ProbeResponse) (metav1.ConditionStatus, string, string) {
	msgOf := func(stage string) string {
		for _, e := range resp.Errors {
			if e.Stage == stage {
				return stage + " stage failed: " + e.Message
			}
		}
		return stage + " stage failed"
	}
	for _, st := range []struct{ stage, result, reason string }{
		{controlapi.StageIngest, resp.Ingest, ReasonProbeIngestFailed},
		{controlapi.StageRouting, resp.Routing, ReasonProbeRoutingFailed},
		{controlapi.StageT2, resp.T2, ReasonProbeT2Failed},
	} {
		if st.result == controlapi.StageFailed {
			return metav1.ConditionFalse, st.reason, msgOf(st.stage)
		}
	}
	return metav1.ConditionTrue, ReasonProbeOK, fmt.Sprintf("/probe: ingest %s, routing %s, t2 %s", resp.Ingest, resp.Routing, resp.T2)
}

// stickyProbeFailure reports whether cond is a stage failure, which a later
// transport error must not erase.
func stickyProbeFailure(cond *metav1.Condition) bool {
	if cond == nil || cond.Status != metav1.ConditionFalse {
		return false
	}
	switch cond.Reason {
	case ReasonProbeIngestFailed, ReasonProbeRoutingFailed, ReasonProbeT2Failed:
		return true
	}
	return false
}

// rateGate allows one action per key per interval and remembers the
// action's outcome, so a pass whose status write was lost (a conflict) can
// publish it again without acting twice.
type rateGate[T any] struct {
	mu   sync.Mutex             // guards last
	last map[string]gateMark[T] // key -> the last action
}

type gateMark[T any] struct {
	at      time.Time
	outcome T
}

// wait returns how long key must still wait at now (0: it may act) and the
// outcome of its last action (ok false when there was none).
func (g *rateGate[T]) wait(key string, now time.Time, interval time.Duration) (left time.Duration, outcome T, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.last[key]
	if !ok {
		return 0, outcome, false
	}
	return max(m.at.Add(interval).Sub(now), 0), m.outcome, true
}

// mark records an action of key at now with its outcome.
func (g *rateGate[T]) mark(key string, now time.Time, outcome T) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.last == nil {
		g.last = map[string]gateMark[T]{}
	}
	g.last[key] = gateMark[T]{at: now, outcome: outcome}
}

func (g *rateGate[T]) forget(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.last, key)
}

// serverBackoff spaces the /probe calls of all backends while the routing
// server does not answer at all (a transport error: refused, reset, timed
// out): after one such failure no backend calls until the backoff ends,
// doubling from minServerBackoff up to the probe interval, so a dead or
// hanging server does not hold every reconcile worker for the /probe
// timeout. Any answer, even an HTTP error, ends it.
type serverBackoff struct {
	mu      sync.Mutex    // guards the fields below
	until   time.Time     // no call before this
	step    time.Duration // the last backoff; 0 while the server answers
	lastErr string        // the transport error that started the backoff
}

// minServerBackoff is the first backoff after a transport error.
const minServerBackoff = time.Second

// hold returns how long calls must still wait at now, and why.
func (s *serverBackoff) hold(now time.Time) (time.Duration, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.until.Sub(now), 0), s.lastErr
}

// failed records a transport error at now and returns the backoff it
// starts.
func (s *serverBackoff) failed(now time.Time, err error, ceiling time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.step = min(max(2*s.step, minServerBackoff), max(ceiling, minServerBackoff))
	s.until, s.lastErr = now.Add(s.step), err.Error()
	return s.step
}

// answered records that the server answered.
func (s *serverBackoff) answered() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.step, s.until, s.lastErr = 0, time.Time{}, ""
}

// transportError reports whether err means the server did not answer (as
// opposed to an HTTP error status or a bad body).
func transportError(err error) bool {
	var ue *url.Error
	return errors.As(err, &ue)
}

// probe sets FunctionalProbeOK of a managed backend whose KV gate reports
// Ready: ProbeBypassed when annotated, otherwise a /probe call at most once
// per ProbeInterval, bounded by ProbeTimeout, and none while the server is
// in backoff after a transport error (serverBackoff). It returns when the
// next call is due (0: none pending).
func (r *CacheBackendReconciler) probe(ctx context.Context, b *v1alpha1.CacheBackend, now time.Time, c conds) time.Duration {
	key := b.Namespace + "/" + b.Name
	if b.Annotations[SkipFunctionalProbeAnnotation] == "true" {
		c.set(v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionTrue, ReasonProbeBypassed,
			"the functional probe is skipped ("+SkipFunctionalProbeAnnotation+": \"true\")")
		return 0
	}
	left, last, ok := r.probes.wait(key, now, r.probeInterval())
	if left > 0 {
		if ok { // the last verdict, in case its status write was lost
			c.set(v1alpha1.BackendConditionFunctionalProbeOK, last.Status, last.Reason, last.Message)
		}
		return left
	}
	unknown := func(msg string) {
		if !stickyProbeFailure(meta.FindStatusCondition(*c.list, v1alpha1.BackendConditionFunctionalProbeOK)) {
			c.set(v1alpha1.BackendConditionFunctionalProbeOK, metav1.ConditionUnknown, ReasonProbeError, msg)
		}
	}
	if wait, why := r.server.hold(now); wait > 0 {
		// Not this backend's turn to find out; its own probe window stays
		// open, so it probes as soon as the backoff ends.
		unknown(fmt.Sprintf("not probed: the routing server did not answer a /probe (%s); the next call is in %s", why, wait.Round(time.Millisecond)))
		return wait
	}
	pctx, cancel := context.WithTimeout(ctx, r.probeTimeout())
	resp, err := r.Server.Probe(pctx, probeRequest(b))
	cancel()
	switch {
	case err != nil && transportError(err):
		if pctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (no answer within the %s /probe timeout)", err, r.probeTimeout())
		}
		step := r.server.failed(now, err, r.probeInterval())
		unknown(fmt.Sprintf("%s; every backend's /probe waits %s", err, step))
	case err != nil:
		r.server.answered()
		unknown(err.Error())
	default:
		r.server.answered()
		r.metrics.recordProbe(key, resp)
		status, reason, msg := probeVerdict(resp)
		c.set(v1alpha1.BackendConditionFunctionalProbeOK, status, reason, msg)
	}
	r.probes.mark(key, now, *meta.FindStatusCondition(*c.list, v1alpha1.BackendConditionFunctionalProbeOK))
	return r.probeInterval()
}

// backendControllerMetrics are the CacheBackend reconciler's series of
// metrics.md:
//
//   - inferencecache_backend_probe_result_total{backend, stage, result}:
//     one increment per stage per /probe call that returned an answer;
//   - inferencecache_backend_server_restart_cascades_total{namespace,
//     backend, reason}: one per restart-cascade decision, deduplicated by a
//     (backend, server instance) ledger.
type backendControllerMetrics struct {
	probeResults *prometheus.CounterVec
	cascades     *prometheus.CounterVec

	mu sync.Mutex // guards ledger
	// ledger is the server instance of each backend's last counted cascade,
	// so a retried cascade of the same instance is not counted twice.
	ledger map[string]string
}

func newBackendControllerMetrics() *backendControllerMetrics {
	return &backendControllerMetrics{
		probeResults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferencecache_backend_probe_result_total",
			Help: "Per-stage outcomes of the CacheBackend reconciler's /probe calls (three per answered call).",
		}, []string{"backend", "stage", "result"}),
		cascades: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferencecache_backend_server_restart_cascades_total",
			Help: "Restart-cascade decisions of the CacheBackend reconciler after a cache-server pod replacement.",
		}, []string{"namespace", "backend", "reason"}),
		ledger: map[string]string{},
	}
}

// CacheBackendCollectors returns unregistered copies of the CacheBackend
// reconciler's vectors, so tools (the alert-rule test) can list the metric
// names the controller exposes.
func CacheBackendCollectors() []prometheus.Collector {
	m := newBackendControllerMetrics()
	return []prometheus.Collector{m.probeResults, m.cascades}
}

func (m *backendControllerMetrics) recordProbe(backend string, resp controlapi.ProbeResponse) {
	m.probeResults.WithLabelValues(backend, controlapi.StageIngest, resp.Ingest).Inc()
	m.probeResults.WithLabelValues(backend, controlapi.StageRouting, resp.Routing).Inc()
	m.probeResults.WithLabelValues(backend, controlapi.StageT2, resp.T2).Inc()
}

// recordCascade counts a cascade of namespace/name to instance id once.
func (m *backendControllerMetrics) recordCascade(namespace, name, id string) {
	key := namespace + "/" + name
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ledger[key] == id {
		return
	}
	m.ledger[key] = id
	m.cascades.WithLabelValues(namespace, name, "server_instance_changed").Inc()
}

// forget drops a deleted backend's series and ledger entry.
func (m *backendControllerMetrics) forget(namespace, name string) {
	m.probeResults.DeletePartialMatch(prometheus.Labels{"backend": namespace + "/" + name})
	m.cascades.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "backend": name})
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.ledger, namespace+"/"+name)
}

var (
	// cbMetrics is registered with the controller-runtime registry the
	// first time a CacheBackend reconciler is set up; cbMetricsOnce guards
	// that, and cbMetrics and cbMetricsErr are read only after its Do.
	cbMetrics     *backendControllerMetrics
	cbMetricsOnce sync.Once
	cbMetricsErr  error
)

func registeredBackendControllerMetrics() (*backendControllerMetrics, error) {
	cbMetricsOnce.Do(func() {
		cbMetrics = newBackendControllerMetrics()
		if cbMetricsErr = ctrlmetrics.Registry.Register(cbMetrics.probeResults); cbMetricsErr == nil {
			cbMetricsErr = ctrlmetrics.Registry.Register(cbMetrics.cascades)
		}
	})
	return cbMetrics, cbMetricsErr
}
