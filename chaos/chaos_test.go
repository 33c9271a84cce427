package chaos_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/chaos"
)

// TestChaos is the chaos run (package doc): 60 s of faults by default,
// CHAOS_DURATION (a Go duration) and CHAOS_SEED override; -short skips it.
// It fails on any mismatch between a server's index and the engines'
// truth, a lookup no server answered, a process that grew without bound or
// one that crashed. The work directory (logs, stores) is kept on failure,
// or always with CHAOS_KEEP=1.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes over a minute; skipped with -short")
	}
	cfg := chaos.Config{Log: os.Stderr}
	if v := os.Getenv("CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CHAOS_DURATION: %v", err)
		}
		cfg.Duration = d
	}
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED: %v", err)
		}
		cfg.Seed = s
	}
	dir, err := os.MkdirTemp("", "inferencecache-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if dl, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-30*time.Second))
		defer cancel()
	}
	built := time.Now()
	if cfg.Bins, err = chaos.Build(ctx, binDir(dir)); err != nil {
		t.Fatal(err)
	}
	t.Logf("binaries built in %v", time.Since(built).Round(time.Millisecond))
	cfg.Dir = dir
	rep, err := chaos.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("%v (work directory %s kept)", err, dir)
	}
	t.Log(rep.Summary())
	if f := rep.Failures(); len(f) > 0 {
		for _, msg := range f {
			t.Error(msg)
		}
		t.Fatalf("rerun with CHAOS_SEED=%d CHAOS_DURATION=%v; logs under %s", rep.Seed, rep.Duration, dir)
	}
	if os.Getenv("CHAOS_KEEP") == "" {
		_ = os.RemoveAll(dir)
	} else {
		t.Logf("work directory %s kept (CHAOS_KEEP)", dir)
	}
}

// binDir is where the binaries are built: a directory of the user's cache
// per checkout, so that a rerun finds them up to date (go build then only
// checks them, instead of linking them again: ~20 s), else under dir.
func binDir(dir string) string {
	cache, err := os.UserCacheDir()
	wd, werr := os.Getwd()
	if err != nil || werr != nil {
		return filepath.Join(dir, "bin")
	}
	sum := sha256.Sum256([]byte(wd))
	return filepath.Join(cache, "inferencecache-chaos", hex.EncodeToString(sum[:8]))
}
