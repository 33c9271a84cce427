package kvevents

import (
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/engine"
	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

func TestParseRole(t *testing.T) {
	for in, want := range map[string]icv1.ReplicaRole{
		"": icv1.ReplicaRole_REPLICA_ROLE_UNSPECIFIED, "prefill": icv1.ReplicaRole_REPLICA_ROLE_PREFILL,
		"Decode": icv1.ReplicaRole_REPLICA_ROLE_DECODE, " both ": icv1.ReplicaRole_REPLICA_ROLE_BOTH,
	} {
		if got, err := ParseRole(in); err != nil || got != want {
			t.Errorf("ParseRole(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseRole("router"); err == nil {
		t.Error("ParseRole accepted an unknown role")
	}
}

// TestE2ERealServerLearnsPlacement: the subscriber's --role, --pd-pool,
// --node-name and --zone reach the server with the replica's reports.
func TestE2ERealServerLearnsPlacement(t *testing.T) {
	srv := startRealServer(t, nil)
	f, _, model := startOnServer(t, srv, func(c *Config) {
		c.Placement = Placement{Role: icv1.ReplicaRole_REPLICA_ROLE_PREFILL, Pool: "prefill", Node: "node-1", Zone: "zone-a"}
	})
	f.publish(t, model, chainBatch(time.Now(), seq(1001, 3), seq(1, 3), nil))
	got, ok := srv.Engine().PlacementOf("t", "m", "r1")
	if want := (engine.Placement{Role: engine.RolePrefill, Pool: "prefill", Node: "node-1", Zone: "zone-a"}); !ok || got != want {
		t.Fatalf("the server knows %+v (%v), want %+v", got, ok, want)
	}
}
