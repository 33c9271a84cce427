package picker

import (
	"strings"
	"testing"
)

// scanIn feeds body to a fresh scanner in pieces of n bytes.
func scanIn(body string, n int) *usageScanner {
	u := &usageScanner{}
	for off := 0; off < len(body); off += n {
		u.write([]byte(body[off:min(off+n, len(body))]))
	}
	return u
}

func TestUsageScanner(t *testing.T) {
	f := func(name, body, result string, prompt, cached int64) {
		t.Helper()
		// Every split must give the same answer: the key, the colon and
		// the object may straddle chunk boundaries anywhere.
		for n := 1; n <= len(body)+1; n++ {
			u := scanIn(body, n)
			if got := u.result(); got != result {
				t.Fatalf("%s, pieces of %d: result %q, want %q", name, n, got, result)
			}
			if result == UsageRead && (u.prompt != prompt || u.cached != cached) {
				t.Fatalf("%s, pieces of %d: prompt %d cached %d, want %d %d", name, n, u.prompt, u.cached, prompt, cached)
			}
		}
	}
	f("json", `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":120,"total_tokens":130,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":96}}}`, UsageRead, 120, 96)
	f("spaced", `{"usage" :  {"prompt_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}}}`, UsageRead, 7, 0)
	f("sse last wins", "data: {\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n", UsageRead, 9, 8)
	f("null usage then real", `data: {"usage":null}`+"\n\n"+`data: {"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}`, UsageRead, 3, 2)
	f("in content", `{"choices":[{"message":{"content":"the \"usage\": {\"prompt_tokens\": 1} key"}}]}`, UsageAbsent, 0, 0)
	f("string value", `{"role":"usage","x":"usage"}`, UsageAbsent, 0, 0)
	f("no details", `{"usage":{"prompt_tokens":4,"prompt_tokens_details":null}}`, UsageNoCached, 0, 0)
	f("absent", `{"choices":[]}`, UsageAbsent, 0, 0)
	f("braces in strings", `{"usage":{"prompt_tokens":4,"note":"}{\"","prompt_tokens_details":{"cached_tokens":2}}}`, UsageRead, 4, 2)
	f("malformed", `{"usage":{"prompt_tokens":"four"}}`, UsageUnreadable, 0, 0)
	f("too large", `{"usage":{"prompt_tokens":1,"pad":"`+strings.Repeat("x", maxUsageCapture)+`"}}`, UsageUnreadable, 0, 0)
}

func TestUsageScannerReset(t *testing.T) {
	u := scanIn(`{"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":1}}}`, 5)
	u.reset()
	if u.result() != UsageAbsent || u.state != stateKey {
		t.Fatalf("reset left %+v", u)
	}
}

// FuzzUsageScanner: any body, split anywhere, never panics, keeps its
// capture bounded, and a split does not change the answer.
func FuzzUsageScanner(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":120,"prompt_tokens_details":{"cached_tokens":96}}}`), 3)
	f.Add([]byte("data: {\"usage\":null}\n\ndata: {\"usage\":{\"prompt_tokens\":9}}\n\n"), 1)
	f.Add([]byte(`"usage":{"a":[{"b":"}\\""}]}`), 7)
	f.Fuzz(func(t *testing.T, body []byte, n int) {
		if n <= 0 || n > len(body)+1 {
			n = len(body) + 1
		}
		whole := &usageScanner{}
		whole.write(body)
		split := scanIn(string(body), n)
		if whole.result() != split.result() || whole.prompt != split.prompt || whole.cached != split.cached {
			t.Fatalf("split %d changed the answer: %q %d/%d vs %q %d/%d", n, whole.result(), whole.prompt, whole.cached, split.result(), split.prompt, split.cached)
		}
		if len(split.capture) > maxUsageCapture {
			t.Fatalf("capture grew to %d bytes", len(split.capture))
		}
	})
}
