package kvevents

import (
	"context"
	"encoding/binary"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferencecache/inferencecache/internal/ratelog/ratelogtest"
	"github.com/inferencecache/inferencecache/kvevents/wire"
)

// TestUndecodableBatchFloodLogsBounded: a flood of engine messages whose
// payload does not decode is counted per batch but costs a bounded number
// of WARN lines.
func TestUndecodableBatchFloodLogsBounded(t *testing.T) {
	const flood = 500
	log, rec := ratelogtest.NewLogger(slog.LevelDebug)
	reg := prometheus.NewRegistry()
	sub, err := New(Config{ReplicaID: "r1", ModelID: "m", TenantID: "t", HashScheme: "vllm",
		Endpoint: "tcp://127.0.0.1:1", Topic: "kv-events", Heartbeat: -1, Registerer: reg, Logger: log}, &recSink{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var seq [8]byte
	for i := range flood {
		binary.BigEndian.PutUint64(seq[:], uint64(i))
		sub.handle(ctx, message{conn: 1, frames: [][]byte{[]byte("kv-events"), seq[:], {0xc1, byte(i)}}})
	}
	if dropped := testutil.CollectAndCount(sub.metrics.batchesDropped); dropped == 0 {
		t.Fatal("no batch counted as dropped")
	}
	var dropped float64
	for _, r := range []string{wire.ReasonTruncated, wire.ReasonEnvelope, wire.ReasonEvent, wire.ReasonFieldType, wire.ReasonTokenID, wire.ReasonTooLarge, wire.ReasonTrailing, wire.ReasonFrames, "other"} {
		dropped += testutil.ToFloat64(sub.metrics.batchesDropped.WithLabelValues(r))
	}
	if dropped != flood {
		t.Fatalf("batches dropped %v, want %d", dropped, flood)
	}
	if n := rec.Count("undecodable event batch"); n == 0 || n > 10 {
		t.Fatalf("%d log lines for %d undecodable batches, want 1 to 10", n, flood)
	}
}
