package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunSynthetic(t *testing.T) {
	for _, kind := range []string{"chat", "rag", "shared-prompt"} {
		dir := t.TempDir()
		var out bytes.Buffer
		args := []string{"-workload", kind, "-replicas", "2", "-cache-blocks", "100, 400", "-out", dir, "-seed", "3", "-limit", "150"}
		if err := run(args, &out); err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		for _, f := range []string{kind + ".md", kind + ".svg"} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Fatalf("%s: %v", kind, err)
			}
		}
		if !strings.Contains(out.String(), "## 400 blocks per replica") || strings.Count(out.String(), "blocks per replica\n") != 2 {
			t.Fatalf("%s: unexpected table:\n%s", kind, out.String())
		}
	}
}

func TestRunTraceAndErrors(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join("..", "..", "bench", "workload", "testdata", "sample_trace.jsonl")
	var out bytes.Buffer
	if err := run([]string{"-trace", trace, "-replicas", "4", "-cache-blocks", "20", "-out", dir, "-name", "s"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "trace sample_trace.jsonl") {
		t.Fatalf("unexpected output:\n%s", out.String())
	}
	for _, args := range [][]string{
		{"-workload", "trace"},                      // no -trace
		{"-workload", "nope"},                       // unknown workload
		{"-workload", "chat", "-cache-blocks", "x"}, // bad size
		{"-workload", "chat", "-replicas", "0"},     // invalid config
		{"-workload", "chat", "extra"},              // stray argument
	} {
		if err := run(append(args, "-out", dir), &out); err == nil {
			t.Fatalf("run(%q) succeeded", args)
		}
	}
}

func TestRunTargets(t *testing.T) {
	trace := filepath.Join("..", "..", "bench", "workload", "testdata", "sample_trace.jsonl")
	var out bytes.Buffer
	if err := run([]string{"targets", "-trace", trace, "-speedups", "1,2", "-workloads", "", "-seeds", "1-2", "-v"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"seed 2 conversation-x2 ", "cells met per seed [", "of 12; mean", "conversation "} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("no %q in:\n%s", want, out.String())
		}
	}
	for _, args := range [][]string{
		{"targets", "-workloads", ""},                                     // nothing to run
		{"targets", "-workloads", "chat", "-seeds", "3-1"},                // bad range
		{"targets", "-workloads", "chat", "-seeds", "x"},                  // bad seed
		{"targets", "-trace", trace, "-speedups", "0"},                    // bad speedup
		{"targets", "-workloads", "nope"},                                 // unknown workload
		{"targets", "-workloads", "chat", "-limit", "50", "-row", "nope"}, // unknown row
		{"targets", "-workloads", "chat", "extra"},                        // stray argument
		{"targets", "-trace", trace, "-trace-jitter", "-1ms"},             // negative jitter
	} {
		if err := run(args, &out); err == nil {
			t.Fatalf("run(%q) succeeded", args)
		}
	}
}
