package main

import (
	"context"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/server"
)

func TestMemoryLimitDerive(t *testing.T) {
	const gi = 1 << 30
	for name, c := range map[string]struct {
		m    memoryLimit
		want derivedLimits
		err  string
	}{
		"no limit":         {m: memoryLimit{indexFraction: 0.5, gcFraction: 0.9}},
		"defaults":         {m: memoryLimit{limit: gi, indexFraction: 0.5, gcFraction: 0.9}, want: derivedLimits{indexBytes: gi / 2, gcBytes: gi * 9 / 10}},
		"explicit index":   {m: memoryLimit{limit: gi, indexFraction: 0.5, gcFraction: 0.9, indexSet: true}, want: derivedLimits{gcBytes: gi * 9 / 10}},
		"GOMEMLIMIT set":   {m: memoryLimit{limit: gi, indexFraction: 0.5, gcFraction: 0.9, gcSet: true}, want: derivedLimits{indexBytes: gi / 2}},
		"other fractions":  {m: memoryLimit{limit: 1000, indexFraction: 0.25, gcFraction: 1}, want: derivedLimits{indexBytes: 250, gcBytes: 1000}},
		"negative":         {m: memoryLimit{limit: -1, indexFraction: 0.5, gcFraction: 0.9}, err: "--memory-limit must not be negative"},
		"index fraction 0": {m: memoryLimit{limit: gi, indexFraction: 0, gcFraction: 0.9}, err: "--memory-limit-index-fraction must be in"},
		"index fraction 1": {m: memoryLimit{limit: gi, indexFraction: 1, gcFraction: 1}, err: "--memory-limit-index-fraction must be in"},
		"gc fraction > 1":  {m: memoryLimit{limit: gi, indexFraction: 0.5, gcFraction: 1.5}, err: "--memory-limit-gc-fraction must be in"},
		"index above gc":   {m: memoryLimit{limit: gi, indexFraction: 0.8, gcFraction: 0.7}, err: "must be below"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := c.m.derive()
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("derive() error = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("derive() = %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestRunAppliesMemoryLimit runs the server with --memory-limit as the
// manifests pass it and checks both derived limits took effect.
func TestRunAppliesMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		t.Setenv("GOMEMLIMIT", v) // restores it after the test
		os.Unsetenv("GOMEMLIMIT")
	}

	for name, c := range map[string]struct {
		args      []string
		wantIndex int64
	}{
		"derived":  {[]string{"--memory-limit", "1073741824"}, 1 << 29},
		"explicit": {[]string{"--memory-limit", "1073741824", "--max-index-bytes", "1000000"}, 1000000},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var stderr syncBuffer
			args := append(append([]string{}, loopback...), "--insecure-disable-auth")
			errc := make(chan error, 1)
			up := make(chan *server.Server, 1)
			go func() { errc <- run(ctx, append(args, c.args...), &stderr, func(s *server.Server) { up <- s }) }()
			select {
			case <-up:
			case err := <-errc:
				t.Fatalf("run: %v\n%s", err, stderr.String())
			case <-ctx.Done():
				t.Fatalf("server not up\n%s", stderr.String())
			}
			if got, want := debug.SetMemoryLimit(-1), int64(1<<30)*9/10; got != want {
				t.Errorf("soft memory limit = %d, want %d", got, want)
			}
			logs := stderr.String()
			if want := `"max_index_bytes":` + strconv.FormatInt(c.wantIndex, 10); !strings.Contains(logs, want) {
				t.Errorf("start-up log lacks %s:\n%s", want, logs)
			}
			cancel()
			select {
			case <-errc:
			case <-time.After(15 * time.Second):
				t.Fatal("server did not stop")
			}
		})
	}
}
