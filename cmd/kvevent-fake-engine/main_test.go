package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRunPublishesSyntheticTurns(t *testing.T) {
	err := run([]string{"--endpoint", "tcp://127.0.0.1:0", "--replay-endpoint", "tcp://127.0.0.1:0",
		"--turns", "20", "--interval", "1ms", "--wait-subscriber", "0", "--duration", "10s", "--lora-ids", "1,2"})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRunLingers: with --linger the engine stays up after its workload,
// until --duration ends it.
func TestRunLingers(t *testing.T) {
	start := time.Now()
	err := run([]string{"--endpoint", "tcp://127.0.0.1:0", "--replay-endpoint", "tcp://127.0.0.1:0", "--engine", "sglang",
		"--turns", "5", "--interval", "1ms", "--wait-subscriber", "0", "--duration", "700ms", "--linger"})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 600*time.Millisecond {
		t.Fatalf("returned after %v, before --duration", d)
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--layout", "tuple"}, "unknown layout"},
		{[]string{"--workload", "other", "--endpoint", "tcp://127.0.0.1:0"}, "unknown --workload"},
		{[]string{"--lora-ids", "x"}, "--lora-ids"},
		{[]string{"--engine", "trt"}, "unknown --engine"},
		{[]string{"--engine", "sglang", "--layout", "map"}, "array-like"},
		{[]string{"--workload", "mooncake", "--trace", "/nonexistent.jsonl"}, "cannot open trace"},
	} {
		err := run(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	if err := run([]string{"-h"}); err != nil {
		t.Errorf("-h: %v", err)
	}
}

// TestStateEndpoint: GET /blocks lists the keys of the blocks the engine
// holds; POST /pause stops publishing, after which the set stays as it is.
func TestStateEndpoint(t *testing.T) {
	addr := freeAddr(t)
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"--endpoint", "tcp://127.0.0.1:0", "--replay-endpoint", "tcp://127.0.0.1:0", "--turns", "0",
			"--interval", "1ms", "--wait-subscriber", "0", "--duration", "30s", "--capacity-blocks", "64", "--state-bind-address", addr})
	}()
	get := func() blocksBody {
		t.Helper()
		var b blocksBody
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := http.Get("http://" + addr + "/blocks")
			if err == nil {
				err = json.NewDecoder(resp.Body).Decode(&b)
				resp.Body.Close()
				if err == nil {
					return b
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET /blocks: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for b := get(); b.Blocks < 64; b = get() {
		if time.Now().After(deadline) {
			t.Fatalf("the engine holds %d blocks after 10 s, want its capacity (64)", b.Blocks)
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Post("http://"+addr+"/pause", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /pause: %d", resp.StatusCode)
	}
	first := get()
	time.Sleep(100 * time.Millisecond)
	second := get()
	if !first.Paused || first.Unkeyed != 0 || first.Blocks != len(first.Keys) || first.Blocks > 64 || !slices.Equal(first.Keys, second.Keys) {
		t.Fatalf("after the pause: %d blocks (paused %v, unkeyed %d), then %d", first.Blocks, first.Paused, first.Unkeyed, second.Blocks)
	}
	select {
	case err := <-done:
		t.Fatalf("the engine exited while paused: %v", err)
	default:
	}
}
