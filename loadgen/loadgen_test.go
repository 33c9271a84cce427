package loadgen_test

import (
	"context"
	"maps"
	"os"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/loadgen"
)

func TestRunAgainstServer(t *testing.T) {
	s := startServer(t)
	cfg := loadgen.DefaultConfig()
	cfg.Target = s.grpcAddr()
	cfg.Rate = 500
	cfg.Warmup = 500 * time.Millisecond
	cfg.Duration = 2 * time.Second
	cfg.ClearEvery = 700 * time.Millisecond
	if testing.Verbose() {
		cfg.Progress = os.Stderr
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if testing.Verbose() {
		_ = rep.WriteMarkdown(os.Stderr)
	}
	got := s.lookupCalls(t, cfg.ModelID)
	if !maps.Equal(got, rep.Totals.Reasons) {
		t.Errorf("server counts %v, report totals %v", got, rep.Totals.Reasons)
	}
}
