package probe

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/inferencecache/inferencecache/controlapi"
)

// ErrNoRemoteTier is what a T2Prober returns when the request names no
// remote tier it can probe; stage t2 is then skipped, not failed.
var ErrNoRemoteTier = errors.New("probe: no remote tier to probe")

// RemoteT2 is the production T2Prober: a put/get round trip against the
// CacheBackend's remote tier (ProbeRequest.T2Endpoint). The one provider
// is Redis (CacheBackend spec.remoteStorage.provider; an empty T2Provider
// means Redis): SET a random value under a key of the backend with a
// 60-second expiry, GET it back, DEL it. The endpoint is "host:port",
// "redis://[user:password@]host:port[/db]" or "rediss://…" (TLS, verified
// against the system roots). No endpoint, or another provider, is
// ErrNoRemoteTier (skipped). The zero value is ready to use.
type RemoteT2 struct {
	// Timeout bounds one round trip when ctx has no earlier deadline; 0
	// means DefaultT2Timeout.
	Timeout time.Duration
}

// DefaultT2Timeout bounds a remote-tier round trip.
const DefaultT2Timeout = 5 * time.Second

// maxReply bounds one Redis reply the prober reads.
const maxReply = 64 << 10

var _ T2Prober = RemoteT2{}

// ProbeT2 runs the round trip (see RemoteT2).
func (p RemoteT2) ProbeT2(ctx context.Context, req controlapi.ProbeRequest) error {
	if req.T2Endpoint == "" {
		return ErrNoRemoteTier
	}
	if req.T2Provider != "" && !strings.EqualFold(req.T2Provider, "Redis") {
		return fmt.Errorf("%w: provider %q (only Redis is probed)", ErrNoRemoteTier, req.T2Provider)
	}
	ep, err := controlapi.ParseT2Endpoint(req.T2Endpoint)
	if err != nil {
		return err
	}
	to := p.Timeout
	if to <= 0 {
		to = DefaultT2Timeout
	}
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", ep.Addr)
	if err != nil {
		return fmt.Errorf("cannot reach the remote tier %s: %w", ep.Addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if ep.TLS {
		host, _, _ := net.SplitHostPort(ep.Addr)
		tc := tls.Client(conn, &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			return fmt.Errorf("cannot open TLS to the remote tier %s: %w", ep.Addr, err)
		}
		conn = tc
	}
	c := &redisConn{w: conn, r: bufio.NewReader(conn)}
	if ep.Password != "" {
		args := []string{"AUTH", ep.Password}
		if ep.User != "" {
			args = []string{"AUTH", ep.User, ep.Password}
		}
		if _, err := c.do(args...); err != nil {
			return fmt.Errorf("remote tier %s: AUTH: %w", ep.Addr, err)
		}
	}
	if ep.DB != "" {
		if _, err := c.do("SELECT", ep.DB); err != nil {
			return fmt.Errorf("remote tier %s: SELECT %s: %w", ep.Addr, ep.DB, err)
		}
	}
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	sum := sha256.Sum256([]byte(req.Backend))
	key := "inferencecache:probe:" + hex.EncodeToString(sum[:8]) + ":" + hex.EncodeToString(nonce[:4])
	val := hex.EncodeToString(nonce[:])
	if r, err := c.do("SET", key, val, "PX", "60000"); err != nil || r.s != "OK" {
		return fmt.Errorf("remote tier %s: put: %v", ep.Addr, orReply(err, r))
	}
	r, err := c.do("GET", key)
	if err != nil {
		return fmt.Errorf("remote tier %s: get: %w", ep.Addr, err)
	}
	if r.null || r.s != val {
		return fmt.Errorf("remote tier %s: get returned %s, not the value just put", ep.Addr, r.describe())
	}
	if _, err := c.do("DEL", key); err != nil {
		return fmt.Errorf("remote tier %s: delete: %w", ep.Addr, err)
	}
	return nil
}

// redisConn speaks RESP: commands as arrays of bulk strings, replies read
// one at a time.
type redisConn struct {
	w io.Writer
	r *bufio.Reader
}

// reply is one RESP reply: a simple string or bulk string (s), an integer
// (n), or a null bulk string.
type reply struct {
	s    string
	n    int64
	null bool
	kind byte
}

func (r reply) describe() string {
	if r.null {
		return "nothing"
	}
	return strconv.Quote(r.s)
}

func orReply(err error, r reply) any {
	if err != nil {
		return err
	}
	return "reply " + r.describe()
}

func (c *redisConn) do(args ...string) (reply, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c.w, b.String()); err != nil {
		return reply{}, err
	}
	return c.read()
}

func (c *redisConn) line() (string, error) {
	l, err := c.r.ReadSlice('\n')
	if err != nil {
		return "", err
	}
	if len(l) < 2 || l[len(l)-2] != '\r' {
		return "", errors.New("malformed reply line")
	}
	return string(l[:len(l)-2]), nil
}

func (c *redisConn) read() (reply, error) {
	l, err := c.line()
	if err != nil {
		return reply{}, err
	}
	if l == "" {
		return reply{}, errors.New("empty reply")
	}
	r := reply{kind: l[0]}
	switch l[0] {
	case '+':
		r.s = l[1:]
	case '-':
		return r, fmt.Errorf("server error: %s", l[1:])
	case ':':
		if r.n, err = strconv.ParseInt(l[1:], 10, 64); err != nil {
			return r, fmt.Errorf("malformed integer reply %q", l)
		}
	case '$':
		n, err := strconv.Atoi(l[1:])
		switch {
		case err != nil || n < -1 || n > maxReply:
			return r, fmt.Errorf("bulk reply of %q bytes", l[1:])
		case n == -1:
			r.null = true
			return r, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return r, err
		}
		if buf[n] != '\r' || buf[n+1] != '\n' {
			return r, errors.New("malformed bulk reply")
		}
		r.s = string(buf[:n])
	default:
		return r, fmt.Errorf("unexpected reply %q", clip(l))
	}
	return r, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
