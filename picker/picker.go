// Package picker is an Endpoint Picker (EPP) for standard gateways: an
// Envoy external processing (ext_proc v3) server that chooses, for every
// inference request, the endpoint of an InferencePool (or of a static
// endpoint list) most likely to hold the request's prompt prefix in its KV
// cache, as the Gateway API Inference Extension's endpoint picker protocol
// specifies (docs/gateway.md).
//
// One ext_proc stream is one HTTP request. The picker reads the request
// headers and buffers the body to its end (bounded), parses it
// (picker/request), tokenizes the whole conversation (Tokenizer), asks the
// index in process (Lookuper, the gRPC service's own LookupRoute), maps the
// ranked replicas to endpoints (picker/endpoints) and answers the deferred
// headers with the destination header x-gateway-destination-endpoint and
// the same value in the dynamic metadata envoy.lb, then re-emits the body.
// In the response phase it passes headers and body through unchanged,
// reads the endpoint that served and the engine's usage, and reports the
// request's start and end (Feedback) and how many cached tokens it
// predicted against how many the engine delivered (Observer).
//
// Nothing a client sends can make the picker fail a stream: a body that is
// not JSON is answered 400, a body over the limit 413, a pool with no
// eligible endpoint 503 (all as ImmediateResponse); everything else that
// keeps the index from answering falls back to the least-loaded endpoint,
// counted by reason.
package picker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/puzpuzpuz/xsync/v3"
	"google.golang.org/grpc"

	"github.com/inferencecache/inferencecache/picker/endpoints"
	"github.com/inferencecache/inferencecache/picker/request"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Protocol names (the endpoint picker protocol, docs/gateway.md).
const (
	// DestinationHeader carries the picked endpoints, "ip:port" or an
	// ordered comma list (primary first).
	DestinationHeader = "x-gateway-destination-endpoint"
	// MetadataNamespace is the dynamic metadata namespace of the picked
	// endpoints (key DestinationHeader) and of the served endpoint (key
	// ServedKey).
	MetadataNamespace = "envoy.lb"
	// ServedKey names, in MetadataNamespace of the response phase's
	// metadata_context, the endpoint that served the request.
	ServedKey = "x-gateway-destination-endpoint-served"
	// SubsetNamespace and SubsetKey carry the gateway's subset hint: the
	// only endpoints the picker may choose from.
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
	// ServiceName is the ext_proc service's full name (its health status
	// is published under it too).
	ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// Limits and defaults.
const (
	// DefaultMaxBodyBytes bounds a buffered request body (Config.MaxBodyBytes).
	DefaultMaxBodyBytes = 4 << 20
	// ChunkBytes is the largest body chunk the picker sends back: Envoy
	// caps a streamed chunk at 64 KiB; 62,000 bytes leaves room for the
	// message around it.
	ChunkBytes = 62_000
	// DefaultMaxFallbacks is how many endpoints follow the primary in the
	// destination list (Config.MaxFallbacks).
	DefaultMaxFallbacks = 3
	// DefaultTokenizeTimeout bounds one request's tokenization.
	DefaultTokenizeTimeout = 250 * time.Millisecond
	// maxUsageCapture bounds the bytes of a response's "usage" object the
	// picker keeps to parse.
	maxUsageCapture = 4 << 10
)

// Tokenizer turns a request into the token ids the engine will compute:
// the model's own chat template over the whole message list (or the
// completion prompt), tokenized exactly as the engine does.
// *modeldir.Dir implements it.
type Tokenizer interface {
	RequestTokens(ctx context.Context, modelID string, r *request.Request) ([]uint32, error)
}

// Feedback learns where requests run: RequestStarted when the picker
// routes a request to a replica, RequestFinished exactly once for each
// start, when its response ends or its stream breaks. now is in
// microseconds since the Unix epoch (engine.Micros). *engine.Engine
// implements it for load-aware routing.
type Feedback interface {
	RequestStarted(tenant, model, replicaID string, now int64)
	RequestFinished(tenant, model, replicaID string, now int64)
}

// Lookuper answers a LookupRoute in process: *rpc.Service.
type Lookuper interface {
	LookupRoute(ctx context.Context, req *pb.LookupRouteRequest) (*pb.LookupRouteResponse, error)
}

// Outcomes of a pick (Observer.Picked).
const (
	OutcomePrefix    = "prefix"     // the index's PREFIX_MATCH ranking
	OutcomeTenantHot = "tenant_hot" // the index's TENANT_HOT ranking
	OutcomeAffinity  = "affinity"   // the index's AFFINITY_HINT (consistent hash)
	OutcomeFallback  = "fallback"   // least loaded; Reason says why
	Outcome503       = "503"        // no eligible endpoint
	Outcome413       = "413"        // body over MaxBodyBytes
	Outcome400       = "400"        // body not JSON
)

// Reasons of a pick. The index outcomes carry ReasonNone.
const (
	ReasonNone = "none"
	// Fallbacks.
	ReasonNoBody          = "no_body"          // a request without a body (headers only)
	ReasonBodyUnavailable = "body_unavailable" // the gateway's body mode does not send the body before the headers answer
	ReasonUnrecognized    = "unrecognized"     // JSON, but not a chat or completion request
	ReasonNoTokenizer     = "no_tokenizer"     // no tokenizer configured
	ReasonTokenizerBusy   = "tokenizer_busy"   // MaxConcurrentTokenize tokenizations in flight for the whole TokenizeTimeout
	ReasonTokenizeFailed  = "tokenize_failed"  // the tokenizer failed (unknown model, template error, timeout)
	ReasonNoHint          = "no_hint"          // the index had no hint (NO_HINT, UNKNOWN_MODEL, ...)
	ReasonTimeout         = "timeout"          // the index answered TIMEOUT
	ReasonUnknownReplicas = "unknown_replicas" // the ranked replicas are not eligible endpoints
	// 503.
	ReasonNoEndpoints = "no_endpoints" // the pool is unknown or empty
	ReasonEmptySubset = "empty_subset" // the subset hint named no eligible endpoint
	// 413 and 400.
	ReasonBodyTooLarge = "body_too_large"
	ReasonNotJSON      = "not_json"
)

// Picks lists every (outcome, reason) pair a pick can be recorded under,
// so metrics can export them all at 0.
var Picks = [][2]string{
	{OutcomePrefix, ReasonNone}, {OutcomeTenantHot, ReasonNone}, {OutcomeAffinity, ReasonNone},
	{OutcomeFallback, ReasonNoBody}, {OutcomeFallback, ReasonBodyUnavailable}, {OutcomeFallback, ReasonUnrecognized},
	{OutcomeFallback, ReasonNoTokenizer}, {OutcomeFallback, ReasonTokenizerBusy}, {OutcomeFallback, ReasonTokenizeFailed},
	{OutcomeFallback, ReasonNoHint}, {OutcomeFallback, ReasonTimeout}, {OutcomeFallback, ReasonUnknownReplicas},
	{Outcome503, ReasonNoEndpoints}, {Outcome503, ReasonEmptySubset},
	{Outcome413, ReasonBodyTooLarge}, {Outcome400, ReasonNotJSON},
	pdPicks[0], pdPicks[1], pdPicks[2],
}

// Usage results (Observer.Usage).
const (
	UsageRead       = "read"       // usage found and read
	UsageAbsent     = "absent"     // the response carried no usage object
	UsageUnreadable = "unreadable" // a usage object too large or malformed
)

// Observer records what the picker does; servermetrics implements it.
// Every method is called on the request path and must not block.
type Observer interface {
	// Picked records one decision and its latency (headers or body end
	// to the decision).
	Picked(outcome, reason string, elapsed time.Duration)
	// Tokenized records one successful tokenization.
	Tokenized(elapsed time.Duration)
	// Delivered records one response whose usage was read: the prompt
	// tokens, the cached tokens the lookup predicted on the endpoint that
	// served (its matched_tokens, 0 when it was not ranked) and the
	// cached tokens the engine reported. model is the index model id.
	Delivered(model string, promptTokens, predicted, delivered int64)
	// Usage records how a finished response's usage was read.
	Usage(result string)
}

type nopObserver struct{}

func (nopObserver) Picked(string, string, time.Duration)          {}
func (nopObserver) Tokenized(time.Duration)                       {}
func (nopObserver) Delivered(string, int64, int64, int64)         {}
func (nopObserver) Usage(string)                                  {}
func (nopFeedback) RequestStarted(string, string, string, int64)  {}
func (nopFeedback) RequestFinished(string, string, string, int64) {}

type nopFeedback struct{}

// Config configures a Picker.
type Config struct {
	// Source publishes the endpoints to choose from. Required.
	Source endpoints.Source
	// Lookup answers the index lookups. Required.
	Lookup Lookuper
	// Tokenizer, when nil, makes every pick of a chat or text-prompt
	// request a fallback (ReasonNoTokenizer).
	Tokenizer Tokenizer
	// Feedback and Observer may be nil.
	Feedback Feedback
	Observer Observer
	// Logger; nil means slog.Default().
	Logger *slog.Logger

	// MaxBodyBytes bounds a buffered request body; 0 means
	// DefaultMaxBodyBytes. Past it the request is answered 413.
	MaxBodyBytes int
	// MaxFallbacks is how many endpoints may follow the primary in the
	// destination list; 0 means DefaultMaxFallbacks, negative none.
	MaxFallbacks int
	// MaxConcurrentTokenize bounds tokenizations in flight; one more
	// waits for a slot within TokenizeTimeout, then falls back
	// (ReasonTokenizerBusy). 0 means 2 x GOMAXPROCS.
	MaxConcurrentTokenize int
	// TokenizeTimeout bounds one tokenization, its wait for a slot
	// included; 0 means DefaultTokenizeTimeout.
	TokenizeTimeout time.Duration

	// PD, when set, makes the pool a prefill/decode pool (pd.go): picks
	// come from LookupPDRoute and carry PrefillHeader. Nil: an aggregated
	// pool, the header untouched.
	PD *PDConfig

	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Errors of New.
var ErrInvalidConfig = errors.New("picker: invalid config")

// Picker is the ext_proc server. It is safe for concurrent use: every
// stream has its own state, and the shared state (in-flight counts, the
// tokenizer semaphore) is lock-free.
type Picker struct {
	extprocv3.UnimplementedExternalProcessorServer

	src          endpoints.Source
	lookup       Lookuper
	tok          Tokenizer
	feedback     Feedback
	obs          Observer
	log          *slog.Logger
	maxBody      int
	maxFallbacks int
	tokTimeout   time.Duration
	now          func() time.Time
	// pd is Config.PD, nil for an aggregated pool (immutable).
	pd *PDConfig

	// tokenizeSem holds one token per tokenization in flight; a full
	// channel sheds the request to the fallback.
	tokenizeSem chan struct{}
	inflight    inflight
	// streams counts the ext_proc streams open (Process calls running).
	streams atomic.Int64
	// lastLog is the UnixNano of the last rate-limited log line.
	lastLog atomic.Int64
}

// New validates cfg and builds a Picker.
func New(cfg Config) (*Picker, error) {
	if cfg.Source == nil || cfg.Lookup == nil {
		return nil, fmt.Errorf("%w: Source and Lookup are required", ErrInvalidConfig)
	}
	if cfg.PD != nil && cfg.PD.Lookup == nil {
		return nil, fmt.Errorf("%w: PD needs a Lookup", ErrInvalidConfig)
	}
	p := &Picker{
		src: cfg.Source, lookup: cfg.Lookup, tok: cfg.Tokenizer,
		feedback: cfg.Feedback, obs: cfg.Observer, log: cfg.Logger,
		maxBody: cfg.MaxBodyBytes, maxFallbacks: cfg.MaxFallbacks,
		tokTimeout: cfg.TokenizeTimeout, now: cfg.Now, pd: cfg.PD,
		inflight: inflight{m: xsync.NewMapOf[string, *atomic.Int64]()},
	}
	if p.feedback == nil {
		p.feedback = nopFeedback{}
	}
	if p.obs == nil {
		p.obs = nopObserver{}
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	switch {
	case p.maxBody < 0:
		return nil, fmt.Errorf("%w: negative MaxBodyBytes %d", ErrInvalidConfig, p.maxBody)
	case p.maxBody == 0:
		p.maxBody = DefaultMaxBodyBytes
	}
	switch {
	case p.maxFallbacks == 0:
		p.maxFallbacks = DefaultMaxFallbacks
	case p.maxFallbacks < 0:
		p.maxFallbacks = 0
	}
	if p.tokTimeout <= 0 {
		p.tokTimeout = DefaultTokenizeTimeout
	}
	n := cfg.MaxConcurrentTokenize
	if n < 0 {
		return nil, fmt.Errorf("%w: negative MaxConcurrentTokenize %d", ErrInvalidConfig, n)
	}
	if n == 0 {
		n = 2 * runtime.GOMAXPROCS(0)
	}
	p.tokenizeSem = make(chan struct{}, n)
	if p.now == nil {
		p.now = time.Now
	}
	return p, nil
}

// Register registers the picker as the ExternalProcessor service of s.
func (p *Picker) Register(s grpc.ServiceRegistrar) { extprocv3.RegisterExternalProcessorServer(s, p) }

// StreamsOpen is the number of ext_proc streams being processed.
func (p *Picker) StreamsOpen() int64 { return p.streams.Load() }

// Inflight calls fn for every endpoint of the current pool with the
// requests the picker has routed there and not seen end.
func (p *Picker) Inflight(fn func(ep endpoints.Endpoint, n int64)) {
	pool := p.src.Pool()
	if pool == nil {
		return
	}
	for _, ep := range pool.Endpoints {
		fn(ep, p.inflight.load(ep.Address))
	}
}

// InflightTotal is the sum of the in-flight counts over every endpoint
// ever counted (tests check it returns to 0).
func (p *Picker) InflightTotal() int64 { return p.inflight.total() }

// rateLimitedWarn logs at WARN at most once a minute (client-triggered
// conditions).
func (p *Picker) rateLimitedWarn(msg string, args ...any) {
	now := p.now().UnixNano()
	last := p.lastLog.Load()
	if now-last < int64(time.Minute) || !p.lastLog.CompareAndSwap(last, now) {
		return
	}
	p.log.Warn(msg, args...)
}
