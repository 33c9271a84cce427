package kvevents

import (
	"fmt"
	"strconv"
	"strings"
)

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
