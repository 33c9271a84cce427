package picker

import (
	"bytes"
	"encoding/json"
)

// UsageNoCached: usage read, but without prompt_tokens_details.cached_tokens
// (an engine that does not report them), so nothing to compare.
const UsageNoCached = "no_cached_tokens"

// usageScanner finds the OpenAI "usage" object in a response body as it
// streams by, without buffering the body: in the last SSE event of a
// streamed response (stream_options.include_usage, or every event with
// vLLM's continuous usage stats: the last one wins) or at the end of a JSON
// body. It matches the key "usage" followed by a colon and an object, keeps
// at most maxUsageCapture bytes of that object and parses it when it
// closes. The key cannot match inside a JSON string (quotes in strings are
// escaped), and a "usage" that is a string value or null is skipped.
// The zero value is ready; reset makes it so again.
type usageScanner struct {
	state   uint8
	matched int // bytes of usageKey matched so far (stateKey)
	depth   int
	inStr   bool
	esc     bool
	capture []byte

	found, hasCached, unreadable bool
	prompt, cached               int64
}

const usageKey = `"usage"`

const (
	stateKey     uint8 = iota // looking for usageKey
	stateColon                // after the key: whitespace, then ':'
	stateValue                // after ':': whitespace, then '{' (else skip)
	stateCapture              // inside the object
)

func (u *usageScanner) reset() {
	c := u.capture[:0]
	*u = usageScanner{capture: c}
}

// write scans the next part of the body.
func (u *usageScanner) write(b []byte) {
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch u.state {
		case stateKey:
			if u.matched == 0 {
				j := bytes.IndexByte(b[i:], '"')
				if j < 0 {
					return
				}
				i += j
				u.matched = 1
				continue
			}
			switch {
			case c == usageKey[u.matched]:
				u.matched++
				if u.matched == len(usageKey) {
					u.matched, u.state = 0, stateColon
				}
			case c == '"':
				u.matched = 1
			default:
				u.matched = 0
			}
		case stateColon:
			switch c {
			case ' ', '\t', '\r', '\n':
			case ':':
				u.state = stateValue
			default:
				u.state = stateKey
				i-- // rescan c as a possible key start
			}
		case stateValue:
			switch c {
			case ' ', '\t', '\r', '\n':
			case '{':
				u.state, u.depth, u.inStr, u.esc = stateCapture, 1, false, false
				u.capture = append(u.capture[:0], c)
			default:
				u.state = stateKey
				i--
			}
		case stateCapture:
			// Copy up to the end of the object or of b.
			start := i
			for ; i < len(b) && u.depth > 0; i++ {
				c := b[i]
				switch {
				case u.esc:
					u.esc = false
				case u.inStr:
					switch c {
					case '\\':
						u.esc = true
					case '"':
						u.inStr = false
					}
				case c == '"':
					u.inStr = true
				case c == '{' || c == '[':
					u.depth++
				case c == '}' || c == ']':
					u.depth--
				}
			}
			if len(u.capture)+i-start > maxUsageCapture {
				u.unreadable = true
				u.state = stateKey
				u.capture = u.capture[:0]
				i--
				continue
			}
			u.capture = append(u.capture, b[start:i]...)
			if u.depth == 0 {
				u.parse()
				u.state = stateKey
			}
			i--
		}
	}
}

// usageObject is the part of "usage" the picker reads.
type usageObject struct {
	PromptTokens        *int64 `json:"prompt_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *usageScanner) parse() {
	var o usageObject
	if json.Unmarshal(u.capture, &o) != nil || o.PromptTokens == nil || *o.PromptTokens < 0 {
		u.unreadable = true
		return
	}
	u.found, u.unreadable = true, false
	u.prompt = *o.PromptTokens
	u.hasCached = false
	if d := o.PromptTokensDetails; d != nil && d.CachedTokens != nil && *d.CachedTokens >= 0 {
		u.hasCached, u.cached = true, *d.CachedTokens
	}
}

// result says what the scan found: a Usage* result for the Observer.
func (u *usageScanner) result() string {
	switch {
	case u.found && u.hasCached:
		return UsageRead
	case u.found:
		return UsageNoCached
	case u.unreadable:
		return UsageUnreadable
	}
	return UsageAbsent
}
