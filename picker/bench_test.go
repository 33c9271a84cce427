package picker_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/inferencecache/inferencecache/picker"
)

// BenchmarkExtProcPicks is picks through real ext_proc streams on
// 127.0.0.1 (plaintext), client included: each op is one HTTP request as
// Envoy drives it (FULL_DUPLEX_STREAMED): a new stream, headers, a chat
// body of about 2,000 bytes, the headers answer and the re-emitted body,
// then the response headers and a JSON body with usage, and the stream's
// end. The stand-in tokenizer makes one token per byte, so this is the
// picker's own cost around a cheap tokenization; 64 conversations repeat,
// so every pick is a prefix hit. loadgen's BenchmarkPickerExtProc is the
// same path with a real tokenizer, TLS, 2,048-token requests and new
// conversations (the >= 5,000 picks/s target).
func BenchmarkExtProcPicks(b *testing.B) {
	env := newEnv(b, func(c *picker.Config) { c.MaxConcurrentTokenize = 1024 })
	var bodies [][]byte
	for i := range 64 {
		// ~2k tokens: byteTokenizer makes one token per byte.
		body := chatBody(false, fmt.Sprintf("conversation %d: ", i)+strings.Repeat("lorem ipsum dolor sit amet ", 70), "ok", "next?")
		bodies = append(bodies, body)
		env.holds(b, testEndpoints[i%3].ReplicaID, tokensOfBody(b, body))
	}
	usage := []byte(`{"id":"x","choices":[{"message":{"content":"fine"}}],"usage":{"prompt_tokens":2000,"prompt_tokens_details":{"cached_tokens":1984}}}`)
	var n atomic.Int64
	ctx := tctx(b)
	b.ReportAllocs()
	b.SetParallelism(8)
	start, cpu0 := time.Now(), cpuTime(b)
	b.RunParallel(func(pb *testing.PB) {
		i := int(n.Add(1))
		for pb.Next() {
			i++
			st, err := env.ep.Process(ctx)
			if err != nil {
				b.Fatal(err)
			}
			c := &client{t: b, st: st}
			c.sendRequest(bodies[i%len(bodies)], 16384)
			c.send(responseHeaders(nil, false, "application/json"))
			c.recv()
			c.send(responseBody(usage, true, nil))
			c.recv()
			_ = c.st.CloseSend()
			if _, err := c.st.Recv(); err == nil {
				b.Error("the stream did not end")
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "picks/s")
	// On a shared machine the wall-clock rate is what the scheduler left
	// over; the CPU a pick costs (server and client, this process) says
	// what 2 dedicated cores would do: 2 s of CPU per second / cost.
	perPick := (cpuTime(b) - cpu0).Seconds() / float64(b.N)
	b.ReportMetric(perPick*1e6, "cpu-µs/pick")
	b.ReportMetric(2/perPick, "picks/s-on-2-cores")
	if env.pk.InflightTotal() != 0 {
		b.Fatalf("in flight %d after the run", env.pk.InflightTotal())
	}
}

// cpuTime is the process's user + system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
