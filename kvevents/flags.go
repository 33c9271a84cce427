package kvevents

import (
	"fmt"
	"strconv"
	"strings"

	icv1 "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
)

// Placement is where the replica runs for disaggregated prefill/decode
// (docs/pd.md): every update carries it, so the server knows which pool's
// candidate the replica is.
type Placement struct {
	Role             icv1.ReplicaRole
	Pool, Node, Zone string
}

// ParseRole parses --role: "prefill", "decode", "both" (an aggregated
// engine), or "" (not reported).
func ParseRole(s string) (icv1.ReplicaRole, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "":
		return icv1.ReplicaRole_REPLICA_ROLE_UNSPECIFIED, nil
	case "both":
		return icv1.ReplicaRole_REPLICA_ROLE_BOTH, nil
	case "prefill":
		return icv1.ReplicaRole_REPLICA_ROLE_PREFILL, nil
	case "decode":
		return icv1.ReplicaRole_REPLICA_ROLE_DECODE, nil
	}
	return 0, fmt.Errorf("cannot parse role %q: want prefill, decode or both", s)
}

// ParseLoRAAdapters parses --lora-adapter-names: "1=sql,2=chat" maps
// lora_id 1 to adapter "sql" and 2 to "chat". Empty input gives an empty
// map; a malformed or duplicate entry is an error.
func ParseLoRAAdapters(s string) (map[int64]string, error) {
	out := map[int64]string{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		idStr, name, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("cannot parse LoRA adapter %q: want id=name", item)
		}
		id, err := strconv.ParseInt(strings.TrimSpace(idStr), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("cannot parse LoRA adapter id %q: %w", idStr, err)
		}
		name = strings.TrimSpace(name)
		if name == "" {
			return nil, fmt.Errorf("cannot parse LoRA adapter %q: empty name", item)
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("cannot parse LoRA adapters: id %d given twice", id)
		}
		out[id] = name
	}
	return out, nil
}
