package loadgen

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/picker/request"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// The picker load mode (RunPicker): drive an endpoint picker through real
// ext_proc streams as Envoy does (docs/gateway.md: FULL_DUPLEX_STREAMED
// both ways), one stream per HTTP request: the request headers and the
// chat body in chunks, the deferred headers answer (the picked endpoints)
// and the re-emitted body, then the response headers and body with the
// engine's usage, and the stream's end. The decision latency is the time
// from sending the last body chunk to the headers answer: what Envoy holds
// the request for.

// Protocol names the picker mode uses (picker's constants; kept here so
// the load generator does not import the picker).
const (
	pickerDestination = "x-gateway-destination-endpoint"
	pickerNamespace   = "envoy.lb"
	pickerServedKey   = "x-gateway-destination-endpoint-served"
)

// PickerTokenizer is what the picker mode tokenizes first turns with to
// report them as the engine that served them would (a
// *modeldir.Dir on the picker's --tokenizer-dir).
type PickerTokenizer interface {
	RequestTokens(ctx context.Context, modelID string, r *request.Request) ([]uint32, error)
}

// PickerConfig configures RunPicker. Start from DefaultPickerConfig.
type PickerConfig struct {
	// Target is the picker's ext_proc address; Conn, when set, is used
	// instead (the caller owns it). TLS dials with TLS when non-nil.
	Target string
	TLS    *tls.Config
	Conn   grpc.ClientConnInterface

	// Model is the chat requests' "model".
	Model string

	// Engine feedback (optional): with CacheConn (the server's gRPC), a
	// Tokenizer and Replicas (endpoint address -> replica id), each
	// conversation's first request is tokenized and reported as held by
	// the replica it was picked for, as its engine's KV events would, so
	// its later turns find their prefix. Tenant, HashScheme and BlockSize
	// key the reports.
	CacheConn            grpc.ClientConnInterface
	Tokenizer            PickerTokenizer
	Replicas             map[string]string
	Tenant, HashScheme   string
	ModelID              string // the index's model id of Model (default Model)
	BlockSize            int
	ReportTimeout        time.Duration
	ReportedConversation func() // test hook: called after each report

	// Workload: Conversations conversations at a time, Turns requests
	// each (then a new conversation takes its place); the first request
	// of a conversation is about PromptTokens tokens of history, each
	// later turn adds an exchange of about TurnTokens. Seed makes it
	// deterministic. SSE sends the response as a server-sent event stream
	// (usage in the last event) instead of one JSON body.
	Conversations, Turns     int
	PromptTokens, TurnTokens int
	Seed                     uint64
	SSE                      bool
	// BodyChunk is the size of the request body chunks (Envoy's buffer).
	BodyChunk int
	// Rate > 0 paces requests open loop (latency from the intended send),
	// at most Concurrency in flight; 0 runs Concurrency streams back to
	// back.
	Rate        float64
	Concurrency int
	// Warmup runs first and is not measured; Duration is the window.
	// Requests > 0 measures exactly that many requests instead (the
	// window lasts until they are done; Go benchmarks set it to b.N).
	Warmup, Duration time.Duration
	Requests         int
	// RequestTimeout bounds each stream.
	RequestTimeout time.Duration
	// MetricsURL is the server's /metrics, for the outcome counts.
	MetricsURL string
}

// DefaultPickerConfig: 256 conversations of 8 turns, about 2,048 tokens
// a request, closed loop with 32 streams in flight, 2 s warm-up, 10 s
// window.
func DefaultPickerConfig() PickerConfig {
	return PickerConfig{
		Model: "llama3", Tenant: "default", HashScheme: "vllm", BlockSize: fingerprint.DefaultBlockSize,
		ReportTimeout: 5 * time.Second,
		Conversations: 256, Turns: 8, PromptTokens: 2048, TurnTokens: 48, Seed: 1, BodyChunk: 16 << 10,
		Concurrency: 32, Warmup: 2 * time.Second, Duration: 10 * time.Second, RequestTimeout: 10 * time.Second,
	}
}

func (c *PickerConfig) validate() error {
	switch {
	case c.Target == "" && c.Conn == nil:
		return fmt.Errorf("%w: no picker address", ErrInvalidConfig)
	case c.Model == "":
		return fmt.Errorf("%w: no model", ErrInvalidConfig)
	case c.Conversations <= 0 || c.Turns <= 0 || c.PromptTokens <= 0 || c.TurnTokens < 0:
		return fmt.Errorf("%w: conversations, turns and prompt tokens must be positive", ErrInvalidConfig)
	case c.Turns > maxPickerTurns || c.PromptTokens+c.Turns*c.TurnTokens > maxPickerTokens:
		return fmt.Errorf("%w: at most %d turns and %d tokens a conversation", ErrInvalidConfig, maxPickerTurns, maxPickerTokens)
	case c.Concurrency <= 0:
		return fmt.Errorf("%w: concurrency must be positive", ErrInvalidConfig)
	case c.Rate < 0 || c.Warmup < 0 || c.Requests < 0 || c.Requests == 0 && c.Duration <= 0:
		return fmt.Errorf("%w: negative rate, warm-up or a window that is not positive", ErrInvalidConfig)
	case c.BodyChunk <= 0 || c.BlockSize <= 0 || c.RequestTimeout <= 0:
		return fmt.Errorf("%w: body chunk, block size and request timeout must be positive", ErrInvalidConfig)
	case c.CacheConn != nil && (c.Tokenizer == nil || len(c.Replicas) == 0):
		return fmt.Errorf("%w: engine feedback needs a tokenizer and the replicas of the endpoints", ErrInvalidConfig)
	}
	return nil
}

// Bounds of a generated conversation (its turns are made up front).
const (
	maxPickerTurns  = 4096
	maxPickerTokens = 1 << 20
)

// PickerReport is what a picker run measured.
type PickerReport struct {
	Scenario struct {
		Target                                         string  `json:"target"`
		TLS                                            bool    `json:"tls"`
		Model                                          string  `json:"model"`
		Conversations, Turns, PromptTokens, TurnTokens int     `json:"-"`
		Mode                                           string  `json:"mode"`
		Rate                                           float64 `json:"rate,omitempty"`
		Concurrency                                    int     `json:"concurrency"`
		WarmupS, DurationS                             float64 `json:"-"`
		Feedback                                       bool    `json:"engine_feedback"`
		SSE                                            bool    `json:"sse"`
	} `json:"scenario"`
	Machine Machine `json:"machine"`
	// Picks are the streams that ended in a pick (a destination) within the
	// window; Immediate the ones the picker answered itself (by status);
	// Errors the ones that failed (a broken stream, a timeout).
	Picks       int64            `json:"picks"`
	Immediate   map[string]int64 `json:"immediate,omitempty"`
	Errors      int64            `json:"errors"`
	PicksPerSec float64          `json:"picks_per_s"`
	// MeanBodyBytes is the mean request body.
	MeanBodyBytes float64 `json:"mean_body_bytes"`
	// Decision is from the last request body chunk sent to the headers
	// answer; Stream the whole request, first message to the stream's end.
	Decision Latency `json:"decision"`
	Stream   Latency `json:"stream"`
	// Outcomes are the server's inferencecache_picker_picks_total in the
	// window, "outcome/reason" (empty without a metrics URL).
	Outcomes map[string]int64 `json:"outcomes,omitempty"`
	// CPUPerPickUs is this process's CPU (user + system) over the window
	// per pick: the client, and the server when it runs in process.
	CPUPerPickUs float64 `json:"cpu_per_pick_us"`
	// Reports counts the first turns reported as held (engine feedback).
	Reports int64 `json:"reports"`
}

// pickerConv is one conversation of the workload: head is the body up to
// and including the messages so far, exchanges each later turn's extra
// messages (JSON, a leading comma), tail what closes the body.
type pickerConv struct {
	id        uint64
	head      []byte
	exchanges [][]byte
	next      int // the turn to send next
}

var pickerWords = strings.Fields(`the a of to in and for with on is are was be it this that which when where how not all each some more
request response engine replica cache prefix block token model gateway picker endpoint route index lookup score load queue
latency memory budget policy tenant stream message body header status error retry timeout user assistant system tool function
call result value field name type string number list object map key read write open close parse render encode hash chain match
rank pick send receive start finish count report file line code test build run deploy config option limit size length version
order invoice account payment refund delivery address email password support customer price date fast slow small large long
short new old first last next warm cold busy idle because however therefore instead finally then also only still already
server client service handler worker buffer allocation compute prefill decode attention layer vocabulary byte word sentence
document conversation turn history context question answer summary detail example case path loop condition keeps holds takes
gives makes finds shows says needs uses adds drops moves changes checks fails works helps quickly exactly roughly simply`)

// prose appends about tokens tokens of text (about 4.3 bytes a token).
func prose(dst []byte, r *rand.Rand, tokens int) []byte {
	target := len(dst) + tokens*43/10
	first := true
	for len(dst) < target {
		w := pickerWords[r.IntN(len(pickerWords))]
		switch {
		case first:
			dst = append(dst, strings.ToUpper(w[:1])...)
			dst = append(dst, w[1:]...)
			first = false
			continue
		case r.IntN(19) == 0:
			w = strconv.Itoa(r.IntN(100000))
		}
		dst = append(dst, ' ')
		dst = append(dst, w...)
		if r.IntN(11) == 0 {
			dst = append(dst, '.')
			if r.IntN(5) == 0 {
				dst = append(dst, `\n\n`...) // a paragraph break, escaped
			}
			first = true
		}
	}
	return append(dst, '.')
}

// newPickerConv builds conversation id: a system prompt, then user and
// assistant messages up to about promptTokens, then the turns.
func newPickerConv(cfg *PickerConfig, id uint64) *pickerConv {
	r := rand.New(rand.NewPCG(cfg.Seed, id))
	c := &pickerConv{id: id}
	h := fmt.Appendf(nil, `{"model":%q,"stream":%t,`, cfg.Model, cfg.SSE)
	if cfg.SSE {
		h = append(h, `"stream_options":{"include_usage":true},`...)
	}
	h = fmt.Appendf(h, `"messages":[{"role":"system","content":"Conversation %d. `, id)
	h = prose(h, r, 120)
	h = append(h, `"}`...)
	role := 0
	for have := 130; have < cfg.PromptTokens; have += 260 {
		n := min(260, cfg.PromptTokens-have)
		h = append(h, `,{"role":"`...)
		h = append(h, []string{"user", "assistant"}[role]...)
		h = append(h, `","content":"`...)
		h = prose(h, r, n)
		h = append(h, `"}`...)
		role ^= 1
	}
	if role == 1 {
		// End on a user message: the request asks for the next answer.
		h = append(h, `,{"role":"user","content":"`...)
		h = prose(h, r, 20)
		h = append(h, `"}`...)
	}
	c.head = h
	for t := 1; t < cfg.Turns; t++ {
		ex := append([]byte(nil), `,{"role":"assistant","content":"`...)
		ex = prose(ex, r, cfg.TurnTokens*3/4)
		ex = append(ex, `"},{"role":"user","content":"`...)
		ex = prose(ex, r, cfg.TurnTokens/4)
		ex = append(ex, `"}`...)
		c.exchanges = append(c.exchanges, ex)
	}
	return c
}

// body appends the request body of turn t.
func (c *pickerConv) body(dst []byte, t int) []byte {
	dst = append(dst, c.head...)
	for _, ex := range c.exchanges[:t] {
		dst = append(dst, ex...)
	}
	return append(dst, "]}"...)
}

// pickerWorkload hands out turns: the conversations in turn, each its
// next request; a conversation that has sent all its turns is replaced by
// a new one.
type pickerWorkload struct {
	cfg *PickerConfig
	// mu protects convs, at and nextID.
	mu     sync.Mutex
	convs  []*pickerConv
	at     int
	nextID uint64
}

func newPickerWorkload(cfg *PickerConfig) *pickerWorkload {
	w := &pickerWorkload{cfg: cfg}
	for range cfg.Conversations {
		w.convs = append(w.convs, newPickerConv(cfg, w.nextID))
		w.nextID++
	}
	return w
}

// next returns a conversation and the turn to send. A conversation that
// sent its last turn is replaced by a new one built outside the lock; until
// the replacement is stored, next passes over it (handing out its turn
// past the last would read past its exchanges).
func (w *pickerWorkload) next() (*pickerConv, int) {
	w.mu.Lock()
	for range len(w.convs) {
		i := w.at
		w.at = (w.at + 1) % len(w.convs)
		c := w.convs[i]
		if c.next >= w.cfg.Turns {
			continue // its replacement is being built
		}
		t := c.next
		c.next++
		var id uint64
		replace := c.next >= w.cfg.Turns
		if replace {
			id = w.nextID
			w.nextID++
		}
		w.mu.Unlock()
		if replace {
			nc := newPickerConv(w.cfg, id)
			w.mu.Lock()
			w.convs[i] = nc
			w.mu.Unlock()
		}
		return c, t
	}
	// Every conversation awaits its replacement (more workers than
	// conversations): this request starts a conversation of its own.
	id := w.nextID
	w.nextID++
	w.mu.Unlock()
	c := newPickerConv(w.cfg, id)
	c.next = 1
	return c, 0
}

// pickerRun is the state of one RunPicker.
type pickerRun struct {
	cfg     *PickerConfig
	ext     extprocv3.ExternalProcessorClient
	cache   pb.InferenceCacheClient
	work    *pickerWorkload
	measure atomic.Bool // inside the window
	// opening holds workers from the end of the warm-up until the window
	// opens (closing open), and inflight counts the requests running, so
	// no warm-up request is still running, to be counted by the server's
	// metrics, when the window's first scrape reads them.
	opening  atomic.Bool
	open     chan struct{}
	inflight atomic.Int64
	// remaining and finished count the window's requests in Requests
	// mode; windowDone is closed when the last one finished.
	remaining, finished atomic.Int64
	windowDone          chan struct{}
	picks               atomic.Int64
	errs                atomic.Int64
	reports             atomic.Int64
	bodySum             atomic.Int64
	// unknown counts picks of an address Replicas does not name.
	unknown atomic.Int64
	lastErr atomic.Pointer[error]
	// mu protects imm, decision and stream.
	mu       sync.Mutex
	imm      map[string]int64
	decision Histogram
	stream   Histogram
}

// RunPicker drives the picker for cfg.Warmup + cfg.Duration and reports
// the window.
func RunPicker(ctx context.Context, cfg PickerConfig) (*PickerReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.ModelID == "" {
		cfg.ModelID = cfg.Model
	}
	conn := cfg.Conn
	if conn == nil {
		creds := insecure.NewCredentials()
		if cfg.TLS != nil {
			creds = credentials.NewTLS(cfg.TLS)
		}
		cc, err := grpc.NewClient(cfg.Target, grpc.WithTransportCredentials(creds))
		if err != nil {
			return nil, fmt.Errorf("cannot dial the picker: %w", err)
		}
		defer cc.Close()
		conn = cc
	}
	r := &pickerRun{cfg: &cfg, ext: extprocv3.NewExternalProcessorClient(conn), imm: map[string]int64{}, windowDone: make(chan struct{}), open: make(chan struct{})}
	r.remaining.Store(int64(cfg.Requests))
	if cfg.CacheConn != nil {
		r.cache = pb.NewInferenceCacheClient(cfg.CacheConn)
	}
	r.work = newPickerWorkload(&cfg)
	var scrape func(ctx context.Context) (map[string]int64, error)
	if cfg.MetricsURL != "" {
		url := cfg.MetricsURL
		scrape = func(ctx context.Context) (map[string]int64, error) { return scrapePickerOutcomes(ctx, url) }
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tokens := make(chan time.Time, cfg.Concurrency)
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Go(func() { r.worker(ctx, tokens) })
	}
	// The schedule: open loop at Rate (latency from the intended send),
	// or closed loop (a token whenever a worker is free).
	wg.Go(func() {
		defer close(tokens)
		start := time.Now()
		for i := 0; ctx.Err() == nil; i++ {
			due := time.Time{}
			if cfg.Rate > 0 {
				due = start.Add(time.Duration(float64(i) / cfg.Rate * float64(time.Second)))
				if d := time.Until(due); d > 0 {
					t := time.NewTimer(d)
					select {
					case <-ctx.Done():
						t.Stop()
						return
					case <-t.C:
					}
				}
			}
			select {
			case tokens <- due:
			case <-ctx.Done():
				return
			}
		}
	})

	if !sleepCtx(ctx, cfg.Warmup) {
		cancel()
		wg.Wait()
		return nil, ctx.Err()
	}
	r.opening.Store(true)
	var before map[string]int64
	err := r.drain(ctx)
	if err == nil && scrape != nil {
		before, err = scrape(ctx)
	}
	if err != nil {
		cancel()
		wg.Wait()
		return nil, err
	}
	r.measure.Store(true)
	r.opening.Store(false)
	close(r.open)
	cpu0, t0 := processCPU(), time.Now()
	var done bool
	if cfg.Requests > 0 {
		select {
		case <-r.windowDone:
			done = true
		case <-ctx.Done():
		}
	} else {
		done = sleepCtx(ctx, cfg.Duration)
	}
	r.measure.Store(false)
	elapsed, cpu := time.Since(t0), processCPU()-cpu0
	var after map[string]int64
	var scrapeErr error
	if done && scrape != nil {
		after, scrapeErr = scrape(ctx)
	}
	cancel()
	wg.Wait()
	if !done {
		return nil, ctx.Err()
	}
	if scrapeErr != nil {
		return nil, scrapeErr
	}
	rep := &PickerReport{Machine: Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPUs: runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version()}, Picks: r.picks.Load(), Errors: r.errs.Load(), Reports: r.reports.Load(), Immediate: r.imm}
	s := &rep.Scenario
	s.Target, s.TLS, s.Model, s.Feedback, s.SSE = cfg.Target, cfg.TLS != nil, cfg.Model, r.cache != nil, cfg.SSE
	s.Conversations, s.Turns, s.PromptTokens, s.TurnTokens = cfg.Conversations, cfg.Turns, cfg.PromptTokens, cfg.TurnTokens
	s.Mode, s.Rate, s.Concurrency = "closed", cfg.Rate, cfg.Concurrency
	if cfg.Rate > 0 {
		s.Mode = "open"
	}
	s.WarmupS, s.DurationS = cfg.Warmup.Seconds(), elapsed.Seconds()
	rep.PicksPerSec = float64(rep.Picks) / elapsed.Seconds()
	if n := rep.Picks + r.immTotal(); n > 0 {
		rep.MeanBodyBytes = float64(r.bodySum.Load()) / float64(n)
	}
	if rep.Picks > 0 {
		rep.CPUPerPickUs = float64(cpu.Microseconds()) / float64(rep.Picks)
	}
	rep.Decision, rep.Stream = summarize(&r.decision), summarize(&r.stream)
	if after != nil {
		rep.Outcomes = map[string]int64{}
		for k, v := range after {
			if d := v - before[k]; d > 0 {
				rep.Outcomes[k] = d
			}
		}
	}
	if rep.Picks == 0 && rep.Errors > 0 {
		if e := r.lastErr.Load(); e != nil {
			return rep, fmt.Errorf("every request failed, the last with: %w", *e)
		}
	}
	return rep, nil
}

func (r *pickerRun) immTotal() int64 {
	var n int64
	for _, v := range r.imm {
		n += v
	}
	return n
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// worker runs requests as the schedule releases them, with its own
// histograms (merged at the end) and buffers.
func (r *pickerRun) worker(ctx context.Context, tokens <-chan time.Time) {
	var dec, str Histogram
	defer func() {
		r.mu.Lock()
		r.decision.Merge(&dec)
		r.stream.Merge(&str)
		r.mu.Unlock()
	}()
	x := &pickerExchange{r: r}
	x.init()
	for due := range tokens {
		waited, ok := r.enter(ctx)
		if !ok {
			return
		}
		if waited {
			due = time.Time{} // the hold was the harness's, not the picker's latency
		}
		measured, stop := r.ticket()
		if stop {
			r.inflight.Add(-1)
			return
		}
		conv, turn := r.work.next()
		x.body = conv.body(x.body[:0], turn)
		start := time.Now()
		if !due.IsZero() && due.Before(start) {
			start = due
		}
		d, imm, err := x.do(ctx, conv, turn)
		r.inflight.Add(-1)
		if ctx.Err() != nil {
			return
		}
		if !measured || r.cfg.Requests == 0 && !r.measure.Load() {
			continue
		}
		r.bodySum.Add(int64(len(x.body)))
		switch {
		case err != nil:
			r.errs.Add(1)
			r.lastErr.Store(&err)
		case imm != "":
			r.mu.Lock()
			r.imm[imm]++
			r.mu.Unlock()
		default:
			r.picks.Add(1)
			dec.Record(d)
			str.Record(time.Since(start))
		}
		if r.cfg.Requests > 0 && r.finished.Add(1) == int64(r.cfg.Requests) {
			close(r.windowDone)
		}
	}
}

// enter counts a request about to start in inflight, first holding it
// while the window opens; waited says it was held, ok false that ctx ended.
func (r *pickerRun) enter(ctx context.Context) (waited, ok bool) {
	for {
		// Counted before the check: drain, having set opening, then sees
		// every request that did not see it.
		r.inflight.Add(1)
		if !r.opening.Load() {
			return waited, true
		}
		r.inflight.Add(-1)
		select {
		case <-r.open:
			waited = true
		case <-ctx.Done():
			return waited, false
		}
	}
}

// drain waits until the requests started before opening was set finished.
func (r *pickerRun) drain(ctx context.Context) error {
	for r.inflight.Load() > 0 {
		if !sleepCtx(ctx, time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// ticket says whether the request about to start is measured, or, in
// Requests mode once the window's requests are handed out, that the
// worker stops (so nothing runs when the outcomes are scraped).
func (r *pickerRun) ticket() (measured, stop bool) {
	if r.cfg.Requests > 0 && r.remaining.Load() <= 0 {
		return false, true
	}
	if !r.measure.Load() {
		return false, false
	}
	if r.cfg.Requests == 0 {
		return true, false
	}
	if r.remaining.Add(-1) < 0 {
		return false, true
	}
	return true, false
}

// pickerExchange is one worker's reusable request state: the body and
// response buffers and the messages it sends (gRPC marshals a message
// within Send, so each is rewritten only after the previous Send
// returned), and the one it receives into.
type pickerExchange struct {
	r    *pickerRun
	body []byte
	resp []byte

	headers  extprocv3.ProcessingRequest
	reqBody  extprocv3.ProcessingRequest
	reqBodyB extprocv3.ProcessingRequest_RequestBody
	reqHTTP  extprocv3.HttpBody
	respHdrs extprocv3.ProcessingRequest
	respHdrB extprocv3.ProcessingRequest_ResponseHeaders
	respHTTP extprocv3.HttpHeaders
	respBody extprocv3.ProcessingRequest
	respBodB extprocv3.ProcessingRequest_ResponseBody
	respBHTP extprocv3.HttpBody
	in       extprocv3.ProcessingResponse
	// served is the response-phase metadata naming each endpoint.
	served map[string]*corev3.Metadata
}

func (x *pickerExchange) init() {
	cfg := x.r.cfg
	x.headers = extprocv3.ProcessingRequest{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(request.ChatPath)},
			{Key: ":authority", RawValue: []byte("loadgen")}, {Key: "content-type", RawValue: []byte("application/json")},
		}}}},
	}
	x.reqBodyB.RequestBody = &x.reqHTTP
	x.reqBody.Request = &x.reqBodyB
	ctype := "application/json"
	if cfg.SSE {
		ctype = "text/event-stream"
	}
	x.respHTTP.Headers = &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte(ctype)},
	}}
	x.respHdrB.ResponseHeaders = &x.respHTTP
	x.respHdrs.Request = &x.respHdrB
	x.respBodB.ResponseBody = &x.respBHTP
	x.respBody.Request = &x.respBodB
	x.served = map[string]*corev3.Metadata{}
}

func (x *pickerExchange) servedMD(addr string) *corev3.Metadata {
	md := x.served[addr]
	if md == nil {
		md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{pickerNamespace: {
			Fields: map[string]*structpb.Value{pickerServedKey: structpb.NewStringValue(addr)}}}}
		x.served[addr] = md
	}
	return md
}

// do sends one request through the picker: the decision latency, or the
// status of the picker's own answer, or the error.
func (x *pickerExchange) do(ctx context.Context, conv *pickerConv, turn int) (time.Duration, string, error) {
	cfg := x.r.cfg
	ctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
	defer cancel()
	st, err := x.r.ext.Process(ctx)
	if err != nil {
		return 0, "", err
	}
	defer func() {
		// Always end the stream, whatever happened.
		_ = st.CloseSend()
	}()
	if err := st.Send(&x.headers); err != nil {
		return 0, "", err
	}
	var sent time.Time
	for off := 0; off < len(x.body); off += cfg.BodyChunk {
		end := min(off+cfg.BodyChunk, len(x.body))
		if end == len(x.body) {
			sent = time.Now()
		}
		x.reqHTTP.Body, x.reqHTTP.EndOfStream = x.body[off:end], end == len(x.body)
		if err := st.Send(&x.reqBody); err != nil {
			return 0, "", err
		}
	}
	m := &x.in
	if err := st.RecvMsg(m); err != nil {
		return 0, "", err
	}
	decision := time.Since(sent)
	if ir := m.GetImmediateResponse(); ir != nil {
		return 0, strconv.Itoa(int(ir.GetStatus().GetCode())), nil
	}
	var dest string
	for _, o := range m.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if o.GetHeader().GetKey() == pickerDestination {
			dest = string(o.GetHeader().GetRawValue())
		}
	}
	if dest == "" {
		return 0, "", errors.New("the headers answer names no destination")
	}
	primary, _, _ := strings.Cut(dest, ",")
	for got := 0; ; {
		if err := st.RecvMsg(m); err != nil {
			return 0, "", err
		}
		sr := m.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		got += len(sr.GetBody())
		if sr.GetEndOfStream() {
			if got != len(x.body) {
				return 0, "", fmt.Errorf("the picker passed on %d body bytes of %d", got, len(x.body))
			}
			break
		}
	}
	prompt := (len(x.body) * 10) / 43
	cached := 0
	if turn > 0 {
		cached = prompt * 9 / 10
	}
	if turn == 0 && x.r.cache != nil {
		if err := x.r.report(ctx, primary, x.body); err != nil {
			return 0, "", err
		}
	}
	served := x.servedMD(primary)
	x.respHdrs.MetadataContext = served
	if err := st.Send(&x.respHdrs); err != nil {
		return 0, "", err
	}
	if err := st.RecvMsg(m); err != nil {
		return 0, "", err
	}
	var parts [2][]byte
	n := 1
	x.resp = x.resp[:0]
	if cfg.SSE {
		x.resp = append(x.resp, `data: {"id":"lg","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Fine."}}],"usage":null}`+"\n\n"...)
		k := len(x.resp)
		x.resp = fmt.Appendf(x.resp, `data: {"id":"lg","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":16,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`+"\n\ndata: [DONE]\n\n", prompt, prompt+16, cached)
		parts, n = [2][]byte{x.resp[:k], x.resp[k:]}, 2
	} else {
		x.resp = fmt.Appendf(x.resp, `{"id":"lg","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Fine."},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":16,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, prompt, prompt+16, cached)
		parts[0] = x.resp
	}
	x.respBody.MetadataContext = served
	for i, p := range parts[:n] {
		x.respBHTP.Body, x.respBHTP.EndOfStream = p, i == n-1
		if err := st.Send(&x.respBody); err != nil {
			return 0, "", err
		}
		if err := st.RecvMsg(m); err != nil {
			return 0, "", err
		}
	}
	if err := st.CloseSend(); err != nil {
		return 0, "", err
	}
	if err := st.RecvMsg(m); !errors.Is(err, io.EOF) {
		return 0, "", fmt.Errorf("the ext_proc stream did not end cleanly: %v", err)
	}
	return decision, "", nil
}

// report tokenizes a conversation's first request and reports its block
// chain as held by the replica at addr, as that engine's KV events would.
func (r *pickerRun) report(ctx context.Context, addr string, body []byte) error {
	replica, ok := r.cfg.Replicas[addr]
	if !ok {
		r.unknown.Add(1)
		return nil
	}
	req, err := request.Parse(request.ChatPath, body)
	if err != nil {
		return fmt.Errorf("cannot parse a generated request: %w", err)
	}
	toks, err := r.cfg.Tokenizer.RequestTokens(ctx, r.cfg.ModelID, req)
	if err != nil {
		return fmt.Errorf("cannot tokenize a generated request: %w", err)
	}
	sums := fingerprint.AppendChain(nil, toks, r.cfg.BlockSize, 0, false)
	pe := &pb.PrefixEntry{BlockHashes: make([][]byte, 0, len(sums)), BlockTokenCounts: make([]int32, 0, len(sums))}
	for _, h := range sums {
		pe.BlockHashes = append(pe.BlockHashes, fingerprint.AppendWire(nil, h))
		pe.BlockTokenCounts = append(pe.BlockTokenCounts, int32(r.cfg.BlockSize))
	}
	rctx, cancel := context.WithTimeout(ctx, r.cfg.ReportTimeout)
	defer cancel()
	st, err := r.cache.ReportCacheState(rctx)
	if err != nil {
		return err
	}
	if err := st.Send(&pb.CacheStateUpdate{TenantId: r.cfg.Tenant, ModelId: r.cfg.ModelID, HashScheme: r.cfg.HashScheme, ReplicaId: replica,
		TimestampUs: time.Now().UnixMicro(), Stats: &pb.ReplicaStats{HitRate: 0.5}, Prefixes: []*pb.PrefixEntry{pe}}); err != nil {
		return err
	}
	if _, err := st.CloseAndRecv(); err != nil {
		return err
	}
	r.reports.Add(1)
	if r.cfg.ReportedConversation != nil {
		r.cfg.ReportedConversation()
	}
	return nil
}

// scrapePickerOutcomes reads inferencecache_picker_picks_total by
// "outcome/reason".
func scrapePickerOutcomes(ctx context.Context, url string) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("cannot scrape %s: status %d", url, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("cannot parse %s: %w", url, err)
	}
	out := map[string]int64{}
	for _, m := range fams["inferencecache_picker_picks_total"].GetMetric() {
		var o, reason string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "outcome":
				o = l.GetValue()
			case "reason":
				reason = l.GetValue()
			}
		}
		out[o+"/"+reason] += int64(m.GetCounter().GetValue())
	}
	return out, nil
}

// processCPU is this process's user + system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// WriteJSON writes the report as indented JSON.
func (rep *PickerReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteMarkdown writes the report as Markdown.
func (rep *PickerReport) WriteMarkdown(w io.Writer) error {
	s := rep.Scenario
	tlsNote := "plaintext"
	if s.TLS {
		tlsNote = "TLS"
	}
	mode := fmt.Sprintf("closed loop, %d streams in flight", s.Concurrency)
	if s.Mode == "open" {
		mode = fmt.Sprintf("open loop at %.0f requests/s (at most %d in flight)", s.Rate, s.Concurrency)
	}
	feedback := "no engine feedback (later turns find a prefix only if engines report it)"
	if s.Feedback {
		feedback = fmt.Sprintf("engine feedback: each conversation's first request tokenized and reported as held by its replica (%d reports)", rep.Reports)
	}
	fmt.Fprintf(w, "Endpoint picker %s (%s), model %s: %d conversations at a time, %d turns each, first request about %d tokens, +%d a turn; "+
		"%s; %.1fs measured after %.1fs of warm-up; %s. Machine: %s/%s, %d CPUs (GOMAXPROCS %d), %s.\n\n",
		s.Target, tlsNote, s.Model, s.Conversations, s.Turns, s.PromptTokens, s.TurnTokens, mode, s.DurationS, s.WarmupS, feedback,
		rep.Machine.GOOS, rep.Machine.GOARCH, rep.Machine.CPUs, rep.Machine.GOMAXPROCS, rep.Machine.GoVersion)
	fmt.Fprintln(w, "| picks/s | picks | errors | picker's own answers | mean body | CPU per pick (this process) | picks/s per 2 cores of that CPU |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|")
	imm := "0"
	if len(rep.Immediate) > 0 {
		var parts []string
		for _, k := range slices.Sorted(mapsKeys(rep.Immediate)) {
			parts = append(parts, fmt.Sprintf("%s: %d", k, rep.Immediate[k]))
		}
		imm = strings.Join(parts, ", ")
	}
	perCores := "-"
	if rep.CPUPerPickUs > 0 {
		perCores = fmt.Sprintf("%.0f", 2e6/rep.CPUPerPickUs)
	}
	fmt.Fprintf(w, "| %.0f | %d | %d | %s | %.0f B | %.0f µs | %s |\n\n", rep.PicksPerSec, rep.Picks, rep.Errors, imm, rep.MeanBodyBytes, rep.CPUPerPickUs, perCores)
	fmt.Fprintln(w, "| latency | p50 | p90 | p99 | p99.9 | max | mean |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	for _, l := range []struct {
		name string
		lat  Latency
	}{{"decision (last body chunk to the headers answer)", rep.Decision}, {"whole request (stream open to end)", rep.Stream}} {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", l.name, fmtUs(l.lat.P50Us), fmtUs(l.lat.P90Us), fmtUs(l.lat.P99Us),
			fmtUs(l.lat.P999Us), fmtUs(l.lat.MaxUs), fmtUs(l.lat.MeanUs))
	}
	if len(rep.Outcomes) > 0 {
		fmt.Fprintln(w, "\n| outcome | reason | picks |")
		fmt.Fprintln(w, "|---|---|---:|")
		for _, k := range slices.Sorted(mapsKeys(rep.Outcomes)) {
			o, reason, _ := strings.Cut(k, "/")
			fmt.Fprintf(w, "| %s | %s | %d |\n", o, reason, rep.Outcomes[k])
		}
	}
	return nil
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
