package modeldir

import (
	"encoding/json"
	"sync"

	"github.com/ardanlabs/jinja"

	"github.com/inferencecache/inferencecache/chattemplate"
)

// msgCache keeps the template values of recently seen messages, keyed by
// their raw JSON (exact: the map compares the bytes), so the turns of a
// long conversation convert only their new messages. It has two
// generations: inserts go to the young one; when it passes half the byte
// budget the old one is dropped and the young one becomes old (a hit in
// the old one moves the entry back). Values are shared between renders and
// only read (templates that could modify them do not use the cache).
type msgCache struct {
	maxBytes int64

	// mu protects young, old and youngBytes.
	mu         sync.Mutex
	young, old map[string]jinja.Value
	youngBytes int64
}

func newMsgCache(maxBytes int64) *msgCache {
	return &msgCache{maxBytes: maxBytes, young: map[string]jinja.Value{}, old: map[string]jinja.Value{}}
}

// convert returns the converted messages, from the cache where it can.
func (c *msgCache) convert(raws []json.RawMessage, format chattemplate.ContentFormat) ([]jinja.Value, error) {
	out := make([]jinja.Value, len(raws))
	var missing []int
	c.mu.Lock()
	for i, raw := range raws {
		if v, ok := c.young[string(raw)]; ok {
			out[i] = v
			continue
		}
		if v, ok := c.old[string(raw)]; ok {
			out[i] = v
			c.putLocked(string(raw), v)
			continue
		}
		missing = append(missing, i)
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	for _, i := range missing {
		v, err := chattemplate.ConvertMessage(raws[i], format)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	c.mu.Lock()
	for _, i := range missing {
		c.putLocked(string(raws[i]), out[i])
	}
	c.mu.Unlock()
	return out, nil
}

func (c *msgCache) putLocked(key string, v jinja.Value) {
	// The values hold about as much as the raw JSON, plus per-value
	// overhead.
	size := 2*int64(len(key)) + 256
	if size > c.maxBytes/2 {
		return
	}
	if c.youngBytes+size > c.maxBytes/2 {
		c.old, c.young, c.youngBytes = c.young, map[string]jinja.Value{}, 0
	}
	if _, ok := c.young[key]; !ok {
		c.young[key] = v
		c.youngBytes += size
	}
}
