package rpc_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/engine"
	"github.com/inferencecache/inferencecache/internal/ratelog/ratelogtest"
	"github.com/inferencecache/inferencecache/policy"
	"github.com/inferencecache/inferencecache/rpc"
	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// TestRequestFloodLogsBounded: floods of lookups and producer messages that
// each trigger a WARN (an oversized id, a prompt_text with no tokenizer, a
// refused event) over a real gRPC server cost one line per kind in a
// minute, each kind counted in full.
func TestRequestFloodLogsBounded(t *testing.T) {
	flood := int64(300)
	if raceEnabled {
		flood = 60 // each request carries 1 MiB; one line per minute holds at any count
	}
	store := policy.NewStore()
	e := engine.New(engine.Config{Policies: store})
	log, rec := ratelogtest.NewLogger(slog.LevelDebug)
	// A frozen clock: the minute does not run out however slow the
	// machine is (the rate-limiters read the service clock).
	frozen := time.Unix(1_700_000_000, 0)
	svc, err := rpc.NewService(rpc.Config{Index: e, Policies: store, Logger: log, Now: func() time.Time { return frozen }})
	if err != nil {
		t.Fatal(err)
	}
	client := serve(t, svc)
	for range flood {
		if r, err := client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: huge, ModelId: model, HashScheme: scheme, PrefixHash: hashOf(1, 0)}); err != nil || r.GetReasonCode() != rpc.ReasonNoHint {
			t.Fatalf("oversized lookup: %v %v", r, err)
		}
		if r, err := client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: "team", ModelId: model, HashScheme: scheme, PromptText: "hello"}); err != nil || r.GetReasonCode() != rpc.ReasonNoHint {
			t.Fatalf("prompt_text lookup: %v %v", r, err)
		}
		if _, err := client.PublishEvent(ctx(t), &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, TenantId: huge, ModelId: model, ReplicaId: "r1"}); err == nil {
			t.Fatal("oversized event accepted")
		}
	}
	for _, msg := range []string{"id over the limit answered NO_HINT", "prompt_text lookups fail open", "producer reports dropped"} {
		if n := rec.Count(msg); n != 1 {
			t.Errorf("%d lines %q for %d requests in a minute, want 1", n, msg, flood)
		}
	}
	if n := svc.PromptTextFailOpens(); n != flood {
		t.Errorf("prompt_text fail-opens counted %d, want %d", n, flood)
	}
	if n := svc.DroppedReports(); n != flood {
		t.Errorf("dropped reports counted %d, want %d", n, flood)
	}
}
