package modeldir

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/engine/fingerprint"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// prompt8k builds a deterministic prompt of about 8k Llama 3 tokens from
// the golden corpus (mixed scripts, code, numbers, whitespace runs).
func prompt8k(t testing.TB, d *Dir) (string, int) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "testdata", "golden", "corpus.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	var corpus []string
	if err := json.NewDecoder(zr).Decode(&corpus); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := 0; ; i++ {
		b.WriteString(corpus[i%len(corpus)])
		b.WriteByte('\n')
		if i%50 == 49 {
			ids, err := d.Encode(context.Background(), "llama3", b.String())
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) >= 8192 {
				return b.String(), len(ids)
			}
		}
	}
}

// BenchmarkLookupRoutePromptText8k: an 8k-token prompt_text through the
// LookupRoute handler (render, tokenize, fingerprint, index lookup) with
// the real Llama 3 tokenizer, answered PREFIX_MATCH. Reports p50 and
// tokens/s; the per-word cache is warm (the steady state of a server).
//
//	TOKENIZER_ASSETS=$(bash hack/tokenizer-assets.sh) go test ./tokenizer/modeldir -run '^$' -bench PromptText8k -benchtime 200x
func BenchmarkLookupRoutePromptText8k(b *testing.B) {
	d, err := New(Config{Root: assetsDir(b), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	prompt, n := prompt8k(b, d)
	store := policy.NewStore()
	store.Apply(&policy.Body{Version: policy.PropagationVersion, Policies: []policy.ResolvedPolicy{{Namespace: "t"}}})
	e := engine.New(engine.Config{Policies: store})
	svc, err := rpc.NewService(rpc.Config{Index: e, Policies: store, Tokenizer: d, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ids, err := d.Encode(context.Background(), "llama3", prompt)
	if err != nil {
		b.Fatal(err)
	}
	// The replica holds the whole prompt.
	var hashes [][]byte
	var counts []int32
	for _, h := range fingerprint.AppendChain(nil, ids, rpc.DefaultEngineBlockSize, 0, false) {
		hashes = append(hashes, fingerprint.AppendWire(nil, h))
		counts = append(counts, rpc.DefaultEngineBlockSize)
	}
	e.Ingest(&engine.Update{ReplicaID: "r1", ModelID: "llama3", TenantID: "t", HashScheme: "vllm",
		Prefixes: []engine.PrefixEntry{{BlockHashes: hashes, BlockTokenCounts: counts}}}, time.Now().UnixMicro())
	req := &pb.LookupRouteRequest{TenantId: "t", ModelId: "llama3", HashScheme: "vllm", PromptText: prompt}
	ctx := context.Background()
	if resp, _ := svc.LookupRoute(ctx, req); resp.GetReasonCode() != rpc.ReasonPrefixMatch {
		b.Fatalf("reason %s, want PREFIX_MATCH", resp.GetReasonCode())
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.SetBytes(int64(len(prompt)))
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		resp, _ := svc.LookupRoute(ctx, req)
		lat = append(lat, time.Since(start))
		if resp.GetReasonCode() != rpc.ReasonPrefixMatch {
			b.Fatalf("reason %s", resp.GetReasonCode())
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	p50 := lat[len(lat)/2]
	b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(n)/p50.Seconds(), "tokens/s")
	b.ReportMetric(float64(n), "tokens")
}
