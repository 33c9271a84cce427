package kvevents

// End to end for prompt_text (issue 14): the engine serves a chat request,
// tokenizes the rendered prompt itself and publishes its blocks; a
// gateway that does not tokenize sends the raw text; the real server
// renders the model's chat template, tokenizes with the model's
// tokenizer.json (--tokenizer-dir), fingerprints, and must land on the
// engine's blocks: PREFIX_MATCH, with the tokens echoed equal to the
// engine's.
//
// The engine's token ids are those of the reference implementation
// (@lenml/tokenizers, recorded in tokenizer/testdata/golden), not of the
// server's tokenizer, so the test checks the server against an independent
// tokenization.

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/kvevents/fakeengine"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
)

func TestE2EPromptTextMatchesEngineTokens(t *testing.T) {
	assets := os.Getenv("TOKENIZER_ASSETS")
	if assets == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("TOKENIZER_ASSETS is not set: run the tests through make test (hack/tokenizer-assets.sh)")
		}
		t.Skip("TOKENIZER_ASSETS is not set (bash hack/tokenizer-assets.sh prints it)")
	}
	for _, model := range promptTextE2EModels {
		t.Run(model, func(t *testing.T) {
			prompt, engineIDs := e2eGolden(t, model)
			// The fixtures serve model "m": lay out a --tokenizer-dir
			// whose m/ is the reference model's folder.
			dir := t.TempDir()
			if err := os.Symlink(filepath.Join(assets, model), filepath.Join(dir, "m")); err != nil {
				t.Fatal(err)
			}
			srv := startRealServer(t, func(cfg *server.Config) { cfg.TokenizerDir = dir })
			f, _, m := startOnServer(t, srv, nil)

			// The engine stores the prompt's full blocks (vLLM hashes
			// only full blocks), as one chain.
			const bs = 16
			full := len(engineIDs) / bs * bs
			if full < 4*bs {
				t.Fatalf("prompt of %d tokens: too short for the test", len(engineIDs))
			}
			ev := fakeengine.Event{Kind: fakeengine.BlockStored, BlockSize: bs, TokenIDs: engineIDs[:full]}
			for i := range full / bs {
				ev.BlockHashes = append(ev.BlockHashes, 0xE2E0000+uint64(i))
			}
			f.publish(t, m, fakeengine.Batch{TS: float64(time.Now().UnixMicro()) / 1e6, Events: []fakeengine.Event{ev}})

			resp, err := srv.cli.LookupRoute(testCtx(t, promptTextE2ETimeout), &icv1.LookupRouteRequest{
				TenantId: "t", ModelId: "m", HashScheme: "vllm", PromptText: prompt,
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(resp.TokenIds, engineIDs) {
				t.Fatalf("echoed %d tokens, the engine has %d; first difference at %d", len(resp.TokenIds), len(engineIDs), firstDiff(resp.TokenIds, engineIDs))
			}
			if resp.ReasonCode != "PREFIX_MATCH" || len(resp.ReplicaScores) != 1 || resp.ReplicaScores[0].ReplicaId != "r1" {
				t.Fatalf("reason %s, scores %v: want PREFIX_MATCH on r1", resp.ReasonCode, resp.ReplicaScores)
			}
			if got := resp.ReplicaScores[0].MatchedTokens; got != int32(full) {
				t.Fatalf("matched %d tokens, want the engine's %d", got, full)
			}
			t.Logf("%s: %d prompt bytes -> %d tokens, PREFIX_MATCH on %d tokens", model, len(prompt), len(resp.TokenIds), full)
		})
	}
}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// e2eGolden returns the end-to-end prompt and the engine's ids for it
// (rendered as one user message with the generation prompt).
func e2eGolden(t *testing.T, model string) (string, []uint32) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", "golden", model+".json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		E2EPrompt string `json:"e2ePrompt"`
		Chat      []struct {
			Text string   `json:"text"`
			IDs  []uint32 `json:"ids"`
		} `json:"chat"`
	}
	if err := json.NewDecoder(zr).Decode(&g); err != nil {
		t.Fatal(err)
	}
	for _, c := range g.Chat {
		if c.Text == g.E2EPrompt {
			return c.Text, c.IDs
		}
	}
	t.Fatalf("%s: no golden ids for the end-to-end prompt", model)
	return "", nil
}
