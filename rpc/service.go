// Package rpc is the server side of the gRPC contract
// (inferencecache.v1alpha1.InferenceCache, generated into rpc/gen): the
// Service that answers gateways (LookupRoute, LookupPDRoute, RenderTemplate,
// GetCacheState) and engine-side producers (ReportCacheState, PublishEvent)
// from the index and the policy snapshot, and observers (StreamCacheEvents,
// StreamMetrics). Contract: shared/spec/contract.md §1, §2 and §3.6–3.9;
// our additions: docs/wire.md and docs/pd.md.
//
// Every lookup fails open: a gRPC error is never returned on the request
// path; the worst answer is an empty replica_scores with a reason code.
//
// Hot path. A LookupRoute for an explicit chain or prefix hash takes no lock
// and allocates only its response: one policy snapshot load, a pooled
// scratch (engine.LookupResult, the engine request, fingerprint buffers and
// the affinity seed), the lock-free engine lookup, and metric children the
// observer resolved earlier. See TestLookupRouteAllocs for the pinned count.
// Served through Register and ServerOptions (as package server does), not
// even the response is allocated: the Codec decodes the request into a
// pooled call and marshals the response from it with protowire
// (codec.go, FuzzCodecDifferential, TestCodecAllocs).
//
// Writes. ReportCacheState streams and PublishEvent calls queue their writes
// in an ingest batcher (batch.go) that applies what is queued under one hold
// of the index's writer lock (engine.IngestBatch).
package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/internal/ratelog"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Reason codes of LookupRoute (contract §2.1) and RenderTemplate. They are
// strings on the wire; clients read a code they do not know as NO_HINT.
const (
	ReasonPrefixMatch         = "PREFIX_MATCH"
	ReasonTenantHot           = "TENANT_HOT"
	ReasonAffinityHint        = "AFFINITY_HINT"
	ReasonNoHint              = "NO_HINT"
	ReasonPolicyRequiresChain = "POLICY_REQUIRES_CHAIN"
	ReasonTimeout             = "TIMEOUT"
	ReasonUnknownTenant       = "UNKNOWN_TENANT"
	ReasonUnknownModel        = "UNKNOWN_MODEL"
	ReasonUnknownHashScheme   = "UNKNOWN_HASH_SCHEME"
	// ReasonOK is RenderTemplate's success (template.go has the others).
	ReasonOK = "OK"
)

// Limits and defaults of the LookupRoute input resolution (contract §3.6, §6).
const (
	// DefaultEngineBlockSize is the block size, in tokens, token_ids and
	// prompt_text are fingerprinted at (--engine-block-size).
	DefaultEngineBlockSize = fingerprint.DefaultBlockSize
	// DefaultTokenizeTimeout bounds tokenization when neither the caller nor
	// the tenant's lookupTimeoutMs set a deadline.
	DefaultTokenizeTimeout = 5 * time.Second
	// MaxLookupTokens caps token_ids (and tokenizer output); more fails open.
	MaxLookupTokens = 1 << 20
	// MaxPromptTextBytes caps prompt_text; more fails open.
	MaxPromptTextBytes = 1 << 20
	// MaxConcurrentTokenize caps tokenizations in flight; a busy tokenizer
	// sheds to NO_HINT.
	MaxConcurrentTokenize = 64
	// MaxIDBytes caps every id a request carries: tenant_id, model_id,
	// replica_id, hash_scheme and adapter_id (an update's and each prefix
	// entry's). A longer id gets the one id rule (limits.go, docs/wire.md):
	// NO_HINT from the lookups before the index is read, the fixed answer
	// of the fail-open stubs, InvalidArgument from every other method.
	// Kubernetes names, Hugging Face model ids and engine paths fit well
	// within it.
	MaxIDBytes = 1024
)

// Index is what the Service needs from the cache index; *engine.Engine
// implements it. The methods keep the engine's contracts (LookupRoute is
// lock-free and allocation-free with a reused result).
type Index interface {
	LookupRoute(req *engine.LookupRequest, now int64, res *engine.LookupResult)
	Credit(res *engine.LookupResult)
	AffinityPick(res *engine.LookupResult, tenant, model, scheme string, seed []byte, mode engine.AffinityMode) (string, engine.ContractPick, bool)
	AdviseByLoad(req *engine.LookupRequest, now int64, res *engine.LookupResult, pick engine.ContractPick, tokens int64) engine.LoadDecision
	RoutedCachedAt(req *engine.LookupRequest, res *engine.LookupResult, pick engine.ContractPick, now int64) int64
	NoteRouted(res *engine.LookupResult, pick engine.ContractPick, uncached, now int64)
	NoteFollowed(req *engine.LookupRequest, res *engine.LookupResult, pick engine.ContractPick, now int64)
	Ingest(u *engine.Update, now int64) engine.IngestResult
	ApplyEvent(ev *engine.Event, now int64)
	ModelState(tenant, model string) ([]engine.ReplicaStatsView, int64)
	// PickPD and NotePDRouted serve LookupPDRoute (docs/pd.md).
	PickPD(req *engine.PDRequest, now int64, res *engine.PDResult)
	NotePDRouted(res *engine.PDResult, now int64)
	// SubscribeChanges serves StreamCacheEvents.
	SubscribeChanges(f engine.ChangeFilter, buffer int) *engine.Subscription
}

var _ Index = (*engine.Engine)(nil)

// LookupObserver records one LookupRoute outcome; the Service calls it
// exactly once per call (servermetrics.Metrics implements it). It is called
// concurrently and must not block.
type LookupObserver interface {
	ObserveLookup(model, reasonCode string, hintUsed bool, elapsed time.Duration)
}

// Tokenizer turns prompt_text into token ids for a model: the text wrapped
// as one user chat message with the generation prompt appended. Encode must
// honor ctx. tokenizer/modeldir implements it (--tokenizer-dir); without
// one, a prompt_text lookup fails open to NO_HINT.
type Tokenizer interface {
	Encode(ctx context.Context, model, text string) ([]uint32, error)
}

// Config wires a Service.
type Config struct {
	// Index is the cache index. Required.
	Index Index
	// Policies supplies the per-tenant knobs; it should be the one the index
	// reads (engine.Engine.Policies()). Required.
	Policies engine.Policies
	// Observer records lookups; nil records nothing.
	Observer LookupObserver
	// Drops counts dropped producer reports; nil counts nothing (they are
	// still logged).
	Drops DropObserver
	// BlockSize is the engine block size for token_ids and prompt_text;
	// 0 means DefaultEngineBlockSize.
	BlockSize int
	// Tokenizer serves prompt_text; nil means none (fail open).
	Tokenizer Tokenizer
	// TokenizeTimeout overrides DefaultTokenizeTimeout when > 0.
	TokenizeTimeout time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil means time.Now. Tests use it to make the lookup
	// budget expire deterministically.
	Now func() time.Time

	// InstanceID identifies this server process; producers read it from
	// the InstanceIDHeader response header of ReportCacheState and
	// PublishEvent and re-report their state when it changes (the server
	// restarted and lost it). Empty sends no header.
	InstanceID string
	// MaxClockSkew is how far in the future a producer's timestamp_us may
	// lie; later ones are clamped to now + MaxClockSkew, so no entry can
	// outlive the TTL by a bad clock. 0 means DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// Producer records producer-side anomalies (clamped timestamps); nil
	// records nothing.
	Producer ProducerObserver

	// TemplateTokenizer tokenizes RenderTemplate's stable prefix; nil
	// hashes the text.
	TemplateTokenizer TemplateTokenizer
	// Metrics serves StreamMetrics; nil refuses it (UNIMPLEMENTED).
	Metrics MetricsSource
	// Features records LookupPDRoute, RenderTemplate and the streams; nil
	// records nothing.
	Features FeatureObserver
	// MaxStreams bounds the StreamCacheEvents and the StreamMetrics
	// streams open at once, each; 0 means DefaultMaxStreams.
	MaxStreams int
	// EventBuffer is each StreamCacheEvents subscriber's buffer in events;
	// 0 means DefaultEventBuffer.
	EventBuffer int
}

// ProducerObserver records what the producer handlers correct in their
// input (servermetrics.Metrics implements it). It is called concurrently and
// must not block.
type ProducerObserver interface {
	// TimestampClamped counts one message of rpc ("ReportCacheState" or
	// "PublishEvent") whose timestamp_us lay beyond now + MaxClockSkew.
	TimestampClamped(rpc string)
}

// InstanceIDHeader is the gRPC response header (metadata key) carrying the
// server's instance id on ReportCacheState and PublishEvent. The id is
// random per server start: a producer that sees it change knows the server
// restarted with an empty index and re-reports what it holds.
const InstanceIDHeader = "inferencecache-server-instance-id"

// DefaultMaxClockSkew bounds how far in the future a producer timestamp may
// lie before it is clamped (Config.MaxClockSkew).
const DefaultMaxClockSkew = 5 * time.Second

// ErrInvalidConfig is wrapped by NewService's errors.
var ErrInvalidConfig = errors.New("rpc: invalid config")

// Service implements pb.InferenceCacheServer. It is safe for concurrent use.
// NewService sets every field; afterwards only the pool, the semaphore and
// the atomics change.
type Service struct {
	pb.UnimplementedInferenceCacheServer

	index     Index
	policies  engine.Policies
	observer  LookupObserver
	drops     DropObserver
	blockSize int
	tokenizer Tokenizer
	tokTO     time.Duration
	log       *slog.Logger
	now       func() time.Time
	producer  ProducerObserver
	// skewUS is MaxClockSkew in µs; instanceMD is the response header
	// carrying the instance id, nil without one. Both are immutable; the
	// header map is only read (grpc copies it into each stream's header).
	skewUS     int64
	instanceMD metadata.MD

	// scratch pools *lookupScratch; each LookupRoute call owns one scratch
	// from Get to Put.
	scratch sync.Pool
	// tokenizeSem bounds tokenizations in flight: a slot is taken before
	// Encode starts and released when it returns (even after the handler
	// gave up on it).
	tokenizeSem chan struct{}

	// promptFailOpen counts prompt_text lookups that failed open before
	// fingerprinting: no tokenizer, a text over MaxPromptTextBytes, every
	// tokenize slot busy, or a tokenizer error, empty or oversized output.
	// Handlers add to it; PromptTextFailOpens loads it.
	promptFailOpen atomic.Int64

	// droppedReports counts producer reports the index did not apply (see
	// DropReasons); handlers add to it, DroppedReports loads it.
	droppedReports atomic.Int64

	// The WARN lines requests can trigger, each at most once a minute (the
	// next one counts those held back): prompt_text fail-opens, dropped
	// producer reports, lookups with an oversized id. Immutable pointers to
	// lock-free limiters.
	promptLog, dropLog, oversizedLookupLog *ratelog.Limiter

	// batcher combines concurrent report streams' updates into IngestBatch
	// calls; nil when the index cannot batch (then every update goes
	// through Ingest).
	batcher *ingestBatcher

	// draining is set once by Drain; lookup streams load it after each
	// answer and end when it is set. lookupStreams counts the lookup
	// stream handlers running (added to on entry and exit).
	draining      atomic.Bool
	lookupStreams atomic.Int64

	// lookupUnary is serveLookupUnary as a method value, made once so the
	// pooled handler passes it to interceptors without allocating.
	lookupUnary grpc.UnaryHandler

	// The additions of docs/pd.md and docs/wire.md: immutable after
	// NewService but for templates (its own lock) and the atomics.
	features    FeatureObserver
	templateTok TemplateTokenizer
	metricsSrc  MetricsSource
	maxStreams  int
	eventBuffer int
	templates   templateCache
	// eventStreams and metricStreams count the observer streams open
	// (added to on entry and exit); drainCh is closed once by Drain and
	// ends them; lastStreamLog rate-limits their WARN (UnixNano, CAS).
	eventStreams, metricStreams atomic.Int64
	drainCh                     chan struct{}
	drainOnce                   sync.Once
	lastStreamLog               atomic.Int64
}

var _ pb.InferenceCacheServer = (*Service)(nil)

// NewService validates cfg and returns the service.
func NewService(cfg Config) (*Service, error) {
	switch {
	case cfg.Index == nil:
		return nil, fmt.Errorf("%w: nil Index", ErrInvalidConfig)
	case cfg.Policies == nil:
		return nil, fmt.Errorf("%w: nil Policies", ErrInvalidConfig)
	case cfg.BlockSize < 0:
		return nil, fmt.Errorf("%w: negative block size %d", ErrInvalidConfig, cfg.BlockSize)
	case cfg.MaxClockSkew < 0:
		return nil, fmt.Errorf("%w: negative max clock skew %v", ErrInvalidConfig, cfg.MaxClockSkew)
	case cfg.MaxStreams < 0 || cfg.EventBuffer < 0:
		return nil, fmt.Errorf("%w: negative stream limit %d or event buffer %d", ErrInvalidConfig, cfg.MaxStreams, cfg.EventBuffer)
	}
	s := &Service{
		index:       cfg.Index,
		policies:    cfg.Policies,
		observer:    cfg.Observer,
		drops:       cfg.Drops,
		blockSize:   cfg.BlockSize,
		tokenizer:   cfg.Tokenizer,
		tokTO:       cfg.TokenizeTimeout,
		log:         cfg.Logger,
		now:         cfg.Now,
		producer:    cfg.Producer,
		skewUS:      cfg.MaxClockSkew.Microseconds(),
		tokenizeSem: make(chan struct{}, MaxConcurrentTokenize),
		features:    cfg.Features,
		templateTok: cfg.TemplateTokenizer,
		metricsSrc:  cfg.Metrics,
		maxStreams:  cfg.MaxStreams,
		eventBuffer: cfg.EventBuffer,
		drainCh:     make(chan struct{}),
	}
	if s.features == nil {
		s.features = nopFeatures{}
	}
	if s.maxStreams == 0 {
		s.maxStreams = DefaultMaxStreams
	}
	if s.eventBuffer == 0 {
		s.eventBuffer = DefaultEventBuffer
	}
	if s.skewUS <= 0 {
		s.skewUS = DefaultMaxClockSkew.Microseconds()
	}
	if s.producer == nil {
		s.producer = nopProducer{}
	}
	if cfg.InstanceID != "" {
		s.instanceMD = metadata.Pairs(InstanceIDHeader, cfg.InstanceID)
	}
	if s.observer == nil {
		s.observer = nopObserver{}
	}
	if s.drops == nil {
		s.drops = nopDrops{}
	}
	if s.blockSize == 0 {
		s.blockSize = DefaultEngineBlockSize
	}
	if s.tokTO <= 0 {
		s.tokTO = DefaultTokenizeTimeout
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.promptLog = ratelog.NewWithClock(1, time.Minute, s.now)
	s.dropLog = ratelog.NewWithClock(1, time.Minute, s.now)
	s.oversizedLookupLog = ratelog.NewWithClock(1, time.Minute, s.now)
	s.scratch.New = func() any { return new(lookupScratch) }
	s.lookupUnary = s.serveLookupUnary
	if bi, ok := cfg.Index.(batchIndex); ok {
		s.batcher = &ingestBatcher{idx: bi}
	}
	return s, nil
}

type nopObserver struct{}

type nopProducer struct{}

func (nopProducer) TimestampClamped(string) {}

func (nopObserver) ObserveLookup(string, string, bool, time.Duration) {}

// PromptTextFailOpens returns how many prompt_text lookups failed open
// before fingerprinting (no tokenizer, oversized text, tokenizer busy or
// failed).
func (s *Service) PromptTextFailOpens() int64 { return s.promptFailOpen.Load() }

// DroppedReports returns how many producer reports the index did not apply
// (every reason of DropReasons).
func (s *Service) DroppedReports() int64 { return s.droppedReports.Load() }

// errDrainingStream ends a lookup stream of a draining server. UNAVAILABLE
// is the status clients retry on another connection (the drain's GOAWAY
// keeps new streams off this one).
var errDrainingStream = status.Error(codes.Unavailable, "server draining: reopen the lookup stream")

// Drain tells the service the server is shutting down: every lookup stream
// ends with UNAVAILABLE after its next answer, so gateways move their
// streams to a ready server instead of holding this one's GracefulStop until
// the drain timeout (a lookup stream that stays idle ends with the server's
// hard stop), and the observer streams (StreamCacheEvents, StreamMetrics)
// end with UNAVAILABLE at once. Unary calls and report streams are not
// affected.
func (s *Service) Drain() {
	s.draining.Store(true)
	s.drainOnce.Do(func() { close(s.drainCh) })
}

// LookupRouteStream answers each request on the stream, in order, with what
// LookupRoute gives it. This is the generated interface's method, used when
// the service is registered with pb.RegisterInferenceCacheServer; it runs
// Register's handler, whose pooled messages are proto messages too, so under
// the standard codec it answers the same (its calls are left to the GC
// instead of going back to the pool).
func (s *Service) LookupRouteStream(stream pb.InferenceCache_LookupRouteStreamServer) error {
	return lookupRouteStreamHandler(s, stream)
}

// LookupStreamsOpen returns how many LookupRouteStream streams are open.
func (s *Service) LookupStreamsOpen() int64 { return s.lookupStreams.Load() }
