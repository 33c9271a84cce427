package servermetrics_test

import (
	"testing"

	"github.com/inferencecache/inferencecache/rpc"
	"github.com/inferencecache/inferencecache/servermetrics"
)

var _ rpc.DropObserver = (*servermetrics.Metrics)(nil)

// TestDroppedReports: declared reasons export at 0, AddDroppedReports adds,
// and the steady state allocates nothing.
func TestDroppedReports(t *testing.T) {
	m := servermetrics.New()
	m.DeclareDropReasons(rpc.DropReasons...)
	m.AddDroppedReports(rpc.DropMalformedChain, 3)
	m.AddDroppedReports(rpc.DropMalformedChain, 0)
	m.AddDroppedReports(rpc.DropIndexFull, 1)
	fams := gather(t, m)
	if n := len(fams[servermetrics.NameDroppedReports].GetMetric()); n != len(rpc.DropReasons) {
		t.Fatalf("%d series, want one per reason (%d)", n, len(rpc.DropReasons))
	}
	for reason, want := range map[string]float64{rpc.DropMalformedChain: 3, rpc.DropIndexFull: 1, rpc.DropOversizedID: 0} {
		if got, ok := value(fams, servermetrics.NameDroppedReports, "reason="+reason); !ok || got != want {
			t.Errorf("reason=%s: %v (present %v), want %v", reason, got, ok, want)
		}
	}
	if n := testing.AllocsPerRun(1000, func() { m.AddDroppedReports(rpc.DropInvalidHash, 1) }); n != 0 {
		t.Fatalf("allocs/op = %v, want 0", n)
	}
}
