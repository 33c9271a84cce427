package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/inferencecache/inferencecache/rpc/gen/inferencecache/v1alpha1"
	"github.com/inferencecache/inferencecache/server"
	"github.com/inferencecache/inferencecache/server/servertest"
)

// testConfig is the servertest configuration: an insecure server on
// loopback ports chosen by the kernel.
func testConfig() server.Config { return servertest.Config() }

// running is a started server with a plaintext client (none with TLS).
type running struct {
	*servertest.Running
	conn *grpc.ClientConn
	cli  pb.InferenceCacheClient
}

// start runs a server built from cfg through servertest.Run, which waits
// until it is ready and stops it (bounded) when the test ends.
func start(t *testing.T, cfg server.Config) *running {
	t.Helper()
	r := &running{Running: servertest.Run(t, func(c *server.Config) { *c = cfg })}
	if !r.TLS() {
		r.conn = servertest.Conn(t, r.Server)
		r.cli = pb.NewInferenceCacheClient(r.conn)
	}
	return r
}

func tctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// httpDo sends one request and returns the status and body.
func httpDo(t *testing.T, method, url, body string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(tctx(t), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFor polls cond every 5 ms for at most 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
