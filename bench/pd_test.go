package bench

import (
	"bytes"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/bench/workload"
)

// fixedPD routes every request the same way.
type fixedPD struct{ route PDRoute }

func (fixedPD) Name() string                               { return "fixed" }
func (fixedPD) Observe(*Event)                             {}
func (f fixedPD) Route(*workload.Request, *PDView) PDRoute { return f.route }

func pdReq(id int, at time.Duration, blocks []uint64, in, out int) workload.Request {
	return workload.Request{ID: id, Arrival: at, Blocks: blocks, BlockSize: 16, InputTokens: in, OutputTokens: out}
}

// The cost model, by hand: one request through each path.
func TestSimulatePDCostModel(t *testing.T) {
	cfg := PDConfig{Prefill: 1, Decode: 1, CacheBlocks: 100, Slots: 2,
		Cost:             CostModel{Overhead: 10 * time.Millisecond, PrefillPerToken: time.Millisecond, DecodePerToken: 20 * time.Millisecond},
		TransferPerToken: 100 * time.Microsecond, Interference: 0.5}
	reqs := []workload.Request{pdReq(0, 0, []uint64{1, 2, 3, 4}, 64, 10)}
	res, err := SimulatePD(reqs, cfg, fixedPD{PDRoute{Prefill: 0, Decode: 0}})
	if err != nil {
		t.Fatal(err)
	}
	// 10 ms + 64 ms prefill, 64 × 100 µs transfer.
	if want := 74*time.Millisecond + 6400*time.Microsecond; res.TTFTP50 != want || res.TPOTMean != 20*time.Millisecond {
		t.Errorf("disaggregated: TTFT %v TPOT %v, want %v and 20ms", res.TTFTP50, res.TPOTMean, want)
	}
	if res.Disaggregated != 1 || res.ComputedTokens != 64 || res.TransferredTokens != 64 {
		t.Errorf("disaggregated counts: %+v", res)
	}
	res, _ = SimulatePD(reqs, cfg, fixedPD{PDRoute{Prefill: -1, Decode: 0}})
	if res.TTFTP50 != 74*time.Millisecond || res.TransferredTokens != 0 || res.Disaggregated != 0 {
		t.Errorf("skipped: %+v", res)
	}

	// A local prefill holds back the batch decoding on the same replica:
	// request 0 decodes from 74 ms to 274 ms; request 1's local prefill
	// (10 + 32 ms from 100 ms) holds it back by 21 ms.
	reqs = []workload.Request{pdReq(0, 0, []uint64{1, 2, 3, 4}, 64, 10), pdReq(1, 100*time.Millisecond, []uint64{9, 10}, 32, 10)}
	res, _ = SimulatePD(reqs, cfg, fixedPD{PDRoute{Prefill: -1, Decode: 0}})
	if res.HeldBack != 21*time.Millisecond || res.TPOTP99 != 22100*time.Microsecond {
		t.Errorf("held back %v, TPOT p99 %v; want 21ms and 22.1ms", res.HeldBack, res.TPOTP99)
	}
	// The decode replica caches what it received: the same prompt again
	// moves nothing and, skipped, computes nothing but the overhead.
	reqs = []workload.Request{pdReq(0, 0, []uint64{1, 2, 3, 4}, 64, 1), pdReq(1, time.Second, []uint64{1, 2, 3, 4}, 64, 1)}
	res, _ = SimulatePD(reqs, cfg, fixedPD{PDRoute{Prefill: 0, Decode: 0}})
	if res.TransferredTokens != 64 || res.ComputedTokens != 64 {
		t.Errorf("repeat: moved %d computed %d, want 64 and 64 (the prefill replica caches it too)", res.TransferredTokens, res.ComputedTokens)
	}
}

func TestSimulatePDSlots(t *testing.T) {
	cfg := DefaultPDConfig()
	cfg.Prefill, cfg.Decode, cfg.Slots = 1, 1, 1
	cfg.Cost = CostModel{PrefillPerToken: time.Millisecond, DecodePerToken: 10 * time.Millisecond}
	cfg.TransferPerToken = 0
	// Two requests at once: the second waits for the first's slot.
	reqs := []workload.Request{pdReq(0, 0, []uint64{1}, 16, 100), pdReq(1, 0, []uint64{2}, 16, 100)}
	res, _ := SimulatePD(reqs, cfg, fixedPD{PDRoute{Prefill: 0, Decode: 0}})
	if res.TTFTP99 != 16*time.Millisecond+time.Second {
		t.Errorf("TTFT p99 %v, want the first's decode (1 s) after its own prefill", res.TTFTP99)
	}
}

func TestSimulatePDValidates(t *testing.T) {
	bad := DefaultPDConfig()
	bad.Interference = 2
	if _, err := SimulatePD(nil, bad, fixedPD{}); err == nil {
		t.Error("interference 2 accepted")
	}
	if _, err := SimulatePD([]workload.Request{pdReq(0, 0, []uint64{1}, 16, 1)}, DefaultPDConfig(), fixedPD{PDRoute{Prefill: 9, Decode: 0}}); err == nil {
		t.Error("a prefill replica out of range accepted")
	}
}

// TestRunPDDeterministic: the same workload gives the same report, byte
// for byte, at any parallelism; every default policy completes every
// request.
func TestRunPDDeterministic(t *testing.T) {
	_, reqs, err := Synthetic("chat", 1)
	if err != nil {
		t.Fatal(err)
	}
	reqs = reqs[:min(len(reqs), 300)]
	wls := []PDWorkload{{Name: "chat", Requests: reqs}}
	var out [2]bytes.Buffer
	for i, par := range []int{1, 4} {
		rep, err := RunPD(DefaultPDConfig(), wls, DefaultPDPolicies(), par)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rep.Workloads[0].Results {
			if r.Requests != len(reqs) || r.TTFTP50 <= 0 {
				t.Errorf("%s: %+v", r.Policy, r)
			}
		}
		if err := rep.WriteMarkdown(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	if out[0].String() != out[1].String() {
		t.Error("the report depends on the parallelism")
	}
}
