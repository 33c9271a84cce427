package engine

import (
	"sync/atomic"
	"testing"
	"time"
)

// panicMetrics panics on its first index-entries report.
type panicMetrics struct {
	nopMetrics
	fired atomic.Bool
}

func (m *panicMetrics) SetIndexEntries(string, int64) {
	if m.fired.CompareAndSwap(false, true) {
		panic("metrics sink failed")
	}
}

// TestWriteLocksSurviveRecoveredPanic: a panic during a write's metric
// report, recovered by the caller (as the gRPC server's interceptor does),
// leaves neither the writer lock nor the report lock held.
func TestWriteLocksSurviveRecoveredPanic(t *testing.T) {
	e := New(Config{Metrics: &panicMetrics{}})
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the metrics panic did not surface")
			}
		}()
		e.Ingest(&Update{TenantID: "t", ModelID: "m", HashScheme: "vllm", ReplicaID: "r", Prefixes: []PrefixEntry{{PrefixHash: h8(1), TokenCount: 16}}}, tT)
	}()
	done := make(chan struct{})
	go func() {
		e.Ingest(&Update{TenantID: "t", ModelID: "m2", HashScheme: "vllm", ReplicaID: "r", Prefixes: []PrefixEntry{{PrefixHash: h8(2), TokenCount: 16}}}, tT)
		e.ApplyEvent(&Event{Type: EventAllCleared, TenantID: "t", ModelID: "m", ReplicaID: "r"}, tT)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("writes still blocked 5 s after a recovered panic")
	}
}
