package server_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/picker/request"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server/servertest"
	"github.com/inferencecache/inferencecache/servermetrics"
	"github.com/inferencecache/inferencecache/tokenizer/modeldir"
)

// The system prompt of the support template: long enough (well over the
// default 64-token matched floor) to be worth caching.
const supportSystem = "You are the support assistant of Example Corp. Answer questions about our products, orders, " +
	"shipping, returns and invoices. Be concise and friendly, cite the relevant policy section when you can, never " +
	"invent order numbers, and hand the conversation to a human agent when the customer asks for one or is upset. " +
	"Our return window is thirty days from delivery; refunds go back to the original payment method within five " +
	"business days. Shipping is free above fifty euros. Business hours are nine to six, Monday to Friday."

func templatePolicy(t *testing.T) string {
	t.Helper()
	body := map[string]any{
		"version": 8,
		"promptTemplates": []map[string]any{{
			"namespace": "team-a", "name": "support",
			"body": "System: {{ system }}\n\n{% if product %}Product: {{ product }}\n{% endif %}Customer: {{ question }}\nAssistant:",
			"slots": []map[string]any{
				{"name": "system", "type": "Stable", "required": true, "description": "the system prompt"},
				{"name": "product", "type": "Stable"},
				{"name": "question", "type": "Mutable", "required": true},
			},
			"templateRevision": "0123456789abcdef",
		}},
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func tokenizerAssets(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("TOKENIZER_ASSETS")
	if dir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("TOKENIZER_ASSETS is not set: run the tests through make test (hack/tokenizer-assets.sh)")
		}
		t.Skip("TOKENIZER_ASSETS is not set (bash hack/tokenizer-assets.sh prints it)")
	}
	return dir
}

// TestE2ERenderThenLookup: a gateway renders through the server, then
// looks up with the stable prefix hash, and gets PREFIX_MATCH on the
// replica that served an earlier request sharing the stable part, for
// every mutable value. The producer is fake (it reports what an engine's
// kvevent subscriber reports: one prefix hash per block of the tokens the
// engine computed, tokenized here independently of the server).
func TestE2ERenderThenLookup(t *testing.T) {
	assets := tokenizerAssets(t)
	const model = "llama3"
	cfg := testConfig()
	cfg.TokenizerDir = assets
	r := start(t, cfg)
	servertest.PushPolicy(t, r.Server, templatePolicy(t))

	engineTok, err := modeldir.New(modeldir.Config{Root: assets})
	if err != nil {
		t.Fatal(err)
	}
	// engineReport is replica's subscriber reporting prompt's blocks.
	engineReport := func(replica, prompt string) {
		t.Helper()
		toks, err := engineTok.RequestTokens(context.Background(), model, &request.Request{Kind: request.KindCompletion, Model: model, Prompt: prompt, AddSpecialTokens: true})
		if err != nil {
			t.Fatal(err)
		}
		sums := fingerprint.AppendChain(nil, toks, fingerprint.DefaultBlockSize, 0, false)
		u := &pb.CacheStateUpdate{ReplicaId: replica, TenantId: "team-a", ModelId: model, HashScheme: "vllm"}
		for i, h := range sums {
			u.Prefixes = append(u.Prefixes, &pb.PrefixEntry{PrefixHash: fingerprint.AppendWire(nil, h), TokenCount: int32((i + 1) * fingerprint.DefaultBlockSize)})
		}
		report(t, r.cli, u)
	}
	render := func(vars map[string]string) *pb.RenderTemplateResponse {
		t.Helper()
		resp, err := r.cli.RenderTemplate(tctx(t), &pb.RenderTemplateRequest{TemplateRef: "support", TenantId: "team-a", ModelId: model, Variables: vars})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetReasonCode() != rpc.ReasonOK {
			t.Fatalf("RenderTemplate: %v", resp)
		}
		return resp
	}

	// Request 1 runs on replica-a; replica-b serves something else.
	first := render(map[string]string{"system": supportSystem, "product": "Kettle K2", "question": "Where is my order?"})
	if got := string(first.GetRenderedPrompt()); !strings.HasPrefix(got, "System: "+supportSystem) || !strings.HasSuffix(got, "Customer: Where is my order?\nAssistant:") {
		t.Fatalf("rendered %q", got)
	}
	if first.GetTemplateRevision() != "0123456789abcdef" || string(first.GetTenantNamespace()) != "team-a" {
		t.Errorf("revision %q, namespace %q", first.GetTemplateRevision(), first.GetTenantNamespace())
	}
	if n := first.GetStablePrefixTokens(); n < 64 || n%16 != 0 || len(first.GetStablePrefixHash()) != 8 || len(first.GetTokenIds()) <= int(n) {
		t.Fatalf("stable prefix: %d tokens, hash %x, %d prompt tokens", n, first.GetStablePrefixHash(), len(first.GetTokenIds()))
	}
	engineReport("replica-a", string(first.GetRenderedPrompt()))
	engineReport("replica-b", "An unrelated prompt that replica-b served a while ago, about something else entirely.")

	for _, q := range []string{"Can I return a kettle after two weeks?", "How long does shipping take?", "Customer: I am upset, get me a human!", ""} {
		resp := render(map[string]string{"system": supportSystem, "product": "Kettle K2", "question": q})
		if string(resp.GetStablePrefixHash()) != string(first.GetStablePrefixHash()) || resp.GetStablePrefixTokens() != first.GetStablePrefixTokens() {
			t.Errorf("question %q: stable prefix %d tokens %x, want %d %x", q, resp.GetStablePrefixTokens(), resp.GetStablePrefixHash(), first.GetStablePrefixTokens(), first.GetStablePrefixHash())
		}
		lk, err := r.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "team-a", ModelId: model, HashScheme: "vllm",
			PrefixHash: resp.GetStablePrefixHash(), PrefixTokenCount: resp.GetStablePrefixTokens()})
		if err != nil {
			t.Fatal(err)
		}
		if lk.GetReasonCode() != rpc.ReasonPrefixMatch || len(lk.GetReplicaScores()) != 1 || lk.GetReplicaScores()[0].GetReplicaId() != "replica-a" ||
			lk.GetReplicaScores()[0].GetMatchedTokens() != resp.GetStablePrefixTokens() {
			t.Errorf("question %q: lookup %v, want PREFIX_MATCH on replica-a with %d tokens", q, lk, resp.GetStablePrefixTokens())
		}
		// The rendering's own tokens are what the engine computes.
		ids, _ := engineTok.RequestTokens(context.Background(), model, &request.Request{Kind: request.KindCompletion, Model: model, Prompt: string(resp.GetRenderedPrompt()), AddSpecialTokens: true})
		if len(ids) != len(resp.GetTokenIds()) {
			t.Errorf("token_ids: %d, the engine's tokenization %d", len(resp.GetTokenIds()), len(ids))
		}
	}

	// Another Stable value is another stable part: no match. (Only whole
	// blocks are hashed, so the difference must lie before the last whole
	// block of the stable part: a product name in its partial last block
	// would give the same hash, rightly, since no engine keys that block.)
	other := render(map[string]string{"system": "You are the billing assistant. " + supportSystem, "product": "Kettle K2", "question": "Where is my order?"})
	if string(other.GetStablePrefixHash()) == string(first.GetStablePrefixHash()) {
		t.Fatal("another product shares the stable prefix hash")
	}
	lk, _ := r.cli.LookupRoute(tctx(t), &pb.LookupRouteRequest{TenantId: "team-a", ModelId: model, HashScheme: "vllm", PrefixHash: other.GetStablePrefixHash(), PrefixTokenCount: other.GetStablePrefixTokens()})
	if lk.GetReasonCode() == rpc.ReasonPrefixMatch {
		t.Errorf("a stable part nobody cached matched: %v", lk)
	}
}

func TestE2ERenderTemplateOutcomes(t *testing.T) {
	r := start(t, testConfig()) // no tokenizer
	servertest.PushPolicy(t, r.Server, templatePolicy(t))
	vars := map[string]string{"system": "S", "question": "Q1"}
	ok1, err := r.cli.RenderTemplate(tctx(t), &pb.RenderTemplateRequest{TemplateRef: "team-a/support", Variables: vars, ModelId: "llama3"})
	if err != nil || ok1.GetReasonCode() != rpc.ReasonOK {
		t.Fatalf("%v, %v", ok1, err)
	}
	// Without a tokenizer: the text's hash, the same for every question.
	vars["question"] = "another"
	ok2, _ := r.cli.RenderTemplate(tctx(t), &pb.RenderTemplateRequest{TemplateRef: "team-a/support", Variables: vars})
	if len(ok1.GetStablePrefixHash()) != 8 || string(ok1.GetStablePrefixHash()) != string(ok2.GetStablePrefixHash()) ||
		ok1.GetStablePrefixTokens() != 0 || len(ok1.GetTokenIds()) != 0 {
		t.Errorf("text hash: %v / %v", ok1, ok2)
	}
	for name, c := range map[string]struct {
		req    *pb.RenderTemplateRequest
		reason string
		msg    string
	}{
		"unknown template":    {&pb.RenderTemplateRequest{TemplateRef: "team-a/nope"}, rpc.ReasonTemplateNotFound, "no PromptTemplate"},
		"other namespace":     {&pb.RenderTemplateRequest{TemplateRef: "support", TenantId: "team-b"}, rpc.ReasonTemplateNotFound, "team-b"},
		"missing required":    {&pb.RenderTemplateRequest{TemplateRef: "team-a/support", Variables: map[string]string{"question": "q"}}, rpc.ReasonRenderError, `required slot "system"`},
		"not a slot":          {&pb.RenderTemplateRequest{TemplateRef: "team-a/support", Variables: map[string]string{"system": "s", "question": "q", "qestion": "x"}}, rpc.ReasonRenderError, `"qestion" is not a slot`},
		"value is not text":   {&pb.RenderTemplateRequest{TemplateRef: "team-a/support", Variables: map[string]string{"system": "\xff", "question": "q"}}, rpc.ReasonRenderError, "not UTF-8"},
		"malformed reference": {&pb.RenderTemplateRequest{TemplateRef: "a/b/c"}, rpc.ReasonTemplateNotFound, ""},
	} {
		t.Run(name, func(t *testing.T) {
			resp, err := r.cli.RenderTemplate(tctx(t), c.req)
			if err != nil {
				// A value that is not UTF-8 is refused by proto itself
				// on the wire (string fields must be UTF-8).
				if name == "value is not text" {
					return
				}
				t.Fatal(err)
			}
			if resp.GetReasonCode() != c.reason || !strings.Contains(resp.GetMessage(), c.msg) || len(resp.GetRenderedPrompt()) != 0 {
				t.Errorf("got %v", resp)
			}
		})
	}
	fams := servertest.Scrape(t, r.Server)
	for reason, want := range map[string]float64{rpc.ReasonOK: 2, rpc.ReasonTemplateNotFound: 3, rpc.ReasonRenderError: 2} {
		if v, _ := servertest.Value(fams, servermetrics.NameRenderCalls, "reason_code="+reason); v != want {
			t.Errorf("render calls %s = %v, want %v", reason, v, want)
		}
	}
	// A push without the template retires it.
	servertest.PushPolicy(t, r.Server, `{"version": 8}`)
	if resp, _ := r.cli.RenderTemplate(tctx(t), &pb.RenderTemplateRequest{TemplateRef: "team-a/support", Variables: vars}); resp.GetReasonCode() != rpc.ReasonTemplateNotFound {
		t.Errorf("after the template was removed: %v", resp)
	}
}
