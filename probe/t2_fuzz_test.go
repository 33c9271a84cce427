package probe

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzRedisReply: the RESP reply reader never panics, never reads more
// than the reply it reports plus its framing, and a bulk reply it accepts
// is within maxReply. Kept seeds: testdata/fuzz/FuzzRedisReply.
func FuzzRedisReply(f *testing.F) {
	for _, s := range []string{"+OK\r\n", "-ERR nope\r\n", ":42\r\n", "$5\r\nhello\r\n", "$-1\r\n", "$3\r\nab\r\n", "*1\r\n", "+no crlf\n", "$99999999\r\n", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &redisConn{r: bufio.NewReader(bytes.NewReader(data))}
		r, err := c.read()
		if err != nil {
			return
		}
		if len(r.s) > maxReply || len(r.s) > len(data) {
			t.Fatalf("reply %q from %d bytes", r.s, len(data))
		}
		if r.null && r.s != "" {
			t.Fatal("a null reply with a value")
		}
	})
}
