package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferencecache/inferencecache/kvevents"
	"github.com/inferencecache/inferencecache/picker/endpoints"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
)

// The picker part of the demo: three fake vLLM engines on 127.0.0.1
// behind the endpoint picker, each followed by a real kvevents subscriber
// (its KV events and /metrics into the server, as the sidecar does), and
// users whose multi-turn chats the demo sends through the picker exactly
// as Envoy does (ext_proc over a real gRPC connection, then upstream over
// HTTP to the endpoint the picker chose, the response streamed back
// through the picker).
const (
	demoTenant = "demo"
	// demoModelID is the model of the embedded tokenizer.
	demoModelID = "demo-model"
	// statsInterval is how often the subscribers scrape their engine's
	// /metrics (the production default is 1 s; the demo is short).
	statsInterval = 100 * time.Millisecond
	// userStagger spaces the users' first requests; thinkTime is the pause
	// between a user's turns (plus up to 30 ms).
	userStagger = 25 * time.Millisecond
	thinkTime   = 20 * time.Millisecond
)

var replicaIDs = []string{"engine-a", "engine-b", "engine-c"}

// pickerDemo is the picker part's setup: the engines and what they
// report about the requests they serve.
type pickerDemo struct {
	model   string
	engines []*fakeEngine
	byAddr  map[string]*fakeEngine
	// served holds each request's engine result by x-request-id until the
	// user that sent it picks it up.
	served sync.Map
}

// newPickerDemo starts the fake engines for model, with the tokenizer
// files of tokDir (the same the picker reads).
func newPickerDemo(tokDir, model string) (*pickerDemo, error) {
	tj, cj, err := readModelFiles(tokDir, model)
	if err != nil {
		return nil, err
	}
	m, err := loadEngineModel(tj, cj)
	if err != nil {
		return nil, err
	}
	d := &pickerDemo{model: model, byAddr: map[string]*fakeEngine{}}
	for _, id := range replicaIDs {
		e, err := newFakeEngine(id, model, m)
		if err != nil {
			d.close()
			return nil, err
		}
		e.record = func(rid string, r engineResult) { d.served.Store(rid, r) }
		d.engines = append(d.engines, e)
		d.byAddr[e.addr] = e
	}
	return d, nil
}

func (d *pickerDemo) close() {
	for _, e := range d.engines {
		e.close()
	}
}

// pool is the engines as the picker's endpoints.
func (d *pickerDemo) pool() (*endpoints.Pool, error) {
	var eps []endpoints.Endpoint
	for _, e := range d.engines {
		eps = append(eps, endpoints.Endpoint{ReplicaID: e.replicaID, Address: e.addr})
	}
	return endpoints.NewPool(demoTenant, "vllm", nil, eps)
}

// turnRecord is one request as the demo saw it.
type turnRecord struct {
	conv, kind     string
	turn           int
	engine         string
	prompt, cached int
}

// pickerResult is what the chat run saw.
type pickerResult struct {
	requests       int
	conversations  []*conversation
	records        []turnRecord
	outcomes       map[string]int // "outcome/reason" from the server's metrics
	tokenizerNote  string
	predicted      float64 // the picker's metrics
	delivered      float64
	conversationsN int
	turns          int
}

// run sends conversations x turns chat requests through the picker and
// records where they went.
func (d *pickerDemo) run(ctx context.Context, srv *server.Server, nConv, turns int) (*pickerResult, error) {
	cconn, err := kvevents.DialServer(srv.GRPCAddr().String(), kvevents.TLSFiles{})
	if err != nil {
		return nil, err
	}
	defer cconn.Close()
	subCtx, stopSubs := context.WithCancel(context.WithoutCancel(ctx))
	var subs sync.WaitGroup
	defer func() { stopSubs(); subs.Wait() }()
	sink := kvevents.NewGRPCSink(cconn, nil)
	for _, e := range d.engines {
		if err := e.subscribe(subCtx, sink, demoTenant, d.model, statsInterval, &subs); err != nil {
			return nil, fmt.Errorf("engine %s: %w", e.replicaID, err)
		}
	}

	// The server loads a model's tokenizer on its first request (a real
	// one takes a second or more); the users should not all fall back
	// meanwhile, so one prompt_text lookup, which waits for the load,
	// goes first.
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	_, err = pb.NewInferenceCacheClient(cconn).LookupRoute(wctx, &pb.LookupRouteRequest{TenantId: demoTenant, ModelId: d.model,
		HashScheme: "vllm", PromptText: "Hello."})
	wcancel()
	if err != nil {
		return nil, fmt.Errorf("cannot warm the picker's tokenizer up: %w", err)
	}

	creds := insecure.NewCredentials()
	if srv.PickerTLS() {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // gateways do not verify an endpoint picker
	}
	pconn, err := grpc.NewClient(srv.PickerAddr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer pconn.Close()
	gw := &gateway{ext: extprocv3.NewExternalProcessorClient(pconn), http: &http.Client{Timeout: 30 * time.Second}}

	res := &pickerResult{outcomes: map[string]int{}, conversationsN: nConv, turns: turns}
	res.conversations = conversations(nConv)
	var mu sync.Mutex // protects res.records and firstErr
	var firstErr error
	uctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var users sync.WaitGroup
	for i, c := range res.conversations {
		users.Go(func() {
			err := d.user(uctx, gw, i, c, turns, func(r turnRecord) {
				mu.Lock()
				res.records = append(res.records, r)
				mu.Unlock()
			})
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", c.name, err)
				}
				mu.Unlock()
				cancel()
			}
		})
	}
	users.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	res.requests = len(res.records)
	return res, nil
}

// user is one user's conversation: a turn, the answer, a pause, the next
// turn.
func (d *pickerDemo) user(ctx context.Context, gw *gateway, i int, c *conversation, turns int, record func(turnRecord)) error {
	if !sleep(ctx, time.Duration(i)*userStagger) {
		return ctx.Err()
	}
	for turn := range turns {
		x, err := gw.do(ctx, c.body(d.model, turn))
		if err != nil {
			return err
		}
		e := d.byAddr[x.dest]
		v, ok := d.served.LoadAndDelete(x.id)
		if e == nil || !ok {
			return fmt.Errorf("the picker chose %q, and no engine there served request %s", x.dest, x.id)
		}
		record(turnRecord{conv: c.name, kind: c.kind, turn: turn, engine: e.replicaID, prompt: x.prompt, cached: x.cached})
		c.answered(turn, x.answer)
		// The user reads the answer before writing the next turn: by then
		// the engine's KV events have reached the index (in a real
		// deployment seconds pass; here the demo waits for them).
		if r := v.(engineResult); r.seq > 0 {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := r.engine.indexed(wctx, r.seq)
			cancel()
			if err != nil {
				return err
			}
		}
		if !sleep(ctx, thinkTime+time.Duration((i*7+turn*13)%30)*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// outcomeMeaning explains the picker's outcomes in the report.
var outcomeMeaning = map[string]string{
	"prefix/none":     "an engine holds a prefix of the prompt (PREFIX_MATCH): the best ranked",
	"tenant_hot/none": "no engine holds a prefix; engines warm for the model (TENANT_HOT)",
	"affinity/none":   "no usable prefix: the index's consistent-hash pin among the engines that hold blocks of the model (AFFINITY_HINT)",
	"fallback/no_hint": "the index had no hint (at the very start it holds nothing): the engine with the fewest requests in flight, " +
		"ties to the rendezvous hash of the conversation",
}

// writePickerReport prints where the chats went and why.
func writePickerReport(w io.Writer, r *pickerResult) {
	fmt.Fprintf(w, "\n## Through the endpoint picker (ext_proc, as Envoy sends it)\n\n")
	fmt.Fprintf(w, "%d chat requests: %d users, %d turns each, at once (staggered by %v, %v-%v between turns), "+
		"through the picker to 3 fake vLLM engines on 127.0.0.1. Each engine renders and tokenizes the conversation itself, "+
		"keeps its prefix cache in blocks of %d tokens, reports `cached_tokens` in the usage of its SSE response and publishes its new blocks "+
		"(BlockStored with their token ids) to a kvevents subscriber, which forwards them with the engine's /metrics load to the server. "+
		"Tokens: %s.\n\n",
		r.requests, r.conversationsN, r.turns, userStagger, thinkTime, thinkTime+30*time.Millisecond, engineBlock, r.tokenizerNote)

	kinds := []string{"support", "coding", "own"}
	kindName := map[string]string{"support": "support desk (one system prompt shared by its users)",
		"coding": "coding assistant (one system prompt shared by its users)", "own": "a system prompt of their own"}
	first := map[string]int{}
	for _, rec := range r.records {
		if rec.turn == 0 && first[rec.kind] == 0 {
			first[rec.kind] = rec.prompt
		}
	}
	fmt.Fprintln(w, "| outcome | reason | requests | why |")
	fmt.Fprintln(w, "|---|---|---:|---|")
	for _, k := range slices.Sorted(maps.Keys(r.outcomes)) {
		if r.outcomes[k] == 0 {
			continue
		}
		o, reason, _ := strings.Cut(k, "/")
		why := outcomeMeaning[k]
		if why == "" {
			why = "the engine with the fewest requests in flight"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s |\n", o, reason, r.outcomes[k], why)
	}

	type agg struct{ reqs, firsts, prompt, cached, laterPrompt, laterCached, later, sameEngine int }
	perEngine := map[string]*agg{}
	perKind := map[string]*agg{}
	last := map[string]string{}
	byConv := map[string][]turnRecord{}
	for _, rec := range r.records {
		byConv[rec.conv] = append(byConv[rec.conv], rec)
	}
	var all agg
	for _, c := range r.conversations {
		recs := byConv[c.name]
		slices.SortFunc(recs, func(a, b turnRecord) int { return a.turn - b.turn })
		byConv[c.name] = recs
		for _, rec := range recs {
			for _, a := range []*agg{get(perEngine, rec.engine), get(perKind, rec.kind), &all} {
				a.reqs++
				a.prompt += rec.prompt
				a.cached += rec.cached
				if rec.turn == 0 {
					a.firsts++
				} else {
					a.later++
					a.laterPrompt += rec.prompt
					a.laterCached += rec.cached
					if last[rec.conv] == rec.engine {
						a.sameEngine++
					}
				}
			}
			last[rec.conv] = rec.engine
		}
	}
	pct := func(a, b int) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f %%", 100*float64(a)/float64(b))
	}
	fmt.Fprintln(w, "\n| engine | requests | first turns | later turns | prompt tokens | cached (engine's usage) |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for _, id := range replicaIDs {
		a := get(perEngine, id)
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %s |\n", id, a.reqs, a.firsts, a.later, a.prompt, pct(a.cached, a.prompt))
	}
	fmt.Fprintln(w, "\n| users | conversations | first turn: prompt tokens, cached | later turns: cached | later turns on the previous turn's engine |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	for _, k := range kinds {
		a := get(perKind, k)
		fp := 0
		if a.firsts > 0 {
			fp = (a.prompt - a.laterPrompt) / a.firsts
		}
		fmt.Fprintf(w, "| %s | %d | %d, %s | %s | %d of %d |\n", kindName[k], a.firsts, fp,
			pct(a.cached-a.laterCached, a.prompt-a.laterPrompt), pct(a.laterCached, a.laterPrompt), a.sameEngine, a.later)
	}
	fmt.Fprintln(w, "\nEach conversation, turn by turn (engine, then the share of the prompt the engine found cached):")
	fmt.Fprintln(w, "\n```")
	for _, c := range r.conversations {
		var parts []string
		for _, rec := range byConv[c.name] {
			parts = append(parts, fmt.Sprintf("%s %3s", strings.TrimPrefix(rec.engine, "engine-"), strings.TrimSuffix(pct(rec.cached, rec.prompt), " %")+"%"))
		}
		fmt.Fprintf(w, "%-10s %s\n", c.name, strings.Join(parts, "  "))
	}
	fmt.Fprintln(w, "```")
	fmt.Fprintf(w, "\nPrefix-cache hits the engines reported: first turns %s of prompt tokens, later turns %s "+
		"(%d of %d later turns went to the engine of the conversation's previous turn).\n",
		pct(all.cached-all.laterCached, all.prompt-all.laterPrompt), pct(all.laterCached, all.laterPrompt), all.sameEngine, all.later)
	fmt.Fprintf(w, "Cached prompt tokens, predicted by the index on the engine that served (the lookup's matched_tokens) against "+
		"delivered (the engines' usage, read by the picker in the response phase): %.0f predicted, %.0f delivered "+
		"(server /metrics %s, %s; the engines' usage as the clients read it: %d).\n",
		r.predicted, r.delivered, "inferencecache_picker_predicted_cached_tokens_total", "inferencecache_picker_delivered_cached_tokens_total", all.cached)
	moved := 0
	for _, recs := range byConv {
		for i := 1; i < len(recs); i++ {
			if recs[i].engine != recs[i-1].engine {
				moved++
			}
		}
	}
	sk, ck := get(perKind, "support"), get(perKind, "coding")
	fmt.Fprintf(w, "\nWhat it shows. The first request finds an empty index (no hint): the picker sends it to the least loaded engine. "+
		"Conversations that start later with a system prompt an engine holds get PREFIX_MATCH there (the support and coding users' "+
		"first turns: %s of their prompt already cached), and their later turns find their own earlier turns on the same engine. "+
		"A conversation with a system prompt of its own has no usable prefix: it gets the index's AFFINITY_HINT, a consistent-hash "+
		"pin among the engines that hold blocks of the model (contract §3.8). While one engine is the only warm one, that pin is "+
		"always it: this is why the demo's earlier traffic, one request at a time, sent every request to one engine (not the shared "+
		"system prompt: the pin's seed is the whole block chain, different for every conversation). With users at once, the warm "+
		"engine queues; its queue reaches the index through its subscriber's /metrics scrape, and load-aware routing "+
		"(docs/routing.md) sends requests to an idle engine instead, where the conversation then stays: "+
		"%d of %d later turns changed engine (0 %% cached on the new one, then their next turns hit there).\n",
		pct(sk.cached-sk.laterCached+ck.cached-ck.laterCached, sk.prompt-sk.laterPrompt+ck.prompt-ck.laterPrompt), moved, all.later)
}

func get[K comparable, V any](m map[K]*V, k K) *V {
	v := m[k]
	if v == nil {
		v = new(V)
		m[k] = v
	}
	return v
}
