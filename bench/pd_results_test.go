package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/inferencecache/inferencecache/bench/workload"
)

// PDTraceConfig is the P/D report's cluster for the Mooncake trace: its
// prompts average 12k tokens, so the pools are sized 2:1 for prefill
// (cmd/bench pd -prefill 8 -decode 4).
func PDTraceConfig() PDConfig {
	c := DefaultPDConfig()
	c.Prefill, c.Decode = 8, 4
	return c
}

// TestCommittedPDResults regenerates bench/results/pd-mooncake.md and
// pd-synthetic.md (what `make bench-report` runs) and requires the
// committed files to match. Regenerate with
//
//	go test ./bench -run CommittedPDResults -rewrite
func TestCommittedPDResults(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("full-trace golden check skipped under the race detector and -short (slow)")
	}
	write := func(name string, cfg PDConfig, wls []PDWorkload) {
		t.Helper()
		rep, err := RunPD(cfg, wls, PDPoliciesWithSweep(PDSweep), 0)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := rep.WriteMarkdown(&b); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("results", name)
		if *rewrite {
			if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Bytes(), want) {
			t.Fatalf("results/%s is stale; regenerate it (see the test's doc):\n%s", name, b.Bytes())
		}
	}
	var syn []PDWorkload
	for _, kind := range []string{"chat", "rag", "shared-prompt"} {
		name, reqs, err := Synthetic(kind, 1)
		if err != nil {
			t.Fatal(err)
		}
		syn = append(syn, PDWorkload{Name: name, Requests: reqs})
	}
	write("pd-synthetic.md", DefaultPDConfig(), syn)
	path := sharedTrace(t)
	reqs, err := workload.LoadTrace(path, workload.MooncakeBlockSize, 0)
	if err != nil {
		t.Fatal(err)
	}
	write("pd-mooncake.md", PDTraceConfig(), []PDWorkload{{Name: "trace " + filepath.Base(path), Requests: reqs}})
}
