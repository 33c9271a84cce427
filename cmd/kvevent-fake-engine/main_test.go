package main

import (
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
